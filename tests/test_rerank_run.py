"""--endpoint rerank end to end (issue 33): a real `locust` process against the fake server's rerank API, two steps
of a query and 4 documents per request (consecutive texts of synthetic:16), top_n 2, through the Cohere-style path.

Checked against the server's truth log: every request carried its query and 4 documents, asked top_n 2 and got 2
results; the records say `documents`, the prompt tokens are the server's; steps.csv has documents/s (with its
interval) and E2E percentiles, and no tok/s, TTFT or TPOT; the console shows the Rerank table; summary.json has
its `rerank` section; the integrity check counts one finished request per document, as vLLM does; an E2E SLO is
judged. Then the failures: a server without the route (one `error:` line before any load), a body that breaks the
contract (bad_response), and options that do not apply (refused)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.helpers.badinput import first_error
from tests.helpers.runs import locust
from tests.helpers.servers import FakeServer

pytestmark = [pytest.mark.contract]

DOCS = 4


@pytest.fixture(scope="module")
def rerank_run(tmp_path_factory):
    server = FakeServer(["--embed-ms", "5", "--embed-per-input-ms", "1"])
    run_dir = tmp_path_factory.mktemp("rerank") / "run"
    try:
        proc = locust(
            "--host", server.url, "--endpoint", "rerank", "--documents", str(DOCS), "--top-n", "2",
            "--rerank-path", "/v2/rerank", "--dataset", "synthetic:16", "--steps", "1,4", "--step-duration", "4s",
            "--step-warmup", "0s", "--slo", "e2e_p95=2s", "--run-dir", str(run_dir), "--print-stats", timeout=120,
        )  # fmt: skip
        yield proc, run_dir, server.get("/truth"), server.get("/prompts")["prompts"], server.get("/stats")
    finally:
        server.stop()


def test_the_run_passes_and_every_request_carries_its_query_and_documents(rerank_run):
    proc, run_dir, truth, prompts, _ = rerank_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "POST     /v2/rerank" in proc.stdout + proc.stderr  # Locust's own table (--print-stats): the path asked
    records = pd.read_parquet(run_dir / "requests.parquet")
    ok = records[records["status"] == "ok"]
    assert len(ok) >= 20 and set(records["endpoint"]) == {"rerank"}
    assert (records["status"] == "ok").sum() + (records["error_type"] == "cut_off").sum() == len(records)
    assert (ok["documents"] == DOCS).all() and ok["inputs"].isna().all()
    t = pd.DataFrame([truth[r] for r in ok["request_id"]], index=ok.index)
    assert (t["documents"] == DOCS).all() and (t["top_n"] == 2).all() and (t["results"] == 2).all()
    assert (ok["prompt_tokens"] == t["prompt_tokens"]).all()  # the server's usage, kept
    sent = [p for p in prompts if p["request_id"] in set(ok["request_id"])]
    assert all(p["path"] == "/v2/rerank" and p["body"]["top_n"] == 2 and len(p["documents"]) == DOCS for p in sent)
    assert all(p["query"] not in p["documents"] for p in sent)  # five consecutive texts: the first is the query


def test_steps_csv_has_documents_per_second_and_e2e_not_tokens(rerank_run):
    _, run_dir, _, _, _ = rerank_run
    steps = pd.read_csv(run_dir / "steps.csv")
    assert list(steps["users"]) == [1, 4]
    for r in steps.to_dict("records"):
        assert r["documents_per_s"] > 0 and r["inputs_per_s"] != r["inputs_per_s"]  # NaN: not an embeddings run
        assert r["documents_per_s_ci_low"] <= r["documents_per_s"] <= r["documents_per_s_ci_high"]
        assert r["prompt_tok_s"] > 0 and r["e2e_p50_s"] >= 0.009  # never before the server's 5 ms + 4 x 1 ms
        for missing in ("aggregate_tok_s", "ttft_p95_s", "tpot_p95_s"):
            assert pd.isna(r[missing]), missing
    # The documents/s of a step is its ok requests' documents completed inside the window, over the window.
    records = pd.read_parquet(run_dir / "requests.parquet")
    run = json.loads((run_dir / "run.json").read_text())
    for entry, r in zip(run["timeline"], steps.to_dict("records")):
        ok = records[records["status"] == "ok"]
        end = ok["start_time"] + ok["e2e_s"]
        inside = (end >= entry["measure_start"]) & (end < entry["end_time"])
        window = entry["end_time"] - entry["measure_start"]
        assert r["documents_per_s"] == pytest.approx(ok.loc[inside, "documents"].sum() / window)


def test_the_console_summary_and_integrity_speak_of_documents(rerank_run):
    proc, run_dir, _, _, stats = rerank_run
    assert "Rerank (documents/s and prompt tok/s" in proc.stdout and "docs/s" in proc.stdout
    assert "0 tok/s" not in proc.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["output_tokens"] is None  # nothing generated: missing, not 0
    section = summary["rerank"]
    assert section["documents_per_request"] == DOCS and section["top_n"] == 2
    assert section["rerank_path"] == "/v2/rerank" and section["documents"] % DOCS == 0
    check = summary["integrity"]
    # The server counts one finished request per document (the probe's 2 documents too), as vLLM does per pair.
    assert check["available"] and check["kind"] == "rerank" and check["client_ok_documents"] == section["documents"]
    answered = stats["documents"] - 2  # the server's, less the preflight's probe
    assert section["documents"] <= answered <= section["documents"] + check["other_documents"]
    assert check["requests_within"] and not check["mismatch"], check
    assert summary["slo"]["objectives"] == {"e2e_p95": 2.0}  # judged on the run's E2E
    assert "documents/s" in (run_dir / "summary.md").read_text()
    page = (run_dir / "report.html").read_text()
    assert "Batching curve (rerank: documents" in page


def test_a_server_without_rerank_is_refused_before_any_load(fake_server, tmp_path):
    server = fake_server("--no-rerank")
    line = first_error("--host", server.url, "--endpoint", "rerank", "--run-dir", str(tmp_path / "run"))
    assert line.startswith(f"error: --endpoint rerank: {server.url}/v1/rerank answered HTTP 404 for model "
                           "'fake-model' (no route POST /v1/rerank); serve a cross-encoder"), line  # fmt: skip
    assert server.get("/stats")["ok"] == 0


def test_a_body_that_breaks_the_contract_is_refused_by_the_preflight(fake_server, tmp_path):
    server = fake_server("--faults", "bad_index=1")
    line = first_error("--host", server.url, "--endpoint", "rerank", "--run-dir", str(tmp_path / "run"))
    assert "answered a body that is not a rerank answer (results[1].index 2 is not one of 0..1 once)" in line, line


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--documents", "3"], "--documents 3 only applies to --endpoint rerank; add it or drop --documents"),
        (["--endpoint", "rerank", "--documents", "0"], "--documents 0 must be at least 1 (documents per request)"),
        (["--endpoint", "rerank", "--top-n", "-1"], "--top-n -1 must be at least 0"),
        (["--endpoint", "rerank", "--batch-size", "2"], "--batch-size 2 only applies to --endpoint embeddings"),
        (["--endpoint", "rerank", "--max-tokens-dist", "uniform:1:4"], "--max-tokens-dist does not apply to"),
        (["--endpoint", "rerank", "--slo", "ttft_p95=1s"], "cannot be judged with --endpoint rerank"),
    ],
)
def test_options_that_do_not_apply_are_refused_with_the_fix(args, error, tmp_path):
    line = first_error("--host", "http://127.0.0.1:9", *args, "--run-dir", str(tmp_path / "run"))
    assert error in line, line
