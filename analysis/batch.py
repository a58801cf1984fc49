"""The kinds that do not stream (analysis/kinds.py; embeddings, issue 19), per step: each kind's items per second
(e.g. inputs/s: analysis/kinds.py declares which) and prompt tok/s over the step's window with batch-means
intervals, the E2E percentiles with order-statistic intervals (steps.csv's last sections), and the console's table of
the run's kind (its declared title), shown instead of the batching curve (any record carrying the kind's items).

Such a request has no TTFT, TPOT, ITL nor output tokens, so the batching curve's columns are all empty there; its
throughput is items (and prompt tokens) completed per second, its latency E2E (the send stamp to the body's last
byte). Rates count a request when it completes inside the window, as aggregate tok/s does, and get the same interval
(analysis.uncertainty.rate_interval). Pure: no Locust.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from . import glossary, kinds
from .glossary import numeric_column as _numbers
from .glossary import percentile
from .uncertainty import (
    batch_count,
    end_to_end,
    halves,
    min_samples_for_quantile,
    quantile_interval,
    rate_interval,
    windows_rate_interval,
)

EMBEDDINGS_COLUMNS = glossary.names(glossary.EMBEDDINGS)
# Every batch kind's columns, in steps.csv's order (each kind's items/s section after the embeddings one).
BATCH_COLUMNS = EMBEDDINGS_COLUMNS + [n for k in kinds.BATCH_KINDS if k.name != glossary.EMBEDDINGS
                                      for n in glossary.names(k.name)]  # fmt: skip
E2E_QUANTILES = (("e2e_p50_s", 0.50), ("e2e_p95_s", 0.95), ("e2e_p99_s", 0.99))
# (rate column, records' field): every batch kind's items, then the prompt tokens any kind may carry.
RATES = (*((k.item_rate, k.items) for k in kinds.BATCH_KINDS), ("prompt_tok_s", "prompt_tokens"))
FEW_MARK = "~"  # as the batching curve's: a percentile with too few samples for an interval


def run_kind(records: pd.DataFrame) -> kinds.RequestKind | None:
    """The batch kind of a run: the first whose items some record carries (only its requests do); None otherwise."""
    for kind in kinds.BATCH_KINDS:
        if kind.items in records.columns and pd.to_numeric(records[kind.items], errors="coerce").notna().any():
            return kind
    return None


def table_kind(table: pd.DataFrame) -> kinds.RequestKind | None:
    """The batch kind of a step table: the first whose items/s some step has; None otherwise."""
    for kind in kinds.BATCH_KINDS:
        rate = kind.item_rate
        if rate in table.columns and pd.to_numeric(table[rate], errors="coerce").notna().any():
            return kind
    return None


def shown(table: pd.DataFrame) -> bool:
    """A batch kind's step table: some step has its items/s."""
    return table_kind(table) is not None


def throughput_column(table: pd.DataFrame) -> str:
    """The curve's throughput: a batch kind's items/s (no output tokens), else aggregate_tok_s."""
    kind = table_kind(table)
    return "aggregate_tok_s" if kind is None else str(kind.item_rate)


def batch_spans(records: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray | None]]:
    """Every ok request's (start, end) and each rate's field (NaN as 0 for the sums; None: no record carries the
    field, so the rate is missing, not 0)."""
    ok = (records["status"] == "ok").to_numpy()
    starts = records["start_time"].to_numpy(dtype=float)[ok]
    ends = (records["start_time"] + pd.to_numeric(records["e2e_s"], errors="coerce")).to_numpy(dtype=float)[ok]
    weights: dict[str, np.ndarray | None] = {}
    for rate, field in RATES:
        values = _numbers(records, field)[ok] if field in records.columns else np.full(int(ok.sum()), math.nan)
        weights[rate] = None if np.isnan(values).all() else np.nan_to_num(values, nan=0.0)
    return starts, ends, weights


