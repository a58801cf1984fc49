"""The live step table (analysis/live.py): a running step none of whose requests has finished shows nothing measured."""

from __future__ import annotations

import math

import orjson
import pytest
from vllm_loadtest.analysis.live import LiveRecords, live_table
from vllm_loadtest.analysis.records import serialize

from tests.test_intake import record

pytestmark = pytest.mark.unit

T0 = 1.7e9


def test_a_running_step_with_nothing_finished_is_missing_not_zero_and_not_stable():
    live = LiveRecords()
    live.add_rows(
        [
            orjson.loads(serialize(record(i, chunks=8, step=0, users=1, start_time=T0 + i, duration_s=5.0)))
            for i in range(10)
        ]
    )
    timeline = [
        {"step": 0, "users": 1, "start_time": T0, "measure_start": T0, "end_time": T0 + 20},
        {"step": 1, "users": 4, "start_time": T0 + 20, "measure_start": T0 + 20, "end_time": None},  # running
    ]
    table, whole = live_table(live.frame(), timeline, now=T0 + 26)
    first, running = table.iloc[0], table.iloc[1]
    assert first["requests"] == 10 and first["aggregate_tok_s"] > 0
    assert running["requests"] == 0 and running["users"] == 4
    for column in ("aggregate_tok_s", "aggregate_tok_s_ci_low", "ttft_p50_s", "per_request_tok_s_mean"):
        assert math.isnan(running[column]), column
    assert running["stable"] is None
    assert whole["requests"] == 10
    # Once the step has ended, it is the step table's row as at the end of a run (here: 0 tok/s measured).
    timeline[1]["end_time"] = T0 + 26
    ended, _ = live_table(live.frame(), timeline, now=T0 + 27)
    assert ended.iloc[1]["aggregate_tok_s"] == 0
