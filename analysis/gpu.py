"""GPU telemetry from NVIDIA's dcgm-exporter (`--gpu-metrics-url`): the scraped DCGM samples as one tidy series per
GPU and field (`gpu_series`), and their per-step summary over each step's measured window (steps.csv's GPU section:
`step_gpu_table`; per GPU: `per_gpu_steps`).

The samples are stored raw in metrics.parquet (DCGM's names, every label, `source` = the exporter's URL); this module
only reads them. A field a GPU does not export (a consumer GPU has no DCGM_FI_PROF_* profiling fields; dcgm-exporter's
default counters leave out DCGM_FI_PROF_SM_ACTIVE) is missing, never 0, and so are DCGM's blank sentinels (the values
it sends for "not supported", at and above 0x7ffffff0). Pure: no Locust, no network.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from . import glossary

GPU_COLUMNS = glossary.names(glossary.GPU)  # steps.csv's GPU section, in order (part of it filled elsewhere)
WINDOW_COLUMNS = ["window_start_time", "window_end_time"]

# DCGM field -> (the suite's field, multiplier, divisor) to its unit: fractions 0-1, bytes, watts. A divisor, not a
# factor of 0.01: 21 / 100 is exactly the float 0.21, 21 * 0.01 is not.
FIELDS = {
    "DCGM_FI_DEV_GPU_UTIL": ("util", 1.0, 100.0),  # percent 0-100
    "DCGM_FI_PROF_SM_ACTIVE": ("sm_active", 1.0, 1.0),  # ratio 0-1
    "DCGM_FI_PROF_DRAM_ACTIVE": ("dram_active", 1.0, 1.0),  # ratio 0-1
    "DCGM_FI_DEV_FB_USED": ("mem_used_bytes", float(2**20), 1.0),  # MiB
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0, 1.0),  # W
}
FIELD_NAMES = [field for field, *_ in FIELDS.values()]
SERIES_COLUMNS = ["timestamp", "gpu_key", "hostname", "gpu", "uuid", "model_name", "field", "value"]
# DCGM's blank values (DCGM_INT32_BLANK = 0x7ffffff0 and the int64 and fp64 blanks above it: not found, not
# supported, not permissioned): no real value of these fields comes near (2**31 MiB is 2 PiB of framebuffer).
DCGM_BLANK = float(0x7FFFFFF0)

# steps.csv's columns computed here: (column, its per-GPU column of per_gpu_steps, how over the GPUs).
_STEP_STATS = (
    ("gpu_util_mean", "util_mean", "mean"),
    ("gpu_sm_active_mean", "sm_active_mean", "mean"),
    ("gpu_dram_active_mean", "dram_active_mean", "mean"),
    ("gpu_mem_used_max_bytes", "mem_used_max_bytes", "max"),
    ("gpu_power_mean_w", "power_mean_w", "mean"),
)
# per_gpu_steps' columns: (column, field, how over the GPU's samples in the window).
_PER_GPU_STATS = (
    ("util_mean", "util", "mean"),
    ("sm_active_mean", "sm_active", "mean"),
    ("dram_active_mean", "dram_active", "mean"),
    ("mem_used_max_bytes", "mem_used_bytes", "max"),
    ("power_mean_w", "power_w", "mean"),
)
STEP_GPU_COLUMNS = [*WINDOW_COLUMNS, "gpus", *(c for c, *_ in _STEP_STATS)]  # this module's, in steps.csv's order
PER_GPU_COLUMNS = [
    "step", "gpu_key", "hostname", "gpu", "uuid", "model_name", "samples",
    "util_mean", "sm_active_mean", "dram_active_mean", "mem_used_max_bytes", "power_mean_w",
]  # fmt: skip


def _label(labels: dict, *names: str) -> str | None:
    """The first of these labels that is set (dcgm-exporter renamed Hostname to hostname after 4.5.3-4.8.2; its UUID
    label is uuid in the 1.x-compatible naming)."""
    for name in names:
        value = labels.get(name)
        if value not in (None, ""):
            return str(value)
    return None


def gpu_identity(labels: dict, source: str = "") -> dict:
    """A DCGM sample's GPU: gpu_key = "<Hostname>/<gpu>" (UUID without a Hostname; a MIG instance adds
    "/mig<GPU_I_ID>"), hostname, gpu, uuid, model_name."""
    hostname = _label(labels, "Hostname", "hostname")
    gpu = _label(labels, "gpu")
    uuid = _label(labels, "UUID", "uuid")
    if hostname is not None and gpu is not None:
        key = f"{hostname}/{gpu}"
    elif uuid is not None:
        key = uuid
    else:  # neither: the exporter's own numbering, kept apart from another exporter's
        key = f"{source}/{gpu}"
    instance = _label(labels, "GPU_I_ID")
    if instance is not None:
        key += f"/mig{instance}"
    return {"gpu_key": key, "hostname": hostname, "gpu": gpu, "uuid": uuid, "model_name": _label(labels, "modelName")}


def gpu_series(metrics: pd.DataFrame | None) -> pd.DataFrame:
    """The GPU samples of metrics.parquet as rows (timestamp, gpu_key, hostname, gpu, uuid, model_name, field, value):
    util = DCGM_FI_DEV_GPU_UTIL / 100, sm_active and dram_active as DCGM gives them (0-1), mem_used_bytes =
    DCGM_FI_DEV_FB_USED * 2**20, power_w = DCGM_FI_DEV_POWER_USAGE; blank and non-finite values left out. Sorted by
    gpu_key, field, timestamp; empty (same columns) without GPU samples."""
    if metrics is None or not len(metrics):
        return _empty_series()
    rows = metrics[metrics["metric"].isin(list(FIELDS))]
    if "source" not in rows.columns:
        rows = rows.assign(source="")
    if not len(rows):
        return _empty_series()
    parts = []
    # One JSON parse per label set (a GPU's labels repeat in every scrape), not per sample.
    for (metric, labels_text, source), group in rows.groupby(["metric", "labels", "source"], sort=False):
        field, multiplier, divisor = FIELDS[metric]
        raw = group["value"].to_numpy(dtype=float)
        keep = np.isfinite(raw) & (raw < DCGM_BLANK)
        if not keep.any():
            continue
        who = gpu_identity(json.loads(labels_text), str(source))
        part = pd.DataFrame(
            {"timestamp": group["timestamp"].to_numpy(dtype=float)[keep], "value": raw[keep] * multiplier / divisor}
        ).assign(field=field, **who)
        parts.append(part)
    if not parts:
        return _empty_series()
    out = pd.concat(parts, ignore_index=True)[SERIES_COLUMNS]
    # A GPU whose pod labels changed mid-run (Kubernetes' pod mapping) is still one GPU: one value per scrape.
    out = out.drop_duplicates(["gpu_key", "field", "timestamp"], keep="last")
    return out.sort_values(["gpu_key", "field", "timestamp"], kind="stable").reset_index(drop=True)


def _empty_series() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=float if c in ("timestamp", "value") else object) for c in SERIES_COLUMNS})


def _bounds(step: dict) -> tuple[float, float]:
    """A step's measured window [measure_start, end_time) in Unix seconds; a step still running ends at +inf."""
    end = step.get("end_time")
    return float(step["measure_start"]), (math.inf if end is None else float(end))


