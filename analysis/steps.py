"""The batching curve: one row per load step, computed from the raw per-request records.

Percentiles are exact order statistics of the raw values (linear interpolation between closest ranks, as
numpy's default), never Locust's rounded response-time buckets. Missing data stays missing (NaN), not 0.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from . import glossary, knee
from .adaptive import RUN_STOPPED
from .batch import (
    BATCH_COLUMNS,
    batch_row,
    batch_spans,
    half_width,
    marked_rows,
    run_kind,
    run_rates,
    stability,
)
from .batch import console_lines as format_batch
from .batch import throughput_column as throughput_column  # re-exported: the curve's y
from .generator import format_generator
from .glossary import StepData, flagged, percentile  # noqa: F401 (percentile: re-exported)
from .reasoning import REASONING_COLUMNS, reasoning_row
from .reasoning import console_lines as format_reasoning
from .schedule import OPEN_LOOP_COLUMNS, format_open_loop, is_rate_run, open_loop_columns
from .sse import CUT_OFF
from .trials import plan_groups
from .uncertainty import batch_count, end_to_end, halves, quantile_interval, t_interval, windows_rate_interval

# Column order of steps.csv's core columns, from the glossary (which computes them too).
STEP_COLUMNS = glossary.names(glossary.STEP)
# The intervals and suspect-step checks, last in steps.csv (after the open-loop columns).
UNCERTAINTY_COLUMNS = glossary.names(glossary.UNCERTAINTY)
# (column, the request column it is a percentile of, q): the percentiles that get an order-statistic interval.
QUANTILE_INTERVALS = (
    ("ttft_p50_s", "ttft_s", 0.50),
    ("ttft_p95_s", "ttft_s", 0.95),
    ("ttft_p99_s", "ttft_s", 0.99),
    ("tpot_p50_s", "tpot_s", 0.50),
    ("tpot_p95_s", "tpot_s", 0.95),
)
# Percentiles without interval columns in steps.csv, still marked when too few requests hold them (TPOT p99 of 40).
FEW_ONLY = (("tpot_p99_s", "tpot_s", 0.99),)
TOO_FEW = "too few samples"  # analysis.uncertainty's note for a percentile without an interval
FEW_MARK = "~"  # the console's mark on a percentile with too few samples for an interval


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


def interval_columns(
    ok: pd.DataFrame,
    spans: tuple[np.ndarray, np.ndarray, np.ndarray],
    window_start: float,
    window_end: float,
    windows: list[tuple[float, float]] | None = None,
) -> dict:
    """One row's uncertainty columns (all but outlier, which needs the neighbouring steps): batch means over the
    tokens completed in the window (k = batch_count(window, median E2E)) widened by the window-edge error,
    t-intervals over the requests, order-statistic intervals of the percentiles, the two halves' rates and the
    stability check on them. `spans`: (start, end, output tokens) of every ok request of the run. `windows`: a
    --repeat step's trials' windows, pooled end to end (uncertainty.end_to_end): its halves are then the first and
    the second half of its trials' time together."""
    e2e = pd.to_numeric(ok["e2e_s"], errors="coerce").to_numpy(dtype=float)
    median_e2e = float(np.median(e2e[~np.isnan(e2e)])) if (~np.isnan(e2e)).any() else math.nan
    starts, ends, tokens = spans
    if windows is not None and len(windows) > 1:
        agg_windows, ends = windows, end_to_end(ends, windows)
        window_start, window_end = 0.0, sum(b - a for a, b in windows)
    else:
        agg_windows = [(window_start, window_end)]
    k = batch_count(window_end - window_start, median_e2e)
    done = (ends >= window_start) & (ends < window_end)
    done_times, done_tokens = ends[done], tokens[done]
    row: dict = {}
    agg = windows_rate_interval(starts, spans[1], tokens, agg_windows, k)
    intervals = {
        "aggregate_tok_s": agg,
        "per_request_tok_s_mean": t_interval(
            [math.nan if v is None else v for v in map(glossary.per_request_tok_s, ok["output_tokens"], ok["e2e_s"])]
        ),
        "e2e_mean_s": t_interval(e2e),
    }
    few = []
    for column, metric, q in QUANTILE_INTERVALS:
        intervals[column] = ci = quantile_interval(pd.to_numeric(ok[metric], errors="coerce").to_numpy(float), q)
        if ci.note == TOO_FEW:
            few.append(column)
    for column, metric, q in FEW_ONLY:
        if quantile_interval(pd.to_numeric(ok[metric], errors="coerce").to_numpy(float), q).note == TOO_FEW:
            few.append(column)
    for name, ci in intervals.items():
        row[f"{name}_ci_low"], row[f"{name}_ci_high"] = ci.low, ci.high
    row["few_samples"] = " ".join(few) or None
    first, second = halves(done_times, done_tokens, window_start, window_end, k)
    row["aggregate_tok_s_first_half"], row["aggregate_tok_s_second_half"] = first.value, second.value
    # Judged only where the whole window has an interval: a half's 2 or 3 batches alone say little of its noise.
    judged = not any(
        math.isnan(v) for v in (first.value, second.value, first.half_width, second.half_width, agg.half_width)
    )
    verdict = knee.stable(first.value, first.half_width, second.value, second.half_width) if judged else None
    row["stable"] = None if verdict is None else bool(verdict)
    row["outlier"] = None
    return row


