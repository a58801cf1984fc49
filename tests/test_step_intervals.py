"""Intervals and suspect-step checks of the step table, on records with known answers: every interval is the one
analysis/uncertainty.py gives on the step's raw values, a percentile with too few samples is marked so (NaN bounds,
few_samples, `~` on the console), a drifting step is unstable, a step far below its neighbours is an outlier."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from vllm_loadtest.analysis import glossary
from vllm_loadtest.analysis.batch import BATCH_COLUMNS
from vllm_loadtest.analysis.reasoning import REASONING_COLUMNS
from vllm_loadtest.analysis.steps import FEW_MARK, UNCERTAINTY_COLUMNS, format_table, outlier_column, step_table
from vllm_loadtest.analysis.uncertainty import batch_count, batch_means, quantile_interval, rate_interval, t_interval

from tests.helpers.records import frame, rec

pytestmark = pytest.mark.unit

TTFT, ITL, TOKENS = 0.02, 0.01, 11  # e2e = 0.02 + 10 * 0.01 = 0.12 s


def closed_loop(
    step: int,
    users: int,
    start: float,
    end: float,
    cycle: float = 0.125,
    first_id: int = 0,
    slow_after: float | None = None,
) -> list[dict]:
    """`users` users sending back to back from start to end; after `slow_after`, each request takes twice as long."""
    rows, i = [], first_id
    for u in range(users):
        t = start + u * cycle / users  # out of phase, as after a warm-up
        while t < end:
            slow = slow_after is not None and t >= slow_after
            itl = ITL * (2 if slow else 1)
            rows.append(rec(i, step, users, t, TTFT + 0.001 * (i % 7), TOKENS, itl, warmup=t < start + 2))
            t += cycle + (TOKENS - 1) * (itl - ITL)
            i += 1
    return rows


def timeline(*users: int, duration: float = 20.0, warmup: float = 2.0) -> list[dict]:
    return [{"step": i, "users": u, "start_time": i * duration, "measure_start": i * duration + warmup,
             "end_time": (i + 1) * duration} for i, u in enumerate(users)]  # fmt: skip


def test_every_interval_is_the_uncertainty_modules_on_the_steps_raw_values():
    records = frame(closed_loop(0, 4, 0.0, 20.0))
    t = step_table(records, timeline(4))
    row = t.iloc[0]
    tail = UNCERTAINTY_COLUMNS + REASONING_COLUMNS + BATCH_COLUMNS
    assert list(t.columns[-len(tail) :]) == tail
    measured = records[~records["warmup"] & (records["start_time"] + records["duration_s"] <= 20.0)]  # not cut off
    end = records["start_time"] + records["e2e_s"]
    done = (end >= 2.0) & (end < 20.0)
    k = batch_count(18.0, float(measured["e2e_s"].median()))
    tokens = records["output_tokens"].astype(float)
    assert row.aggregate_tok_s == pytest.approx(batch_means(end[done], tokens[done], 2.0, 20.0, k).value)  # unchanged
    agg = rate_interval(records["start_time"], end, tokens, 2.0, 20.0, k)
    assert (row.aggregate_tok_s_ci_low, row.aggregate_tok_s_ci_high) == pytest.approx((agg.low, agg.high))
    assert row.aggregate_tok_s_ci_low < row.aggregate_tok_s < row.aggregate_tok_s_ci_high
    e2e = t_interval(measured["e2e_s"])
    assert (row.e2e_mean_s_ci_low, row.e2e_mean_s_ci_high) == pytest.approx((e2e.low, e2e.high))
    per = t_interval(measured["output_tokens"] / measured["e2e_s"])
    assert (row.per_request_tok_s_mean_ci_low, row.per_request_tok_s_mean_ci_high) == pytest.approx((per.low, per.high))
    p50 = quantile_interval(measured["ttft_s"], 0.5)
    assert (row.ttft_p50_s_ci_low, row.ttft_p50_s_ci_high) == (p50.low, p50.high)
    assert row.ttft_p50_s_ci_low <= row.ttft_p50_s <= row.ttft_p50_s_ci_high
    # ~576 requests: enough for the p95 (200) but not for the p99 (1000); TPOT is constant: p50 = p95 = its bounds.
    assert row.few_samples == "ttft_p99_s tpot_p99_s"  # TPOT p99 has no interval columns, but is marked too
    assert math.isnan(row.ttft_p99_s_ci_low) and math.isnan(row.ttft_p99_s_ci_high) and not math.isnan(row.ttft_p99_s)
    assert row.ttft_p95_s_ci_low <= row.ttft_p95_s <= row.ttft_p95_s_ci_high
    assert row.tpot_p95_s_ci_low == pytest.approx(ITL) and row.tpot_p95_s_ci_high == pytest.approx(ITL)
    assert row.stable and row.outlier is None  # steady; a single step has no neighbours
    assert row.aggregate_tok_s_first_half == pytest.approx(row.aggregate_tok_s, rel=0.03)


def test_a_step_with_few_requests_has_no_percentile_intervals_and_the_console_says_so():
    records = frame(closed_loop(0, 1, 0.0, 4.0))  # ~16 measured requests: too few even for a p50 interval (20)
    t = step_table(records, timeline(1, duration=4.0))
    row = t.iloc[0]
    few = row.few_samples.split()
    assert few == ["ttft_p50_s", "ttft_p95_s", "ttft_p99_s", "tpot_p50_s", "tpot_p95_s", "tpot_p99_s"]
    assert all(math.isnan(row[f"{c}_ci_low"]) for c in few[:-1])  # TPOT p99 has no interval columns
    assert f"{row.tpot_p99_s * 1000:.1f}{FEW_MARK}" in format_table(t).splitlines()[2]
    text = format_table(t)
    line = text.splitlines()[2]
    assert f"{row.ttft_p50_s * 1000:.1f}{FEW_MARK}" in line and f"{row.tpot_p95_s * 1000:.1f}{FEW_MARK}" in line
    hw = (row.aggregate_tok_s_ci_high - row.aggregate_tok_s_ci_low) / 2
    assert f"{row.aggregate_tok_s:.1f} ±{hw:.1f}" in line
    assert "± the half-width of the 95 % interval" in text.splitlines()[0]


def test_a_step_whose_throughput_drifts_inside_its_window_is_unstable():
    records = frame(closed_loop(0, 4, 0.0, 20.0, slow_after=11.0))  # twice as slow from mid-window on
    row = step_table(records, timeline(4)).iloc[0]
    assert row.stable is not None and not row.stable
    assert row.aggregate_tok_s_second_half < 0.7 * row.aggregate_tok_s_first_half
    steady = step_table(frame(closed_loop(0, 4, 0.0, 20.0)), timeline(4)).iloc[0]
    text = format_table(pd.DataFrame([row, steady]))
    assert text.splitlines()[1].split()[-1] == "stable"
    assert text.splitlines()[2].endswith("UNSTABLE") and not text.splitlines()[3].endswith("UNSTABLE")


def test_without_intervals_the_console_shows_the_values_alone():
    t = step_table(frame(closed_loop(0, 1, 0.0, 2.6)), timeline(1, duration=2.6))  # 0.6 s window: < 5 batches
    row = t.iloc[0]
    assert math.isnan(row.aggregate_tok_s_ci_low) and row.stable is None
    line = format_table(t).splitlines()[2]
    assert f"{row.aggregate_tok_s:.1f} ±" not in line and f"{row.aggregate_tok_s:.1f}" in line


def test_the_outlier_column_flags_a_step_far_below_its_neighbours_and_leaves_the_ends_unjudged():
    t = pd.DataFrame({"step": [0, 1, 2, 3], "users": [1, 2, 4, 8], "aggregate_tok_s": [100.0, 90.0, 400.0, 800.0]})
    assert outlier_column(t) == [None, True, False, None]
    assert outlier_column(t.iloc[:2]) == [None, None]
    rates = t.assign(users=[50] * 4, rate_rps=[1.0, 2.0, 4.0, 8.0]).iloc[[2, 0, 3, 1]]  # keyed on the rate, any order
    assert outlier_column(rates) == [False, None, None, True]
    shown = format_table(t.assign(outlier=outlier_column(t), stable=[True, True, None, True]))
    lines = shown.splitlines()
    assert lines[1].split()[-1] == "outlier" and lines[3].endswith("OUTLIER") and "UNSTABLE" not in shown


def test_the_uncertainty_columns_are_declared_in_their_own_section_after_the_open_loop_columns():
    names = glossary.names(glossary.UNCERTAINTY)
    assert names == UNCERTAINTY_COLUMNS and names[:2] == ["aggregate_tok_s_ci_low", "aggregate_tok_s_ci_high"]
    for base in ("per_request_tok_s_mean", "e2e_mean_s", "ttft_p50_s", "ttft_p95_s", "ttft_p99_s", "tpot_p50_s",
                 "tpot_p95_s"):  # fmt: skip
        assert {f"{base}_ci_low", f"{base}_ci_high"} <= set(names)
    assert glossary.STEP_TABLE["stable"].show(False) == "UNSTABLE" and glossary.STEP_TABLE["stable"].show(True) == "ok"
    assert glossary.STEP_TABLE["outlier"].show(True) == "OUTLIER" and glossary.STEP_TABLE["outlier"].show(None) == "-"
    keys = list(glossary.COLUMNS)
    last_open_loop = max(i for i, (s, _) in enumerate(keys) if s == glossary.OPEN_LOOP)
    assert min(i for i, (s, _) in enumerate(keys) if s == glossary.UNCERTAINTY) > last_open_loop
    assert np.isfinite(1.0)
