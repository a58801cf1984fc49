"""vLLM's own benchmark client as a baseline for bench_generator: `vllm bench serve`'s request function for the
completions API (vllm.benchmarks.lib.endpoint_request_func.async_request_openai_completions), closed loop.

Runs with the Python of an environment where vLLM is installed (bench_generator uses the embedded server's,
embedded_vllm.server.cache_dir() / "venv"), never the suite's. One aiohttp session with keep-alive as `bench serve`
makes it, N tasks, uvloop when it is installed (`bench serve` itself runs asyncio's default loop: uvloop only makes
this baseline stronger). vLLM stamps each event with time.perf_counter() after reading it; its offsets (TTFT, then
the inter-token gaps added up) are written as the suite's chunk_offsets_s, one token per chunk.

    <vllm venv>/bin/python tests/benchmarks/vllm_client.py --url http://127.0.0.1:PORT --users 64 --seconds 20 \
        --out F [--max-tokens 64] [--cpu 0]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import time
import uuid


async def user(session, func, make_input, stop_at: float, out: list) -> None:
    while time.time() < stop_at:
        rid = uuid.uuid4().hex
        start = time.time()
        result = await func(make_input(rid), session)
        if not result.success:
            out.append({"request_id": rid, "start_time": start, "chunk_offsets_s": [], "chunk_tokens": []})
            continue
        offsets = list(itertools.accumulate([result.ttft, *result.itl]))
        out.append(
            {"request_id": rid, "start_time": start, "chunk_offsets_s": offsets, "chunk_tokens": [1] * len(offsets)}
        )


async def run(url: str, users: int, seconds: float, max_tokens: int, out: list) -> None:
    import aiohttp
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncInput, async_request_openai_completions

    def make_input(rid: str) -> RequestFuncInput:
        return RequestFuncInput(
            prompt="Hello", api_url=url + "/v1/completions", prompt_len=1, output_len=max_tokens, model="bench",
            request_id=rid,
        )  # fmt: skip

    stop_at = time.time() + seconds
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60, force_close=False)  # as bench serve's
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=6 * 3600)) as session:
        tasks = [
            asyncio.create_task(user(session, async_request_openai_completions, make_input, stop_at, out))
            for _ in range(users)
        ]
        await asyncio.sleep(seconds)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--users", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--out", required=True)
    ap.add_argument("--cpu", type=int, default=None)
    a = ap.parse_args()
    if a.cpu is not None:
        os.sched_setaffinity(0, {a.cpu})
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    out: list[dict] = []
    asyncio.run(run(a.url, a.users, a.seconds, a.max_tokens, out))
    with open(a.out, "w") as f:
        for r in out:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
