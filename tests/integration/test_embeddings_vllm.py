"""Embeddings against the real vLLM: the embedded server with `serve --embed` (the tiny model through vLLM's pooling
runner; the session's `embed_vllm` (tests/helpers/fleet.py); the session's `vllm_server` generates).

What vLLM 0.32 counts for a pooling request (captured in tests/fixtures/vllm-0.32-cpu-embed/): every INPUT of a
/v1/embeddings request is one engine request, so vllm:request_success_total{finished_reason="stop"} rises by the
batch size per HTTP request, and vllm:prompt_tokens_total by the response's usage.prompt_tokens (the sum over the
inputs); vllm:generation_tokens_total does not move. The tiny tokenizer adds no BOS token, so a `synthetic:64`
prompt (cut to 64 tokens with /tokenize, which the pooling server serves too) is 64 prompt tokens in the usage.

Select with `-m vllm`."""

from __future__ import annotations

import json
import urllib.request

import pandas as pd
import pytest
from vllm_loadtest.analysis.records import load_records
from vllm_loadtest.analysis.server_metrics import SUCCESS, counter_total

from tests.helpers.runs import locust
from tests.helpers.vllm import scrape

pytestmark = [pytest.mark.vllm, pytest.mark.contract]

BATCH = 4
PROMPT = 64
PROMPT_TOKENS = "vllm:prompt_tokens_total"


def counters(url: str) -> tuple[float, float]:
    """vllm:request_success_total{finished_reason="stop"} and vllm:prompt_tokens_total."""
    samples = scrape(url)
    stopped = sum(v for name, labels, v in samples if name == SUCCESS and labels.get("finished_reason") == "stop")
    return stopped, counter_total(samples, PROMPT_TOKENS)


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as r:
        return json.loads(r.read())


def test_the_pooling_server_answers_as_the_fixtures_say(embed_vllm):
    """The captured shapes still hold: one vector per input, all the same length; each input one finished request."""
    before = counters(embed_vllm.url)
    texts = ["The quick brown fox jumps over the lazy dog.", "Hello!", "Time to first token.", "La fotosíntesis."]
    answer = post(embed_vllm.url + "/v1/embeddings", {"model": "tiny", "input": texts, "encoding_format": "float"})
    tokenized = [
        post(embed_vllm.url + "/tokenize", {"model": "tiny", "prompt": t})["count"] for t in texts
    ]  # the dataset's exact lengths come from here
    after = counters(embed_vllm.url)
    assert [d["index"] for d in answer["data"]] == list(range(len(texts)))
    assert {len(d["embedding"]) for d in answer["data"]} == {128}  # the tiny model's hidden size
    assert answer["usage"]["prompt_tokens"] == sum(tokenized)
    assert after[0] - before[0] == len(texts)  # per input, not per HTTP request
    assert after[1] - before[1] == sum(tokenized)


def test_a_stepped_embeddings_run_has_inputs_and_prompt_tokens_per_second(embed_vllm, tmp_path):
    run_dir = tmp_path / "run"
    before = counters(embed_vllm.url)
    proc = locust(
        "--host", embed_vllm.url, "--endpoint", "embeddings", "--batch-size", str(BATCH),
        "--dataset", f"synthetic:{PROMPT}", "--steps", "1,4", "--step-duration", "6s", "--step-warmup", "1s",
        "--run-dir", str(run_dir),
        timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    after = counters(embed_vllm.url)

    records = load_records(run_dir)
    ok = records[records["status"] == "ok"]
    # Requests in flight when the run stops are cut off (error_type cut_off), as streams are; nothing else fails.
    cut = records[records["error_type"] == "cut_off"]
    # How many finish in the two 6 s steps is the busy machine's (8 in a stress run): each check below holds for any.
    assert len(ok) > 0 and len(ok) + len(cut) == len(records), records["error"].dropna().unique()
    assert (ok["endpoint"] == "embeddings").all()
    assert (ok["inputs"] == BATCH).all()
    assert (ok["prompt_tokens"] == BATCH * PROMPT).all()  # exact lengths: /tokenize counts as the pooler does
    assert (ok["e2e_s"] > 0).all()
    for column in ("ttft_s", "tpot_s", "output_tokens"):
        assert ok[column].isna().all(), column  # does not apply to a request that does not stream
    # The server's own counters over the run (this module's server has no other client), less the preflight's probe
    # (one input, "hello": locustfiles/preflight.py, sent before the run's first scrape). A request cut off at the
    # stop may still have been pooled to its end (a pooling request of ~64 tokens takes milliseconds), so the server
    # counts between the ok inputs and the ok and cut-off ones.
    probe_tokens = post(embed_vllm.url + "/tokenize", {"model": "tiny", "prompt": "hello"})["count"]
    inputs, prompt = after[0] - before[0] - 1, after[1] - before[1] - probe_tokens
    assert ok["inputs"].sum() <= inputs <= ok["inputs"].sum() + BATCH * len(cut)
    assert ok["prompt_tokens"].sum() <= prompt <= ok["prompt_tokens"].sum() + BATCH * PROMPT * len(cut)

    steps = pd.read_csv(run_dir / "steps.csv")
    assert list(steps["users"]) == [1, 4]
    assert steps["requests"].sum() > 0
    for _, step in steps[steps["requests"] > 0].iterrows():  # a step the busy machine stalled may measure none
        assert step["inputs_per_s"] > 0
        # Every input is PROMPT tokens, and both rates count the same ok requests in the same window.
        assert step["prompt_tok_s"] == pytest.approx(PROMPT * step["inputs_per_s"], rel=1e-9)
        # Too few batches in a window (a loaded machine's slow requests) leave an interval missing, never made up.
        assert pd.isna(step["inputs_per_s_ci_low"]) == pd.isna(step["prompt_tok_s_ci_low"])
        if pd.notna(step["inputs_per_s_ci_low"]):
            assert step["inputs_per_s_ci_low"] <= step["inputs_per_s"] <= step["inputs_per_s_ci_high"]
            assert step["prompt_tok_s_ci_low"] <= step["prompt_tok_s"] <= step["prompt_tok_s_ci_high"]
        assert 0 < step["e2e_p50_s"] <= step["e2e_p95_s"] <= step["e2e_p99_s"]
    # Columns that need streamed tokens are missing, not 0 ("0 tok/s" would read as a dead server).
    assert not (steps["aggregate_tok_s"] == 0).any()

    summary = json.loads((run_dir / "summary.json").read_text())
    check = summary["integrity"]
    assert check["available"], check
    if cut.empty:  # else the server may rightly count more than the ok records (above)
        assert not check["mismatch"], check["text"]
        assert check["requests_match"], check["text"]
