"""GPU energy from dcgm-exporter's DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION (mJ since boot, a counter; issue 35): per
step and GPU the joules drawn over the step's measured window, summed over the GPUs, per output token and per request
completed in the window (steps.csv's energy section, last), the run's totals (summary.json's `energy`), the console's
"Energy" table.

A window rarely starts or ends on a scrape, so the counter's value at each edge is interpolated linearly between the
two scrapes around it (a counter reset between them handled as Prometheus' increase() does: server_metrics.
counter_increase). The energy is then exact when the power is constant between those two scrapes, and otherwise off by
at most the power's change within one scrape interval at each edge; scaling the increase between the scrapes around
the whole window to its length would instead mix in up to two intervals of power outside it. A gap between scrapes
inside the window costs nothing: the counter kept counting. An edge with no scrape beyond it (scraping began inside
the window, or stopped before its end) is extrapolated at the GPU's mean power over the window's scrapes, only when
the nearest scrape is within 1.1 scrape intervals of it (as Prometheus extrapolates); else the GPU's energy is
missing. A GPU without the field (or with DCGM's blank value) is left out and `energy_gpus` counts the others; no GPU
with it: every energy column is missing, never 0. Pure: no Locust, no network.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from . import glossary
from .gpu import gpu_identity
from .server_metrics import counter_increase

ENERGY_FIELD = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"  # mJ since boot, a counter
# The names metrics.parquet may hold it under: prometheus_client's text parser names a counter's sample <family>_total
# when the exporter's name lacks the suffix (DCGM's does), other parsers keep DCGM's name.
ENERGY_METRICS = (ENERGY_FIELD, f"{ENERGY_FIELD}_total")
# DCGM_INT64_BLANK (0x7ffffffffffffff0) and the blanks above it: "not supported". gpu.DCGM_BLANK (the int32 blank) is
# no bound here: a GPU at 700 W passes 2**31 mJ in 51 minutes.
INT64_BLANK = float(0x7FFFFFFFFFFFFFF0)
EXTRAPOLATE = 1.1  # an edge this many scrape intervals from the nearest scrape at most is extrapolated (Prometheus')
ENERGY_COLUMNS = glossary.names(glossary.ENERGY)  # steps.csv's energy section, in order
SERIES_COLUMNS = ["timestamp", "gpu_key", "hostname", "gpu", "uuid", "model_name", "counter_mj"]
PER_GPU_COLUMNS = ["step", "gpu_key", "hostname", "gpu", "uuid", "model_name", "scrapes", "energy_j"]
IDENTITY = ("hostname", "gpu", "uuid", "model_name")


def energy_series(metrics: pd.DataFrame | None) -> pd.DataFrame:
    """The energy counter's samples of metrics.parquet: (timestamp, gpu_key, identity, counter_mj), blank and
    non-finite values left out, one value per GPU and scrape, sorted by gpu_key and timestamp; empty without any."""
    empty = pd.DataFrame({c: pd.Series(dtype=object) for c in SERIES_COLUMNS})
    if metrics is None or not len(metrics):
        return empty
    rows = metrics[metrics["metric"].isin(ENERGY_METRICS)]
    if not len(rows):
        return empty
    if "source" not in rows.columns:
        rows = rows.assign(source="")
    parts = []
    for (labels_text, source), group in rows.groupby(["labels", "source"], sort=False):
        raw = group["value"].to_numpy(dtype=float)
        keep = np.isfinite(raw) & (raw >= 0) & (raw < INT64_BLANK)
        if keep.any():
            labels = json.loads(labels_text)
            # A device counter: dcgm-exporter repeats a MIG GPU's device fields under each instance's GPU_I_ID
            # (NVIDIA/dcgm-exporter#257, #317); counted once per device, not once per instance.
            labels.pop("GPU_I_ID", None)
            who = gpu_identity(labels, str(source))
            times = group["timestamp"].to_numpy(dtype=float)[keep]
            parts.append(pd.DataFrame({"timestamp": times, "counter_mj": raw[keep]}).assign(**who))
    if not parts:
        return empty
    out = pd.concat(parts, ignore_index=True)[SERIES_COLUMNS]
    out = out.drop_duplicates(["gpu_key", "timestamp"], keep="last")  # a changed pod label, MIG instances: one GPU
    return out.sort_values(["gpu_key", "timestamp"], kind="stable").reset_index(drop=True)


def _part(counter: pd.Series, t0: float, t1: float, start: float, end: float) -> float:
    """The share of the counter's increase between the scrapes at t0 < t1 that falls in [start, end] (linear)."""
    overlap = min(t1, end) - max(t0, start)
    return counter_increase(counter, t0, t1) * overlap / (t1 - t0) if overlap > 0 else 0.0


