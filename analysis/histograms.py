"""Quantiles of a Prometheus histogram read honestly: the bucket bounds they lie between, narrowed by the mean.

Pure. Bucket increases over a window say only how many observations fell between two bounds; linear interpolation
inside the bucket is a guess (in the first bucket it guesses half its width, whatever the data were). What is known:
the q-quantile lies inside the bucket where the cumulative count crosses q * total, and, for a non-negative
variable, it is at most mean / (1 - q) (Markov's inequality), with the exact mean from _sum / _count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Interpolating inside a bucket is only reported as a value when the bucket is this narrow relative to its upper
# bound (vLLM's TTFT buckets 0.3 / 0.5 / 0.75 / 1 s ... are; its first bucket, 0 to 0.001 or 0 to 0.3 s, is not).
NARROW_BUCKET = 0.5


@dataclass(frozen=True)
class HistogramQuantile:
    """What a histogram says of its q-quantile: it lies in [low, high]; `value` is an interpolated estimate only
    when that range is narrow, else NaN (the bounds are then all there is)."""

    q: float
    low: float
    high: float
    value: float

    def text(self, scale: float = 1000.0, unit: str = "ms") -> str:
        """'812 ms', '< 300 ms', '100-250 ms' or '> 60000 ms': what is known, at the precision known (unit "":
        the bare numbers, for a table whose title gives the unit)."""
        if math.isnan(self.low):
            return "-"
        if not math.isnan(self.value):
            out = _number(self.value * scale)
        elif math.isinf(self.high):
            out = f"> {_number(self.low * scale)}"
        elif self.low <= 0:
            out = f"< {_number(self.high * scale)}"
        else:
            out = f"{_number(self.low * scale)}-{_number(self.high * scale)}"
        return f"{out} {unit}".rstrip()


def ms_text(seconds: float) -> str:
    """Seconds as '17 ms', '0.017 ms': whole ms from 10 ms on, else two significant digits."""
    return f"{_number(seconds * 1000)} ms"


def _number(x: float) -> str:
    """Whole units from 10 on, else two significant digits: a bound of 0.034 ms must not print as 0."""
    return f"{x:.0f}" if abs(x) >= 10 else f"{x:.2g}"


def from_columns(q: float, low: object, high: object, value: object = math.nan) -> HistogramQuantile:
    """A quantile as a table holds it (steps.csv's *_low_s, *_high_s and the value column); None/NaN: missing."""

    def num(v: object) -> float:
        try:
            return math.nan if v is None else float(v)
        except (TypeError, ValueError):
            return math.nan

    lo, hi = num(low), num(high)
    if math.isnan(lo):
        return MISSING
    return HistogramQuantile(q, lo, math.inf if math.isnan(hi) else hi, num(value))


MISSING = HistogramQuantile(math.nan, math.nan, math.nan, math.nan)


def quantile_bounds(q: float, buckets: dict[float, float], mean: float | None = None) -> HistogramQuantile:
    """From cumulative counts {upper bound: count}: [low, high] = the bucket holding rank q * total, high lowered to
    mean / (1 - q) when that is tighter and still above low; value = linear interpolation inside [low, high] when
    (high - low) / high <= NARROW_BUCKET, else NaN. All NaN without observations."""
    bounds = sorted(buckets)
    if not bounds or not math.isinf(bounds[-1]) or not buckets[bounds[-1]] > 0:
        return MISSING
    total = buckets[bounds[-1]]
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for b in bounds:
        count = buckets[b]
        if count >= rank and count > lower_count:
            low, high = lower_bound, b
            if mean is not None and not math.isnan(mean) and q < 1:
                markov = mean / (1 - q)
                if low < markov < high:  # a mean that contradicts the buckets (scrape skew) is not trusted
                    high = markov
            value = math.nan
            if not math.isinf(high) and high > 0 and (high - low) / high <= NARROW_BUCKET:
                # Interpolate on the bucket's own counts, inside the (possibly narrowed) bounds.
                frac = (rank - lower_count) / (count - lower_count)
                value = low + (min(b, high) - low) * min(max(frac, 0.0), 1.0)
            return HistogramQuantile(q, low, high, value)
        lower_bound, lower_count = b, count
    return MISSING
