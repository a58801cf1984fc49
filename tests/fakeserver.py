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
streams it (VllmChat in tests/fake_stream.py), and each /truth entry says when the first answer token was sent
(first_answer_s).

With --spec-decode K:A the server speculates: every decode step drafts K tokens and accepts exactly A, so each chunk
after the first carries A + 1 tokens and /metrics serves vLLM's vllm:spec_decode_* counters (acceptance rate A / K,
mean acceptance length 1 + A; a request's last, shorter chunk still counts one draft with A accepted).

POST /v1/embeddings answers at once after --embed-ms (+ --embed-per-input-ms per input), one vector of --embed-dim
values per input, as vLLM 0.32's EmbeddingResponse; its /truth entry has the inputs, their tokens and the send of
the body (last_sent_wall). Faults wrong_count, ragged and no_usage break its body's contract.

POST /v1/rerank (and /rerank, /v2/rerank) answers the same way with one item per document: results sorted by a
score that is the share of each document's words found in the query, top_n of them; its /truth entry has the
documents, the results and the prompt tokens (query + document per pair). Faults wrong_count, bad_index, no_usage.

With --lora a1=5,a2 it serves LoRA adapters under --model as vLLM with --lora-modules does: /v1/models lists them
with parent = --model, a request may ask for one (any other model is a 404), each streams at its own ITL when given,
each /truth entry says the model asked for, and /metrics exports vllm:lora_requests_info.
"""

from __future__ import annotations

import argparse
import json
import socket
import socketserver
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script (python tests/fakeserver.py): the repository on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fake_pooled import PooledEndpoints
from tests.fake_state import FAULT_KINDS, HOSTILE, RERANK_PATHS, Config, State
from tests.fake_stream import StreamEndpoint

# The tests count tokens and read images as the server does (tests.fakeserver.count_tokens, ...).
from tests.fake_text import (  # noqa: F401
    MAX_MODEL_LEN,
    count_tokens,
    decode_image,
    image_tokens,
    image_urls,
    unknown_fields,
    without_images,
)


class Handler(StreamEndpoint, PooledEndpoints, socketserver.StreamRequestHandler):
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
            # As vLLM with --lora-modules: the base model (root = itself), then each adapter with parent = it.
            data = [{"id": cfg.model, "object": "model", "root": cfg.model, "parent": None}]
            data += [{"id": n, "object": "model", "root": f"/adapters/{n}", "parent": cfg.model} for n in cfg.loras]
            return self.send_json(200, {"object": "list", "data": data})
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
                if cfg.loras:
                    text += lora_info_text(state, len(cfg.loras))
                if cfg.spec_tokens:  # vLLM's names and labels (vllm/v1/spec_decode/metrics.py)
                    drafts, k, a = state.spec_drafts, cfg.spec_tokens, sum(state.spec_per_position)
                    text += (
                        "# TYPE vllm:spec_decode_num_drafts_total counter\n"
                        f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="{m}"}} {drafts}\n'
                        "# TYPE vllm:spec_decode_num_draft_tokens_total counter\n"
                        f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="{m}"}} {drafts * k}\n'
                        "# TYPE vllm:spec_decode_num_accepted_tokens_total counter\n"
                        f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="{m}"}} {a}\n'
                        "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter\n"
                    )
                    for p in range(k):
                        n = state.spec_per_position[p] if p < len(state.spec_per_position) else 0
                        text += (
                            "vllm:spec_decode_num_accepted_tokens_per_pos_total"
                            f'{{engine="0",model_name="{m}",position="{p}"}} {n}\n'
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


def lora_info_text(state: State, max_lora: int) -> str:
    """vllm:lora_requests_info as vLLM 0.32 exports it (v1/metrics/loggers.py): the current adapters running and
    waiting as comma-separated label values, the value the Unix time that set was last current; earlier sets stay
    with their last time. Called under the state's lock."""
    current = (",".join(sorted(state.lora_running)), ",".join(sorted(state.lora_waiting)))
    state.lora_info[current] = time.time()
    lines = ["# TYPE vllm:lora_requests_info gauge"]
    for (running, waiting), t in state.lora_info.items():
        lines.append(
            f'vllm:lora_requests_info{{max_lora="{max_lora}",running_lora_adapters="{running}",'
            f'waiting_lora_adapters="{waiting}"}} {t!r}'
        )
    return "\n".join(lines) + "\n"


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


def parse_loras(text: str) -> dict[str, float | None]:
    """--lora a1=20,a2: adapter -> its ITL in s (None: the server's --itl-ms)."""
    out: dict[str, float | None] = {}
    for part in filter(None, (text or "").split(",")):
        name, _, itl = part.partition("=")
        out[name.strip()] = float(itl) / 1000 if itl else None
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
    p.add_argument("--lora", default="", metavar="NAME[=ITL_MS],...",
                   help="LoRA adapters served under --model: listed by /v1/models with parent = --model, accepted as "
                   "a request's model (any other model: 404), each with its own ITL when given; /metrics gains "
                   "vllm:lora_requests_info")  # fmt: skip
    p.add_argument("--spec-decode", default="", metavar="K:A",
                   help="speculative decoding: every decode step drafts K tokens and accepts exactly A (rate A/K), "
                   "streamed as chunks of A + 1 tokens after the first; /metrics gains vllm:spec_decode_*")  # fmt: skip
    a = p.parse_args(argv)
    spec_k, _, spec_a = a.spec_decode.partition(":")
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
        loras=parse_loras(a.lora),
        spec_tokens=int(spec_k or 0),
        spec_accepted=int(spec_a or 0),
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
