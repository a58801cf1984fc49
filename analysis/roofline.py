"""The roofline verdict per step, from dcgm-exporter's GPU samples: decode memory-bandwidth-bound (DRAM activity high,
SM activity below saturation), compute-bound (SM activity saturated, DRAM below its threshold), neither (both low:
the GPU waits), or untold (empty) when the counters are missing or their intervals do not clear the thresholds.

Each GPU is judged on its own readings inside the step's window: an interval of the mean of its DRAM and SM activity
that allows for readings moving together (analysis.uncertainty.series_mean_interval); a bound must clear a threshold
(analysis.thresholds), so a step whose activity moved (a GPU idle for part of it) is left untold rather than called.
The step's regime is that of its busy GPUs (the idle ones, judged neither, left aside) when they agree; steps.csv's
interval columns are of the mean over the GPUs. Readings dcgm-exporter did not refresh (every field of a GPU equal
to its previous scrape's: its collect interval, -c, longer than --scrape-interval) are dropped: a repeat is not a
new sample.

Input: analysis.gpu.gpu_series (columns SERIES_COLUMNS; field util, sm_active, dram_active, mem_used_bytes, power_w).
Pure: no Locust, no network.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import glossary
from .knee import KV_FULL
from .thresholds import DRAM_ACTIVE_HIGH, GPU_ACTIVE_LOW, SM_ACTIVE_SATURATED, WEIGHT_SHARE_FAR_BELOW
from .uncertainty import MIN_BATCHES, Interval, series_mean_interval

MEMORY_BOUND = "memory_bound"
COMPUTE_BOUND = "compute_bound"
NEITHER = "neither"
UNTOLD = ""  # written as an empty cell
REGIMES = (MEMORY_BOUND, COMPUTE_BOUND, NEITHER)
FIELDS = ("util", "sm_active", "dram_active", "mem_used_bytes", "power_w")
SERIES_COLUMNS = ["timestamp", "gpu_key", "hostname", "gpu", "uuid", "model_name", "field", "value"]
DCGM_PREFIX = "DCGM_FI_"
# steps.csv's columns of this module, last in its GPU section (after analysis/gpu.py's means).
VERDICT_COLUMNS = [
    "gpu_regime", "gpu_dram_active_ci_low", "gpu_dram_active_ci_high", "gpu_sm_active_ci_low", "gpu_sm_active_ci_high",
]  # fmt: skip
NO_PROFILING = (
    "dcgm-exporter gave no profiling counters (DCGM_FI_PROF_DRAM_ACTIVE, DCGM_FI_PROF_SM_ACTIVE): a GPU without "
    "them (most consumer GPUs), or a counters file that leaves them out"
)


def empty_series() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=float if c in ("timestamp", "value") else object) for c in SERIES_COLUMNS})


def samples(metrics: pd.DataFrame | None) -> pd.DataFrame:
    """analysis.gpu.gpu_series of a run's metrics; an empty frame (SERIES_COLUMNS) when it holds no DCGM sample."""
    if metrics is None or not len(metrics) or not metrics["metric"].str.startswith(DCGM_PREFIX, na=False).any():
        return empty_series()  # most runs: no GPU endpoint, nothing to parse
    from .gpu import gpu_series  # only where DCGM samples exist

    return gpu_series(metrics)


def readings(series: pd.DataFrame) -> pd.DataFrame:
    """One row per GPU and scrape (gpu_key, timestamp, a column per field), without the repeats: a scrape where
    every field of the GPU equals its previous scrape's (the exporter had not refreshed) is dropped."""
    if not len(series):
        return pd.DataFrame(columns=["gpu_key", "timestamp", *FIELDS])
    wide = series.pivot_table(index=["gpu_key", "timestamp"], columns="field", values="value", aggfunc="last")
    wide = wide.reindex(columns=list(FIELDS)).sort_index()
    prev = wide.groupby(level=0).shift()
    repeat = ((wide == prev) | (wide.isna() & prev.isna())).all(axis=1)
    return wide[~repeat].reset_index()


def _clip(iv: Interval) -> Interval:
    """A ratio's interval within [0, 1] (a t-interval of readings near 0 reaches below it)."""
    if math.isnan(iv.low):
        return iv
    return Interval(iv.value, max(iv.low, 0.0), min(iv.high, 1.0), iv.n, iv.note)


