"""The inter-arrival times an open-loop run actually sent, next to the ones it intended and the process it asked for.

An open loop (--rates, --find-capacity rate, a trace replay) intends each request for a time drawn from its arrival
process; what reaches the server is the actual send stamps, which a busy pool of users or a late event loop bunches
up (a backlog leaves in a burst). Per step, the gaps between consecutive sends of all processes (merged and sorted)
are compared with the gaps between the intended times and with the process's own distribution: Poisson
(exponential gaps, CV 1), constant (CV 0) or gamma of shape B (CV 1 / sqrt(B)); a trace has no formula, only its
intended gaps. The report's "Inter-arrival times" section and summary.json's `arrivals` show it.
Pure: no Locust, no network.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from scipy import special

from .schedule import ARRIVALS, DEFAULT_ARRIVAL, GAMMA
from .uncertainty import CONFIDENCE, Interval

TRACE = "trace"  # the arrivals of a trace replay: its rows' timestamps, no formula
MIN_GAPS_FOR_INTERVAL = 20  # fewer gaps: the CV's bootstrap interval would not mean much
BOOTSTRAP_RESAMPLES = 400
_BOOTSTRAP_CELLS = 2_000_000  # resampled blocks held at once (16 MB of indices), whatever the step's length


def expected_cv(arrival: str, burstiness: float = 1.0) -> float | None:
    """The arrival process's coefficient of variation of gaps: poisson 1, constant 0, gamma 1 / sqrt(B); None for
    a trace."""
    if arrival == GAMMA:
        return 1 / math.sqrt(burstiness)
    return {"poisson": 1.0, "constant": 0.0}.get(arrival)


def expected_cdf(x: np.ndarray, arrival: str, burstiness: float = 1.0) -> np.ndarray | None:
    """P(gap * rate <= x) of the arrival process: gamma(shape B, scale 1 / B) (poisson: B = 1, i.e. 1 - exp(-x)),
    constant: 0 below 1 and 1 from 1; None for a trace."""
    x = np.asarray(x, dtype=float)
    if arrival == GAMMA:
        return special.gammainc(burstiness, np.clip(x, 0, None) * burstiness)  # gamma(B, 1 / B).cdf
    if arrival == "poisson":
        return -np.expm1(-np.clip(x, 0, None))
    if arrival == "constant":
        return (x >= 1).astype(float)
    return None


def gaps(times: np.ndarray | pd.Series) -> np.ndarray:
    """Gaps between consecutive times once sorted: diff(sort(times)), NaN times left out."""
    t = np.asarray(times, dtype=float)
    return np.diff(np.sort(t[~np.isnan(t)]))


def cv(values: np.ndarray) -> float:
    """CV = sd(values, ddof 1) / mean(values); NaN below 2 values or with a mean of 0."""
    x = np.asarray(values, dtype=float)
    if x.size < 2:
        return math.nan
    m = float(x.mean())
    return float(x.std(ddof=1) / m) if m > 0 else math.nan


def cv_interval(
    values: np.ndarray, confidence: float = CONFIDENCE, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0
) -> Interval:
    """CV of consecutive gaps with a block bootstrap percentile interval: the gaps cut into consecutive blocks of
    L = ceil(n^(1/3)), each resample the CV of as many blocks drawn with replacement, the interval the (1 -/+ c) / 2
    quantiles of those CVs. Blocks keep runs of late sends together (the gaps are not independent); a resample's
    CV comes from its blocks' sums of x and x^2, so the cost is resamples x n^(2/3), not resamples x n; a fixed
    seed keeps a rebuilt report the same. No bounds below MIN_GAPS_FOR_INTERVAL gaps."""
    x = np.asarray(values, dtype=float)
    n = int(x.size)
    value = cv(x)
    if n < MIN_GAPS_FOR_INTERVAL or math.isnan(value):
        return Interval(value, n=n, note="too few gaps" if n < MIN_GAPS_FOR_INTERVAL else None)
    block = math.ceil(n ** (1 / 3))
    starts = np.arange(0, n, block)
    centre = float(x.mean())
    d = x - centre  # sums of deviations: no cancellation in sum(x^2) - sum(x)^2 / n
    s1, s2 = np.add.reduceat(d, starts), np.add.reduceat(d * d, starts)
    count = np.diff(np.append(starts, n)).astype(float)
    k = starts.size
    rng = np.random.default_rng(seed)
    chunk = max(1, _BOOTSTRAP_CELLS // k)
    found: list[np.ndarray] = []
    for done in range(0, resamples, chunk):
        pick = rng.integers(0, k, size=(min(chunk, resamples - done), k))
        m, a, b = count[pick].sum(axis=1), s1[pick].sum(axis=1), s2[pick].sum(axis=1)
        mean = centre + a / m
        var = np.clip(b - a * a / m, 0, None) / (m - 1)
        found.append(np.where(mean > 0, np.sqrt(var) / np.where(mean > 0, mean, 1), np.nan))
    cvs = np.concatenate(found)
    cvs = cvs[~np.isnan(cvs)]
    if not cvs.size:
        return Interval(value, n=n)
    alpha = (1 - confidence) / 2
    low, high = np.quantile(cvs, [alpha, 1 - alpha])
    return Interval(value, float(low), float(high), n)


@dataclass(frozen=True)
class StepArrivals:
    """One step's gaps: `rate_rps` the intended rate (NaN for a trace's step), `scale` what its gaps were
    multiplied by to be pooled (the rate, else 1 / the mean intended gap), CVs of the sent and intended gaps."""

    step: int
    rate_rps: float
    scale: float
    cv_sent: Interval
    cv_intended: float
    gaps_intended: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "rate_rps": _num(self.rate_rps),
            "gaps": self.cv_sent.n,
            "cv": _num(self.cv_sent.value),
            "cv_low": _num(self.cv_sent.low),
            "cv_high": _num(self.cv_sent.high),
            "cv_intended": _num(self.cv_intended),
        }


@dataclass
class Arrivals:
    """An open-loop run's inter-arrival times: the process asked for, per step the CVs, and the gaps of every step
    pooled after scaling each by its step's rate (so 1 is the mean gap whatever the rate), sorted."""

    process: str  # poisson, constant, gamma or trace
    burstiness: float | None  # gamma's shape; None for another process
    steps: list[StepArrivals]
    sent: np.ndarray = field(repr=False)  # the pooled scaled gaps between actual sends, sorted
    intended: np.ndarray = field(repr=False)  # the same between intended send times
    pooled: Interval = field(default_factory=lambda: Interval(math.nan))  # the CV of `sent`

    @property
    def expected_cv(self) -> float | None:
        return expected_cv(self.process, self.burstiness or 1.0)

    @property
    def pooled_intended_cv(self) -> float:
        return cv(self.intended)

    def expected_cdf(self, x: np.ndarray) -> np.ndarray | None:
        return expected_cdf(x, self.process, self.burstiness or 1.0)

    def to_dict(self) -> dict[str, Any]:
        """summary.json's `arrivals`."""
        return {
            "process": self.process,
            "burstiness": self.burstiness,
            "expected_cv": _num(self.expected_cv),
            "pooled": {
                "gaps": self.pooled.n,
                "cv": _num(self.pooled.value),
                "cv_low": _num(self.pooled.low),
                "cv_high": _num(self.pooled.high),
                "cv_intended": _num(self.pooled_intended_cv),
            },
            "steps": [s.to_dict() for s in self.steps],
        }


