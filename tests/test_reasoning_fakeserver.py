"""The fake server's reasoning and tool-call modes: every chunk shaped as vLLM 0.32 streams it (compared with real
captures of the embedded vLLM, tests/fixtures/vllm-0.32-cpu-chat-*.sse), token splits exact, and /truth's
first_answer_s the send of the chunk holding the first answer token."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlparse

import pytest

from tests.helpers.paths import FIXTURES

pytestmark = pytest.mark.unit


def stream(url: str, body: dict, request_id: str = "r1", path: str = "/v1/chat/completions") -> list[bytes]:
    """The data lines of one streamed request, as raw bytes (without "data: ")."""
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=20)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json", "X-Request-Id": request_id})
    resp = conn.getresponse()
    assert resp.status == 200
    lines = [line.removeprefix(b"data: ").rstrip(b"\n") for line in resp.read().split(b"\n\n") if line.strip()]
    conn.close()
    return lines


def chat(max_tokens: int = 10, **extra) -> dict:
    return {
        "model": "fake-model",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        **extra,
    }


def pieces(text: str | None) -> list[str]:
    return (text or "").split()


def shape(obj: object) -> object:
    """A JSON value's structure: keys in order, value types; what two streams of the same kind share."""
    if isinstance(obj, dict):
        return [(k, shape(v)) for k, v in obj.items()]
    if isinstance(obj, list):
        return [shape(v) for v in obj[:1]]
    return type(obj).__name__