def _known(iv: Interval) -> bool:
    return not (math.isnan(iv.low) or math.isnan(iv.high))


def judge(dram: Interval, sm: Interval) -> tuple[str, str]:
    """(regime, why): memory_bound when DRAM's low bound >= DRAM_ACTIVE_HIGH and SM's high bound < SM_ACTIVE_SATURATED;
    compute_bound when SM's low bound >= SM_ACTIVE_SATURATED and DRAM's high bound < DRAM_ACTIVE_HIGH; neither when
    DRAM's high bound < DRAM_ACTIVE_HIGH and SM's < GPU_ACTIVE_LOW; else untold ("")."""
    if math.isnan(dram.value) or math.isnan(sm.value):
        return UNTOLD, NO_PROFILING
    if not (_known(dram) and _known(sm)):
        return UNTOLD, (
            f"too few distinct readings in the window ({min(dram.n, sm.n)}; an interval needs {MIN_BATCHES}: a longer "
            "step, or a shorter --scrape-interval and dcgm-exporter collect interval (-c), gives more)"
        )
    if dram.low >= DRAM_ACTIVE_HIGH and sm.high < SM_ACTIVE_SATURATED:
        return MEMORY_BOUND, "DRAM activity high, SM activity below saturation"
    if sm.low >= SM_ACTIVE_SATURATED and dram.high < DRAM_ACTIVE_HIGH:
        return COMPUTE_BOUND, "SM activity saturated, DRAM activity below its threshold"
    if dram.high < DRAM_ACTIVE_HIGH and sm.high < GPU_ACTIVE_LOW:
        return NEITHER, "DRAM and SM activity both low"
    if dram.low >= DRAM_ACTIVE_HIGH and sm.low >= SM_ACTIVE_SATURATED:
        return UNTOLD, "DRAM and SM activity are both at their limits: these counters cannot tell which binds"
    if dram.high < DRAM_ACTIVE_HIGH and sm.low >= GPU_ACTIVE_LOW and sm.high < SM_ACTIVE_SATURATED:
        return UNTOLD, (
            f"the SMs are busy ({GPU_ACTIVE_LOW:g}-{SM_ACTIVE_SATURATED:g}) while DRAM is not: neither saturated nor "
            "idle (small batches, latency-bound kernels)"
        )
    return UNTOLD, (
        "an interval straddles a threshold: the activity moved too much over the step to tell (a GPU idle for part "
        "of it, spikes), or it lies at a threshold"
    )


@dataclass(frozen=True)
class GpuVerdict:
    """One GPU over one step's window: its regime, why, and its readings' means (intervals for DRAM and SM)."""

    gpu_key: str
    regime: str
    why: str
    dram: Interval
    sm: Interval
    util: float
    mem_used_max_bytes: float
    power_mean_w: float
    readings: int


@dataclass(frozen=True)
class StepVerdict:
    """One step: its regime (that of its busy GPUs when they agree), why, the intervals of the mean over its GPUs,
    and each GPU's verdict."""

    step: int
    regime: str
    why: str
    dram: Interval
    sm: Interval
    gpus: tuple[GpuVerdict, ...]

    @property
    def busy(self) -> tuple[GpuVerdict, ...]:
        """The GPUs not judged idle (neither)."""
        return tuple(g for g in self.gpus if g.regime != NEITHER)


def _stat(values: pd.Series, how: str) -> float:
    v = values.dropna()
    return float(getattr(v, how)()) if len(v) else math.nan


def gpu_verdict(gpu_key: str, rows: pd.DataFrame) -> GpuVerdict:
    """One GPU's verdict from its (fresh, time-ordered) readings inside a window."""
    rows = rows.sort_values("timestamp")
    dram = _clip(series_mean_interval(rows["dram_active"].to_numpy(dtype=float)))
    sm = _clip(series_mean_interval(rows["sm_active"].to_numpy(dtype=float)))
    regime, why = judge(dram, sm)
    return GpuVerdict(
        gpu_key, regime, why, dram, sm, _stat(rows["util"], "mean"), _stat(rows["mem_used_bytes"], "max"),
        _stat(rows["power_w"], "mean"), len(rows),
    )  # fmt: skip


