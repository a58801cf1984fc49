"""Parse an OpenAI-compatible SSE completion stream that was stamped line by line.

The client stamps every line as it arrives and parses nothing until the stream is over; this module turns
those `(arrival offset, raw line)` pairs into token arrivals, usage and an outcome. Pure: no I/O, no Locust.

Reasoning models and tool calls: each token-carrying chat chunk is the answer (`delta.content`), a tool call
(`delta.tool_calls`) or reasoning (`delta.reasoning`, vLLM 0.32; `delta.reasoning_content`, older vLLM, SGLang and
others), looked at in that order, so a chunk that carries both the end of a thought and the start of the answer
(vLLM's reasoning parsers at `</think>` when one step brings several tokens: `{"reasoning": "...", "content":
"Hi"}`) is the answer's first chunk (TTFO); its tokens are split by the increase of the server's
usage.completion_tokens_details.reasoning_tokens over the chunk before (vLLM 0.32 with a reasoning parser and
continuous usage), else all counted as answer tokens. A chunk without any text (an empty string
or no field: a held-back partial character, the end-of-sequence token, the `</think>` token alone on a finish
chunk) counts with the field its empty string names (`"content": ""` answer, `"reasoning": ""` reasoning), else
with the chunk before it. The completions endpoint streams `text` only: all answer.
docs/how-to/reasoning-models.md says more.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import orjson

from . import error_body

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
# What a token-carrying chunk streamed (ParsedStream's split of the output).
ANSWER, TOOL_CALL, REASONING = 0, 1, 2
NO_CHUNK = -1  # before the first token-carrying chunk


@dataclass
class ParsedStream:
    token_offsets_s: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    usage_completion_tokens: int | None = None
    prompt_tokens: int | None = None
    # usage.prompt_tokens_details.cached_tokens (vLLM with --enable-prompt-tokens-details, SGLang with
    # --enable-cache-report): the prompt tokens found in the server's prefix cache; None when it was not sent.
    cached_prompt_tokens: int | None = None
    continuous_usage: bool = False
    finish_reason: str | None = None
    done: bool = False
    events: int = 0
    error_type: str | None = None
    error: str | None = None
    # The split of the output (see the module's docstring): tokens of the reasoning chunks (with continuous usage
    # the exact tokens each carried; without, one per chunk), the offset of the first answer or tool-call chunk
    # (TTFO; None while only reasoning came), the token-carrying chunks that streamed a tool call.
    reasoning_chunk_tokens: int = 0
    first_output_offset_s: float | None = None
    tool_call_chunks: int = 0
    # usage.completion_tokens_details.reasoning_tokens of the final usage (vLLM 0.32 with a reasoning parser): the
    # server's own count, which leaves out the <think> and </think> tokens; None when it was not sent.
    usage_reasoning_tokens: int | None = None

    @property
    def output_tokens(self) -> int:
        """Output tokens = last usage.completion_tokens, else the sum of per-chunk token counts."""
        if self.usage_completion_tokens is not None:
            return self.usage_completion_tokens
        return sum(self.chunk_tokens)

    @property
    def output_tokens_estimated(self) -> bool:
        return self.usage_completion_tokens is None

    @property
    def reasoning_tokens(self) -> int:
        """Reasoning tokens = the tokens of the reasoning chunks with continuous usage; without it, the server's
        usage.completion_tokens_details.reasoning_tokens when sent, else the count of reasoning chunks."""
        if self.continuous_usage or self.usage_reasoning_tokens is None:
            return self.reasoning_chunk_tokens
        return self.usage_reasoning_tokens


def _is_role_only(choice: dict) -> bool:
    """A chat delta that only announces the assistant role carries no token."""
    delta = choice.get("delta")
    if not isinstance(delta, dict) or "role" not in delta:
        return False
    return not (
        delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning") or delta.get("tool_calls")
    )


def _quiet_kind(delta: dict, previous: int) -> int:
    """The kind of a token-carrying chat delta without answer text: a tool call, reasoning text, else the field its
    empty string names, else the kind of the chunk before it."""
    if delta.get("tool_calls"):
        return TOOL_CALL
    if delta.get("reasoning") or delta.get("reasoning_content"):
        return REASONING
    if type(delta.get("content")) is str:
        return ANSWER
    if type(delta.get("reasoning")) is str or type(delta.get("reasoning_content")) is str:
        return REASONING
    return ANSWER if previous == NO_CHUNK else previous


def _reasoning_details(usage: dict) -> int | None:
    """usage.completion_tokens_details.reasoning_tokens, or None when the usage carries none."""
    details = usage.get("completion_tokens_details")
    count = details.get("reasoning_tokens") if type(details) is dict else None
    return None if count is None else int(count)


def _cached_tokens(usage: dict) -> int | None:
    """usage.prompt_tokens_details.cached_tokens, or None when the usage carries none."""
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if type(details) is dict else None
    return None if cached is None else int(cached)


def _choice_text(choice: object) -> str:
    """The answer text a choice carries: `text` (completions) or `delta.content` (chat); reasoning is not kept."""
    if type(choice) is not dict:
        return ""
    text = choice.get("text")
    if text is None:
        delta = choice.get("delta")
        text = delta.get("content") if type(delta) is dict else None
    return text if type(text) is str else ""


class StreamParser:
    """Incremental parser: feed each stamped line as it arrives (a few µs), read `.result` at the end.
    `keep_text=True` (conversations, which resend the answer) also keeps the streamed answer: `.text()`."""

    __slots__ = ("_kind", "_seen", "_usage", "result", "texts")

    def __init__(self, keep_text: bool = False) -> None:
        self.result = ParsedStream()
        self._seen = 0  # cumulative completion_tokens seen so far
        self._kind = NO_CHUNK  # the kind of the last token-carrying chunk (a chunk without text counts with it)
        self._usage: dict | None = None  # the last reasoning chunk's usage
        self.texts: list[str] | None = [] if keep_text else None  # None: one check per chunk, nothing kept

    def text(self) -> str:
        """The answer streamed so far (keep_text=True; "" otherwise)."""
        return "".join(self.texts) if self.texts else ""

    def feed(self, offset: float, raw: bytes) -> bool:
        """Token arrivals: a chunk carries (cumulative completion_tokens - previous), or 1 per choice without usage.

        Returns False once the stream has failed (an error event or malformed JSON): later lines are ignored.
        """
        out = self.result
        if out.error_type is not None:
            return False
        if raw[:5] != b"data:":
            return True  # blank separator, SSE comment (keep-alive) or a field (event:, id:) without payload
        payload = raw[5:]  # orjson skips the whitespace around the JSON: no stripped copy of every chunk
        if len(payload) < 16 and payload.strip() == DONE:
            out.done = True
            return True
        try:
            obj = orjson.loads(payload)
        except ValueError as e:
            out.error_type = MALFORMED_JSON
            out.error = f"chunk {out.events + 1} is not JSON ({e}): {payload.strip()[:120]!r}"
            return False
        if type(obj) is not dict:
            out.error_type = MALFORMED_JSON
            out.error = f"chunk {out.events + 1} is not a JSON object: {payload.strip()[:120]!r}"
            return False
        out.events += 1
        if "error" in obj or obj.get("object") == "error":
            out.error_type, out.error = (
                STREAM_ERROR,
                error_body.message_of(obj) or " ".join(str(obj).split())[: error_body.MESSAGE_CHARS],
            )
            return False

        choices = obj.get("choices")
        usage = obj.get("usage")
        cumulative = None
        if usage:
            # int() only for what is not an int already: a call saved twice per chunk (continuous usage)
            prompt = usage.get("prompt_tokens")
            if prompt is not None:
                out.prompt_tokens = prompt if type(prompt) is int else int(prompt)
            cumulative = usage.get("completion_tokens")
            if cumulative is not None:
                if type(cumulative) is not int:
                    cumulative = int(cumulative)
                out.usage_completion_tokens = cumulative
        if not choices:
            # Usage-only chunk: no token arrives with it. The final usage is where vLLM and SGLang put the cached
            # prompt tokens (their continuous-usage chunks carry none), so the token chunks never look for them.
            if usage:
                cached = _cached_tokens(usage)
                if cached is not None:
                    out.cached_prompt_tokens = cached
                reasoning = _reasoning_details(usage)
                if reasoning is not None:
                    out.usage_reasoning_tokens = reasoning
            return True
        # The first choice is looked at once, for its finish reason and its delta (the split below); the suite asks
        # for one choice (n = 1), and vLLM streams one per chunk: the others only for their finish reasons.
        first = choices[0] if type(choices) is list else None
        if type(first) is dict:
            delta = first.get("delta")
            if first.get("finish_reason"):
                self._finished(first, usage)
            if len(choices) > 1:
                for choice in choices[1:]:
                    if type(choice) is dict and choice.get("finish_reason"):
                        self._finished(choice, usage)
        else:
            delta = None
        if self.texts is not None:
            self.texts.extend(map(_choice_text, choices))

        if cumulative is not None:
            # Continuous usage: the exact count of tokens this chunk delivered.
            out.continuous_usage = True
            tokens = cumulative - self._seen
            self._seen = cumulative
        elif out.continuous_usage:
            tokens = 0  # a server that sent continuous usage and then a chunk without: no new count
        elif type(choices) is list and len(choices) == 1:
            tokens = 0 if type(first) is dict and _is_role_only(first) else 1
        else:
            tokens = 0 if all(type(c) is dict and _is_role_only(c) for c in choices) else 1
        if tokens > 0:
            out.token_offsets_s.append(offset)
            out.chunk_tokens.append(tokens)
            # The split (the module's docstring): one lookup for an answer chunk, the rest only without answer text.
            if type(delta) is not dict or delta.get("content"):  # completions' text, or chat answer text
                if self._kind:  # not after an answer chunk: the first one, or one after reasoning or a tool call
                    if self._kind == REASONING:
                        out.reasoning_chunk_tokens += self._boundary(delta, usage, tokens)
                    self._kind = ANSWER
                    if out.first_output_offset_s is None:
                        out.first_output_offset_s = offset
                return True
            if delta.get("reasoning") and not delta.get("tool_calls"):  # vLLM 0.32's thought, without a call
                kind = REASONING
            else:
                kind = _quiet_kind(delta, self._kind)
            if kind == REASONING:
                self._kind = kind
                self._usage = usage  # the usage before the chunk that may close the thought (_boundary)
                out.reasoning_chunk_tokens += tokens
                return True
            if self._kind == REASONING and kind == TOOL_CALL:
                out.reasoning_chunk_tokens += self._boundary(delta, usage, tokens)
            self._kind = kind
            if out.first_output_offset_s is None:
                out.first_output_offset_s = offset
            if kind == TOOL_CALL:
                out.tool_call_chunks += 1
        return True

    def _boundary(self, delta: dict, usage: dict | None, tokens: int) -> int:
        """The reasoning tokens of the chunk that ends the thought and starts the answer (or a tool call) when it
        carries both: the increase of the server's usage.completion_tokens_details.reasoning_tokens over the chunk
        before (vLLM 0.32 with a reasoning parser and continuous usage), all but one at most; 0 when the chunk has no
        reasoning text or the server sends no such count (then all its tokens are the answer's)."""
        if not (delta.get("reasoning") or delta.get("reasoning_content")) or not usage or not self._usage:
            return 0
        now, before = _reasoning_details(usage), _reasoning_details(self._usage)
        if now is None or before is None:
            return 0
        return max(0, min(tokens - 1, now - before))

    def _finished(self, choice: dict, usage: dict | None) -> None:
        """A choice with a finish reason: the reason, and the usage a server's last token chunk may hold."""
        out = self.result
        out.finish_reason = choice["finish_reason"]
        if usage:
            if out.cached_prompt_tokens is None:
                out.cached_prompt_tokens = _cached_tokens(usage)
            reasoning = _reasoning_details(usage)
            if reasoning is not None:
                out.usage_reasoning_tokens = reasoning


def parse_stream(lines: Iterable[tuple[float, bytes]]) -> ParsedStream:
    """Parse a whole stamped stream: `StreamParser.feed` applied to every (offset, line)."""
    parser = StreamParser()
    for offset, raw in lines:
        if not parser.feed(offset, raw):
            break
    return parser.result
