"""Where a batching curve stops growing for good, and which steps not to trust while finding it.

Pure: works on the step table (one row per step, sorted by load). Rules, each tested on disturbed data:
- A step is `unstable` when its throughput moved between the first and second half of its window beyond both
  halves' noise and by more than STABLE_TOLERANCE.
- A step is an `outlier` when the curve around it says it ran slow: the next step is clearly above it, and it lies
  more than OUTLIER_MARGIN below the straight line between its neighbours, beyond its own interval. A saturating
  server's curve is concave (linear growth, then flat or slowly falling), so its points lie on or above such
  lines; a point far below one is something else on the machine, not the server's curve.
- The knee is the first step (outliers left out) that no later step exceeds by more than KNEE_GAIN and beyond both
  intervals: the curve is flat from there on. It is reported as a range: between that step and the next.
- Saturation is judged from the server too: requests waiting while the KV cache is full or preemptions climb
  mean the batch limit is reached, even where throughput still creeps up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .thresholds import KNEE_GAIN, OUTLIER_MARGIN, STABLE_TOLERANCE

KV_FULL = 0.95  # KV-cache usage counted as full (at 91 % the batch cap bound, not the cache: measured)
TPOT_RISE = 1.2  # a step's TPOT this much above both neighbours' says the server itself ran slower


def num(row: pd.Series, col: str) -> float:
    """row[col] as a float; NaN when missing or not a number."""
    v = row.get(col) if col in row.index else None
    try:
        return math.nan if v is None else float(v)
    except (TypeError, ValueError):
        return math.nan


THROUGHPUT = "aggregate_tok_s"  # the curve's y; a batch kind's run's is its items/s (batch.throughput_column)


def _bounds(row: pd.Series, y_col: str = THROUGHPUT) -> tuple[float, float, float]:
    """(value, low, high) of the throughput column; without an interval the bounds are the value itself."""
    y = num(row, y_col)
    lo, hi = num(row, f"{y_col}_ci_low"), num(row, f"{y_col}_ci_high")
    return y, (y if math.isnan(lo) else lo), (y if math.isnan(hi) else hi)


def clearly_above(upper: pd.Series, lower: pd.Series, gain: float = KNEE_GAIN, y_col: str = THROUGHPUT) -> bool:
    """upper's throughput > lower's by more than `gain` and their intervals do not overlap."""
    yu, lu, _ = _bounds(upper, y_col)
    yl, _, hl = _bounds(lower, y_col)
    if math.isnan(yu) or math.isnan(yl):
        return False
    return yu > yl * (1 + gain) and lu > hl


def stable(first_half: float, first_half_width: float, second_half: float, second_half_width: float) -> bool | None:
    """False when |second - first| > sqrt(hw1^2 + hw2^2) and > STABLE_TOLERANCE of their mean; None without data."""
    if any(math.isnan(v) for v in (first_half, second_half)):
        return None
    diff = abs(second_half - first_half)
    mean = (first_half + second_half) / 2
    noise = math.hypot(0.0 if math.isnan(first_half_width) else first_half_width,
                       0.0 if math.isnan(second_half_width) else second_half_width)  # fmt: skip
    return not (diff > noise and mean > 0 and diff / mean > STABLE_TOLERANCE)


@dataclass
class Outlier:
    step: int
    implied_tok_s: float  # the neighbours' line at this step's load
    explained_by: str | None = None  # what the server's numbers say about it, when they do


def outliers(rows: pd.DataFrame, key: str = "users", y_col: str = THROUGHPUT) -> list[Outlier]:
    """Interior steps far below their neighbours' line (see the module docstring), in load order."""
    rows = rows.sort_values(key).reset_index(drop=True)
    out = []
    for i in range(1, len(rows) - 1):
        prev, row, nxt = rows.iloc[i - 1], rows.iloc[i], rows.iloc[i + 1]
        y, _, hi = _bounds(row, y_col)
        if math.isnan(y) or not clearly_above(nxt, row, y_col=y_col):
            continue
        x0, x, x1 = float(prev[key]), float(row[key]), float(nxt[key])
        y0, y1 = _bounds(prev, y_col)[0], _bounds(nxt, y_col)[0]
        if math.isnan(y0) or x1 == x0:
            continue
        implied = y0 + (y1 - y0) * (x - x0) / (x1 - x0)
        if hi < implied * (1 - OUTLIER_MARGIN):
            out.append(Outlier(int(row["step"]), implied, _explain(prev, row, nxt)))
    return out


