"""A Mooncake-format trace replayed against the real vLLM (prefix caching on, as the embedded server sets it): rows
that share hash_ids share their text blocks, so the server's own counters show prefix-cache hits where the trace's
blocks repeat, and not for a trace whose blocks are all distinct. Every row is sent once, with its exact prompt
length (the server's /tokenize) and its output length (--ignore-eos).

Select with `-m vllm`. The server starts once per session (tests/conftest.py: 32-token blocks, 512-token context)."""

import json

import pandas as pd
import pytest

from tests.helpers.runs import locust

pytestmark = [pytest.mark.vllm, pytest.mark.contract]

BLOCK = 64  # --trace-block-tokens: two of the server's 32-token KV blocks per hash_id
ROWS = 48


def write_trace(path, shared: bool) -> list[dict]:
    """ROWS rows at ~5 req/s over ~10 s. Shared: four "conversations", each row resending its conversation's blocks
    (hash_ids 0 = a system prompt shared by all, then the conversation's own) plus one new block; distinct: every
    row's blocks are its own."""
    rows = []
    for i in range(ROWS):
        if shared:
            conversation, turn = i % 4, i // 4
            ids = [0, 1000 + conversation, 2000 + 100 * conversation + turn % 2]
        else:
            ids = [10_000 + 3 * i, 10_001 + 3 * i, 10_002 + 3 * i]
        rows.append({"timestamp": 200 * i, "input_length": BLOCK * 3 - 8, "output_length": 8 + i % 9, "hash_ids": ids})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def replay(vllm_server, tmp_path, name: str, shared: bool, seed: int):
    trace = tmp_path / f"{name}.jsonl"
    rows = write_trace(trace, shared)
    run_dir = tmp_path / name
    proc = locust(
        "--host", vllm_server.url, "--trace", str(trace), "--trace-block-tokens", str(BLOCK), "--seed", str(seed),
        "--step-duration", "5s", "--step-warmup", "0s", "--max-users", "16", "--ignore-eos", "--stop-timeout", "60",
        "--run-dir", str(run_dir),
        timeout=300,
    )  # fmt: skip
    print(proc.stdout[-3000:])
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = pd.read_parquet(run_dir / "requests.parquet").sort_values("trace_row").reset_index(drop=True)
    steps = pd.read_csv(run_dir / "steps.csv")
    return rows, records, steps, run_dir


def hit_rate(steps: pd.DataFrame) -> float:
    """The run's prefix-cache hit rate from the per-window rates (each window's prompt tokens are alike)."""
    rates = steps["prefix_cache_hit_rate"].dropna()
    assert len(rates), steps.to_dict("records")
    return float(rates.mean())


def test_a_mooncake_trace_with_shared_hash_ids_hits_the_prefix_cache(vllm_server, tmp_path):
    # Distinct blocks first (and each run its own seed: its own texts), so nothing of one run is cached for the other.
    _, distinct_records, distinct_steps, _ = replay(vllm_server, tmp_path, "distinct", shared=False, seed=1701)
    rows, records, steps, run_dir = replay(vllm_server, tmp_path, "shared", shared=True, seed=1702)

    for recs in (records, distinct_records):
        assert recs["trace_row"].tolist() == list(range(ROWS))
        assert (recs["status"] == "ok").all(), recs["error"].dropna().unique()
    # Each row's exact lengths: the prompt as the server's tokenizer counts it, the output forced by ignore_eos.
    assert (records["prompt_tokens"] == [r["input_length"] for r in rows]).all()
    assert (records["output_tokens"] == [r["output_length"] for r in rows]).all()
    assert (records["max_tokens"] == [r["output_length"] for r in rows]).all()

    # The server's own counters: blocks repeated in the trace are found in its prefix cache; distinct ones are not
    # (at most the BOS block's worth).
    shared_rate, distinct_rate = hit_rate(steps), hit_rate(distinct_steps)
    print(f"prefix-cache hit rate: shared hash_ids {shared_rate:.2f}, distinct {distinct_rate:.2f}")
    assert shared_rate > 0.3 and shared_rate > distinct_rate + 0.2
    # Per request, where the server reports it (vLLM with --enable-prompt-tokens-details): the rows after each
    # conversation's first hit its cache.
    cached = records["cached_prompt_tokens"]
    if cached.notna().any():
        later = records["trace_row"] >= 4
        assert (cached[later].fillna(0) >= 2 * BLOCK).mean() > 0.8, cached.tolist()
    run = json.loads((run_dir / "run.json").read_text())
    assert run["trace"]["format"] == "mooncake" and run["trace"]["rows"] == ROWS
    assert run["trace"]["prompts"]["tokenizer"] == "/tokenize"
    assert "Prefix-cache hit rate" in (run_dir / "report.html").read_text()