def mean_over(gpus: tuple[GpuVerdict, ...] | list[GpuVerdict], name: str) -> Interval:
    """The mean over GPUs of their means, half-width = the mean of their half-widths: sd(mean of X_i) <= mean of
    sd(X_i) whatever their correlation (GPUs of one tensor-parallel group move together), so it never reads
    narrower than the data allow; NaN bounds when a GPU has none."""
    ivs = [getattr(g, name) for g in gpus if not math.isnan(getattr(g, name).value)]
    if not ivs:
        return Interval(math.nan, note="no samples")
    value = float(np.mean([iv.value for iv in ivs]))
    n = int(sum(iv.n for iv in ivs))
    if not all(_known(iv) for iv in ivs):
        return Interval(value, n=n, note="too few samples")
    half = float(np.mean([iv.half_width for iv in ivs]))
    return _clip(Interval(value, value - half, value + half, n))


def combine(gpus: tuple[GpuVerdict, ...]) -> tuple[str, str]:
    """(regime, why) of a step: neither when every GPU is idle; else the busy GPUs' common regime; untold when they
    disagree or one of them cannot be told."""
    if not gpus:
        return UNTOLD, "no GPU samples in the window"
    busy = [g for g in gpus if g.regime != NEITHER]
    if not busy:
        return NEITHER, gpus[0].why
    kinds = {g.regime for g in busy}
    if len(kinds) == 1 and UNTOLD not in kinds:
        return kinds.pop(), busy[0].why
    if len(kinds - {UNTOLD}) > 1:
        return UNTOLD, "the GPUs disagree: " + ", ".join(f"{g.gpu_key} {g.regime or 'untold'}" for g in gpus)
    return UNTOLD, next(g.why for g in busy if g.regime == UNTOLD)


def step_verdicts(series: pd.DataFrame, timeline: list[dict]) -> dict[int, StepVerdict]:
    """Every step's verdict over its measured window [measure_start, end_time); steps without GPU samples left out."""
    fresh = readings(series)
    out: dict[int, StepVerdict] = {}
    if not len(fresh):
        return out
    times = fresh["timestamp"].to_numpy(dtype=float)
    for step in timeline:
        start = float(step["measure_start"])
        end = math.inf if step.get("end_time") is None else float(step["end_time"])
        inside = fresh[(times >= start) & (times < end)]
        if not len(inside):
            continue
        gpus = tuple(gpu_verdict(str(key), rows) for key, rows in inside.groupby("gpu_key", sort=True))
        regime, why = combine(gpus)
        s = int(step["step"])
        out[s] = StepVerdict(s, regime, why, mean_over(gpus, "dram"), mean_over(gpus, "sm"), gpus)
    return out


def roofline_table(series: pd.DataFrame, timeline: list[dict]) -> pd.DataFrame:
    """steps.csv's verdict columns (VERDICT_COLUMNS) per step of the timeline: the regime (empty when untold or
    without GPU samples) and the 95 % intervals of the mean DRAM and SM activity over the GPUs."""
    verdicts = step_verdicts(series, timeline)
    rows = []
    for step in timeline:
        s = int(step["step"])
        v = verdicts.get(s)
        row: dict = {"step": s, **dict.fromkeys(VERDICT_COLUMNS, math.nan)}
        row["gpu_regime"] = None
        if v is not None:
            row["gpu_regime"] = v.regime or None
            row["gpu_dram_active_ci_low"], row["gpu_dram_active_ci_high"] = v.dram.low, v.dram.high
            row["gpu_sm_active_ci_low"], row["gpu_sm_active_ci_high"] = v.sm.low, v.sm.high
        rows.append(row)
    return pd.DataFrame(rows, columns=["step", *VERDICT_COLUMNS])


# --- the words ---------------------------------------------------------------------------------------------------


def ratio_text(iv: Interval) -> str:
    """'0.82 [0.79, 0.85]', or '0.82' without an interval, '-' without a value."""
    if math.isnan(iv.value):
        return "-"
    return f"{iv.value:.2f}" + (f" [{iv.low:.2f}, {iv.high:.2f}]" if _known(iv) else "")


