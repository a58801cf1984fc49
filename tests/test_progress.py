"""The console's line per step (analysis/progress.py): always the same columns, the step table's own numbers, from the
records received by the step's end."""

import math

import pandas as pd
import pytest
from vllm_loadtest.analysis import progress
from vllm_loadtest.analysis.records import RequestRecord
from vllm_loadtest.analysis.steps import step_table

pytestmark = pytest.mark.unit

STEP = {"step": 0, "users": 2, "start_time": 1000.0, "measure_start": 1001.0, "end_time": 1031.0}


def records(n: int, step: int = 0, inputs: int | None = None, start: float = 1000.0) -> list[dict]:
    rows = []
    for i in range(n):
        r = RequestRecord(request_id=f"{step}-{i}", worker="w", step=step, users=2, warmup=start + i * 0.1 < 1001.0,
                          endpoint="completions", model="m", start_time=start + i * 0.1, status="ok")  # fmt: skip
        if inputs is None:
            r.ttft_s, r.output_tokens = 0.04 + 0.001 * (i % 7), 16
            r.tpot_s = 0.008 + 0.0005 * (i % 3)
            r.e2e_s = r.ttft_s + 15 * r.tpot_s
        else:
            r.endpoint, r.e2e_s, r.inputs, r.prompt_tokens = "embeddings", 0.02 + 0.001 * (i % 5), inputs, 8 * inputs
        if i % 29 == 5:
            r.status, r.error_type, r.error, r.output_tokens = "error", "http_500", "boom", None
        r.duration_s = r.e2e_s
        rows.append({f: getattr(r, f) for f in RequestRecord.__dataclass_fields__})
    return rows


def test_a_step_line_has_the_step_tables_numbers():
    rows = records(290)
    steps = progress.Steps()
    steps.add_rows(rows[:150])
    steps.add_rows(rows[100:])  # a worker's copy arriving twice counts once
    row = progress.step_row(steps, STEP)
    table = step_table(pd.DataFrame(rows), [STEP]).iloc[0]
    for name in ("requests", "errors", "ttft_p50_s", "ttft_p95_s", "tpot_p50_s", "tpot_p95_s", "stable"):
        assert row[name] == table[name], name
    assert row["aggregate_tok_s"] == pytest.approx(table["aggregate_tok_s"])
    hw = (table["aggregate_tok_s_ci_high"] - table["aggregate_tok_s_ci_low"]) / 2
    assert row["half_width"] == pytest.approx(hw)


def test_a_line_has_the_same_columns_as_its_header():
    steps = progress.Steps()
    steps.add_rows(records(290))
    row = progress.step_row(steps, STEP)
    head, line = progress.header(steps.kind), progress.line(steps.kind, row)
    assert head.split()[:4] == ["step", "users", "reqs", "errors"] and head.endswith("(latencies in ms)")
    cells = line.split()
    assert cells[:2] == ["0", "2"] and cells[5].startswith("±") and cells[-1] in ("ok", "UNSTABLE", "-")
    assert len(line) == len(head) - len("   (latencies in ms)")  # right-aligned in the header's widths


def test_a_batch_kind_shows_its_item_rate_and_no_token_latencies():
    steps = progress.Steps()
    steps.add_rows(records(290, inputs=4))
    row = progress.step_row(steps, STEP)
    assert progress.columns(steps.kind)[4] == "inputs_per_s" and row["inputs_per_s"] > 0
    assert all(math.isnan(row[name]) for name, _, _ in progress.LATENCIES)  # missing, not 0
    assert progress.line(steps.kind, row).split()[6:10] == ["-", "-", "-", "-"]


def test_a_shown_step_keeps_nothing_and_a_step_without_records_has_no_line():
    steps = progress.Steps()
    steps.add_rows(records(50))
    assert progress.step_row(steps, {**STEP, "step": 1}) is None
    steps.shown_step(STEP)
    assert progress.step_row(steps, STEP) is None and steps.spans == ([], [], [])  # all ended before 1031
    steps.add_rows(records(5))  # late records of a shown step are not kept
    assert not steps.per_step
