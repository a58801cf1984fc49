"""The fake server's configuration, its shared state and its fault kinds (tests/fakeserver.py)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from tests.fake_text import PrefixCache

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
    "trickle",  # after a few tokens, one byte a second (never a whole line) for --stall-s seconds
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
    # LoRA adapters served under the base model: name -> its own ITL (None: --itl-ms). With any, /v1/models lists them
    # (parent = the base model), an unknown model is a 404 and /metrics has vllm:lora_requests_info (issue 35).
    loras: dict[str, float | None] = field(default_factory=dict)
    # Speculative decoding (--spec-decode K:A): every decode step proposes K draft tokens and accepts exactly A, so
    # the acceptance rate is A / K and each chunk after the first carries A + 1 tokens (0: no speculation).
    spec_tokens: int = 0
    spec_accepted: int = 0


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
        self.lora_running: dict[str, int] = {}  # streams generating, per adapter
        self.lora_waiting: dict[str, int] = {}  # streams waiting for a slot (--max-running), per adapter
        # vllm:lora_requests_info's label sets: (running, waiting) -> the Unix time it was last the state (as vLLM's
        # gauge: set_to_current_time on the current set, the old sets kept with their last time)
        self.lora_info: dict[tuple[str, str], float] = {}
        self.spec_drafts = 0  # --spec-decode: vllm:spec_decode_num_drafts_total, one per chunk after the first
        self.spec_per_position: list[int] = []  # accepted tokens per draft position (K entries)

    def spec_step(self, k: int, accepted: int) -> None:
        """One speculating decode step of one request: a draft of k tokens, the first `accepted` of them kept."""
        with self.lock:
            if len(self.spec_per_position) < k:
                self.spec_per_position += [0] * (k - len(self.spec_per_position))
            self.spec_drafts += 1
            for p in range(accepted):
                self.spec_per_position[p] += 1

    def next_request(self, faults: list[tuple[str, int]]) -> tuple[int, str | None]:
        with self.lock:
            self.requests += 1
            n = self.requests
            for kind, every in faults:
                if every and n % every == 0:
                    self.faults[kind] = self.faults.get(kind, 0) + 1
                    return n, kind
            return n, None