def _kv_clause(row: pd.Series | dict | None) -> str:
    kv = None if row is None else row.get("kv_cache_usage_max")
    if kv is None or pd.isna(kv):
        return ""
    if float(kv) >= KV_FULL:
        return f"; the KV cache is full too (peak {float(kv):.0%})"
    return f"; the KV cache has room (peak {float(kv):.0%})"


def regime_line(v: StepVerdict, load: str, row: pd.Series | dict | None = None) -> str:
    """The diagnosis's GPU sentence for one step ('At 16 users decode is memory-bandwidth-bound: DRAM active 0.82
    [0.79, 0.85], SM active 0.31 [0.28, 0.34]; the KV cache has room (peak 62%).'), `load` the step in words."""
    busy = v.busy
    some = 0 < len(busy) < len(v.gpus) and v.regime in (MEMORY_BOUND, COMPUTE_BOUND)
    shown = busy if some else v.gpus
    dram, sm = (mean_over(shown, "dram"), mean_over(shown, "sm")) if some else (v.dram, v.sm)
    numbers = f"DRAM active {ratio_text(dram)}, SM active {ratio_text(sm)}"
    where = ""
    if some:
        names = ", ".join(g.gpu_key for g in busy)
        where = (
            f" on {len(busy)} of {len(v.gpus)} GPUs ({names}; the other {len(v.gpus) - len(busy)} idle: the load is "
            "not spread over the GPUs)"
        )
    kv = _kv_clause(row)
    if v.regime == MEMORY_BOUND:
        return f"At {load} decode is memory-bandwidth-bound{where}: {numbers}{kv}."
    if v.regime == COMPUTE_BOUND:
        return (
            f"At {load} the GPU is compute-bound{where}: SM active {ratio_text(sm)} is saturated (at least "
            f"{SM_ACTIVE_SATURATED:g}) while DRAM active {ratio_text(dram)} is below {DRAM_ACTIVE_HIGH:g}{kv}."
        )
    if v.regime == NEITHER:
        return (
            f"At {load} the GPU is neither memory- nor compute-bound: {numbers}, both below {GPU_ACTIVE_LOW:g}: it "
            f"waits (on the serving engine's CPU side, its scheduler, or the load){kv}."
        )
    if v.why == NO_PROFILING:
        util = mean_over_util(v.gpus)
        used = "" if math.isnan(util) else f"; GPU utilisation (a kernel running) {util:.2f}"
        return f"At {load} the GPU's roofline regime cannot be told: {NO_PROFILING}{used}."
    return f"At {load} the GPU's roofline regime cannot be told: {v.why} ({numbers})."


def mean_over_util(gpus: tuple[GpuVerdict, ...]) -> float:
    values = [g.util for g in gpus if not math.isnan(g.util)]
    return float(np.mean(values)) if values else math.nan


def _num(row: pd.Series | dict, name: str) -> float:
    v = row.get(name)
    try:
        return math.nan if v is None else float(v)
    except (TypeError, ValueError):
        return math.nan