def outlier_column(table: pd.DataFrame) -> list[bool | None]:
    """Per row: an outlier of the curve (analysis.knee.outliers on throughput_column, keyed on the rate in a rate
    run); None for the first and last step by load and for a step without throughput: a step needs a neighbour on
    each side."""
    key = "rate_rps" if is_rate_run(table) else "users"
    y_col = throughput_column(table) if len(table) else "aggregate_tok_s"
    if len(table) < 3 or y_col not in table.columns:
        return [None] * len(table)
    flagged_steps = {o.step for o in knee.outliers(table, key, y_col)}
    order = table.sort_values(key)["step"].tolist()
    ends = {order[0], order[-1]}
    return [
        None if (s in ends or pd.isna(y)) else (s in flagged_steps)
        for s, y in zip(table["step"].astype(int), table[y_col])
    ]


# A batch kind's run's output-token columns: no request has output tokens, so they are missing, not 0 tok/s.
_NO_OUTPUT = (
    "output_tokens",
    "aggregate_tok_s",
    "aggregate_tok_s_ci_low",
    "aggregate_tok_s_ci_high",
    "aggregate_tok_s_first_half",
    "aggregate_tok_s_second_half",
)


def _batch_stable(
    row: dict, kind, emb_spans: tuple, window_start: float, window_end: float, ok: pd.DataFrame, windows=None
) -> None:
    """A batch kind's step's stability judged on its items/s (its tok/s halves are missing), in place."""
    e2e = pd.to_numeric(ok["e2e_s"], errors="coerce").dropna()
    if windows is not None and len(windows) > 1:  # --repeat's pooled step: its trials' windows end to end
        emb_spans = (emb_spans[0], end_to_end(emb_spans[1], windows), emb_spans[2])
        window_start, window_end = 0.0, sum(b - a for a, b in windows)
    halves_ = stability(emb_spans, kind, window_start, window_end, float(e2e.median()) if len(e2e) else math.nan)
    judged = (
        halves_ is not None
        and not any(math.isnan(v) for v in halves_)
        and not pd.isna(row.get(f"{kind.item_rate}_ci_low"))
    )
    verdict = knee.stable(*halves_) if judged else None
    row["stable"] = None if verdict is None else bool(verdict)


def measured_masks(records: pd.DataFrame, timeline: list[dict]) -> tuple[pd.Series, pd.Series, float]:
    """(measured: started after its step's warm-up, in flight when the load generator began to stop, stop time)."""
    # Requests still in flight when the load generator began to stop are not measured: the stop itself
    # blocks Locust's event loop (for ~90 ms in Locust 2.47), which would delay their last timestamps.
    stop_time = max((float(t["end_time"]) for t in timeline if t.get("end_time") is not None), default=math.inf)
    finished = records["start_time"] + records["duration_s"].fillna(math.inf)
    in_flight_at_stop = (finished > stop_time) | (records["error_type"] == CUT_OFF)
    return ~records["warmup"].astype(bool), in_flight_at_stop, stop_time


def close_unfinished(timeline: list[dict], records: pd.DataFrame) -> list[dict]:
    """A finished run whose last run.json still has a step open (it could not be written at the end: a full disk,
    or the process was killed): that step ends with the last request recorded, stopped before its end; measured
    to infinity, its tok/s read as missing and its length as nan."""
    if all(t.get("end_time") is not None for t in timeline) or not len(records):
        return timeline
    ends = records["start_time"] + records["duration_s"].fillna(0.0)
    last = float(ends.max())
    if last != last:  # NaN: no record has a time
        return timeline
    closed = [dict(t) for t in timeline]
    for t in closed:
        if t.get("end_time") is None:
            t["end_time"] = max(last, float(t.get("start_time") or last))
            t["end_reason"] = t.get("end_reason") or RUN_STOPPED
    return closed


