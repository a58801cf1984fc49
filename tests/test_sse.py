import orjson
import pytest
from vllm_loadtest.analysis.sse import EMPTY_STREAM, MALFORMED_JSON, STREAM_ERROR, StreamParser, parse_stream

from tests.helpers.paths import FIXTURES

pytestmark = pytest.mark.unit


def stamped(raw: bytes, start: float = 0.05, step: float = 0.01) -> list[tuple[float, bytes]]:
    """Split a capture into lines as the client reads them, one arrival time per data line."""
    out, t = [], start
    for line in raw.splitlines(keepends=True):
        out.append((t, line))
        if line.startswith(b"data:"):
            t += step
    return out


def data(obj) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else orjson.dumps(obj)) + b"\n"


def chunk(text="x", cumulative=None, finish=None, chat=False):
    choice = {"index": 0, "finish_reason": finish}
    choice.update({"delta": {"content": text}} if chat else {"text": text})
    obj = {"choices": [choice]}
    if cumulative is not None:
        obj["usage"] = {"prompt_tokens": 3, "completion_tokens": cumulative}
    return obj


def test_real_vllm_continuous_usage_counts_every_chunk_even_empty_text():
    p = parse_stream(stamped((FIXTURES / "completions_continuous_usage.sse").read_bytes()))
    assert p.error_type is None and p.done and p.finish_reason == "length"
    assert p.chunk_tokens == [1, 1, 1, 1, 1, 1]
    assert p.token_offsets_s == pytest.approx([0.05, 0.06, 0.07, 0.08, 0.09, 0.10])
    assert p.output_tokens == 6 and not p.output_tokens_estimated
    assert p.prompt_tokens == 3 and p.continuous_usage


def test_real_vllm_include_usage_only_counts_chunks_and_takes_final_usage():
    p = parse_stream(stamped((FIXTURES / "completions_include_usage.sse").read_bytes()))
    assert p.chunk_tokens == [1] * 6
    assert p.output_tokens == 6 and not p.output_tokens_estimated
    assert not p.continuous_usage


def test_real_vllm_error_event_inside_200_stream():
    p = parse_stream(stamped((FIXTURES / "completions_error_in_200_stream.sse").read_bytes()))
    assert p.error_type == STREAM_ERROR
    assert "EngineCore encountered an issue" in p.error
    assert p.token_offsets_s == []


def test_multi_token_chunks_from_continuous_usage():
    lines = [
        (0.05, data(chunk("a", 1))),
        (0.06, b"\n"),
        (0.08, data(chunk("bc", 3))),
        (0.09, data(chunk("", 4, "stop"))),
        (0.09, data(b"[DONE]")),
    ]
    p = parse_stream(lines)
    assert p.chunk_tokens == [1, 2, 1]
    assert p.token_offsets_s == [0.05, 0.08, 0.09]
    assert p.output_tokens == 4


def test_without_usage_output_tokens_are_estimated_from_chunks():
    lines = [
        (0.1, data(chunk("a"))),
        (0.2, data(chunk(""))),
        (0.3, data(chunk("b", finish="length"))),
        (0.3, data(b"[DONE]")),
    ]
    p = parse_stream(lines)
    assert p.output_tokens == 3 and p.output_tokens_estimated
    assert p.chunk_tokens == [1, 1, 1]


def test_chat_role_chunk_is_not_a_token_with_or_without_usage():
    role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
    with_usage = {**role, "usage": {"prompt_tokens": 3, "completion_tokens": 0}}
    for first in (role, with_usage):
        cumulative = (lambda n: n) if "usage" in first else (lambda n: None)
        lines = [
            (0.01, data(first)),
            (0.05, data(chunk("hi", cumulative(1), chat=True))),
            (0.06, data(chunk("", cumulative(2), "stop", chat=True))),
            (0.06, data(b"[DONE]")),
        ]
        p = parse_stream(lines)
        assert p.token_offsets_s == [0.05, 0.06], first
        assert p.output_tokens == 2


def test_one_token_output():
    p = parse_stream([(0.05, data(chunk("a", 1, "length"))), (0.05, data(b"[DONE]"))])
    assert p.token_offsets_s == [0.05] and p.output_tokens == 1


def test_malformed_json_stops_parsing_and_keeps_earlier_tokens():
    lines = [(0.05, data(chunk("a", 1))), (0.06, b'data: {"choices": [\n'), (0.07, data(chunk("b", 2)))]
    p = parse_stream(lines)
    assert p.error_type == MALFORMED_JSON and "chunk 2" in p.error
    assert p.token_offsets_s == [0.05]


def test_non_object_json_is_malformed():
    assert parse_stream([(0.05, b"data: [1, 2]\n")]).error_type == MALFORMED_JSON


def test_comments_fields_crlf_and_data_without_space():
    lines = [
        (0.0, b": keep-alive\r\n"),
        (0.0, b"event: message\r\n"),
        (0.05, b"data:" + orjson.dumps(chunk("a", 1)) + b"\r\n"),
        (0.05, b"\r\n"),
        (0.06, b"data: [DONE]\r\n"),
    ]
    p = parse_stream(lines)
    assert p.token_offsets_s == [0.05] and p.done


def test_stream_without_done_or_finish_is_not_marked_done():
    p = parse_stream([(0.05, data(chunk("a", 1)))])
    assert not p.done and p.finish_reason is None


def test_incremental_feed_matches_whole_parse():
    raw = (FIXTURES / "completions_continuous_usage.sse").read_bytes()
    parser = StreamParser()
    for t, line in stamped(raw):
        parser.feed(t, line)
    assert parser.result == parse_stream(stamped(raw))


def test_empty_stream_category_exists_for_clean_streams_without_tokens():
    p = parse_stream([(0.05, data(b"[DONE]"))])
    assert p.done and p.token_offsets_s == []
    assert EMPTY_STREAM == "empty_stream"