def ceiling_lines(table: pd.DataFrame, ceiling: dict | None) -> list[str]:
    """The ceiling's bandwidth against the measured DRAM activity, at the lowest step and the highest: the weights'
    share of the peak bandwidth = (1 / TPOT p50) decode steps/s / the ceiling's tok/s (each step reads every weight
    once; / the GPUs seen, when the model is split over them) against DRAM active's interval."""
    if ceiling is None or not len(table) or "gpu_dram_active_ci_low" not in table.columns:
        return []
    rows = table[pd.to_numeric(table["gpu_dram_active_ci_low"], errors="coerce").notna()]
    rows = rows[pd.to_numeric(rows["tpot_p50_s"], errors="coerce") > 0] if "tpot_p50_s" in rows.columns else rows[:0]
    if not len(rows):
        return []
    rows = rows.sort_values("users")
    picked = [rows.iloc[0]] + ([rows.iloc[-1]] if len(rows) > 1 else [])
    out = []
    for row in picked:
        steps_s = 1.0 / _num(row, "tpot_p50_s")
        gpus = _num(row, "gpus")
        split = gpus if gpus > 1 else 1.0
        share = steps_s / ceiling["decode_ceiling_tok_s"] / split
        dram = Interval(
            _num(row, "gpu_dram_active_mean"), _num(row, "gpu_dram_active_ci_low"), _num(row, "gpu_dram_active_ci_high")
        )
        if math.isnan(dram.value):
            dram = Interval((dram.low + dram.high) / 2, dram.low, dram.high)
        head = (
            f"At {int(row['users'])} users the weight reads use {share:.2f} of the peak bandwidth (1 / TPOT p50 = "
            f"{steps_s:.1f} decode steps/s, each reading {ceiling['weight_bytes'] / 1e9:.3g} GB of weights"
            + (f" split over {split:.0f} GPUs" if split > 1 else "")
            + f", against {ceiling['bandwidth_gb_s']:g} GB/s); DRAM was active {ratio_text(dram)}"
        )
        if share > dram.high:
            tail = (
                ": more than the memory moved, so --model-bytes or the bandwidth figure is too high (or the model is "
                "split over GPUs this run did not scrape)."
            )
        elif dram.low >= DRAM_ACTIVE_HIGH and share < WEIGHT_SHARE_FAR_BELOW * dram.low:
            tail = (
                ": the memory is busy, but far below the ceiling's pace: it moves much more than the weights (the KV "
                "cache at long contexts and many users, activations), or --model-bytes or the bandwidth figure is "
                "off (quantized weights, another --gpu)."
            )
        elif dram.high < DRAM_ACTIVE_HIGH:
            tail = (
                ": the memory is idle most of the time, so the gap to the ceiling is not bandwidth but the time "
                "between the GPU's kernels (the engine's scheduling, sampling and launches)."
            )
        else:
            tail = ": decode runs at the memory's pace; the rest of the traffic is the KV cache and activations."
        out.append(head + tail)
    return out


# --- the console -----------------------------------------------------------------------------------------------

TITLE = (
    "GPU (dcgm-exporter over each step's measured window: means over the GPUs and their readings; util, SM and DRAM "
    "active as fractions 0-1, ± the half-width of the 95 % interval; memory: the peak in GiB; regime: memory_bound, "
    "compute_bound, neither, - cannot be told)"
)
# (column, header, format): the console's GPU table.
CONSOLE = (
    ("step", "step", "int"),
    ("users", "users", "int"),
    ("gpus", "gpus", "int"),
    ("gpu_util_mean", "util", "num2"),
    ("gpu_sm_active_mean", "SM", "num2"),
    ("gpu_dram_active_mean", "DRAM", "num2"),
    ("gpu_mem_used_max_bytes", "mem max GiB", "gib1"),
    ("gpu_power_mean_w", "power W", "num0"),
    ("gpu_regime", "regime", "text"),
)
_BOUNDS = {"gpu_sm_active_mean": "gpu_sm_active", "gpu_dram_active_mean": "gpu_dram_active"}


def _cell(row: dict, name: str, fmt: str) -> str:
    value = row.get(name)
    if fmt == "gib1":
        v = _num(row, name)
        return "-" if math.isnan(v) else f"{v / 2**30:.1f}"
    if fmt == "text" and (value is None or value == "" or (isinstance(value, float) and math.isnan(value))):
        return "-"
    text = glossary.format_value(value, fmt)
    prefix = _BOUNDS.get(name)
    if prefix and text != "-":
        low, high = _num(row, f"{prefix}_ci_low"), _num(row, f"{prefix}_ci_high")
        if not (math.isnan(low) or math.isnan(high)):
            text += f" ±{(high - low) / 2:.2f}"
    return text


def console_lines(table: pd.DataFrame) -> list[str]:
    """The console's "GPU" table (step, users, gpus, util, SM, DRAM, mem max GiB, power W, regime); nothing when no
    step saw a GPU."""
    if not len(table) or not glossary.applies(table, glossary.GPU):
        return []
    rows = [[header for _, header, _ in CONSOLE]]
    for r in table.to_dict(orient="records"):
        rows.append([_cell(r, name, fmt) for name, _, fmt in CONSOLE])
    return ["", TITLE, *glossary.aligned(rows)]