def _explain(prev: pd.Series, row: pd.Series, nxt: pd.Series) -> str | None:
    """The server's own numbers at the step, when they say it ran slower there."""
    t, t0, t1 = (num(r, "tpot_p50_s") for r in (row, prev, nxt))
    if not any(math.isnan(v) for v in (t, t0, t1)) and t > TPOT_RISE * max(t0, t1):
        return (
            f"its TPOT p50 rose to {t * 1000:.1f} ms against {t0 * 1000:.1f} and {t1 * 1000:.1f} ms at the steps "
            "around it: the server itself generated tokens more slowly"
        )
    q, q0, q1 = (num(r, "server_queue_time_mean_s") for r in (row, prev, nxt))
    if not any(math.isnan(v) for v in (q, q0, q1)) and q > TPOT_RISE * max(q0, q1) and q > 0.001:
        return f"the server's queue time rose to {q * 1000:.0f} ms (mean) at that step"
    return None


def saturated(row: pd.Series) -> bool:
    """Requests wait for capacity while the KV cache is full or preemptions climb: the batch limit is reached."""
    # max() with a NaN first argument returns it whatever follows: a server without the by-reason gauge.
    waiting = max((v for v in (num(row, "waiting_mean"), num(row, "waiting_capacity_max")) if not math.isnan(v)),
                  default=math.nan)  # fmt: skip
    kv = num(row, "kv_cache_usage_max")
    preempted = num(row, "preemptions")
    return bool(waiting >= 1 and ((kv >= KV_FULL) or preempted > 0))


@dataclass
class Knee:
    step: int | None = None  # the highest load before the flattening (None: no knee in the curve)
    load: float | None = None
    range: tuple[float, float] | None = None  # (that load, the next step's): the knee lies in between
    saturated_step: int | None = None  # the first step where the server's own state says the batch is full
    saturated_load: float | None = None
    outliers: list[Outlier] = field(default_factory=list)
    unmeasured: list[int] = field(default_factory=list)  # steps that sent no request at all: left out


def sent_requests(rows: pd.DataFrame) -> pd.Series:
    """Per row: the step sent requests (ok, failed or cut off). One that sent none (its load processes lost, say)
    measured no throughput: its 0 would read as a flat curve."""
    cols = [c for c in ("requests", "errors", "cut_off") if c in rows.columns]
    if not cols:
        return pd.Series(True, index=rows.index)
    return rows[cols].apply(pd.to_numeric, errors="coerce").fillna(0).sum(axis=1) > 0


def find_knee(table: pd.DataFrame, key: str = "users", y_col: str = THROUGHPUT) -> Knee:
    """The knee (module docstring) on the throughput column y_col, from the steps that are not outliers, and the
    first saturated step."""
    rows = table.sort_values(key).reset_index(drop=True)
    sent = sent_requests(rows)
    knee = Knee(unmeasured=[int(s) for s in rows.loc[~sent, "step"]])
    knee.outliers = outliers(rows[sent], key, y_col)
    set_aside = {o.step for o in knee.outliers}
    kept = rows[sent & ~rows["step"].astype(int).isin(set_aside) & rows[y_col].notna()].reset_index(drop=True)
    for i in range(len(kept) - 1):
        row = kept.iloc[i]
        if not any(clearly_above(kept.iloc[j], row, y_col=y_col) for j in range(i + 1, len(kept))):
            knee.step, knee.load = int(row["step"]), float(row[key])
            knee.range = (float(row[key]), float(kept.iloc[i + 1][key]))
            break
    for _, row in rows.iterrows():
        if saturated(row):
            knee.saturated_step, knee.saturated_load = int(row["step"]), float(row[key])
            break
    return knee


def first_and_second_half(times: np.ndarray, weights: np.ndarray, start: float, end: float) -> tuple[float, float]:
    """(rate over [start, mid), rate over [mid, end)): the two halves `stable` compares."""
    mid = (start + end) / 2
    if not end > start:
        return math.nan, math.nan
    first = weights[(times >= start) & (times < mid)].sum() / (mid - start)
    second = weights[(times >= mid) & (times < end)].sum() / (end - mid)
    return float(first), float(second)
