"""--endpoint rerank against the real vLLM: the embedded server with `serve --rerank` (a tiny generated cross-encoder,
LlamaForSequenceClassification with one label, on vLLM 0.32's pooling runner; tests/helpers/fleet.py's
`rerank_vllm`). The answer's shape is vLLM's own (RerankResponse), the server counts one finished request per
document (one engine request per query-document pair), and a short stepped run records every request's documents and
prompt tokens, with the integrity check holding. Select with `-m vllm`."""

from __future__ import annotations

import json
import urllib.request

import pandas as pd
import pytest
from vllm_loadtest.analysis.rerank_response import parse_rerank
from vllm_loadtest.analysis.server_metrics import SUCCESS, counter_total

from tests.helpers.runs import locust
from tests.helpers.vllm import scrape

pytestmark = [pytest.mark.vllm, pytest.mark.contract]

DOCS = 4


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as r:
        return json.loads(r.read())


def finished(url: str) -> float:
    return sum(v for name, labels, v in scrape(url) if name == SUCCESS and labels.get("finished_reason") == "stop")


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank", "/v2/rerank"])
def test_each_rerank_path_answers_vllms_shape_and_counts_each_document(rerank_vllm, path):
    documents = ["The quick brown fox.", "Hello!", "Time to first token.", "La fotosíntesis."]
    before = finished(rerank_vllm.url)
    raw = post(rerank_vllm.url + path, {"model": "tiny", "query": "a fox", "documents": documents, "top_n": 2})
    after = finished(rerank_vllm.url)
    answer = parse_rerank(json.dumps(raw).encode(), len(documents), top_n=2)
    assert answer.error is None and answer.results == 2, raw
    assert answer.prompt_tokens and answer.prompt_tokens > 0, raw
    assert after - before == len(documents)  # per query-document pair, not per HTTP request


def test_a_stepped_rerank_run_records_documents_and_the_integrity_check_holds(rerank_vllm, tmp_path):
    run_dir = tmp_path / "run"
    proc = locust(
        "--host", rerank_vllm.url, "--endpoint", "rerank", "--documents", str(DOCS), "--dataset", "synthetic:16",
        "--steps", "1,4", "--step-duration", "6s", "--step-warmup", "1s", "--no-report", "--run-dir", str(run_dir),
        timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = pd.read_parquet(run_dir / "requests.parquet")
    ok = records[records["status"] == "ok"]
    assert len(ok) > 0 and (ok["documents"] == DOCS).all() and (ok["prompt_tokens"] > 0).all()
    failed = records[records["status"] != "ok"]
    assert (failed["error_type"] == "cut_off").all(), failed["error_type"].value_counts().to_dict()
    summary = json.loads((run_dir / "summary.json").read_text())
    check = summary["integrity"]
    assert check["available"] and check["kind"] == "rerank" and check["requests_within"], check
    prompt_counter = counter_total(scrape(rerank_vllm.url), "vllm:prompt_tokens_total")
    assert prompt_counter >= ok["prompt_tokens"].sum()
    steps = pd.read_csv(run_dir / "steps.csv")
    assert steps["documents_per_s"].notna().all() and steps["aggregate_tok_s"].isna().all()
