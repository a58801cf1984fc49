"""How many 1-input embeddings requests one load-generator process sustains, and what each costs it.

Starts a fast loopback embeddings server (this module with --serve: one asyncio/uvloop process, no framework,
answering every POST /v1/embeddings at once with one prebuilt vLLM-shaped body of one vector) pinned to one core,
then drives it with the suite's own user (a real headless `locust -f locustfiles/vllm_streaming.py --endpoint
embeddings --batch-size 1` run, one process) pinned to another core, at each user count in turn, with and without
--keep-alive. Run on demand; prints a table; asserts nothing.

    .venv/bin/python -m tests.benchmarks.bench_embeddings [--users 1,8,32] [--warmup 3] [--measure 10] [--dim 384]

Definitions (over the measured window [start + warm-up, + measure]):
- req/s: ok records whose body completed inside the window / window length (the server answers at once, so this
  is the client's own ceiling);
- CPU %: the client process's CPU time in the window (user + system, from /proc every 0.1 s) / window length;
  CPU µs/req: that time / requests;
- E2E p50 / p99: the records' e2e_s (the server's answer is immediate: this is the loop's own latency).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import psutil

ROOT = Path(__file__).resolve().parents[2]
SERVER_CPU, CLIENT_CPU = 1, 0


# --- the server ------------------------------------------------------------------------------------------------
def answer_body(dim: int) -> bytes:
    """One embedding of `dim` floats, shaped as vLLM 0.32's EmbeddingResponse (compact JSON)."""
    vector = [((i * 7919) % 1000) / 1000 - 0.5 for i in range(dim)]
    usage = {"prompt_tokens": 8, "total_tokens": 8, "completion_tokens": 0, "prompt_tokens_details": None}
    item = {"index": 0, "object": "embedding", "embedding": vector}
    return orjson.dumps(
        {"id": "embd-bench", "object": "list", "created": 1795966847, "model": "bench", "data": [item], "usage": usage}
    )


class Connection(asyncio.Protocol):
    def __init__(self, body: bytes) -> None:
        self.body = body
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = self.buf[:end].decode("latin-1").split("\r\n")
            path = lines[0].split(" ")[1]
            headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
            length = int(headers.get("content-length", "0"))
            if len(self.buf) < end + 4 + length:
                return
            self.buf = self.buf[end + 4 + length :]
            close = headers.get("connection", "").lower() == "close"
            if path.endswith("/v1/models"):
                body, status = b'{"object":"list","data":[{"id":"bench","object":"model"}]}', b"200 OK"
            elif path.endswith("/v1/embeddings"):
                body, status = self.body, b"200 OK"
            elif path == "/metrics":
                body, status = b"# no metrics: benchmark server\n", b"200 OK"
            else:
                body, status = b'{"error":{"message":"not found"}}', b"404 Not Found"
            self.transport.write(
                b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s"
                % (status, len(body), b"connection: close\r\n" if close else b"", body)
            )
            if close:
                self.transport.close()
                return


def serve(port: int, dim: int, cpu: int | None) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    gc.disable()
    body = answer_body(dim)

    async def run() -> None:
        srv = await asyncio.get_running_loop().create_server(lambda: Connection(body), "127.0.0.1", port, backlog=4096)
        print(f"listening on {srv.sockets[0].getsockname()[1]}", flush=True)
        await srv.serve_forever()

    asyncio.run(run())


