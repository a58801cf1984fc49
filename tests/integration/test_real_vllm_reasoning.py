"""Reasoning and tool calls against the real vLLM: the embedded server with `--reasoning-parser qwen3
--enable-auto-tool-choice --tool-call-parser hermes` (the session's `reasoning_vllm`, tests/helpers/fleet.py; its
`vllm_server` runs without parsers).

The tiny model's weights are random, so its next token is close to uniform over the 516-token vocabulary: at
temperature 1 a thought ends (`</think>`) within 48 tokens in roughly 1 request of 10, at temperature 0 never. A
`logit_bias` on `</think>` (sent with --extra-body) makes most thoughts end after a few tokens, so a run holds both
kinds: answered (TTFO after TTFT) and never answered (every token reasoning, no TTFO).

Select with `-m vllm`."""

from __future__ import annotations

import http.client
import json
import time

import pandas as pd
import pytest
from vllm_loadtest.analysis.sse import parse_stream

from tests.helpers.runs import locust

pytestmark = [pytest.mark.vllm, pytest.mark.contract]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


def end_of_thought_bias(server, bias: float) -> dict:
    ids = json.loads((server.model_dir / "tiny_model.json").read_text())["parser_tokens"]
    return {str(ids["</think>"]): bias}


def stamped_stream(server, body: dict) -> list[tuple[float, bytes]]:
    """One streamed chat request's lines, each with its arrival offset (as the client stamps them)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()[:500]
    lines = []
    while line := resp.readline():
        lines.append((time.perf_counter() - t0, line.rstrip(b"\r\n")))
    conn.close()
    return lines


def chunk_split(lines: list[tuple[float, bytes]]) -> tuple[int, int, int | None, int]:
    """What the server streamed: the tokens of its reasoning chunks (continuous usage's completion_tokens steps of
    chunks with reasoning and neither content nor tool calls), all tokens, its own usage count, and the tokens of
    chunks that carry both reasoning and answer text (a busy server's step of several tokens across `</think>`)."""
    reasoning, previous, server_count, kind, mixed = 0, 0, None, "answer", 0
    for _, line in lines:
        if not line.startswith(b"data: {"):
            continue
        chunk = json.loads(line[6:])
        usage = chunk.get("usage") or {}
        done = usage.get("completion_tokens", previous)
        if chunk["choices"]:
            delta = chunk["choices"][0].get("delta") or {}
            if delta.get("content") or delta.get("tool_calls"):
                kind = "answer"
                mixed += done - previous if delta.get("reasoning") else 0
            elif delta.get("reasoning"):
                kind = "reasoning"
            # else a chunk without text: its tokens go with the chunk before it
            reasoning += done - previous if kind == "reasoning" else 0
        else:
            server_count = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens")
        previous = done
    return reasoning, previous, server_count, mixed


def test_the_parser_reads_the_reasoning_split_the_server_streamed(reasoning_vllm):
    body = {
        "model": "tiny", "messages": [{"role": "user", "content": "Explain photosynthesis."}], "max_tokens": 48,
        "ignore_eos": True, "temperature": 1.0, "logit_bias": end_of_thought_bias(reasoning_vllm, 3), "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }  # fmt: skip
    answered = 0
    for _ in range(6):
        lines = stamped_stream(reasoning_vllm, body)
        reasoning, total, server_count, mixed = chunk_split(lines)
        parsed = parse_stream(lines)
        print(f"chunks: {reasoning} of {total} reasoning ({mixed} in a mixed chunk); vLLM's usage says {server_count}")
        assert parsed.output_tokens == total == 48
        # A mixed chunk's tokens are split by the server's count (at least one is the answer's): see analysis/sse.py.
        assert reasoning <= parsed.reasoning_tokens <= reasoning + max(0, mixed - 1)
        assert server_count is not None  # vLLM 0.32 with a reasoning parser counts them
        if reasoning < total:
            answered += 1
            assert parsed.first_output_offset_s is not None
            assert parsed.first_output_offset_s >= parsed.token_offsets_s[0]
        else:
            assert parsed.first_output_offset_s is None
    assert answered >= 3  # with the bias most thoughts end


def test_a_run_records_reasoning_and_thinking_off_records_none(reasoning_vllm, tmp_path):
    # About 1 token in 27 ends the thought: after 32 tokens about 3 thoughts in 10 still go on.
    bias = json.dumps({"logit_bias": end_of_thought_bias(reasoning_vllm, 3)})
    # 16 users (the server's max_num_seqs): even a step the shared machine stalls ends with 16 requests in flight,
    # which --stop-timeout lets finish (a fresh clone's 4-user step once finished only its 4 in-flight requests).
    common = (
        "--host", reasoning_vllm.url, "--endpoint", "chat", "--max-tokens", "32", "--ignore-eos", "--steps", "16",
        "--step-duration", "8s", "--step-warmup", "0s", "--no-report", "--stop-timeout", "30",
    )  # fmt: skip
    # Temperature 1: sampled, so a thought's length varies (greedy, the bias would end every one at once).
    proc = locust(*common, "--run-dir", str(tmp_path / "on"), "--temperature", "1", "--extra-body", bias, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ok = pd.read_parquet(tmp_path / "on" / "requests.parquet").query("status == 'ok'")
    assert len(ok) >= 16  # so that both kinds show: 16 requests are all answered, or none, with p < 0.4 %
    assert ok["reasoning_tokens"].notna().all() and (ok["reasoning_tokens"] <= ok["output_tokens"]).all()
    never = ok[ok["ttfo_s"].isna()]
    assert (never["reasoning_tokens"] == never["output_tokens"]).all()  # no answer token: all of it reasoning
    answered = ok[ok["ttfo_s"].notna()]
    print(f"{len(answered)} answered, {len(never)} only reasoned")
    assert len(never) > 0 and len(answered) > 0 and (answered["ttfo_s"] >= answered["ttft_s"]).all()
    assert (answered["reasoning_tokens"] < answered["output_tokens"]).all()

    proc = locust(
        *common, "--run-dir", str(tmp_path / "off"), "--chat-template-kwargs", '{"enable_thinking": false}',
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    off = pd.read_parquet(tmp_path / "off" / "requests.parquet").query("status == 'ok'")
    assert len(off) >= 16
    assert (off["reasoning_tokens"] == 0).all() and off["ttfo_s"].notna().all()
    assert (off["ttfo_s"] == off["ttft_s"]).all()


def test_tools_with_tool_choice_required_are_accepted_and_the_calls_counted(reasoning_vllm, tmp_path):
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS))
    # Thinking off: vLLM applies the required call's structured output only once the thought ended (in the prompt).
    proc = locust(
        "--host", reasoning_vllm.url, "--endpoint", "chat", "--max-tokens", "48", "--steps", "2",
        "--step-duration", "8s", "--step-warmup", "0s", "--no-report", "--stop-timeout", "30",
        "--tools", str(tools), "--tool-choice", "required", "--chat-template-kwargs", '{"enable_thinking": false}',
        "--run-dir", str(tmp_path / "run"), timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    ok = records[records["status"] == "ok"]
    # Each call is structured output, slow on a busy CPU: 2 ok requests in 8 s once under load. What is checked is
    # that they are accepted (every request not cut off is ok) and their calls counted, not how many fit.
    assert len(ok) >= 1 and len(ok) == len(records) - (records["error_type"] == "cut_off").sum()
    # The structured output forces [{"name": "get_weather", "parameters": {...: the hermes-shaped deltas stream it.
    called = ok[ok["tool_call_chunks"] > 0]
    assert len(called) >= len(ok) // 2, ok["tool_call_chunks"].value_counts().to_dict()
    assert called["ttfo_s"].notna().all() and (called["reasoning_tokens"] == 0).all()
