"""Prompt sources end to end: real `locust` processes against the fake server, which keeps every prompt and
max_tokens it receives (GET /prompts) and counts prompt tokens with the same rule as its /tokenize."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest

from tests.fakeserver import count_tokens
from tests.helpers.runs import locust

pytestmark = pytest.mark.contract

# 4 s steps: a busy machine has taken 1.5 s of a 2 s step before the first request (the run start, the users' spawn).
QUICK = ["--steps", "2", "--step-duration", "4s", "--step-warmup", "0s", "--max-tokens", "4", "--stop-timeout", "10"]


def run(server, tmp_path, *args: str, name: str = "r") -> tuple[pd.DataFrame, dict, list[dict], str]:
    run_dir = tmp_path / name
    proc = locust("--host", server.url, *QUICK, *args, "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = pd.read_parquet(run_dir / "requests.parquet")
    assert len(records) > 2 and (records["status"] == "ok").all(), records["error"].dropna().unique()
    run_json = json.loads((run_dir / "run.json").read_text())
    return records, run_json, server.get("/prompts")["prompts"], proc.stderr


def test_fixed_is_unchanged(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "2", "--itl-ms", "1")
    records, run_json, prompts, _ = run(server, tmp_path, "--prompt", "just this")
    assert {p["prompt"] for p in prompts} == {"just this"} and {p["max_tokens"] for p in prompts} == {4}
    assert (records["dataset"] == "fixed").all() and (records["max_tokens"] == 4).all()
    assert records["reference_output_tokens"].isna().all()
    assert run_json["options"]["dataset"] == "fixed" and server.get("/prompts")["tokenize_calls"] == 0


def test_synthetic_prompts_have_exactly_n_tokens(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "2", "--itl-ms", "1")
    records, run_json, prompts, _ = run(server, tmp_path, "--dataset", "synthetic:30", "--num-prompts", "5")
    assert {count_tokens(p["prompt"]) for p in prompts} == {30}
    assert 1 < len({p["prompt"] for p in prompts}) <= 5
    assert (records["prompt_tokens"] == 30).all() and (records["dataset"] == "synthetic:30").all()
    assert run_json["dataset"]["tokenizer"] == "/tokenize" and run_json["dataset"]["items"] == 5


def test_synthetic_without_tokenize_is_approximate_and_says_so_once(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "2", "--itl-ms", "1", "--no-tokenize")
    records, run_json, prompts, stderr = run(server, tmp_path, "--dataset", "synthetic:30", "--num-prompts", "5")
    assert {len(p["prompt"].split()) for p in prompts} == {30}  # ~1 word per token
    assert stderr.count("no usable /tokenize") == 1 and "approximate" in stderr
    assert run_json["dataset"]["tokenizer"].startswith("none (HTTP 404)")
    assert records["prompt_tokens"].notna().all()  # the server's own count, whatever the estimate


def test_sharegpt_uses_the_reference_lengths_as_max_tokens(fake_server, tmp_path):
    path = tmp_path / "sharegpt.json"
    answers = {f"question {i}": " ".join(["word"] * (i + 2)) for i in range(6)}  # i + 2 tokens each
    path.write_text(
        json.dumps(
            [
                {"conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}]}
                for q, a in answers.items()
            ]
        )
    )
    server = fake_server("--ttft-ms", "2", "--itl-ms", "1")
    records, run_json, prompts, _ = run(server, tmp_path, "--dataset", f"sharegpt:{path}")
    assert all(p["max_tokens"] == len(answers[p["prompt"]].split()) for p in prompts)
    assert (records["max_tokens"] == records["reference_output_tokens"]).all()
    assert (records["output_tokens"] == records["max_tokens"]).all()  # the fake server generates max_tokens
    assert run_json["options"]["dataset"] == f"sharegpt:{path}"
    # An explicit choice keeps --max-tokens.
    _, _, more, _ = run(server, tmp_path, "--dataset", f"sharegpt:{path}", "--max-tokens-dist", "fixed", name="f")
    assert {p["max_tokens"] for p in more[len(prompts) :]} == {4}


def test_shared_prefix_every_request_shares_the_prefix_then_its_own_id(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "2", "--itl-ms", "1")
    records, _, prompts, _ = run(server, tmp_path, "--dataset", "shared-prefix:40", "--num-prompts", "3")
    texts = [p["prompt"] for p in prompts]
    prefix = texts[0].split("\n")[0] + "\n"
    assert count_tokens(prefix) == 40 and all(t.startswith(prefix) for t in texts)
    assert len({t[len(prefix) :] for t in texts}) == len(texts)  # unique after the prefix
    # The unique part is the request's own id, so a prompt can be joined with its record.
    received = server.get("/received")["request_ids"]
    assert all(rid in text for rid, text in zip(received, texts))
    assert set(records["request_id"]) <= set(received)


def test_max_tokens_from_a_seeded_distribution(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "1", "--itl-ms", "0.2")
    args = ("--dataset", "synthetic:10", "--max-tokens-dist", "uniform:3:9", "--seed", "5")
    records, run_json, prompts, _ = run(server, tmp_path, *args)
    values = [p["max_tokens"] for p in prompts]
    assert min(values) >= 3 and max(values) <= 9 and len(set(values)) > 1
    assert sorted(records["max_tokens"]) == sorted(values) and (records["output_tokens"] == records["max_tokens"]).all()
    assert run_json["options"]["max_tokens_dist"] == "uniform:3:9" and run_json["options"]["seed"] == 5


def test_workers_build_the_same_dataset(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "2", "--itl-ms", "1")
    records, _, prompts, _ = run(
        server, tmp_path, "--dataset", "synthetic:20", "--num-prompts", "3", "--processes", "2", "--stop-timeout", "10"
    )
    assert len(records["worker"].unique()) == 2
    assert len({p["prompt"] for p in prompts}) <= 3  # two processes, one set of 3 prompts
    assert {count_tokens(p["prompt"]) for p in prompts} == {20}


def test_a_shared_prefix_report_shows_the_workload(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "2", "--itl-ms", "1")
    run(server, tmp_path, "--dataset", "shared-prefix:16")
    report = (tmp_path / "r" / "report.html").read_text()
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert "<h2>Workload</h2>" in report and "--dataset shared-prefix:16" in report
    # The fake server has no prefix-cache counters: the report says the rate is not available.
    assert "Prefix-cache hit rate: not available" in report
    assert summary["dataset"]["spec"] == "shared-prefix:16" and os.path.exists(tmp_path / "r" / "steps.csv")
