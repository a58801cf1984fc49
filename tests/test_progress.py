"""The console's line per step (analysis/progress.py): always the same columns, from the step's own records."""

import pandas as pd
import pytest
from vllm_loadtest.analysis import progress
from vllm_loadtest.analysis.records import RequestRecord

pytestmark = pytest.mark.unit


def records(n: int, step: int, users: int, start: float, inputs: int | None = None) -> pd.DataFrame:
    rows = []
    for i in range(n):
        r = RequestRecord(request_id=f"{step}-{i}", worker="w", step=step, users=users, warmup=False,
                          endpoint="completions", model="m", start_time=start + i * 0.1, status="ok")  # fmt: skip
        if inputs is None:
            r.ttft_s, r.e2e_s, r.tpot_s, r.output_tokens = 0.05, 0.2, 0.01, 16
            r.chunk_offsets_s, r.chunk_tokens = [0.05 + 0.01 * k for k in range(16)], [1] * 16
        else:
            r.endpoint, r.e2e_s, r.inputs, r.prompt_tokens = "embeddings", 0.02, inputs, 8 * inputs
        r.duration_s = r.e2e_s
        rows.append({f: getattr(r, f) for f in RequestRecord.__dataclass_fields__})
    return pd.DataFrame(rows)


STEP = {"step": 0, "users": 2, "start_time": 1000.0, "measure_start": 1001.0, "end_time": 1011.0}


def test_a_step_line_has_the_same_columns_as_its_header():
    table, row = progress.step_row(records(80, 0, 2, 1001.0), STEP)
    head, line = progress.header(table), progress.line(table, row)
    assert head.split()[:4] == ["step", "users", "reqs", "errors"] and head.endswith("(latencies in ms)")
    cells = line.split()
    assert cells[:4] == ["0", "2", "80", "0"] and cells[5].startswith("±")  # tok/s with its half-width
    assert cells[6:10] == ["50.0", "50.0", "10.0", "10.0"] and cells[-1] in ("ok", "UNSTABLE", "-")
    # Right-aligned in fixed widths: each line starts where the header does and the stable column ends with it.
    assert len(line) == len(head) - len("   (latencies in ms)")


def test_a_batch_kind_shows_its_item_rate_and_no_token_latencies():
    table, row = progress.step_row(records(60, 0, 2, 1001.0, inputs=4), STEP)
    assert progress.columns(table)[4] == "inputs_per_s"
    cells = progress.line(table, row).split()
    assert cells[6:10] == ["-", "-", "-", "-"]  # no TTFT or TPOT: missing, not 0


def test_a_step_without_a_finished_request_has_no_line():
    assert progress.step_row(records(5, 1, 4, 1001.0), STEP) is None
    assert progress.step_row(records(0, 0, 2, 1001.0), STEP) is None
