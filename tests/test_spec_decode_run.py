"""Speculative decoding end to end (issue 35): a real headless Locust run against tests/fakeserver.py --spec-decode
K:A, whose every decode step drafts K tokens and accepts exactly A. steps.csv's acceptance rate is A / K (within 0.01),
its mean acceptance length 1 + A, the per-position rates in summary.json, and the client's tokens per chunk what the
fake streamed (its /truth chunk sizes); a server without the counters leaves the server's columns empty."""

from __future__ import annotations

import json
import urllib.request

import pandas as pd
import pytest

from tests.helpers.runs import locust, short_run

pytestmark = pytest.mark.contract

K, A = 4, 2  # 4 draft tokens per step, 2 accepted: rate 0.5, length 3, chunks of 3 tokens after the first
MAX_TOKENS = 31  # 1 + 10 chunks of 3: every chunk whole


def test_a_speculating_server_gives_its_known_acceptance_and_chunk_sizes(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "5", "--itl-ms", "2", "--spec-decode", f"{K}:{A}")
    run_dir = tmp_path / "run"
    proc = locust("--host", server.url, "--steps", "2", "--step-duration", "3s", "--step-warmup", "0s",
                  "--max-tokens", str(MAX_TOKENS), "--scrape-interval", "0.25", "--run-dir", str(run_dir))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    with urllib.request.urlopen(server.url + "/truth", timeout=10) as answer:
        truth = json.load(answer)
    step = pd.read_csv(run_dir / "steps.csv").iloc[0]
    assert step["spec_drafts"] > 0
    assert abs(step["spec_acceptance_rate"] - A / K) <= 0.01
    assert step["spec_acceptance_length_mean"] == pytest.approx(1 + A)
    assert step["spec_draft_tokens"] == K * step["spec_drafts"]

    records = pd.read_parquet(run_dir / "requests.parquet")
    ok = records[(records["status"] == "ok") & records["measured"]]
    sizes = [truth[rid]["sizes"] for rid in ok["request_id"]]
    assert all(s == [1] + [A + 1] * 10 for s in sizes)  # what the fake streamed
    chunks = [c for s in sizes for c in s]
    assert step["tokens_per_chunk_mean"] == pytest.approx(sum(chunks) / len(chunks))
    assert step["multi_token_chunk_share"] == pytest.approx(sum(c > 1 for c in chunks) / len(chunks))
    assert step["tokens_per_chunk_p99"] == A + 1
    assert ok["tokens_per_chunk"].tolist() == pytest.approx([MAX_TOKENS / 11] * len(ok))

    summary = json.loads((run_dir / "summary.json").read_text())["spec_decode"]
    assert summary["acceptance_rate"] == pytest.approx(A / K, abs=0.01)
    assert summary["acceptance_rate_per_position"] == pytest.approx([1.0] * A + [0.0] * (K - A))
    assert "Speculative decoding" in proc.stdout and "Over the measured run: acceptance rate 50.0%" in proc.stdout
    assert "<h2>Speculative decoding</h2>" in (run_dir / "report.html").read_text(encoding="utf-8")


def test_a_server_without_the_counters_leaves_them_empty(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "5", "--itl-ms", "1")
    run_dir = tmp_path / "run"
    proc = short_run(server.url, run_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = pd.read_csv(run_dir / "steps.csv")
    assert steps[[c for c in steps.columns if c.startswith("spec_")]].isna().all().all()
    assert (steps["tokens_per_chunk_mean"] == 1.0).all()  # the fake streams one token per chunk by default
    summary = json.loads((run_dir / "summary.json").read_text())["spec_decode"]
    assert summary["drafts"] is None and summary["acceptance_rate"] is None and summary["steps"] == []
    assert "Speculative decoding" not in proc.stdout
    assert "<h2>Speculative decoding</h2>" not in (run_dir / "report.html").read_text(encoding="utf-8")
