"""Embeddings after the records (issue 19): steps.csv's embeddings section with known values and intervals that
cover the truth, the knee looked for on inputs/s (a slow step left out, not a knee), the console's Embeddings table
in place of the empty batching curve, nothing saying "0 tok/s", the report's inputs/s curve without empty TTFT
charts, the integrity check on requests and prompt tokens, summary.json and summary.md, and --slo objectives an
embeddings request has no value of refused before any load.

The run directories are hand-made: records written with RecordWriter, a run.json, a metrics.jsonl, then finish_run."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from vllm_loadtest.analysis import glossary as g
from vllm_loadtest.analysis.batch import BATCH_COLUMNS, EMBEDDINGS_COLUMNS, batch_row, batch_spans, console_lines
from vllm_loadtest.analysis.energy import ENERGY_COLUMNS
from vllm_loadtest.analysis.finish import finish_run
from vllm_loadtest.analysis.gpu import GPU_COLUMNS
from vllm_loadtest.analysis.lora import LORA_COLUMNS
from vllm_loadtest.analysis.records import RecordWriter, RequestRecord
from vllm_loadtest.analysis.server_metrics import GENERATION_TOKENS, SUCCESS, scrape_line
from vllm_loadtest.analysis.slo import check_endpoint, parse_slo
from vllm_loadtest.analysis.spec_decode import SPEC_COLUMNS
from vllm_loadtest.analysis.steps import step_table

from tests.helpers.badinput import first_error
from tests.helpers.records import make_record

pytestmark = pytest.mark.unit

T0 = 1_700_000_000.0
STEP_S, WARMUP_S = 30.0, 2.0
BATCH, TOKENS_PER_INPUT = 4, 64


def service_s(users: int) -> float:
    """A server that batches up to 4 requests at once: E2E flat to 4 users, then growing with the queue."""
    return 0.02 * max(1.0, users / 4)


def write_embeddings_run(
    run_dir,
    loads=(1, 2, 4, 8, 16),
    slow: dict | None = None,
    errors_every: int = 0,
    seed: int = 19,
    extra_ok=0,
    service=service_s,
    drift: dict | None = None,
    cut_off_counted: int | None = None,
):
    """A closed-loop embeddings run: each user sends BATCH inputs per request back to back; `slow` {users: factor}
    slows one step (something else on the machine); every `errors_every`-th request fails. The server's counters
    in metrics.jsonl count the ok requests' inputs, as vLLM counts one finished request per input (+ extra_ok
    requests from another client), and their prompt tokens."""
    rng = np.random.default_rng(seed)
    writer = RecordWriter(run_dir / "records" / "local.jsonl")
    timeline, i, ok_count, prompt_total = [], 0, 0, 0
    for step, users in enumerate(loads):
        start = T0 + step * STEP_S
        timeline.append({"step": step, "users": users, "rate_rps": None, "start_time": start,
                         "measure_start": start + WARMUP_S, "end_time": start + STEP_S,
                         "end_reason": "fixed"})  # fmt: skip
        factor = (slow or {}).get(users, 1.0)
        for _u in range(users):
            t = start + rng.uniform(0, 0.01)
            while True:
                late = t > start + (STEP_S + WARMUP_S) / 2  # `drift` {users: factor}: the second half slower
                e2e = service(users) * factor * (drift or {}).get(users, 1.0) ** late * rng.uniform(0.85, 1.15)
                if t + e2e >= start + STEP_S:
                    break
                failed = errors_every and i % errors_every == errors_every - 1
                prompt = BATCH * TOKENS_PER_INPUT
                writer.write(
                    RequestRecord(
                        request_id=f"e{i}", worker="w", step=step, users=users, warmup=t < start + WARMUP_S,
                        start_time=t, endpoint="embeddings", model="m",
                        status="error" if failed else "ok", error_type="http_500" if failed else None,
                        error="HTTP 500" if failed else None,
                        e2e_s=None if failed else e2e, duration_s=e2e,
                        prompt_tokens=None if failed else prompt, inputs=BATCH, chunks=0,
                        chunk_offsets_s=[], chunk_tokens=[],
                    )
                )  # fmt: skip
                if not failed:
                    ok_count += 1
                    prompt_total += prompt
                i += 1
                t += e2e + 0.0005
    end = T0 + len(loads) * STEP_S
    if cut_off_counted is not None:  # one request in flight at the stop, of which the server pooled some inputs
        writer.write(RequestRecord(
            request_id="cut", worker="w", step=len(loads) - 1, users=loads[-1], warmup=False, start_time=end - 0.01,
            endpoint="embeddings", model="m", status="error", error_type="cut_off", error="stopped", inputs=BATCH,
        ))  # fmt: skip
        extra_ok = cut_off_counted / BATCH
    writer.close()
    with open(run_dir / "metrics.jsonl", "wb") as f:
        last = (end + 1, (ok_count + extra_ok) * BATCH, prompt_total + int(extra_ok * 256))
        for t, done, prompt in ((T0 - 1, 0, 0), last):
            lab = {"model_name": "m"}
            f.write(scrape_line(t, [(SUCCESS, {**lab, "finished_reason": "stop"}, float(done)),
                                    (GENERATION_TOKENS, lab, 0.0),
                                    ("vllm:prompt_tokens_total", lab, float(prompt))]))  # fmt: skip
    options = {"host": "http://fake", "endpoint": "embeddings", "batch_size": BATCH, "max_error_rate": "100%"}
    run = {"started_at": T0, "finished_at": end, "timeline": timeline, "options": options}
    (run_dir / "run.json").write_text(json.dumps(run))
    return run_dir


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    console: list[str] = []
    outcome = finish_run(write_embeddings_run(tmp_path_factory.mktemp("emb")), echo=console.append)
    return outcome, "\n".join(console)


def truth_inputs_per_s(users: int) -> float:
    """Users each completing BATCH inputs every service_s (plus the 0.5 ms gap), on average."""
    return users * BATCH / (service_s(users) + 0.0005)


def test_steps_csv_ends_with_the_embeddings_section_in_the_contracts_order(finished):
    outcome, _ = finished
    csv = pd.read_csv(outcome.run_dir / "steps.csv")
    tail = BATCH_COLUMNS + GPU_COLUMNS + ENERGY_COLUMNS + LORA_COLUMNS + SPEC_COLUMNS  # GPU (20); 35's
    assert list(csv.columns[-len(tail) :]) == tail
    assert EMBEDDINGS_COLUMNS[:15] == [
        "inputs_per_s", "prompt_tok_s", "e2e_p50_s", "e2e_p95_s", "e2e_p99_s",
        "inputs_per_s_ci_low", "inputs_per_s_ci_high", "prompt_tok_s_ci_low", "prompt_tok_s_ci_high",
        "e2e_p50_s_ci_low", "e2e_p50_s_ci_high", "e2e_p95_s_ci_low", "e2e_p95_s_ci_high",
        "e2e_p99_s_ci_low", "e2e_p99_s_ci_high",
    ]  # fmt: skip


def test_rates_are_near_the_truth_inside_their_intervals_and_tok_s_is_missing_not_zero(finished):
    outcome, _ = finished
    t = outcome.table
    for _, r in t.iterrows():
        truth = truth_inputs_per_s(int(r["users"]))
        assert r["inputs_per_s"] == pytest.approx(truth, rel=0.05)
        assert r["inputs_per_s_ci_low"] < r["inputs_per_s"] < r["inputs_per_s_ci_high"]
        assert r["inputs_per_s_ci_low"] <= truth * 1.02 and truth * 0.98 <= r["inputs_per_s_ci_high"]
        assert r["prompt_tok_s"] == pytest.approx(r["inputs_per_s"] * TOKENS_PER_INPUT)
        assert r["e2e_p50_s"] == pytest.approx(service_s(int(r["users"])), rel=0.05)
        assert r["e2e_p95_s_ci_low"] <= r["e2e_p95_s"] <= r["e2e_p95_s_ci_high"]
        assert math.isnan(r["aggregate_tok_s"]) and math.isnan(r["output_tokens"])
        assert math.isnan(r["ttft_p50_s"]) and math.isnan(r["tpot_p95_s"])
        assert r["stable"] is True or r["stable"] == True  # noqa: E712 (steady by construction)


def test_the_knee_is_on_inputs_per_s_and_nothing_says_tok_s(finished):
    outcome, console = finished
    d = outcome.diagnosis
    # 1 -> 2 -> 4 users: inputs/s doubles; 8 and 16 users: flat (the server batches 4 at once).
    assert d.knee_users == 4 and d.knee_range == [4, 8]
    text = " ".join(d.text)
    assert "Embeddings throughput (inputs/s) flattens at 4 users" in text and "inputs/s" in text
    assert "tok/s" not in text and not d.outlier_steps and not d.unstable_steps
    assert "0 tok/s" not in console and "nan" not in console.lower().replace("finance", "")


def test_a_slow_step_is_an_outlier_on_inputs_per_s_not_a_knee(tmp_path):
    loads = (1, 2, 4, 8, 16, 32)

    # A saturating server at 16 users slowed by half there (something else on the machine): 8 -> 16 -> 32.
    def service(users: int) -> float:
        return 0.02 * max(1.0, users / 16)

    outcome = finish_run(write_embeddings_run(tmp_path, loads, slow={8: 2.0}, service=service))
    d = outcome.diagnosis
    step8 = int(outcome.table.loc[outcome.table["users"] == 8, "step"].iloc[0])
    assert d.outlier_steps == [step8]
    assert d.knee_users == 16
    assert any("ran slower than the steps around it imply" in line and "inputs/s" in line for line in d.text)
    assert outcome.table.loc[outcome.table["users"] == 8, "outlier"].iloc[0] == True  # noqa: E712


def test_the_console_shows_the_embeddings_table_in_place_of_the_batching_curve(finished):
    outcome, console = finished
    assert "Embeddings (inputs/s and prompt tok/s" in console and "Batching curve" not in console
    header = next(line for line in console.splitlines() if line.lstrip().startswith("step  users"))
    for word in ("reqs", "errors", "inputs/s", "prompt tok/s", "E2E p50", "p95", "p99"):
        assert word in header
    row = console.splitlines()[console.splitlines().index(header) + 1]
    assert " ±" in row  # the rates carry their interval's half-width
    shown = console.splitlines()[console.splitlines().index(header) :][: len(outcome.table) + 1]
    # The kind's table, then the columns every step table ends with (stable: ok, UNSTABLE or -).
    assert all(line.startswith(kind) for kind, line in zip(console_lines(outcome.table)[1:], shown))
    assert shown[0].endswith("stable") and {line.split()[-1] for line in shown[1:]} <= {"ok", "UNSTABLE", "-"}


def test_a_chat_run_has_no_embeddings_table_and_its_prompt_rate(tmp_path):
    rows = [make_record(i, start_time=1000.0 + i * 0.2, prompt_tokens=3) for i in range(60)]
    records = pd.DataFrame([{f: getattr(r, f) for f in RequestRecord.__dataclass_fields__} for r in rows])
    timeline = [{"step": 0, "users": 1, "start_time": 1000.0, "measure_start": 1000.0, "end_time": 1012.0}]
    table = step_table(records, timeline)
    assert console_lines(table) == []
    assert math.isnan(table["inputs_per_s"].iloc[0])
    done = ((records["start_time"] + records["e2e_s"]) < 1012.0).sum()
    assert table["prompt_tok_s"].iloc[0] == pytest.approx(3 * done / 12.0)
    assert table["aggregate_tok_s"].iloc[0] > 0


def test_errors_are_counted_and_left_out_of_the_rates(tmp_path):
    outcome = finish_run(write_embeddings_run(tmp_path, (1, 2, 4), errors_every=10))
    t = outcome.table
    assert (t["errors"] > 0).all()
    for _, r in t.iterrows():
        # 1 in 10 requests failed: the ok inputs/s is ~90 % of the clean server's.
        assert r["inputs_per_s"] == pytest.approx(0.9 * truth_inputs_per_s(int(r["users"])), rel=0.06)
    assert outcome.integrity["requests_match"] and outcome.integrity["prompt_tokens_match"]


def test_the_integrity_check_compares_requests_and_prompt_tokens(finished, tmp_path):
    outcome, console = finished
    check = outcome.integrity
    assert check["available"] and check["requests_match"] and check["prompt_tokens_match"]
    assert not check["mismatch"]
    assert any(line.startswith("Prompt tokens: the ") for line in check["text"])
    assert "Output tokens: do not apply" in console and "0 output tokens" not in console
    other = finish_run(write_embeddings_run(tmp_path, (1, 2), extra_ok=3)).integrity
    assert other["mismatch"] and other["text"][0].startswith("MISMATCH") and f"+{3 * BATCH}" in other["text"][0]
    assert other["text"][1].startswith("MISMATCH") and "+768" in other["text"][1]


def test_inputs_the_server_pooled_from_a_request_cut_off_at_the_stop_are_no_mismatch(tmp_path):
    # vLLM finishes (and counts) the inputs of a cut-off request it had already pooled: between the ok inputs and
    # the ok plus the cut-off request's inputs is what the stop explains; beyond that is a mismatch.
    within = finish_run(write_embeddings_run(tmp_path / "a", (1, 2), cut_off_counted=BATCH - 1)).integrity
    assert not within["requests_match"] and within["requests_within"] and not within["mismatch"]
    assert within["text"][0].startswith("Requests: the server finished") and "account for" in within["text"][0]
    beyond = finish_run(write_embeddings_run(tmp_path / "b", (1, 2), cut_off_counted=BATCH + 1)).integrity
    assert beyond["mismatch"] and beyond["text"][0].startswith("MISMATCH")


def test_summary_json_and_md_carry_the_per_step_embeddings_numbers(finished):
    outcome, _ = finished
    summary = json.loads((outcome.run_dir / "summary.json").read_text())
    first = summary["steps"][0]
    assert first["inputs_per_s"] == pytest.approx(outcome.table["inputs_per_s"].iloc[0])
    assert first["aggregate_tok_s"] is None  # missing, not 0
    assert summary["output_tokens"] is None and summary["embeddings"]["batch_size"] == BATCH
    ok = outcome.records[outcome.records["status"] == "ok"]
    assert summary["embeddings"]["inputs"] == BATCH * len(ok)
    assert summary["embeddings"]["prompt_tokens"] == BATCH * TOKENS_PER_INPUT * len(ok)
    md = (outcome.run_dir / "summary.md").read_text()
    assert "| inputs/s | prompt tok/s | E2E p50 | E2E p95 |" in md


def test_the_report_plots_inputs_per_s_and_has_no_ttft_charts(finished):
    outcome, _ = finished
    page = (outcome.run_dir / "report.html").read_text()
    slash = "\\u002f"  # plotly's JSON writes "/" so
    assert f"Batching curve (embeddings: inputs{slash}s and E2E)" in page
    assert "TTFT CDF" not in page and "TPOT (ms)" not in page and "E2E CDF (ms)" in page
    assert f"aggregate tok{slash}s" not in page and f'"title":{{"text":"inputs{slash}s"}}' in page.replace(" ", "")
    # The workload states the batch, not a max_tokens the requests never carried.
    assert f"--batch-size {BATCH} inputs per request" in page and "max_tokens per request" not in page
    # The step table leaves out the columns that do not apply and shows the embeddings ones.
    assert g.STEP_TABLE["inputs_per_s"].title in page and g.STEP_TABLE["ttft_p50_s"].title not in page


def test_embeddings_row_missing_without_inputs_and_without_a_window():
    ok = pd.DataFrame({"e2e_s": [0.1] * 30, "status": ["ok"] * 30})
    records = ok.assign(start_time=np.arange(30.0), inputs=None, prompt_tokens=None)
    row = batch_row(ok, batch_spans(records), 0.0, 30.0)
    assert math.isnan(row["inputs_per_s"]) and math.isnan(row["prompt_tok_s"])
    assert row["e2e_p50_s"] == pytest.approx(0.1)
    assert math.isnan(batch_row(ok, batch_spans(records.assign(inputs=2)), 5.0, 5.0)["inputs_per_s"])


@pytest.mark.parametrize("objective", ["ttft_p95=500ms", "ttfo_p50=1s", "tpot_p95=50ms", "itl_p99=20ms"])
def test_streaming_objectives_are_refused_with_embeddings(objective):
    with pytest.raises(ValueError, match="cannot be judged with --endpoint embeddings"):
        check_endpoint(parse_slo(f"e2e_p95=1s,{objective}"), "embeddings")
    check_endpoint(parse_slo(objective), "chat")  # fine on a streaming endpoint
    check_endpoint(parse_slo("e2e_p95=200ms,error_rate=1%"), "embeddings")


def test_the_refusal_is_one_line_before_any_load():
    line = first_error("--endpoint", "embeddings", "--slo", "ttft_p95=500ms", "--dataset", "synthetic:16")
    assert "--slo ttft_p95 cannot be judged with --endpoint embeddings" in line and "e2e_p95=" in line


def test_the_e2e_slo_gate_judges_an_embeddings_run(tmp_path):
    run_dir = write_embeddings_run(tmp_path, (1, 4, 16))
    run = json.loads((run_dir / "run.json").read_text())
    run["options"]["slo"] = "e2e_p95=50ms"
    (run_dir / "run.json").write_text(json.dumps(run))
    gate = finish_run(run_dir).slo
    met = {s["users"]: s["e2e_p95_met"] for s in gate["steps"]}
    assert met == {1: True, 4: True, 16: False} and not gate["passed"]


def test_a_step_that_slowed_halfway_is_unstable_on_inputs_per_s(tmp_path):
    outcome = finish_run(write_embeddings_run(tmp_path, (1, 2, 4, 8, 16), drift={2: 1.6}))
    t = outcome.table.set_index("users")
    assert t.loc[2, "stable"] == False  # noqa: E712
    assert t.loc[2, "inputs_per_s_first_half"] > 1.4 * t.loc[2, "inputs_per_s_second_half"]
    assert all(t.loc[u, "stable"] == True for u in (1, 4, 8, 16))  # noqa: E712
    lines = [line for line in outcome.diagnosis.text if "was not steady" in line]
    assert len(lines) == 1 and "The 2-user step" in lines[0] and "inputs/s" in lines[0] and "tok/s" not in lines[0]


def test_the_live_view_shows_inputs_per_s_prompt_tok_s_and_e2e_p95(tmp_path):
    from vllm_loadtest.analysis.live import LiveRecords, live_table
    from vllm_loadtest.analysis.records import parse_lines
    from vllm_loadtest.locustfiles.webui import _row

    run_dir = write_embeddings_run(tmp_path, (1, 2))
    live = LiveRecords()
    live.add_rows(parse_lines((run_dir / "records" / "local.jsonl").read_bytes()))
    timeline = json.loads((run_dir / "run.json").read_text())["timeline"]
    timeline[-1]["end_time"] = None  # the last step still running
    table, whole = live_table(live.frame(), timeline, now=T0 + 2 * STEP_S)
    final = finish_run(run_dir).table
    assert table["inputs_per_s"].tolist() == pytest.approx(final["inputs_per_s"].tolist())
    assert table["prompt_tok_s"].tolist() == pytest.approx(final["prompt_tok_s"].tolist())
    row = _row("current step", table.iloc[-1].to_dict(), {})
    assert row["inputs_per_s"] == f"{final['inputs_per_s'].iloc[-1]:.1f}"
    assert row["e2e_p95_ms"] == f"{final['e2e_p95_s'].iloc[-1] * 1000:.1f}"
    assert row["aggregate_tok_s"] == "-" and whole["inputs_per_s"] > 0


def test_two_embeddings_runs_are_compared_on_inputs_per_s_prompt_tok_s_and_e2e_p95(tmp_path):
    from vllm_loadtest.analysis.compare import compare_runs

    base = finish_run(write_embeddings_run(tmp_path / "a", (1, 4))).table
    slower = finish_run(write_embeddings_run(tmp_path / "b", (1, 4), slow={4: 1.3}, seed=5)).table
    c = compare_runs(slower, base, "b", "a")
    assert c.metrics == (("inputs_per_s", "inputs/s"), ("prompt_tok_s", "prompt tok/s"), ("e2e_p95_s", "E2E p95"))
    at1, at4 = c.steps
    assert all(d.significant is False for d in at1.differences[:2])  # the same server at 1 user: within the noise
    inputs = at4.differences[0]
    assert inputs.significant and inputs.relative == pytest.approx(1 / 1.3 - 1, abs=0.03)
    assert "inputs/s: -2" in at4.line() and "tok/s" not in at4.line().replace("prompt tok/s", "")


def test_the_live_charts_data_carry_inputs_per_s_and_e2e_p95_over_time(tmp_path):
    from vllm_loadtest.analysis import live_charts

    run_dir = write_embeddings_run(tmp_path, (1, 2))
    outcome = finish_run(run_dir)
    timeline = outcome.run["timeline"]
    data = live_charts.chart_data(outcome.table, timeline, outcome.records, None, T0 + 60.0, "stopped")
    assert data["items"] == {"kind": "embeddings", "unit": "inputs/s", "label": "Inputs/s"}  # the page's labels
    for point, (_, row) in zip(data["steps"], outcome.table.iterrows()):
        assert point["items_per_s"] == pytest.approx(row["inputs_per_s"])
        assert point["items_ci_low"] == pytest.approx(row["inputs_per_s_ci_low"])
        assert point["e2e_p95_s"] == pytest.approx(row["e2e_p95_s"])
        assert point["aggregate_tok_s"] is None  # missing, not 0
    e2e = [v for v in data["latency"]["e2e_p95_s"] if v is not None]
    assert e2e and all(0.015 < v < 0.03 for v in e2e)  # 20-23 ms at 1 and 2 users
    assert all(v is None for v in data["latency"]["ttft_p95_s"])
    json.loads(live_charts.to_json(data))  # strict JSON: no NaN