def per_gpu_steps(series: pd.DataFrame, timeline: list[dict]) -> pd.DataFrame:
    """Per step and GPU, over the GPU's samples inside the step's window [measure_start, end_time): the mean of
    util, sm_active, dram_active, power_w and the max of mem_used_bytes (NaN for a field it has no sample of), and
    how many scrapes it appears in (samples). The report's per-GPU table."""
    rows = []
    if len(series):
        for step in timeline:
            start, end = _bounds(step)
            inside = series[(series["timestamp"] >= start) & (series["timestamp"] < end)]
            for key, group in inside.groupby("gpu_key", sort=True):
                first = group.iloc[0]
                row = {"step": int(step["step"]), "gpu_key": key, "samples": int(group["timestamp"].nunique())}
                row.update({c: first[c] for c in ("hostname", "gpu", "uuid", "model_name")})
                by_field = group.groupby("field")["value"]
                stats = {"mean": by_field.mean(), "max": by_field.max()}
                for column, field, how in _PER_GPU_STATS:
                    row[column] = float(stats[how].get(field, math.nan))
                rows.append(row)
    return pd.DataFrame(rows, columns=PER_GPU_COLUMNS)


def step_gpu_table(metrics: pd.DataFrame | None, timeline: list[dict]) -> pd.DataFrame:
    """steps.csv's GPU columns per step: window_start_time = measure_start, window_end_time = end_time (Unix s);
    gpus = GPUs with a sample in the window; gpu_*_mean = mean over those GPUs of each GPU's mean over its samples in
    the window (a GPU without the field left out; NaN when none has it); gpu_mem_used_max_bytes = max over GPUs and
    samples."""
    timeline = [t for t in timeline if "step" in t and t.get("measure_start") is not None]
    per_gpu = per_gpu_steps(gpu_series(metrics), timeline)
    rows = []
    for step in timeline:
        start, end = _bounds(step)
        row: dict = {
            "step": int(step["step"]),
            "window_start_time": start,
            "window_end_time": end if math.isfinite(end) else math.nan,
        }
        mine = per_gpu[per_gpu["step"] == int(step["step"])]
        row["gpus"] = len(mine) if len(mine) else None  # no GPU telemetry: unknown, not 0 GPUs
        for column, per_gpu_column, over_gpus in _STEP_STATS:
            values = mine[per_gpu_column].dropna()
            row[column] = float(getattr(values, over_gpus)()) if len(values) else math.nan
        rows.append(row)
    table = pd.DataFrame(rows, columns=["step", *STEP_GPU_COLUMNS])
    return table.astype({"gpus": "Int64"})
