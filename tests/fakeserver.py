"""An OpenAI-compatible streaming server with exactly known timing and injectable faults, for tests.

Runs in its own process (so its timing does not share the load generator's event loop) with one thread per
connection and absolute deadlines: token i of a request is sent at receipt + ttft + (i - 1) * itl, and a
chunk carrying tokens i..j goes out at token j's deadline (with --max-running, counted from the moment the
stream got a slot; with --slow-at-concurrency, each gap planned while exactly N streams ran is F times longer).
It records the actual send offsets per X-Request-Id, served at GET /truth, so a test can compare the client's
measurements with the truth.

    python tests/fakeserver.py --port 0 --ttft-ms 50 --itl-ms 10 --multi-every 7 --empty-every 5 \
        --faults http_500=11,stream_error=13
"""

from __future__ import annotations

import argparse
import json
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
)


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


def count_tokens(prompt: object = None, messages: object = None, special: bool = True) -> int:
    """The fake tokenizer: a word (whitespace-separated) of up to 4 characters is one token, longer words one
    token per 4 characters; the prompt gets one BOS token (with special tokens); chat messages get a BOS, 3
    template tokens per message and 1 for the generation prompt."""

    def words(text: str) -> int:
        return sum(-(-len(w) // 4) for w in str(text).split())

    if messages is not None:
        return 1 + sum(3 + words(m.get("content", "")) for m in messages) + 1
    return words(prompt or "") + (1 if special else 0)


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


class Handler(socketserver.StreamRequestHandler):
    server: Server

    def setup(self) -> None:
        super().setup()
        # Without TCP_NODELAY, Nagle plus delayed ACKs coalesce SSE events and ruin the timing.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

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
                    200, {"requests": state.requests, "ok": state.ok, "faults": state.faults, "tokens": state.tokens}
                )
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
                    f'vllm:request_success_total{{engine="0",finished_reason="length",model_name="{m}"}} {state.ok}\n'
                    "# TYPE vllm:generation_tokens counter\n"
                    f'vllm:generation_tokens_total{{engine="0",model_name="{m}"}} {state.tokens}\n'
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
            n = count_tokens(req.get("prompt"), req.get("messages"), bool(req.get("add_special_tokens", True)))
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

    def _stream(self, path: str, headers: dict, req: dict, t_recv: float, t_admit: float) -> bool:
        cfg: Config = self.server.config
        state: State = self.server.state
        _, fault = state.next_request(cfg.faults)
        request_id = headers.get("x-request-id", "")
        with state.lock:
            state.received.append(request_id)
            state.prompts.append(
                {"prompt": req.get("prompt"), "messages": req.get("messages"), "max_tokens": req.get("max_tokens")}
            )
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
        opts = req.get("stream_options") or {}
        include_usage = bool(opts.get("include_usage"))
        continuous = bool(opts.get("continuous_usage_stats"))
        n_tokens = cfg.tokens if cfg.tokens is not None else int(req.get("max_tokens") or 16)
        prompt_tokens = count_tokens(req.get("prompt"), req.get("messages"))
        self.wfile.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        self.wfile.flush()

        def event(obj_or_raw) -> None:
            data = obj_or_raw if isinstance(obj_or_raw, bytes) else json.dumps(obj_or_raw).encode()
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

        offsets: list[float] = []
        done = 0
        slowed = 0.0  # extra delay so far from --slow-at-concurrency (token gaps planned while it held)
        try:
            if chat:
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
                event(chunk(text, finish, done))
                offsets.append(time.perf_counter() - t_recv)
            if fault == "no_done":
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
                return True
            if include_usage:
                event(
                    {
                        "id": "cmpl-fake",
                        "object": "text_completion",
                        "model": cfg.model,
                        "choices": [],
                        "usage": {
                            "prompt_tokens": prompt_tokens,
                            "completion_tokens": done,
                            "total_tokens": prompt_tokens + done,
                        },
                    }
                )
            event(b"[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            return False
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
            }
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