# --- the client runs -------------------------------------------------------------------------------------------
class CpuSampler:
    """The process's CPU seconds (user + system) every 0.1 s, to read the time spent in a window."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                t = self.proc.cpu_times()
            except psutil.Error:
                return
            self.samples.append((time.time(), t.user + t.system))
            time.sleep(0.1)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, start: float, end: float) -> float:
        times, cpu = np.array(self.samples).T
        return float(np.interp(end, times, cpu) - np.interp(start, times, cpu))


def run_suite(url: str, users: int, seconds: float, keep_alive: bool, out: Path) -> tuple[pd.DataFrame, CpuSampler]:
    args = [
        "taskset", "-c", str(CLIENT_CPU), sys.executable, "-m", "locust", "-f", "locustfiles/vllm_streaming.py",
        "--headless", "--host", url, "--endpoint", "embeddings", "--batch-size", "1", "--steps", str(users),
        "--step-duration", f"{seconds:g}s", "--step-warmup", "0s", "--no-report", "--metrics-url", "off",
        "--max-error-rate", "100%", "--run-dir", str(out), *(["--keep-alive"] if keep_alive else []),
    ]  # fmt: skip
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    sampler = CpuSampler(proc.pid)
    _, err = proc.communicate(timeout=seconds + 120)
    sampler.stop()
    if not (out / "requests.parquet").exists():
        raise RuntimeError(f"the suite's run failed: {err.decode()[-2000:]}")
    return pd.read_parquet(out / "requests.parquet"), sampler


def measure(url: str, users: int, keep_alive: bool, warmup: float, window: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        records, sampler = run_suite(url, users, warmup + window + 1, keep_alive, Path(tmp) / "run")
    ok = records[records["status"] == "ok"]
    start = records["start_time"].min() + warmup
    end = start + window
    done = ok["start_time"] + ok["e2e_s"]
    inside = ok[(done >= start) & (done < end)]
    cpu = sampler.between(start, end)
    return {
        "users": users, "keep_alive": keep_alive, "req_s": len(inside) / window,
        "cpu_pct": 100 * cpu / window, "cpu_us_req": 1e6 * cpu / max(len(inside), 1),
        "e2e_p50_ms": 1e3 * float(np.percentile(inside["e2e_s"], 50)) if len(inside) else float("nan"),
        "e2e_p99_ms": 1e3 * float(np.percentile(inside["e2e_s"], 99)) if len(inside) else float("nan"),
        "errors": int(((records["status"] != "ok") & (records["error_type"] != "cut_off")).sum()),
        "cut_off": int((records["error_type"] == "cut_off").sum()),  # in flight when the run stopped
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--serve", action="store_true", help="be the server (used by the benchmark itself)")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--cpu", type=int, default=None)
    ap.add_argument("--dim", type=int, default=384, help="the answer's vector length")
    ap.add_argument("--users", default="1,8,32")
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--measure", type=float, default=10.0)
    ap.add_argument("--keep-alive", default="off,on", help="off, on or off,on")
    a = ap.parse_args()
    if a.serve:
        serve(a.port, a.dim, a.cpu)
        return
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.benchmarks.bench_embeddings", "--serve", "--cpu", str(SERVER_CPU),
         "--dim", str(a.dim)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = server.stdout.readline()
        if not line.startswith("listening on "):
            raise RuntimeError(f"the server did not start: {line!r}")
        url = f"http://127.0.0.1:{int(line.split()[-1])}"
        rows = []
        for keep in [k.strip() == "on" for k in a.keep_alive.split(",")]:
            for users in [int(u) for u in a.users.split(",")]:
                row = measure(url, users, keep, a.warmup, a.measure)
                rows.append(row)
                print(
                    f"users {row['users']:>3}  keep-alive {'on ' if keep else 'off'}  {row['req_s']:8.0f} req/s  "
                    f"CPU {row['cpu_pct']:5.1f}%  {row['cpu_us_req']:6.0f} µs/req  E2E p50 {row['e2e_p50_ms']:.2f} "
                    f"ms p99 {row['e2e_p99_ms']:.2f} ms  errors {row['errors']} (+{row['cut_off']} cut off)",
                    flush=True,
                )
    finally:
        server.kill()
        server.wait()
    print(f"\n{a.dim}-float vector, 1 input per request; client on CPU {CLIENT_CPU}, server on CPU {SERVER_CPU}")


if __name__ == "__main__":
    main()
