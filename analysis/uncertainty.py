"""How sure a step's numbers are: confidence intervals that hold on the data a load test produces.

Pure (numpy and scipy, no Locust, no network). The methods, and what they assume, are in docs/reference/metrics.md:
- rates over a window (aggregate tok/s, requests/s): batch means. Events inside one step are autocorrelated (the
  same users, the same batch), so a t-interval over 1-second bins is too narrow; the window is cut into k equal
  batches, each much longer than one request, and the t-interval (k - 1 degrees of freedom) is taken over the k
  batch rates. When adjacent batch rates are still correlated, fewer and longer batches are used.
- percentiles (TTFT, TPOT, E2E): distribution-free order-statistic intervals from the binomial distribution of
  the number of samples below the true quantile, assuming independent requests.
- means over requests (per-request tok/s, E2E mean): the t-interval over the requests.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special  # not scipy.stats: importing it cost every Locust process about 0.6 CPU-s more

CONFIDENCE = 0.95
MIN_BATCHES = 5  # fewer batches leave a t-interval too wide to mean anything (t(3) = 3.18)
MAX_BATCHES = 20
# A batch spans at least this many median E2Es. Not more: on simulated closed loops (1 to 64 users, near-periodic
# and gamma E2Es, 4 to 22 s windows) one E2E kept coverage at 96-100 % (periodic completions make adjacent batches
# anti-correlated: conservative), while 4 left the busy steps of `make demo` (22 s windows, 3 s E2Es) with fewer
# than MIN_BATCHES batches, so with no interval at all, and 2 covered a near-periodic single user only 86 %.
BATCH_E2E_MULTIPLE = 1.0
MAX_LAG1 = 0.5  # above this lag-1 autocorrelation of batch rates, batches are merged pairwise
# series_mean_interval's cap on the correlation it corrects for: readings of a step that changed halfway read r near 1,
# which would make the interval infinite rather than wide (at 0.95 it is sqrt(39) = 6.2 times a t-interval's).
MAX_SERIES_LAG1 = 0.95


@dataclass(frozen=True)
class Interval:
    """A point estimate and its confidence interval; low/high are NaN when the data cannot give one, and `note`
    then says why ("too few samples", "step too short")."""

    value: float
    low: float = math.nan
    high: float = math.nan
    n: int = 0
    note: str | None = None

    @property
    def half_width(self) -> float:
        """(high - low) / 2: the ± printed beside a value."""
        return (self.high - self.low) / 2

    @property
    def relative_half_width(self) -> float:
        """half_width / |value|: what --ci-target is compared with."""
        return self.half_width / abs(self.value) if self.value else math.nan

    def contains(self, x: float) -> bool:
        return bool(self.low <= x <= self.high)


def t_interval(values: Sequence[float] | np.ndarray, confidence: float = CONFIDENCE) -> Interval:
    """Mean ± t(n-1, (1+c)/2) * s / sqrt(n) over independent values; NaN bounds below 2 values."""
    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    n = int(x.size)
    if n == 0:
        return Interval(math.nan, n=0, note="no samples")
    mean = float(x.mean())
    if n < 2:
        return Interval(mean, n=n, note="too few samples")
    half = float(special.stdtrit(n - 1, (1 + confidence) / 2) * x.std(ddof=1) / math.sqrt(n))
    return Interval(mean, mean - half, mean + half, n)


def lag1_autocorrelation(x: np.ndarray) -> float:
    """r1 = sum((x_i - m)(x_(i+1) - m)) / sum((x_i - m)^2); NaN for fewer than 3 values or no variance."""
    if x.size < 3:
        return math.nan
    d = x - x.mean()
    denom = float(np.dot(d, d))
    return float(np.dot(d[:-1], d[1:]) / denom) if denom > 0 else math.nan


def batch_count(window_s: float, e2e_median_s: float | None) -> int:
    """k = min(MAX_BATCHES, window_s / (BATCH_E2E_MULTIPLE * median E2E)), so each batch spans several requests."""
    if not window_s > 0:
        return 0
    if e2e_median_s is None or not e2e_median_s > 0 or math.isnan(e2e_median_s):
        return MAX_BATCHES
    return int(min(MAX_BATCHES, window_s // (BATCH_E2E_MULTIPLE * e2e_median_s)))


def batch_means(
    times: Sequence[float] | np.ndarray,
    weights: Sequence[float] | np.ndarray,
    start: float,
    end: float,
    batches: int,
    confidence: float = CONFIDENCE,
) -> Interval:
    """Rate = sum of the weights of the events in [start, end) / (end - start), with a batch-means t-interval:
    the window cut into `batches` equal batches, rate_b = weights in batch b / batch length, t-interval over the
    rate_b (merged pairwise while their lag-1 autocorrelation exceeds MAX_LAG1). The point estimate is the same
    as the whole window's rate, since equal batches partition the window."""
    t = np.asarray(times, dtype=float)
    w = np.asarray(weights, dtype=float)
    window = end - start
    if not window > 0:
        return Interval(math.nan, note="empty window")
    inside = (t >= start) & (t < end)
    value = float(w[inside].sum() / window)
    if batches < MIN_BATCHES:
        return Interval(value, n=max(batches, 0), note="step too short for an interval")
    index = np.minimum(((t[inside] - start) / window * batches).astype(np.int64), batches - 1)
    rates = np.bincount(index, weights=w[inside], minlength=batches) / (window / batches)
    while rates.size >= 2 * MIN_BATCHES and lag1_autocorrelation(rates) > MAX_LAG1:
        rates = rates[: rates.size // 2 * 2].reshape(-1, 2).mean(axis=1)  # fewer, longer batches
    ci = t_interval(rates, confidence)
    if rates.size < MIN_BATCHES:
        return Interval(value, n=int(rates.size), note="step too short for an interval")
    return Interval(value, value - ci.half_width, value + ci.half_width, int(rates.size))


def series_mean_interval(values: Sequence[float] | np.ndarray, confidence: float = CONFIDENCE) -> Interval:
    """Mean of a time-ordered series (a gauge's readings) with an AR(1) interval: r = lag-1 autocorrelation of the
    readings + (1 + 4 r) / n (its small-sample bias), within [0, MAX_SERIES_LAG1]; n_eff = n (1 - r) / (1 + r);
    half-width = t(max(n_eff, 2) - 1) * sd / sqrt(n) * sqrt((1 + r) / (1 - r)); NaN bounds below MIN_BATCHES
    readings."""
    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    n = int(x.size)
    if n == 0:
        return Interval(math.nan, n=0, note="no samples")
    mean = float(x.mean())
    if n < MIN_BATCHES:
        return Interval(mean, n=n, note="too few samples")
    # A gauge drifts (a cache filling, a GPU idle for part of the step): adjacent readings are alike, and a t-interval
    # over them as if independent is far too narrow. Batch means of 30 readings (a 30 s step) left too few batches to
    # see that correlation: 84 % coverage at a lag-1 correlation of 0.7, where this keeps about 90 %.
    r = lag1_autocorrelation(x)
    r = 0.0 if math.isnan(r) else r
    r = min(max(r + (1 + 4 * max(r, 0.0)) / n, 0.0), MAX_SERIES_LAG1)
    n_eff = max(n * (1 - r) / (1 + r), 2.0)
    sd = float(x.std(ddof=1))
    half = float(special.stdtrit(n_eff - 1, (1 + confidence) / 2) * sd / math.sqrt(n) * math.sqrt((1 + r) / (1 - r)))
    return Interval(mean, mean - half, mean + half, n)


def min_samples_for_quantile(q: float) -> int:
    """n >= 10 / (1 - q): fewer samples leave the q-quantile's upper bound at the sample maximum or beyond."""
    return math.ceil(10 / (1 - q) - 1e-9)


def quantile_interval(values: Sequence[float] | np.ndarray, q: float, confidence: float = CONFIDENCE) -> Interval:
    """q-quantile (linear interpolation, as numpy) with the order-statistic interval [x_(l), x_(u)]: the largest l
    with P(B <= l-1) <= (1-c)/2 and the smallest u with P(B <= u-1) >= (1+c)/2, B ~ Binomial(n, q); at least c
    coverage for independent samples. Bounds are NaN, and the note says "too few samples", when n < 10 / (1 - q)
    or a rank falls outside 1..n."""
    x = np.asarray(values, dtype=float)
    x = np.sort(x[~np.isnan(x)])
    n = int(x.size)
    if n == 0:
        return Interval(math.nan, n=0, note="no samples")
    value = float(np.percentile(x, q * 100))
    if n < min_samples_for_quantile(q):
        return Interval(value, n=n, note="too few samples")
    ranks = np.arange(0, n + 1)  # cdf[k] = P(B <= k)
    cdf = special.bdtr(ranks, n, q)  # the binomial cdf at k = 0..n
    alpha = (1 - confidence) / 2
    below = np.nonzero(cdf <= alpha)[0]  # l - 1 candidates
    above = np.nonzero(cdf >= 1 - alpha)[0]  # u - 1 candidates
    if not below.size or not above.size or above[0] + 1 > n:
        return Interval(value, n=n, note="too few samples")
    low_rank, high_rank = int(below[-1]) + 1, int(above[0]) + 1  # 1-based ranks
    return Interval(value, float(x[low_rank - 1]), float(x[high_rank - 1]), n)


def wilson_interval(successes: int, trials: int, confidence: float = CONFIDENCE) -> Interval:
    """A binomial proportion k / n with Wilson's score interval: (p + z^2/2n ± z sqrt(p(1-p)/n + z^2/4n^2)) /
    (1 + z^2/n), z the normal quantile of (1 + c) / 2; it stays inside [0, 1] and keeps close to its nominal coverage
    at small n or p near 0 or 1, where the normal approximation does not. NaN without trials."""
    n, k = int(trials), int(successes)
    if n <= 0:
        return Interval(math.nan, n=0, note="no samples")
    p = k / n
    z = float(special.ndtri((1 + confidence) / 2))
    scale = 1 + z * z / n
    center = (p + z * z / (2 * n)) / scale
    half = z / scale * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return Interval(p, max(0.0, center - half), min(1.0, center + half), n)


def halves(
    times: Sequence[float] | np.ndarray,
    weights: Sequence[float] | np.ndarray,
    start: float,
    end: float,
    batches: int,
    confidence: float = CONFIDENCE,
) -> tuple[Interval, Interval]:
    """(first half, second half) of [start, end): each half's rate = its weights / half length, with a t-interval
    over its batches (the window cut into 2 * (batches // 2) equal batches); NaN bounds below 2 batches a half."""
    t = np.asarray(times, dtype=float)
    w = np.asarray(weights, dtype=float)
    window = end - start
    if not window > 0:
        return Interval(math.nan, note="empty window"), Interval(math.nan, note="empty window")
    per_half = max(batches // 2, 0)
    inside = (t >= start) & (t < end)
    mid = start + window / 2
    out = []
    for lo, hi in ((start, mid), (mid, end)):
        part = inside & (t >= lo) & (t < hi)
        value = float(w[part].sum() / (hi - lo))
        if per_half < 2:
            out.append(Interval(value, n=per_half, note="step too short for an interval"))
            continue
        index = np.minimum(((t[part] - lo) / (hi - lo) * per_half).astype(np.int64), per_half - 1)
        rates = np.bincount(index, weights=w[part], minlength=per_half) / ((hi - lo) / per_half)
        half = t_interval(rates, confidence).half_width
        out.append(Interval(value, value - half, value + half, per_half))
    return out[0], out[1]


def completion_edge_sd(
    starts: Sequence[float] | np.ndarray,
    ends: Sequence[float] | np.ndarray,
    tokens: Sequence[float] | np.ndarray,
    start: float,
    end: float,
    points: int = 200,
) -> float:
    """sd of the window-edge error of a rate that counts each request's tokens when it completes: the tokens in
    flight at the window's start (counted, though partly made before it) minus those at its end (made inside, not
    counted). P(t) = sum of n_r * (t - s_r) / (e_r - s_r) over the requests in flight at t (linear progress); the
    error is (P(start) - P(end)) / window, sd = sqrt(2 * var(P)) / window with var(P) over `points` instants of the
    window. Batch means miss it when completions are periodic (a few users in step with the batches)."""
    s = np.asarray(starts, dtype=float)
    e = np.asarray(ends, dtype=float)
    n = np.asarray(tokens, dtype=float)
    window = end - start
    keep = (e > start) & (s < end) & (e > s) & ~np.isnan(n)
    if not window > 0 or not keep.any():
        return 0.0 if window > 0 else math.nan
    s, e, n = s[keep], e[keep], n[keep]
    rate = n / (e - s)
    # One instant at a time: a points x requests matrix of a long step would take gigabytes.
    p = np.array([float((rate * (t - s))[(s < t) & (t < e)].sum()) for t in np.linspace(start, end, points, False)])
    return float(math.sqrt(2 * p.var()) / window)


def rate_interval(
    starts: Sequence[float] | np.ndarray,
    ends: Sequence[float] | np.ndarray,
    tokens: Sequence[float] | np.ndarray,
    start: float,
    end: float,
    batches: int,
    confidence: float = CONFIDENCE,
) -> Interval:
    """The window's rate of tokens counted at completion (sum of the tokens of the requests ending in [start, end)
    / window) with the batch-means interval widened by the window-edge error: half-width = sqrt(hw_batches^2 +
    (z * completion_edge_sd)^2), z the normal quantile; NaN bounds where batch means give none."""
    e = np.asarray(ends, dtype=float)
    ci = batch_means(e, tokens, start, end, batches, confidence)
    if math.isnan(ci.low):
        return ci
    edge = completion_edge_sd(starts, ends, tokens, start, end)
    z = float(special.ndtri((1 + confidence) / 2))
    half = math.hypot(ci.half_width, z * edge)
    return Interval(ci.value, ci.value - half, ci.value + half, ci.n)


def end_to_end(times: Sequence[float] | np.ndarray, windows: Sequence[tuple[float, float]]) -> np.ndarray:
    """Times inside any of the windows placed on the windows laid end to end (window i starts where window i - 1
    ends, at the sum of the earlier lengths); NaN outside every window. --repeat's pooled step: its trials' windows,
    a whole plan apart, become one window of their total length for batch means and halves."""
    t = np.asarray(times, dtype=float)
    out = np.full(t.shape, math.nan)
    offset = 0.0
    for start, end in windows:
        inside = (t >= start) & (t < end)
        out[inside] = t[inside] - start + offset
        offset += max(end - start, 0.0)
    return out


def windows_rate_interval(
    starts: Sequence[float] | np.ndarray,
    ends: Sequence[float] | np.ndarray,
    tokens: Sequence[float] | np.ndarray,
    windows: Sequence[tuple[float, float]],
    batches: int,
    confidence: float = CONFIDENCE,
) -> Interval:
    """rate_interval over several windows: the tokens completed in any window / their total length; batch means over
    the windows laid end to end (end_to_end), widened by the window-edge errors of every window (each window's sd
    weighted by its share of the total length: sd = sqrt(sum((W_i sd_i)^2)) / W). One window: rate_interval."""
    if len(windows) == 1:
        return rate_interval(starts, ends, tokens, windows[0][0], windows[0][1], batches, confidence)
    total = sum(max(b - a, 0.0) for a, b in windows)
    ci = batch_means(end_to_end(ends, windows), tokens, 0.0, total, batches, confidence)
    if math.isnan(ci.low):
        return ci
    edge = math.sqrt(sum(((b - a) * completion_edge_sd(starts, ends, tokens, a, b)) ** 2 for a, b in windows)) / total
    z = float(special.ndtri((1 + confidence) / 2))
    half = math.hypot(ci.half_width, z * edge)
    return Interval(ci.value, ci.value - half, ci.value + half, ci.n)
