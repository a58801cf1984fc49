"""CPU cost of the per-chunk path: parsing an SSE line and writing a record. Run on demand, prints figures.

.venv/bin/python -m tests.benchmarks.bench_parse
"""

from __future__ import annotations

import json
import timeit
from dataclasses import asdict

import orjson
from vllm_loadtest.analysis.records import RequestRecord
from vllm_loadtest.analysis.sse import StreamParser, parse_stream

from tests.helpers.paths import FIXTURES


def vllm_lines(n_tokens: int) -> list[tuple[float, bytes]]:
    """n_tokens real-format vLLM 0.32 chunks with continuous usage, each followed by its blank separator."""
    first = (FIXTURES / "completions_continuous_usage.sse").read_bytes().split(b"\n")[0]
    obj = json.loads(first[6:])
    lines = []
    for i in range(n_tokens):
        obj["usage"]["completion_tokens"] = i + 1
        t = 0.05 + i * 0.01
        lines += [(t, b"data: " + json.dumps(obj).encode() + b"\n"), (t, b"\n")]
    return [*lines, (3.0, b"data: [DONE]\n"), (3.0, b"\n")]


def chat_lines(n_reasoning: int, n_answer: int) -> list[tuple[float, bytes]]:
    """vLLM 0.32's chat chunks with a reasoning parser and continuous usage: n_reasoning `delta.reasoning` chunks,
    then n_answer `delta.content` chunks (chat_completion/serving.py's shapes, exclude_unset)."""
    head = '{"id":"chatcmpl-4d3c","object":"chat.completion.chunk","created":1764600000,"model":"qwen3","choices":'
    lines = []
    for i in range(n_reasoning + n_answer):
        delta = {"reasoning": f" tok{i}"} if i < n_reasoning else {"content": f" tok{i}"}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None, "token_ids": None}
        usage = {"prompt_tokens": 12, "total_tokens": 13 + i, "completion_tokens": i + 1,
                 "completion_tokens_details": {"reasoning_tokens": min(i + 1, n_reasoning)}}  # fmt: skip
        line = head + orjson.dumps([choice]).decode() + ',"usage":' + orjson.dumps(usage).decode() + "}"
        t = 0.05 + i * 0.01
        lines += [(t, b"data: " + line.encode() + b"\n"), (t, b"\n")]
    return [*lines, (3.0, b"data: [DONE]\n"), (3.0, b"\n")]


def best(fn, number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=7)) / number


def main() -> None:
    lines = vllm_lines(256)
    data_line = lines[0][1]

    def feed_all():
        p = StreamParser()
        for t, line in lines:
            p.feed(t, line)

    per_line = best(lambda: StreamParser().feed(0.05, data_line), 20000)
    whole = best(lambda: parse_stream(lines), 50)
    parsed = parse_stream(lines)
    record = RequestRecord(
        "a" * 32,
        "host-1",
        0,
        1,
        False,
        1.8e9,
        "completions",
        "m",
        ttft_s=0.05,
        e2e_s=2.6,
        tpot_s=0.01,
        duration_s=2.6,
        output_tokens=256,
        chunks=256,
        chunk_offsets_s=parsed.token_offsets_s,
        chunk_tokens=parsed.chunk_tokens,
    )
    fast = best(lambda: orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE), 2000)
    slow = best(lambda: json.dumps(asdict(record)), 100)
    print(f"one vLLM data line (len {len(data_line)} B) parsed:      {per_line * 1e6:8.2f} µs")
    print(
        f"a 256-token stream ({len(lines)} lines) parsed at its end: {whole * 1e6:8.0f} µs "
        "(one stall of the event loop if parsed after the stream)"
    )
    print(f"  the same fed line by line:                     {best(feed_all, 50) * 1e6:8.0f} µs in {len(lines)} slices")
    chat = chat_lines(128, 128)

    def feed_chat():
        p = StreamParser()
        for t, line in chat:
            p.feed(t, line)

    print(f"a 256-token chat stream, 128 reasoning + 128 answer, fed line by line: {best(feed_chat, 50) * 1e6:8.0f} µs")
    print(f"256-token record, orjson.dumps(dataclass):       {fast * 1e6:8.1f} µs")
    print(f"256-token record, json.dumps(asdict(...)):       {slow * 1e6:8.1f} µs")


if __name__ == "__main__":
    main()
