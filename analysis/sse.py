"""Parse an OpenAI-compatible SSE completion stream that was stamped line by line.

The client stamps every line as it arrives and parses nothing until the stream is over; this module turns
those `(arrival offset, raw line)` pairs into token arrivals, usage and an outcome. Pure: no I/O, no Locust.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import orjson

# Error categories shared by the client, the records and the tables.
# Non-200 answers before the stream are categorized "http_<status>" (http_429, http_503, ...).
STREAM_ERROR = "stream_error"  # an error event inside a 200 stream
INCOMPLETE_STREAM = "incomplete_stream"  # ended without [DONE] and without a finish_reason
MALFORMED_JSON = "malformed_json"  # a data line that is not a JSON object
EMPTY_STREAM = "empty_stream"  # finished cleanly but carried no output token
NOT_SSE = "not_sse"  # a 200 response that is not an event stream (e.g. a proxy's HTML page)
CONNECTION_ERROR = "connection_error"  # refused, reset, closed mid-response
TIMEOUT = "timeout"  # connect or read timeout (--read-timeout)
CUT_OFF = "cut_off"  # the load generator stopped the user while the request was in flight

DONE = b"[DONE]"


@dataclass
class ParsedStream:
    token_offsets_s: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    usage_completion_tokens: int | None = None
    prompt_tokens: int | None = None
    continuous_usage: bool = False
    finish_reason: str | None = None
    done: bool = False
    events: int = 0
    error_type: str | None = None
    error: str | None = None

    @property
    def output_tokens(self) -> int:
        """Output tokens = last usage.completion_tokens, else the sum of per-chunk token counts."""
        if self.usage_completion_tokens is not None:
            return self.usage_completion_tokens
        return sum(self.chunk_tokens)

    @property
    def output_tokens_estimated(self) -> bool:
        return self.usage_completion_tokens is None


def _is_role_only(choice: dict) -> bool:
    """A chat delta that only announces the assistant role carries no token."""
    delta = choice.get("delta")
    if not isinstance(delta, dict) or "role" not in delta:
        return False
    return not (
        delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning") or delta.get("tool_calls")
    )


def _error_message(obj: dict) -> str:
    err = obj.get("error")
    if isinstance(err, dict):
        return str(err.get("message") or err)
    if err is not None:
        return str(err)
    return str(obj.get("message") or obj)


class StreamParser:
    """Incremental parser: feed each stamped line as it arrives (a few µs), read `.result` at the end."""

    __slots__ = ("_seen", "result")

    def __init__(self) -> None:
        self.result = ParsedStream()
        self._seen = 0  # cumulative completion_tokens seen so far

    def feed(self, offset: float, raw: bytes) -> bool:
        """Token arrivals: a chunk carries (cumulative completion_tokens - previous), or 1 per choice without usage.

        Returns False once the stream has failed (an error event or malformed JSON): later lines are ignored.
        """
        out = self.result
        if out.error_type is not None:
            return False
        if raw[:5] != b"data:":
            return True  # blank separator, SSE comment (keep-alive) or a field (event:, id:) without payload
        payload = raw[5:].strip()
        if payload == DONE:
            out.done = True
            return True
        try:
            obj = orjson.loads(payload)
        except ValueError as e:
            out.error_type = MALFORMED_JSON
            out.error = f"chunk {out.events + 1} is not JSON ({e}): {payload[:120]!r}"
            return False
        if type(obj) is not dict:
            out.error_type = MALFORMED_JSON
            out.error = f"chunk {out.events + 1} is not a JSON object: {payload[:120]!r}"
            return False
        out.events += 1
        if "error" in obj or obj.get("object") == "error":
            out.error_type, out.error = STREAM_ERROR, _error_message(obj)
            return False

        choices = obj.get("choices")
        usage = obj.get("usage")
        cumulative = None
        if usage:
            prompt = usage.get("prompt_tokens")
            if prompt is not None:
                out.prompt_tokens = int(prompt)
            cumulative = usage.get("completion_tokens")
            if cumulative is not None:
                cumulative = int(cumulative)
                out.usage_completion_tokens = cumulative
        if not choices:
            return True  # usage-only chunk: no token arrives with it
        for choice in choices:
            if type(choice) is dict and choice.get("finish_reason"):
                out.finish_reason = choice["finish_reason"]

        if cumulative is not None:
            # Continuous usage: the exact count of tokens this chunk delivered.
            out.continuous_usage = True
            tokens = cumulative - self._seen
            self._seen = cumulative
        elif out.continuous_usage:
            tokens = 0  # a server that sent continuous usage and then a chunk without: no new count
        else:
            tokens = 0 if all(type(c) is dict and _is_role_only(c) for c in choices) else 1
        if tokens > 0:
            out.token_offsets_s.append(offset)
            out.chunk_tokens.append(tokens)
        return True


def parse_stream(lines: Iterable[tuple[float, bytes]]) -> ParsedStream:
    """Parse a whole stamped stream: `StreamParser.feed` applied to every (offset, line)."""
    parser = StreamParser()
    for offset, raw in lines:
        if not parser.feed(offset, raw):
            break
    return parser.result
