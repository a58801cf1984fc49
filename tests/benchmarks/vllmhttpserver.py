"""A loopback completions server on vLLM's own HTTP stack, for measuring clients as users meet them.

uvicorn (httptools, uvloop: what vLLM 0.32's `vllm serve` runs, the same versions) with a Starlette
`StreamingResponse` over an async generator, as vLLM's `/v1/completions` answers a stream: one `data:` event per
token, each handed to uvicorn as its own body message, so uvicorn frames each as one chunk of its chunked transfer
encoding. The events are vLLM 0.32's exactly: their JSON shape and key order are taken from the real capture
`tests/fixtures/completions_continuous_usage.sse` (continuous usage stats in every chunk, a last usage-only chunk
with `system_fingerprint`, `data: [DONE]`), checked byte for byte at startup; each request gets its own
`cmpl-<16 hex>` id, `created` and the requested model.

Timing: token i is yielded at receipt + ttft + (i - 1) * itl (absolute deadlines, no drift; receipt = when the
handler began, a user-space stamp: uvicorn owns the socket). Every yield is stamped (wall clock) and counted:
- GET /counter: {"tokens": tokens yielded so far, "requests": streams finished, "time": wall clock}: a benchmark
  reads it at both ends of a window, so its tokens per window come from the server's own count;
- GET /truth: per X-Request-Id {"received": receipt, "sent": [stamp per token]}; GET /reset clears it;
- GET /metrics and /version: the real vLLM 0.32 metrics capture and version, so a client's defaults (server-type
  detection, the metrics scraper) behave as against vLLM; GET /v1/models lists the model.

    python -m tests.benchmarks.vllmhttpserver --port 0 --ttft-ms 20 --itl-ms 10 [--cpu 1] [--model bench]

Prints "listening on PORT" when ready. max_tokens of each request sets its length (default 16).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import socket
import time
from pathlib import Path

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CAPTURE = FIXTURES / "completions_continuous_usage.sse"
METRICS = FIXTURES / "vllm-0.32-cpu-metrics.txt"
TEXTS = (" the", " model", " answers", ",", " and", " then")  # token texts, cycled (the capture's are a tiny model's)


def capture_templates() -> tuple[dict, dict]:
    """The capture's first token event and its usage-only event, checked to re-encode to the captured bytes."""
    events = [e[6:] for e in CAPTURE.read_bytes().split(b"\n\n") if e.startswith(b"data: ") and e != b"data: [DONE]"]
    for raw in events:
        if orjson.dumps(orjson.loads(raw)) != raw:
            raise SystemExit(f"{CAPTURE}: an event does not re-encode to its own bytes")
    token, usage = orjson.loads(events[0]), orjson.loads(events[-1])
    if usage["choices"] or "system_fingerprint" not in usage or not token["choices"]:
        raise SystemExit(f"{CAPTURE}: not the expected token and usage events")
    return token, usage


class Stats:
    def __init__(self) -> None:
        self.tokens = 0
        self.requests = 0
        self.truth: dict[str, dict] = {}


def make_app(ttft_s: float, itl_s: float, model: str) -> Starlette:
    token_tpl, usage_tpl = capture_templates()
    stats = Stats()
    metrics = METRICS.read_text()

    def event(obj: dict) -> bytes:
        return b"data: " + orjson.dumps(obj) + b"\n\n"

    async def stream(received: float, rid: str, n: int, prompt_tokens: int, name: str):
        loop = asyncio.get_running_loop()
        start = loop.time() + ttft_s - (time.time() - received)  # deadlines from the receipt
        sent: list[float] = []
        stats.truth[rid] = {"received": received, "sent": sent}
        cid, created = f"cmpl-{secrets.token_hex(8)}", int(received)
        choice = dict(token_tpl["choices"][0])
        obj = {**token_tpl, "id": cid, "created": created, "model": name, "choices": [choice]}
        usage = obj["usage"] = {"prompt_tokens": prompt_tokens, "total_tokens": 0, "completion_tokens": 0}
        for i in range(1, n + 1):
            delay = start + (i - 1) * itl_s - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            choice["text"] = TEXTS[i % len(TEXTS)]
            choice["finish_reason"] = "length" if i == n else None
            usage["total_tokens"], usage["completion_tokens"] = prompt_tokens + i, i
            data = event(obj)
            sent.append(time.time())
            stats.tokens += 1
            yield data
        last = {**usage_tpl, "id": cid, "created": created, "model": name}
        last["usage"] = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + n, "completion_tokens": n}
        stats.requests += 1
        yield event(last)  # vLLM yields the usage chunk and [DONE] apart: two chunks on the wire
        yield b"data: [DONE]\n\n"

    async def completions(request: Request) -> Response:
        received = time.time()
        body = orjson.loads(await request.body())
        prompt = body.get("prompt") or ""
        prompt_tokens = max(1, len(prompt.split())) if isinstance(prompt, str) else len(prompt)
        gen = stream(
            received, request.headers.get("x-request-id", ""), int(body.get("max_tokens") or 16), prompt_tokens,
            body.get("model") or model,
        )  # fmt: skip
        return StreamingResponse(gen, media_type="text/event-stream")

    def json(obj) -> Response:
        return Response(orjson.dumps(obj), media_type="application/json")

    async def counter(_: Request) -> Response:
        return json({"tokens": stats.tokens, "requests": stats.requests, "time": time.time()})

    async def truth(_: Request) -> Response:
        return json(stats.truth)

    async def reset(_: Request) -> Response:
        stats.truth.clear()
        return json({})

    async def models(_: Request) -> Response:
        return json({"object": "list", "data": [{"id": model, "object": "model", "owned_by": "vllm"}]})

    async def version(_: Request) -> Response:
        return json({"version": "0.32.0"})

    async def prometheus(_: Request) -> Response:
        return PlainTextResponse(metrics)

    return Starlette(
        routes=[
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/counter", counter),
            Route("/truth", truth),
            Route("/reset", reset),
            Route("/v1/models", models),
            Route("/version", version),
            Route("/metrics", prometheus),
        ]
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--ttft-ms", type=float, default=20)
    ap.add_argument("--itl-ms", type=float, default=10)
    ap.add_argument("--model", default="bench")
    ap.add_argument("--cpu", type=int, default=None, help="pin to this CPU")
    a = ap.parse_args()
    if a.cpu is not None:
        os.sched_setaffinity(0, {a.cpu})
    app = make_app(a.ttft_ms / 1000, a.itl_ms / 1000, a.model)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", a.port))
    sock.listen(4096)  # before "listening on": a client may connect at once
    # As vLLM runs it: httptools and uvloop; no access log (vLLM logs each request: server CPU, not the client's).
    config = uvicorn.Config(
        app, loop="uvloop", http="httptools", log_level="warning", access_log=False, backlog=4096,
        timeout_keep_alive=5,
    )  # fmt: skip
    print(f"listening on {sock.getsockname()[1]}", flush=True)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