def measured_column(records: pd.DataFrame, timeline: list[dict]) -> np.ndarray:
    """measured = started after its step's warm-up and finished before the load generator began to stop: the
    requests the step table counts (requests.parquet's `measured`)."""
    if records.empty:
        return np.zeros(0, dtype=bool)
    timeline = close_unfinished(timeline, records) if timeline else timeline_from_records(records)
    measured, cut, _ = measured_masks(records, timeline)
    return (measured & ~cut).to_numpy(dtype=bool)


def step_table(records: pd.DataFrame, timeline: list[dict]) -> pd.DataFrame:
    """Per-step table: latency stats over ok requests started after the step's warm-up; tok/s over its window;
    then the open-loop columns (empty in a closed-loop run, but achieved_rps)."""
    if not timeline:
        timeline = timeline_from_records(records)
    end_time = records["start_time"] + records["e2e_s"]
    measured, cut, stop_time = measured_masks(records, timeline)
    is_ok = (records["status"] == "ok").to_numpy()
    spans = (  # every ok request's (start, end, tokens): the tokens the windows count, for their intervals
        records["start_time"].to_numpy(dtype=float)[is_ok],
        end_time.to_numpy(dtype=float)[is_ok],
        pd.to_numeric(records["output_tokens"], errors="coerce").fillna(0).to_numpy(dtype=float)[is_ok],
    )
    # An open loop of conversations (--turns) schedules new conversations: its achieved rate counts first turns.
    starts = records["turn"].isna() | (records["turn"] == 1) if "turn" in records.columns else None
    emb_spans = batch_spans(records)
    batch = run_kind(records)
    rows = []
    # One row per step; with --repeat, one per plan step over its trials pooled (analysis/trials.py).
    for entries in plan_groups(timeline):
        step = entries[0]
        in_step = records["step"].isin([int(t["step"]) for t in entries]) & measured
        ok = records[in_step & (records["status"] == "ok") & ~cut]
        errors = int((in_step & (records["status"] != "ok") & ~cut).sum())
        windows = [(float(t["measure_start"]), float(t["end_time"] or stop_time)) for t in entries]
        window_start, window_end = windows[0]
        window_s = sum(b - a for a, b in windows)
        done = pd.Series(False, index=records.index)
        in_window = pd.Series(False, index=records.index)
        for a, b in windows:
            done |= (records["status"] == "ok") & (end_time >= a) & (end_time < b)
            in_window |= (records["start_time"] >= a) & (records["start_time"] < b)
        tokens = int(records.loc[done, "output_tokens"].sum())
        row = {"step": int(step.get("plan_step", step["step"])), "users": int(step["users"])}
        row.update(_summarize(ok, errors, int((in_step & cut).sum()), tokens, window_s))
        if starts is not None and step.get("rate_rps") is not None:
            in_window &= starts
        sent_in_window = int(in_window.sum())
        sent = records.loc[in_step, [c for c in ("schedule_lag_s",) if c in records.columns]]
        row.update(open_loop_columns(sent, ok, sent_in_window, window_s, step.get("rate_rps")))
        row.update(interval_columns(ok, spans, window_start, window_end, windows))
        row.update(reasoning_row(ok))
        row.update(batch_row(ok, emb_spans, window_start, window_end, windows))
        if batch is not None:
            row.update(dict.fromkeys(_NO_OUTPUT, math.nan))
            _batch_stable(row, batch, emb_spans, window_start, window_end, ok, windows)
        rows.append(row)
    table = pd.DataFrame(
        rows, columns=STEP_COLUMNS + OPEN_LOOP_COLUMNS + UNCERTAINTY_COLUMNS + REASONING_COLUMNS + BATCH_COLUMNS
    )
    table["outlier"] = pd.Series(outlier_column(table), index=table.index, dtype=object)
    return table