def window_energy_j(counter: pd.Series, start: float, end: float, interval: float) -> float:
    """Joules of one GPU over [start, end]: the counter (mJ, indexed by scrape time, sorted) interpolated at both edges
    between the scrapes around them, with resets as counter_increase; an edge without a scrape beyond it extrapolated
    at the mean power of the window's scrapes when within EXTRAPOLATE * interval; NaN otherwise or with < 2 scrapes."""
    times = counter.index.to_numpy(dtype=float)
    if not (math.isfinite(start) and math.isfinite(end)) or end <= start:
        return math.nan
    lo = int(np.searchsorted(times, start, side="right")) - 1  # the last scrape at or before start (-1: none)
    hi = int(np.searchsorted(times, end, side="left"))  # the first scrape at or after end (len: none)
    points = counter.iloc[max(lo, 0) : min(hi, len(times) - 1) + 1]
    t = points.index.to_numpy(dtype=float)
    if len(t) < 2:
        return math.nan
    inner = t[(t >= start) & (t <= end)]  # the scrapes inside: their increase whole, in one call
    mj = counter_increase(points, inner[0], inner[-1]) if len(inner) >= 2 else 0.0
    if t[0] < start:  # the pair around the start: its share inside
        mj += _part(points, t[0], t[1], start, end)
    if t[-1] > end and not (len(t) == 2 and t[0] < start):  # the pair around the end, unless that same pair
        mj += _part(points, t[-2], t[-1], start, end)
    covered = min(t[-1], end) - max(t[0], start)  # the part of the window between scrapes
    gap = (max(t[0] - start, 0.0), max(end - t[-1], 0.0))  # the edges no scrape reaches beyond
    if any(g > EXTRAPOLATE * interval for g in gap) or covered <= 0:
        return math.nan
    return (mj + mj / covered * sum(gap)) / 1000.0


def per_gpu_energy(series: pd.DataFrame, timeline: list[dict]) -> pd.DataFrame:
    """Per step and GPU: its joules over the step's measured window [measure_start, end_time] (window_energy_j with
    the GPU's median scrape interval) and its scrapes inside the window; a GPU with no value left out."""
    rows = []
    for key, group in series.groupby("gpu_key", sort=True):
        counter = pd.Series(group["counter_mj"].to_numpy(dtype=float), index=group["timestamp"].to_numpy(dtype=float))
        gaps = np.diff(counter.index.to_numpy())
        interval = float(np.median(gaps)) if len(gaps) else math.nan
        who = {c: group[c].iloc[0] for c in IDENTITY}
        for step in timeline:
            start, end = _bounds(step)
            joules = window_energy_j(counter, start, end, interval)
            if math.isnan(joules):
                continue
            inside = int(((counter.index >= start) & (counter.index < end)).sum())
            rows.append({"step": int(step["step"]), "gpu_key": key, **who, "scrapes": inside, "energy_j": joules})
    return pd.DataFrame(rows, columns=PER_GPU_COLUMNS)


def _bounds(step: dict) -> tuple[float, float]:
    end = step.get("end_time")
    return float(step["measure_start"]), (math.nan if end is None else float(end))


def completed_requests(records: pd.DataFrame, start: float, end: float) -> int:
    """Ok requests that completed inside [start, end): the requests whose tokens the step's output_tokens counts."""
    if not len(records):
        return 0
    ends = records["start_time"] + records["e2e_s"]
    return int(((records["status"] == "ok") & (ends >= start) & (ends < end)).sum())


def _ratio(a: float, b: float) -> float:
    return a / b if not (math.isnan(a) or math.isnan(b)) and b > 0 else math.nan


def _num(row: dict, name: str) -> float:
    value = pd.to_numeric(row.get(name), errors="coerce")
    return math.nan if value is None or pd.isna(value) else float(value)