def batch_row(
    ok: pd.DataFrame,
    run_spans: tuple[np.ndarray, np.ndarray, dict[str, np.ndarray | None]],
    window_start: float,
    window_end: float,
    windows: list[tuple[float, float]] | None = None,
) -> dict:
    """One row's batch columns (BATCH_COLUMNS, in their order): rate = sum of the field over the ok requests
    completed in [window_start, window_end) / window, batch means with k = batch_count(window, median E2E); E2E
    percentiles of the measured ok requests with order-statistic intervals. `ok`: the step's measured ok requests.
    `windows`: a --repeat step's trials' windows, pooled end to end (uncertainty.end_to_end)."""
    e2e = _numbers(ok, "e2e_s")
    known = e2e[~np.isnan(e2e)]
    median_e2e = float(np.median(known)) if known.size else math.nan
    starts, ends, weights = run_spans
    pooled = windows is not None and len(windows) > 1
    if pooled:
        run_spans = (starts, end_to_end(ends, windows), weights)
        window_start, window_end, real_ends, ends = 0.0, sum(b - a for a, b in windows), ends, run_spans[1]
    window = window_end - window_start
    k = batch_count(window, median_e2e)
    done = (ends >= window_start) & (ends < window_end)
    row: dict = {}
    for rate, _field in RATES:
        w = weights[rate]
        if w is None or not window > 0:
            row[rate] = row[f"{rate}_ci_low"] = row[f"{rate}_ci_high"] = math.nan
            continue
        if pooled:
            ci = windows_rate_interval(starts, real_ends, w, windows, k)
        else:
            ci = rate_interval(starts, ends, w, window_start, window_end, k)
        row[rate] = float(w[done].sum() / window)
        row[f"{rate}_ci_low"], row[f"{rate}_ci_high"] = ci.low, ci.high
    for kind in kinds.BATCH_KINDS:
        halves_ = stability(run_spans, kind, window_start, window_end, median_e2e) if window > 0 else None
        row[f"{kind.item_rate}_first_half"], row[f"{kind.item_rate}_second_half"] = (
            (math.nan, math.nan) if halves_ is None else (halves_[0], halves_[2])
        )
    for name, q in E2E_QUANTILES:
        row[name] = percentile(e2e, q * 100)
        ci = quantile_interval(e2e, q)
        row[f"{name}_ci_low"], row[f"{name}_ci_high"] = ci.low, ci.high
    return {name: row[name] for name in BATCH_COLUMNS}


def run_rates(
    run_spans: tuple[np.ndarray, np.ndarray, dict[str, np.ndarray | None]], windows: list[tuple[float, float]]
) -> dict:
    """The whole run's items/s and prompt tok/s: the sums over every measured window / the windows' total length."""
    _starts, ends, weights = run_spans
    total = sum(max(b - a, 0.0) for a, b in windows)
    out = {}
    for rate, _field in RATES:
        w = weights[rate]
        if w is None or not total > 0:
            out[rate] = math.nan
            continue
        done = np.zeros(ends.size, dtype=bool)
        for a, b in windows:
            done |= (ends >= a) & (ends < b)
        out[rate] = float(w[done].sum() / total)
    return out


def stability(
    run_spans: tuple[np.ndarray, np.ndarray, dict[str, np.ndarray | None]],
    kind: kinds.RequestKind,
    window_start: float,
    window_end: float,
    median_e2e: float,
) -> tuple[float, float, float, float] | None:
    """(first half, its half-width, second half, its half-width) of the kind's items/s, for knee.stable; None
    without its items."""
    _starts, ends, weights = run_spans
    w = weights[str(kind.item_rate)]
    if w is None:
        return None
    k = batch_count(window_end - window_start, median_e2e)
    done = (ends >= window_start) & (ends < window_end)
    first, second = halves(ends[done], w[done], window_start, window_end, k)
    return first.value, first.half_width, second.value, second.half_width


def _few(row: dict, q: float) -> bool:
    n = row.get("requests")
    return n is not None and not pd.isna(n) and int(n) < min_samples_for_quantile(q)


def half_width(row: dict, name: str) -> float:
    """Half the width of a step row's interval of `name` (its _ci_low and _ci_high columns); NaN without one."""
    try:
        return (float(row.get(f"{name}_ci_high")) - float(row.get(f"{name}_ci_low"))) / 2
    except (TypeError, ValueError):
        return math.nan


def console_lines(table: pd.DataFrame) -> list[str]:
    """The console's table of the run's batch kind (step, users, requests, errors, items/s ± CI, prompt tok/s ± CI,
    E2E p50/p95/p99, ~ on a percentile with too few samples); nothing in a run of a streamed kind."""
    kind = table_kind(table) if len(table) else None
    if kind is None:
        return []
    return [glossary.SECTIONS[kind.name].title, *glossary.aligned(marked_rows(table))]


def marked_rows(table: pd.DataFrame) -> list[list[str]]:
    """The batch kind's table's cells, header first, with '± half-width' after the rates and '~' after a percentile
    with too few samples for an interval."""
    kind = table_kind(table) or kinds.EMBEDDINGS
    section = glossary.SECTIONS[kind.name]
    names = [c.name for c, _ in section.shown()]
    rows = glossary.console_rows(table, kind.name)
    for cells, r in zip(rows[1:], table.to_dict(orient="records")):
        for rate in (kind.item_rate, "prompt_tok_s"):
            i = names.index(rate)
            hw = half_width(r, rate)
            if cells[i] != "-" and not math.isnan(hw):
                cells[i] += f" ±{hw:.1f}"
        for name, q in E2E_QUANTILES:
            i = names.index(name)
            if cells[i] != "-" and _few(r, q):
                cells[i] += FEW_MARK
    return rows


def _as_float(v: object) -> float:
    try:
        return math.nan if v is None else float(v)
    except (TypeError, ValueError):
        return math.nan