def run_row(records: pd.DataFrame, timeline: list[dict]) -> dict:
    """The whole run as one row: every step's measured requests, tok/s over the sum of the measured windows."""
    measured, cut, stop_time = measured_masks(records, timeline)
    end_time = records["start_time"] + records["e2e_s"]
    ok = records[measured & (records["status"] == "ok") & ~cut]
    errors = int((measured & (records["status"] != "ok") & ~cut).sum())
    tokens, window_s, windows = 0, 0.0, []
    for step in timeline:
        window_start, window_end = float(step["measure_start"]), float(step["end_time"] or stop_time)
        done = (records["status"] == "ok") & (end_time >= window_start) & (end_time < window_end)
        tokens += int(records.loc[done, "output_tokens"].sum())
        window_s += max(window_end - window_start, 0.0)
        windows.append((window_start, window_end))
    row = {"step": "all", "users": max((int(t["users"]) for t in timeline), default=0)}
    row.update(_summarize(ok, errors, int((measured & cut).sum()), tokens, window_s))
    row.update(reasoning_row(ok))
    # The whole run's E2E percentiles (with intervals) over every measured request; its rates over every window,
    # without an interval (batch means assume one stationary window, and the steps differ in load).
    emb_spans = batch_spans(records)
    if windows:
        row.update(batch_row(ok, emb_spans, windows[0][0], windows[0][0]))
    row.update(run_rates(emb_spans, windows))
    if run_kind(records) is not None:
        row.update(dict.fromkeys(_NO_OUTPUT, math.nan))
    return row


def unstable(value: object) -> bool:
    """The stability check was made and failed (None / NaN: not judged)."""
    return value is not None and not pd.isna(value) and not bool(value)


def _marked(table: pd.DataFrame, rows: list[list[str]]) -> None:
    """The console's uncertainty marks, in place: '± half-width' after the tok/s values that have an interval, '~'
    after a percentile with too few samples for one."""
    shown = [c.name for c, _ in glossary.SECTIONS[glossary.STEP].shown()]
    for cells, r in zip(rows[1:], table.to_dict(orient="records")):
        for name in ("aggregate_tok_s", "per_request_tok_s_mean"):
            hw = half_width(r, name)
            if name in shown and not math.isnan(hw) and cells[shown.index(name)] != "-":
                cells[shown.index(name)] += f" ±{hw:.1f}"
        few = r.get("few_samples")
        for name in few.split() if isinstance(few, str) else ():
            if name in shown and cells[shown.index(name)] != "-":
                cells[shown.index(name)] += FEW_MARK


def format_table(table: pd.DataFrame) -> str:
    """The batching curve for the console: latencies in ms, throughput in tokens/s (± its 95 % interval's
    half-width), missing values as '-', a percentile with too few samples for an interval marked '~'."""
    batch = format_batch(table)
    rows = glossary.console_rows(table, glossary.STEP)
    _marked(table, rows)
    if "generator_bound" in table.columns and table["generator_bound"].map(flagged).any():
        # Marked where the numbers are read: a flagged step's latencies are the client's lateness, not the server's.
        bound = glossary.STEP_TABLE["generator_bound"]
        rows[0].append(bound.header)
        for row, value in zip(rows[1:], table["generator_bound"]):
            row.append(bound.flag if flagged(value) else "")
    # Whether each step was steady, always (ok, UNSTABLE, - when not judged): the same columns in every run.
    if "stable" in table.columns:
        column = glossary.STEP_TABLE["stable"]
        rows[0].append(column.header)
        for row, value in zip(rows[1:], table["stable"]):
            row.append(column.show(value))
    # The outliers, marked the same way as the generator-bound steps: their numbers are not the server's curve.
    for name, is_suspect in (("outlier", flagged),):
        if name in table.columns and table[name].map(is_suspect).any():
            column = glossary.STEP_TABLE[name]
            rows[0].append(column.header)
            for row, value in zip(rows[1:], table[name]):
                row.append(column.flag if is_suspect(value) else "")
    if "probe" in table.columns and table["probe"].notna().any():
        # A capacity search: the order its probes ran in, since the steps are not in load order (1, 2, 4, 8, 16, 12).
        probe = glossary.STEP_TABLE["probe"]
        rows[0].append(probe.header)
        for row, value in zip(rows[1:], table["probe"]):
            row.append(probe.show(value))
    # A batch kind's run's batching curve has only empty streaming columns (no TTFT, TPOT, ITL, output tokens): its
    # kind's table takes that place, with the same suspect-step marks after it.
    if batch:
        lead = len(glossary.SECTIONS[glossary.STEP].shown())
        marks = [row[lead:] for row in rows]
        out = [batch[0], *glossary.aligned([e + m for e, m in zip(marked_rows(table), marks)])]
    else:
        out = [glossary.SECTIONS[glossary.STEP].title, *glossary.aligned(rows)]
    if glossary.applies(table, glossary.SERVER):
        out += ["", *glossary.console_table(table, glossary.SERVER)]
    out += format_generator(table)
    out += format_open_loop(table)
    out += format_reasoning(table)
    return "\n".join(out)
