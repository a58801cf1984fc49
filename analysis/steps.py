"""The batching curve: one row per load step, computed from the raw per-request records.

Percentiles are exact order statistics of the raw values (linear interpolation between closest ranks, as
numpy's default), never Locust's rounded response-time buckets. Missing data stays missing (NaN), not 0.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from . import glossary
from .generator import format_generator
from .glossary import StepData, flagged, percentile  # noqa: F401 (percentile: re-exported)
from .schedule import OPEN_LOOP_COLUMNS, format_open_loop, open_loop_columns
from .sse import CUT_OFF

# Column order of steps.csv's core columns, from the glossary (which computes them too).
STEP_COLUMNS = glossary.names(glossary.STEP)


def timeline_from_records(records: pd.DataFrame) -> list[dict]:
    """A fallback timeline when the run's own was lost: each step spans its records, no warm-up known."""
    out = []
    if records.empty:
        return out
    end = records["start_time"] + records["duration_s"].fillna(0)
    for step, group in records.groupby("step"):
        start = float(group["start_time"].min())
        out.append(
            {
                "step": int(step),
                "users": int(group["users"].max()),
                "start_time": start,
                "measure_start": start,
                "end_time": float(end[group.index].max()),
                "rate_rps": None,  # not in the records: a rate run's intended rate is in its run.json only
            }
        )
    return out


def _flatten(lists: pd.Series, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """A column of per-request lists as one array end to end, and each request's number of values."""
    arrays = [() if a is None else a for a in lists.tolist()]
    lengths = np.fromiter(map(len, arrays), dtype=np.int64, count=len(arrays))
    values = np.concatenate(arrays) if arrays else np.array([], dtype=dtype)
    return values.astype(dtype, copy=False), lengths


def itl_samples(ok: pd.DataFrame) -> np.ndarray:
    """Every ITL sample of the requests: glossary.itl_samples_s of each, computed on all their chunks at once
    (a one-hour run holds tens of millions of chunks: a Python loop over them took most of the analysis)."""
    if "chunk_offsets_s" not in ok.columns:  # the live view keeps no per-chunk lists
        return np.array([], dtype=float)
    offsets, lengths = _flatten(ok["chunk_offsets_s"], np.float64)
    tokens, token_lengths = _flatten(ok["chunk_tokens"], np.int64)
    if not np.array_equal(lengths, token_lengths):
        raise ValueError("records whose chunk_offsets_s and chunk_tokens differ in length")
    gaps = np.diff(offsets, prepend=np.nan)  # gaps[i] = offsets[i] - offsets[i - 1]
    later = np.ones(offsets.size, dtype=bool)
    later[(np.cumsum(lengths) - lengths)[lengths > 0]] = False  # a request's first chunk is its TTFT, no sample
    keep = later & (tokens > 0)
    return np.repeat(gaps[keep] / tokens[keep], tokens[keep])


def _summarize(ok: pd.DataFrame, errors: int, cut_off: int, tokens: int, window_s: float) -> dict:
    """The measured columns of one row, from its ok requests and the tokens completed in its window."""
    return glossary.step_values(StepData(ok, errors, cut_off, tokens, window_s, itl_samples(ok)))


def measured_masks(records: pd.DataFrame, timeline: list[dict]) -> tuple[pd.Series, pd.Series, float]:
    """(measured: started after its step's warm-up, in flight when the load generator began to stop, stop time)."""
    # Requests still in flight when the load generator began to stop are not measured: the stop itself
    # blocks Locust's event loop (for ~90 ms in Locust 2.47), which would delay their last timestamps.
    stop_time = max((float(t["end_time"]) for t in timeline if t.get("end_time") is not None), default=math.inf)
    finished = records["start_time"] + records["duration_s"].fillna(math.inf)
    in_flight_at_stop = (finished > stop_time) | (records["error_type"] == CUT_OFF)
    return ~records["warmup"].astype(bool), in_flight_at_stop, stop_time


def step_table(records: pd.DataFrame, timeline: list[dict]) -> pd.DataFrame:
    """Per-step table: latency stats over ok requests started after the step's warm-up; tok/s over its window;
    then the open-loop columns (empty in a closed-loop run, but achieved_rps)."""
    if not timeline:
        timeline = timeline_from_records(records)
    end_time = records["start_time"] + records["e2e_s"]
    measured, cut, stop_time = measured_masks(records, timeline)
    rows = []
    for step in timeline:
        s = int(step["step"])
        in_step = (records["step"] == s) & measured
        ok = records[in_step & (records["status"] == "ok") & ~cut]
        errors = int((in_step & (records["status"] != "ok") & ~cut).sum())
        window_start, window_end = float(step["measure_start"]), float(step["end_time"] or stop_time)
        done = (records["status"] == "ok") & (end_time >= window_start) & (end_time < window_end)
        tokens = int(records.loc[done, "output_tokens"].sum())
        row = {"step": s, "users": int(step["users"])}
        row.update(_summarize(ok, errors, int((in_step & cut).sum()), tokens, window_end - window_start))
        sent_in_window = int(((records["start_time"] >= window_start) & (records["start_time"] < window_end)).sum())
        sent = records.loc[in_step, [c for c in ("schedule_lag_s",) if c in records.columns]]
        row.update(open_loop_columns(sent, ok, sent_in_window, window_end - window_start, step.get("rate_rps")))
        rows.append(row)
    return pd.DataFrame(rows, columns=STEP_COLUMNS + OPEN_LOOP_COLUMNS)


def run_row(records: pd.DataFrame, timeline: list[dict]) -> dict:
    """The whole run as one row: every step's measured requests, tok/s over the sum of the measured windows."""
    measured, cut, stop_time = measured_masks(records, timeline)
    end_time = records["start_time"] + records["e2e_s"]
    ok = records[measured & (records["status"] == "ok") & ~cut]
    errors = int((measured & (records["status"] != "ok") & ~cut).sum())
    tokens, window_s = 0, 0.0
    for step in timeline:
        window_start, window_end = float(step["measure_start"]), float(step["end_time"] or stop_time)
        done = (records["status"] == "ok") & (end_time >= window_start) & (end_time < window_end)
        tokens += int(records.loc[done, "output_tokens"].sum())
        window_s += max(window_end - window_start, 0.0)
    row = {"step": "all", "users": max((int(t["users"]) for t in timeline), default=0)}
    row.update(_summarize(ok, errors, int((measured & cut).sum()), tokens, window_s))
    return row


def format_table(table: pd.DataFrame) -> str:
    """The batching curve for the console: latencies in ms, throughput in tokens/s, missing values as '-'."""
    rows = glossary.console_rows(table, glossary.STEP)
    if "generator_bound" in table.columns and table["generator_bound"].map(flagged).any():
        # Marked where the numbers are read: a flagged step's latencies are the client's lateness, not the server's.
        bound = glossary.STEP_TABLE["generator_bound"]
        rows[0].append(bound.header)
        for row, value in zip(rows[1:], table["generator_bound"]):
            row.append(bound.flag if flagged(value) else "")
    out = [glossary.SECTIONS[glossary.STEP].title, *glossary.aligned(rows)]
    if "kv_cache_usage_max" in table.columns and table["kv_cache_usage_max"].notna().any():
        out += ["", *glossary.console_table(table, glossary.SERVER)]
    out += format_generator(table)
    out += format_open_loop(table)
    return "\n".join(out)