def test_reasoning_then_answer_split_exactly_with_vllm_chunks(fake_server):
    # Chunk 3 carries tokens 3-4 (--multi-every 2): it straddles the end of the 3-token thought.
    server = fake_server("--ttft-ms", "20", "--itl-ms", "5", "--multi-every", "2", "--reasoning", "3")
    raw = stream(server.url, chat(10))
    assert raw[-1] == b"[DONE]"
    assert all(b", " not in line and b'": ' not in line for line in raw[:-1])  # pydantic's compact JSON
    chunks = [json.loads(line) for line in raw[:-1]]
    role, *tokens, final = chunks
    assert role["id"] == "chatcmpl-r1" and list(role) == [
        "id", "object", "created", "model", "choices", "usage", "prompt_token_ids", "prompt_text",
    ]  # fmt: skip
    assert role["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    ]
    assert role["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}
    deltas = [c["choices"][0]["delta"] for c in tokens]
    thought = [p for d in deltas for p in pieces(d.get("reasoning"))]
    answer = [p for d in deltas for p in pieces(d.get("content"))]
    assert thought == ["tok1", "tok2", "tok3"] and answer == [f"tok{i}" for i in range(4, 11)]
    straddle = deltas[2]
    assert list(straddle) == ["content", "reasoning"] and straddle == {"content": " tok4", "reasoning": " tok3"}
    assert all(list(d) in (["reasoning"], ["content"]) for i, d in enumerate(deltas) if i != 2)
    # Continuous usage: the tokens so far and, of them, the reasoning ones.
    usage = [
        (c["usage"]["completion_tokens"], c["usage"]["completion_tokens_details"]["reasoning_tokens"]) for c in tokens
    ]
    assert usage[:4] == [(1, 1), (2, 2), (4, 3), (5, 3)] and usage[-1] == (10, 3)
    assert [list(c["choices"][0]) for c in tokens[:-1]] == [
        ["index", "delta", "logprobs", "finish_reason", "token_ids"]
    ] * (len(tokens) - 1)
    last = tokens[-1]["choices"][0]
    assert list(last) == ["index", "delta", "logprobs", "finish_reason", "stop_reason", "token_ids"]
    assert last["finish_reason"] == "length" and "system_fingerprint" not in tokens[-1]  # include_usage: on the final
    assert final["choices"] == [] and final["usage"] == {
        "prompt_tokens": final["usage"]["prompt_tokens"], "total_tokens": final["usage"]["prompt_tokens"] + 10,
        "completion_tokens": 10, "completion_tokens_details": {"reasoning_tokens": 3},
    }  # fmt: skip
    assert final["system_fingerprint"].startswith("vllm-0.32.0-")

    truth = server.get("/truth")["r1"]
    assert truth["reasoning_tokens"] == 3 and truth["tool_call_chunks"] == 0 and truth["tokens"] == 10
    assert truth["sizes"][:3] == [1, 1, 2]
    # Token 4 is due at receipt + ttft + 3 itl; the chunk holding it (tokens 3-4) goes out then, never earlier.
    assert truth["first_answer_s"] >= 0.020 + 3 * 0.005
    assert truth["ttft_s"] < truth["first_answer_s"] < truth["e2e_s"]


def test_older_servers_reasoning_content_field(fake_server):
    server = fake_server(
        "--ttft-ms", "5", "--itl-ms", "1", "--reasoning", "2", "--reasoning-field", "reasoning_content"
    )
    chunks = [json.loads(line) for line in stream(server.url, chat(4))[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks[1:-1]]
    assert deltas == [
        {"reasoning_content": " tok1"},
        {"reasoning_content": " tok2"},
        {"content": " tok3"},
        {"content": " tok4"},
    ]


def test_a_thought_longer_than_the_answer_has_no_answer_token(fake_server):
    server = fake_server("--ttft-ms", "5", "--itl-ms", "1", "--reasoning", "50")
    chunks = [json.loads(line) for line in stream(server.url, chat(6))[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks[1:-1]]
    assert all(list(d) == ["reasoning"] for d in deltas) and len(deltas) == 6
    assert chunks[-1]["usage"]["completion_tokens_details"] == {"reasoning_tokens": 6}
    truth = server.get("/truth")["r1"]
    assert truth["first_answer_s"] is None and truth["reasoning_tokens"] == 6


def tool_request(max_tokens: int) -> dict:
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    return chat(max_tokens, tools=[tool], tool_choice="auto")


@pytest.mark.parametrize("style", ["auto", "required"])
def test_the_answer_as_one_streamed_tool_call(fake_server, style):
    server = fake_server("--ttft-ms", "5", "--itl-ms", "1", "--reasoning", "2", "--tool-calls", style)
    chunks = [json.loads(line) for line in stream(server.url, tool_request(8))[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks[1:-1]]
    assert deltas[:2] == [{"reasoning": " tok1"}, {"reasoning": " tok2"}]
    calls = [d["tool_calls"] for d in deltas[2:]]
    assert all(len(c) == 1 and c[0]["index"] == 0 for c in calls)
    first = calls[0][0]
    assert list(first) == ["id", "type", "index", "function"] and first["type"] == "function"
    assert first["id"].startswith("chatcmpl-tool-") and len(first["id"]) == len("chatcmpl-tool-") + 16
    assert first["function"]["name"] == "lookup"  # the request's first tool
    rest = [c[0] for c in calls[1:]]
    assert all(list(c) == ["index", "function"] for c in rest)
    if style == "auto":  # the hermes parser: content=None beside its tool calls, the name alone first
        assert all(list(d) == ["content", "tool_calls"] and d["content"] is None for d in deltas[2:])
        assert first["function"] == {"name": "lookup"}
        assert all(list(c["function"]) == ["arguments"] for c in rest)
    else:  # tool_choice=required: no content; name and arguments so far, then name null with new arguments
        assert all(list(d) == ["tool_calls"] for d in deltas[2:])
        assert list(first["function"]) == ["name", "arguments"]
        assert all(c["function"]["name"] is None for c in rest)
    arguments = "".join(c[0]["function"].get("arguments") or "" for c in calls)
    assert json.loads(arguments) == {"text": "tok5 tok6 tok7 "}
    assert len(calls) == 6 and chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    truth = server.get("/truth")["r1"]
    assert truth["tool_call_chunks"] == 6 and truth["reasoning_tokens"] == 2 and truth["first_answer_s"] is not None


def test_default_mode_unchanged_and_its_truth_has_the_answer_at_the_first_token(fake_server):
    server = fake_server("--ttft-ms", "5", "--itl-ms", "1")
    raw = stream(server.url, chat(3))
    assert json.loads(raw[1]) == {
        "id": "cmpl-fake", "object": "chat.completion.chunk", "model": "fake-model",
        "choices": [{"index": 0, "delta": {"content": " tok1"}, "finish_reason": None}],
        "usage": {"prompt_tokens": json.loads(raw[1])["usage"]["prompt_tokens"], "completion_tokens": 1,
                  "total_tokens": json.loads(raw[1])["usage"]["prompt_tokens"] + 1},
    }  # fmt: skip
    assert b", " in raw[1]  # json.dumps' spaces, as before
    truth = server.get("/truth")["r1"]
    assert truth["first_answer_s"] == truth["ttft_s"] and truth["reasoning_tokens"] == 0


def test_completions_endpoint_never_reasons(fake_server):
    server = fake_server("--ttft-ms", "5", "--itl-ms", "1", "--reasoning", "2", "--tool-calls")
    body = {"model": "fake-model", "prompt": "hi", "max_tokens": 4, "stream": True}
    chunks = [json.loads(line) for line in stream(server.url, body, path="/v1/completions")[:-1]]
    assert [c["choices"][0]["text"] for c in chunks] == [" tok1", " tok2", " tok3", " tok4"]
    assert server.get("/truth")["r1"]["reasoning_tokens"] == 0


CAPTURES = sorted(FIXTURES.glob("vllm-0.32-cpu-chat-*.sse"))


def kinds(chunks: list[dict]) -> dict[str, object]:
    """The shape of the first chunk of each kind: role, reasoning, content, tool-first (id, type, name), tool (more
    arguments), finish (its delta aside: whatever the last step brought), final (usage; prompt_tokens_details
    aside: the embedded vLLM sends it with --enable-prompt-tokens-details)."""
    out: dict[str, object] = {}
    for c in chunks:
        choice = (c["choices"] or [{}])[0]
        delta = choice.get("delta") or {}
        calls = delta.get("tool_calls") or [{}]
        if not c["choices"]:
            kind, c = "final", {**c, "usage": {k: v for k, v in c["usage"].items() if k != "prompt_tokens_details"}}
        elif choice.get("finish_reason"):
            kind, c = "finish", {**c, "choices": [{**choice, "delta": {}}]}
        else:
            kind = "role" if "role" in delta else "tool-first" if "id" in calls[0] else "+".join(delta)
        out.setdefault(kind, shape(c))
    return out


@pytest.mark.skipif(not CAPTURES, reason="no captures")
@pytest.mark.parametrize("capture", CAPTURES, ids=[c.stem for c in CAPTURES])
def test_chunk_shapes_are_the_real_vllm_s(fake_server, capture):
    """Each kind of chunk the real vLLM streamed (captured from the embedded server with --reasoning-parser qwen3
    --enable-auto-tool-choice --tool-call-parser hermes) has its kind in the fake's stream, with the same keys in the
    same order and the same value types."""
    meta, *lines = capture.read_text().splitlines()
    spec = json.loads(meta.removeprefix("# fake server: "))
    real = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: {")]
    assert lines[-1] == "data: [DONE]"
    server = fake_server("--ttft-ms", "2", "--itl-ms", "1", *spec["args"])
    raw = stream(server.url, {**spec["body"], "stream": True})
    assert raw[-1] == b"[DONE]"
    fake = [json.loads(line) for line in raw[:-1]]
    real_kinds, fake_kinds = kinds(real), kinds(fake)
    assert real_kinds, capture
    for kind, real_shape in real_kinds.items():
        assert fake_kinds.get(kind) == real_shape, kind
