"""Speculative decoding against the real vLLM: the embedded server with ngram speculation (`serve --speculative
ngram`, the session's `spec_vllm`, tests/helpers/fleet.py). One short step: steps.csv's acceptance rate and mean
acceptance length are vLLM's own counters' ratios over the window (what its /metrics says, not a speed), summary.json
has a rate per draft position, and the client sees chunks of several tokens. The server (shared with the LoRA tests)
starts with the session's others and answers one request before it counts as ready (the first compiles the ngram
proposer); the test itself takes about 15 s.

The tiny model's weights are random and greedy decoding repeats a token, which ngram lookup then drafts: most drafts
are accepted, so the chunks carry up to 4 tokens (3 drafts and the target model's own). Select with `-m vllm`."""

from __future__ import annotations

import json
import urllib.request

import pandas as pd
import pytest
from vllm_loadtest.analysis.prometheus_text import parse_samples
from vllm_loadtest.analysis.spec_decode import ACCEPTED, DRAFT_TOKENS, DRAFTS

from tests.helpers.runs import locust

pytestmark = [pytest.mark.vllm, pytest.mark.contract]


def counters(server) -> dict[str, float]:
    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as answer:
        samples = parse_samples(answer.read().decode())
    return {name: sum(v for n, _, v in samples if n == name) for name in (DRAFTS, DRAFT_TOKENS, ACCEPTED)}


def test_a_real_speculating_server_gives_its_acceptance_per_step(spec_vllm, tmp_path):
    run_dir = tmp_path / "run"
    before = counters(spec_vllm)
    proc = locust("--host", spec_vllm.url, "--steps", "2", "--step-duration", "4s", "--step-warmup", "0s",
                  "--max-tokens", "32", "--scrape-interval", "0.5",
                  "--run-dir", str(run_dir))  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    after = counters(spec_vllm)
    step = pd.read_csv(run_dir / "steps.csv").iloc[0]
    # The window's increases are at most the server's over the whole run, and its ratios vLLM's formulas.
    assert 0 < step["spec_drafts"] <= after[DRAFTS] - before[DRAFTS]
    assert 0 < step["spec_accepted_tokens"] <= step["spec_draft_tokens"] <= after[DRAFT_TOKENS] - before[DRAFT_TOKENS]
    rate = step["spec_accepted_tokens"] / step["spec_draft_tokens"]
    assert step["spec_acceptance_rate"] == pytest.approx(rate)
    assert step["spec_acceptance_length_mean"] == pytest.approx(1 + step["spec_accepted_tokens"] / step["spec_drafts"])
    assert step["spec_acceptance_rate_ci_low"] <= rate <= step["spec_acceptance_rate_ci_high"]
    summary = json.loads((run_dir / "summary.json").read_text())["spec_decode"]
    assert len(summary["acceptance_rate_per_position"]) == 3  # num_speculative_tokens
    assert summary["acceptance_rate_per_position"][0] >= summary["acceptance_rate_per_position"][2]
    # The client's side: some chunks brought several tokens. Not at most 4 (3 drafts and the bonus token): when its
    # API server falls behind, vLLM merges the outputs of several engine steps into one chunk (p99 4.39 seen here).
    assert step["multi_token_chunk_share"] > 0 and step["tokens_per_chunk_mean"] > 1
    assert "Speculative decoding" in proc.stdout
