"""The baselines for bench_generator: plain asyncio + aiohttp (+ uvloop) streaming clients, closed loop.

Written the way a careful engineer writes a minimal one: one session, N tasks, a stamp before the request, parsing
with one JSON decode per SSE event. Two ways of reading the body (`--read`):
- `bulk` (the strong baseline, as vLLM's `bench serve` reads): `resp.content.iter_any()` hands over whatever the
  socket had, stamped once per read; events are split off on the blank line that ends them (`bytes.find`), and each
  event's `data:` payload is decoded with the stdlib `json.loads`, as vLLM does. `--json orjson` decodes with orjson
  instead: a stronger baseline than vLLM's own, kept as a second reference.
- `lines`: `async for line in resp.content` (one `readline()` per line), stamped per line; about 1.5x slower than
  `bulk` in flood, kept as the weak reference earlier figures were measured against.

Writes one JSON line per finished request: its id, its wall-clock send stamp, the offsets (s) of its token chunks
and their token counts (from the continuous usage, as the suite counts them).

    python -m tests.benchmarks.aiohttp_client --url http://127.0.0.1:PORT --users 64 --seconds 20 --out F \
        [--read bulk|lines] [--json json|orjson] [--cpu 0]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import uuid

import orjson

BODY = {
    "model": "bench",
    "prompt": "Hello",
    "max_tokens": 64,
    "temperature": 0,
    "stream": True,
    "stream_options": {"include_usage": True, "continuous_usage_stats": True},
}


def parse(lines: list[tuple[float, bytes]]) -> tuple[list[float], list[int]]:
    """Token arrivals from stamped lines: a chunk carries (cumulative completion_tokens - previous)."""
    offsets, tokens, seen = [], [], 0
    for t, line in lines:
        if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
            continue
        obj = orjson.loads(line[6:])
        if not obj.get("choices"):
            continue
        n = obj["usage"]["completion_tokens"] - seen
        seen += n
        if n > 0:
            offsets.append(t)
            tokens.append(n)
    return offsets, tokens


async def user_lines(session, url: str, body: bytes, stop_at: float, out: list, loads) -> None:
    clock = time.perf_counter
    while time.time() < stop_at:
        rid = uuid.uuid4().hex
        start = time.time()
        t0 = clock()
        lines = []
        async with session.post(
            url, data=body, headers={"Content-Type": "application/json", "X-Request-Id": rid}
        ) as resp:
            async for line in resp.content:
                lines.append((clock() - t0, line))
        offsets, tokens = parse(lines)
        out.append({"request_id": rid, "start_time": start, "chunk_offsets_s": offsets, "chunk_tokens": tokens})


async def user_bulk(session, url: str, body: bytes, stop_at: float, out: list, loads) -> None:
    """Each read stamped once; its complete events decoded as they arrive (one decode per event)."""
    clock = time.perf_counter
    while time.time() < stop_at:
        rid = uuid.uuid4().hex
        start = time.time()
        t0 = clock()
        offsets: list[float] = []
        tokens: list[int] = []
        seen = 0
        buf = b""
        async with session.post(
            url, data=body, headers={"Content-Type": "application/json", "X-Request-Id": rid}
        ) as resp:
            async for data in resp.content.iter_any():
                t = clock() - t0
                buf += data
                begin = 0
                while True:
                    end = buf.find(b"\n\n", begin)
                    if end < 0:
                        break
                    event = buf[begin:end]
                    begin = end + 2
                    if not event.startswith(b"data: ") or event == b"data: [DONE]":
                        continue
                    obj = loads(event[6:])
                    if not obj.get("choices"):
                        continue
                    n = obj["usage"]["completion_tokens"] - seen
                    seen += n
                    if n > 0:
                        offsets.append(t)
                        tokens.append(n)
                buf = buf[begin:]
        out.append({"request_id": rid, "start_time": start, "chunk_offsets_s": offsets, "chunk_tokens": tokens})


READERS = {"bulk": user_bulk, "lines": user_lines}


async def run(url: str, users: int, seconds: float, max_tokens: int, out: list, read: str, loads) -> None:
    import aiohttp

    body = orjson.dumps({**BODY, "max_tokens": max_tokens})
    stop_at = time.time() + seconds
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=60)
    user = READERS[read]
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        tasks = [
            asyncio.create_task(user(session, url + "/v1/completions", body, stop_at, out, loads)) for _ in range(users)
        ]
        await asyncio.sleep(seconds)
        for t in tasks:
            t.cancel()  # requests in flight at the end are dropped, as a cut-off
        await asyncio.gather(*tasks, return_exceptions=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--users", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--out", required=True)
    ap.add_argument("--cpu", type=int, default=None)
    ap.add_argument("--read", choices=sorted(READERS), default="bulk")
    ap.add_argument("--json", choices=("json", "orjson"), default="json")
    a = ap.parse_args()
    if a.cpu is not None:
        os.sched_setaffinity(0, {a.cpu})
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    out: list[dict] = []
    loads = json.loads if a.json == "json" else orjson.loads
    asyncio.run(run(a.url, a.users, a.seconds, a.max_tokens, out, a.read, loads))
    with open(a.out, "wb") as f:
        for r in out:
            f.write(orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE))


if __name__ == "__main__":
    main()
