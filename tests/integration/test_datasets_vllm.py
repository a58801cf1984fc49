"""A shared-prefix workload against the real vLLM (prefix caching on, as the embedded server sets it): the
server's own counters show prefix-cache hits, in steps.csv and in the report.

Select with `-m vllm`. The server starts once per session (tests/conftest.py)."""

import json

import pandas as pd
import pytest

from tests.helpers.runs import locust

pytestmark = [pytest.mark.vllm, pytest.mark.contract]

PREFIX_TOKENS = 256  # 8 full blocks of 32 tokens: cacheable; with the suffix and 32 output tokens it fits 512


def test_a_shared_prefix_run_hits_the_prefix_cache(vllm_server, tmp_path):
    run_dir = tmp_path / "run"
    proc = locust(
        "--host", vllm_server.url, "--dataset", f"shared-prefix:{PREFIX_TOKENS}", "--steps", "4",
        "--step-duration", "10s", "--step-warmup", "3s", "--max-tokens", "32", "--ignore-eos", "--stop-timeout", "60",
        "--run-dir", str(run_dir),
        timeout=300,
    )  # fmt: skip
    print(proc.stdout[-3000:])
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = pd.read_csv(run_dir / "steps.csv")
    records = pd.read_parquet(run_dir / "requests.parquet")
    ok = records[records["status"] == "ok"]
    # A step whose window held no prefill (a busy machine's slow first request, or scrapes too sparse) has no rate:
    # missing, not 0 (a stress run once finished no request inside the window). The steps that measured one found
    # the shared prefix in the cache; else the answers' own usage says so (prompt_tokens_details.cached_tokens).
    rates = steps["prefix_cache_hit_rate"].dropna()
    assert (rates > 0).all(), steps.to_dict("records")
    assert len(rates) or (ok["cached_prompt_tokens"] > 0).any(), ok["cached_prompt_tokens"].tolist()
    assert len(ok) >= 4 and (ok["dataset"] == f"shared-prefix:{PREFIX_TOKENS}").all()
    assert (ok["prompt_tokens"] > PREFIX_TOKENS).all() and (ok["max_tokens"] == 32).all()
    run = json.loads((run_dir / "run.json").read_text())
    assert run["dataset"]["tokenizer"] == "/tokenize" and run["options"]["dataset"] == f"shared-prefix:{PREFIX_TOKENS}"
    assert "Prefix-cache hit rate" in (run_dir / "report.html").read_text()