def _num(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else float(v)


def process_of(options: dict) -> tuple[str, float | None]:
    """(process, burstiness) of a run's saved options: trace with --trace, else --arrival (burstiness for gamma)."""
    if options.get("trace"):
        return TRACE, None
    arrival = str(options.get("arrival") or DEFAULT_ARRIVAL)
    if arrival not in ARRIVALS:
        arrival = DEFAULT_ARRIVAL
    if arrival != GAMMA:
        return arrival, None
    try:
        burstiness = float(options.get("burstiness", 1.0))
    except (TypeError, ValueError):
        burstiness = math.nan
    return arrival, burstiness if math.isfinite(burstiness) and burstiness > 0 else 1.0


def inter_arrivals(
    records: pd.DataFrame, process: str, burstiness: float | None = None, rates: dict[int, float] | None = None
) -> Arrivals | None:
    """Per step, gaps(start_time) and gaps(intended_start_time) of the requests that had an intended time (an open
    loop's, any outcome, warm-up included: the schedule runs through it), a conversation's first turns only (its
    later turns follow their answers, not the arrivals); each step's gaps scaled by `rates[step]` (else by 1 / the
    mean intended gap) and pooled. None in a closed loop (no intended times) or with no step of 2 sends."""
    if not len(records) or "intended_start_time" not in records.columns:
        return None
    planned = records[records["intended_start_time"].notna()]
    if "turn" in planned.columns:
        planned = planned[planned["turn"].isna() | (planned["turn"] <= 1)]
    steps: list[StepArrivals] = []
    sent: list[np.ndarray] = []
    intended: list[np.ndarray] = []
    for step, group in planned.groupby("step", sort=True):
        actual = gaps(group["start_time"])
        wanted = gaps(group["intended_start_time"])
        if not actual.size:
            continue
        rate = math.nan if rates is None else float(rates.get(int(step), math.nan))
        rate = rate if math.isfinite(rate) and rate > 0 else math.nan
        mean_wanted = float(wanted.mean()) if wanted.size else math.nan
        scale = rate if not math.isnan(rate) else (1 / mean_wanted if mean_wanted > 0 else math.nan)
        steps.append(StepArrivals(int(step), rate, scale, cv_interval(actual), cv(wanted), int(wanted.size)))
        if math.isfinite(scale):
            sent.append(actual * scale)
            intended.append(wanted * scale)
    if not steps:
        return None
    pooled_sent = np.sort(np.concatenate(sent)) if sent else np.array([])
    pooled_intended = np.sort(np.concatenate(intended)) if intended else np.array([])
    # The pooled CV's interval from the steps' gaps in their order (concatenated), not sorted: blocks stay runs.
    pooled = cv_interval(np.concatenate(sent)) if sent else Interval(math.nan)
    return Arrivals(process, burstiness if process == GAMMA else None, steps, pooled_sent, pooled_intended, pooled)


def arrivals_of_run(records: pd.DataFrame, run: dict, table: pd.DataFrame) -> Arrivals | None:
    """inter_arrivals of a run: its process from run.json's options, each step's rate from steps.csv's rate_rps."""
    process, burstiness = process_of(run.get("options") or {})
    rates = None
    if "rate_rps" in table.columns and "step" in table.columns:
        rates = {int(s): float(r) for s, r in zip(table["step"], table["rate_rps"], strict=True) if pd.notna(r)}
    return inter_arrivals(records, process, burstiness, rates)