def step_energy_table(
    metrics: pd.DataFrame | None, timeline: list[dict], table: pd.DataFrame, records: pd.DataFrame
) -> pd.DataFrame:
    """steps.csv's energy columns per step of `table` (the core step table: its output_tokens, window_s and the
    aggregate tok/s interval): energy_gpus, energy_j = the sum of each GPU's joules, per output token (with the
    interval the tok/s interval gives), per request completed in the window, and the mean power per GPU."""
    timeline = [t for t in timeline if "step" in t and t.get("measure_start") is not None]
    per_gpu = per_gpu_energy(energy_series(metrics), timeline)
    by_step = {int(t["step"]): t for t in timeline}
    rows = []
    for r in table.to_dict(orient="records"):
        row = {"step": r["step"], **dict.fromkeys(ENERGY_COLUMNS, math.nan)}
        step = by_step.get(int(r["step"])) if str(r["step"]).lstrip("-").isdigit() else None
        mine = per_gpu[per_gpu["step"] == int(r["step"])] if step is not None else per_gpu.iloc[0:0]
        if len(mine):
            start, end = _bounds(step)
            joules = float(mine["energy_j"].sum())
            window = end - start
            row.update(energy_gpus=len(mine), energy_j=joules, energy_power_w=joules / window / len(mine))
            row["energy_per_output_token_j"] = _ratio(joules, _num(r, "output_tokens"))
            row["energy_per_request_j"] = _ratio(joules, float(completed_requests(records, start, end)))
            watts = joules / window  # J per token = W / (tok/s): the tok/s interval bounds it (the counter is exact)
            row["energy_per_output_token_j_ci_low"] = _ratio(watts, _num(r, "aggregate_tok_s_ci_high"))
            row["energy_per_output_token_j_ci_high"] = _ratio(watts, _num(r, "aggregate_tok_s_ci_low"))
        rows.append(row)
    out = pd.DataFrame(rows, columns=["step", *ENERGY_COLUMNS])
    return out.astype({"energy_gpus": "Int64"})


def energy_summary(
    table: pd.DataFrame, records: pd.DataFrame, metrics: pd.DataFrame | None, timeline: list[dict]
) -> dict | None:
    """summary.json's `energy`: the run's joules over the measured windows of the steps with a value, per output token
    and per request completed in them, the mean power per GPU, and each GPU's joules (in total and per step); None
    when no step has energy (never 0)."""
    timeline = [t for t in timeline if "step" in t and t.get("measure_start") is not None]
    per_gpu = per_gpu_energy(energy_series(metrics), timeline)
    if not len(per_gpu):
        return None
    windows = {int(t["step"]): _bounds(t) for t in timeline if int(t["step"]) in set(per_gpu["step"])}
    rows = table[table["step"].astype(str).isin({str(s) for s in windows})]
    joules = float(per_gpu["energy_j"].sum())
    tokens = pd.to_numeric(rows["output_tokens"], errors="coerce")
    requests = sum(completed_requests(records, start, end) for start, end in windows.values())
    gpu_seconds = sum((end - start) * int((per_gpu["step"] == s).sum()) for s, (start, end) in windows.items())
    gpus = []
    for key, g in per_gpu.groupby("gpu_key", sort=True):
        gpus.append({
            "gpu_key": key, **{c: g[c].iloc[0] for c in IDENTITY}, "energy_j": float(g["energy_j"].sum()),
            "steps": {str(int(s)): float(j) for s, j in zip(g["step"], g["energy_j"])},
        })  # fmt: skip
    has_tokens = bool(tokens.notna().any())
    return {
        "steps": sorted(windows),
        "gpus": len(gpus),
        "window_s": sum(end - start for start, end in windows.values()),
        "energy_j": joules,
        "output_tokens": int(tokens.sum()) if has_tokens else None,  # a batch kind's run has none: null, not 0
        "requests": requests,
        "energy_per_output_token_j": _json(_ratio(joules, float(tokens.sum()))) if has_tokens else None,
        "energy_per_request_j": _json(_ratio(joules, float(requests))),
        "energy_power_w": _json(_ratio(joules, gpu_seconds)),
        "per_gpu": gpus,
    }


def _json(value: float) -> float | None:
    return None if math.isnan(value) else value


def console_lines(table: pd.DataFrame) -> list[str]:
    """The console's "Energy" table (its declared headers), only when a step has energy."""
    if not len(table) or not glossary.applies(table, glossary.ENERGY):
        return []
    return ["", *glossary.console_table(table, glossary.ENERGY)]
