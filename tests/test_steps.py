import math

import numpy as np
import pandas as pd
import pytest
from vllm_loadtest.analysis.batch import BATCH_COLUMNS
from vllm_loadtest.analysis.reasoning import REASONING_COLUMNS
from vllm_loadtest.analysis.schedule import OPEN_LOOP_COLUMNS
from vllm_loadtest.analysis.steps import STEP_COLUMNS, UNCERTAINTY_COLUMNS, format_table, percentile, step_table

from tests.helpers.records import TIMELINE, frame, rec

pytestmark = pytest.mark.unit


def test_percentile_is_exact_and_missing_is_nan():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile(list(range(101)), 99) == 99.0
    assert math.isnan(percentile([], 50))
    assert math.isnan(percentile([np.nan], 50))


def test_step_table_excludes_warmup_and_counts_window_tokens():
    rows = [
        rec(0, 0, 1, 1.0, 0.1, 11, 0.01, warmup=True),  # warm-up: excluded from latency stats
        rec(1, 0, 1, 3.0, 0.2, 11, 0.01),
        rec(2, 0, 1, 4.0, 0.4, 11, 0.02),
        rec(3, 0, 1, 5.0, 0.0, 0, 0, status="error", error_type="http_500", duration=0.01),
        rec(4, 1, 2, 13.0, 0.3, 21, 0.01),
        rec(5, 1, 2, 13.5, 0.5, 21, 0.01),
    ]
    t = step_table(frame(rows), TIMELINE)
    tail = UNCERTAINTY_COLUMNS + REASONING_COLUMNS + BATCH_COLUMNS  # each issue's section appended
    assert list(t.columns) == STEP_COLUMNS + OPEN_LOOP_COLUMNS + tail
    s0, s1 = t.iloc[0], t.iloc[1]
    assert (s0.requests, s0.errors, s0.cut_off) == (2, 1, 0)
    assert s0.ttft_p50_s == pytest.approx(0.3)
    assert s0.tpot_p50_s == pytest.approx(0.015)
    # ok requests completing in [2, 10): r1 and r2 (r0 completed at 1.2, before the warm-up ended)
    assert s0.output_tokens == 22 and s0.aggregate_tok_s == pytest.approx(22 / 8.0)
    assert s0.itl_p50_s == pytest.approx(0.015)
    assert s0.e2e_mean_s == pytest.approx(((0.2 + 0.1) + (0.4 + 0.2)) / 2)
    assert s0.per_request_tok_s_mean == pytest.approx((11 / 0.3 + 11 / 0.6) / 2)
    assert (s1.users, s1.requests) == (2, 2)
    assert s1.aggregate_tok_s == pytest.approx(42 / 8.0)


def test_requests_in_flight_at_the_stop_are_cut_off_not_measured():
    rows = [
        rec(1, 1, 2, 13.0, 0.3, 21, 0.01),
        rec(2, 1, 2, 19.9, 0.3, 21, 0.01),  # finishes at 20.5, after the stop began at 20.0
        rec(3, 1, 2, 19.95, 0, 0, 0, status="error", error_type="cut_off", duration=0.05),
    ]
    t = step_table(frame(rows), TIMELINE)
    s1 = t.iloc[1]
    assert (s1.requests, s1.errors, s1.cut_off) == (1, 0, 2)


def test_a_step_without_requests_reports_missing_not_zero():
    t = step_table(frame([rec(1, 0, 1, 3.0, 0.2, 11, 0.01)]), TIMELINE)
    s1 = t.iloc[1]
    assert s1.requests == 0 and math.isnan(s1.ttft_p50_s) and math.isnan(s1.e2e_mean_s)
    assert s1.aggregate_tok_s == 0.0  # a measured window in which no tokens arrived
    text = format_table(t)
    assert "TTFT p50" in text and " - " in text


def test_without_timeline_steps_come_from_records():
    t = step_table(frame([rec(1, 0, 4, 3.0, 0.2, 11, 0.01), rec(2, 0, 4, 3.5, 0.2, 11, 0.01)]), [])
    assert list(t["users"]) == [4] and t.iloc[0].requests == 2


def test_empty_records():
    t = step_table(frame([]), TIMELINE)
    assert list(t["requests"]) == [0, 0]
    assert pd.isna(t.iloc[0].ttft_p99_s)
