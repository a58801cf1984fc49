"""How much one load-generator process takes in, what each chunk costs it, and how exact its stamps stay.

Starts tests/benchmarks/streamserver.py pinned to one core and drives, pinned to another core and one at a
time: the suite's own user (a real headless `locust -f locustfiles/vllm_streaming.py` run, one process) and the
baseline, a plain asyncio + aiohttp + uvloop client (tests/benchmarks/aiohttp_client.py). Run on demand; prints
a table; asserts nothing.

    .venv/bin/python -m tests.benchmarks.bench_generator [--streams 1,16,64,256,512] [--flood-streams 16,64]
        [--warmup 5] [--measure 15] [--clients suite,aiohttp]

Definitions (every figure over the measured window: [first request + warm-up, + measure]):
- tok/s: token chunks that arrived in the window x tokens per chunk / window length;
- CPU µs/chunk: the client process's CPU time in the window (user + system, sampled from /proc every 0.1 s and
  interpolated to the window's edges) / token chunks that arrived in it; CPU %: that time / window length;
- errors (timed mode only; requests that started and finished inside the window, joined on X-Request-Id):
  TTFT error = client TTFT - (server's first send - server's receipt of the whole request): it contains the
  client's send delay (stamp taken, request not yet on the wire) and its read delay;
  ITL error = each client inter-chunk gap - the server's gap between the same two sends;
  TPOT error = client TPOT - server (last send - first send) / (tokens - 1).
  Shown as p50 / p99 of the absolute error, in ms.
- flagged: the suite's own verdict in steps.csv (generator_bound), when that column exists.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import psutil

ROOT = Path(__file__).resolve().parents[2]
SERVER_CPU, CLIENT_CPU = 1, 0
TTFT_MS, ITL_MS, MAX_TOKENS = 50.0, 10.0, 64
TARGETS = {"ttft_err_p99_ms": 5.0, "itl_err_p99_ms": 3.0, "tpot_err_p99_ms": 1.0, "throughput_ratio": 1.0}


class StreamServer:
    def __init__(self, flood: bool) -> None:
        args = [sys.executable, "-m", "tests.benchmarks.streamserver", "--cpu", str(SERVER_CPU)]
        args += ["--flood"] if flood else ["--ttft-ms", str(TTFT_MS), "--itl-ms", str(ITL_MS)]
        self.proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("listening on "):
            self.proc.kill()
            raise RuntimeError(f"stream server did not start: {line!r}")
        self.url = f"http://127.0.0.1:{int(line.split()[-1])}"

    def get(self, path: str):
        with urllib.request.urlopen(self.url + path, timeout=120) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


class CpuSampler:
    """The CPU seconds a process has used, sampled with wall-clock times, to read off any window afterwards."""

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
            self._stop.wait(0.1)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, start: float, end: float) -> float:
        ts, cpu = np.array(self.samples).T
        return float(np.interp(end, ts, cpu) - np.interp(start, ts, cpu))


def run_suite(url: str, users: int, seconds: float, out: Path) -> tuple[pd.DataFrame, CpuSampler, bool | None]:
    args = [
        sys.executable, "-m", "locust", "-f", str(ROOT / "locustfiles" / "vllm_streaming.py"), "--headless",
        "--host", url, "--steps", str(users), "--step-duration", f"{seconds:g}s", "--step-warmup", "0s",
        "--max-tokens", str(MAX_TOKENS), "--metrics-url", "off", "--stop-timeout", "0", "--run-dir", str(out),
        "--max-error-rate", "100%", "--only-summary",
    ]  # fmt: skip
    proc = subprocess.Popen(
        ["taskset", "-c", str(CLIENT_CPU), *args], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    sampler = CpuSampler(proc.pid)
    _, err = proc.communicate(timeout=seconds + 120)
    sampler.stop()
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"locust exited {proc.returncode}: {err.decode()[-2000:]}")
    records = pd.read_parquet(out / "requests.parquet")
    records = records[records["status"] == "ok"]
    steps = pd.read_csv(out / "steps.csv")
    flagged = bool(steps["generator_bound"].any()) if "generator_bound" in steps else None
    return records[["request_id", "start_time", "chunk_offsets_s", "chunk_tokens"]], sampler, flagged


def run_aiohttp(url: str, users: int, seconds: float, out: Path) -> tuple[pd.DataFrame, CpuSampler, None]:
    out.mkdir(parents=True)
    args = [
        sys.executable, "-m", "tests.benchmarks.aiohttp_client", "--url", url, "--users", str(users),
        "--seconds", f"{seconds:g}", "--max-tokens", str(MAX_TOKENS), "--out", str(out / "records.jsonl"),
        "--cpu", str(CLIENT_CPU),
    ]  # fmt: skip
    proc = subprocess.Popen(args, cwd=ROOT, stderr=subprocess.PIPE)
    sampler = CpuSampler(proc.pid)
    _, err = proc.communicate(timeout=seconds + 120)
    sampler.stop()
    if proc.returncode != 0:
        raise RuntimeError(f"aiohttp client exited {proc.returncode}: {err.decode()[-2000:]}")
    return pd.DataFrame(orjson.loads(line) for line in (out / "records.jsonl").read_bytes().splitlines()), sampler, None


CLIENTS = {"suite": run_suite, "aiohttp": run_aiohttp}


@dataclass
class Result:
    mode: str
    streams: int
    client: str
    tok_s: float
    cpu_us_per_chunk: float
    cpu_pct: float
    requests: int
    ttft: tuple[float, float] | None = None
    itl: tuple[float, float] | None = None
    tpot: tuple[float, float] | None = None
    flagged: bool | None = None
    send: tuple[float, float] | None = None  # the TTFT error's parts: stamp -> server has the request
    read: tuple[float, float] | None = None  # server sent the first token -> client stamped it


def p50_p99_ms(errors: list[float] | np.ndarray) -> tuple[float, float] | None:
    a = np.abs(np.asarray(errors, dtype=float)) * 1000
    return (float(np.percentile(a, 50)), float(np.percentile(a, 99))) if len(a) else None


def measure(mode: str, client: str, streams: int, server: StreamServer, warmup: float, window: float) -> Result:
    server.get("/reset")
    with tempfile.TemporaryDirectory() as tmp:
        records, cpu, flagged = CLIENTS[client](server.url, streams, warmup + window + 1, Path(tmp) / "run")
    truth = server.get("/truth") if mode == "timed" else {}
    w0 = records["start_time"].min() + warmup
    w1 = w0 + window
    arrivals = np.concatenate([s + np.asarray(o) for s, o in zip(records["start_time"], records["chunk_offsets_s"])])
    sizes = np.concatenate([np.asarray(t) for t in records["chunk_tokens"]])
    inside = (arrivals >= w0) & (arrivals < w1)
    chunks = int(inside.sum())
    cpu_s = cpu.between(w0, w1)
    result = Result(
        mode, streams, client, float(sizes[inside].sum()) / window, cpu_s / max(chunks, 1) * 1e6,
        cpu_s / window * 100, 0, flagged=flagged,
    )  # fmt: skip
    if mode != "timed":
        return result
    ttft, itl, tpot, send, read = [], [], [], [], []
    for r in records.itertuples():
        t = truth.get(r.request_id)
        offsets = np.asarray(r.chunk_offsets_s)
        if t is None or r.start_time < w0 or len(offsets) == 0 or r.start_time + offsets[-1] >= w1:
            continue
        sent = np.asarray(t["sent"])
        if len(sent) != len(offsets):  # one token per chunk: the k-th arrival is the k-th send
            print(f"  {client}: {len(offsets)} chunks read, {len(sent)} sent for {r.request_id}")
            continue
        result.requests += 1
        ttft.append(offsets[0] - (sent[0] - t["received"]))
        send.append(t["received"] - r.start_time)
        read.append(r.start_time + offsets[0] - sent[0])
        itl.extend(np.diff(offsets) - np.diff(sent))
        n = len(sent)
        tpot.append(((offsets[-1] - offsets[0]) - (sent[-1] - sent[0])) / (n - 1))
    result.ttft, result.itl, result.tpot = p50_p99_ms(ttft), p50_p99_ms(itl), p50_p99_ms(tpot)
    result.send, result.read = p50_p99_ms(send), p50_p99_ms(read)
    return result


def fmt(pair: tuple[float, float] | None) -> str:
    return "           -" if pair is None else f"{pair[0]:5.2f} {pair[1]:6.2f}"


def print_table(results: list[Result]) -> None:
    print(
        "\nmode   streams client    tok/s  CPU µs/chunk  CPU %  requests  TTFT err p50 p99  ITL err p50 p99"
        "  TPOT err p50 p99  flagged"
    )
    for r in results:
        flagged = "-" if r.flagged is None else ("yes" if r.flagged else "no")
        print(
            f"{r.mode:6} {r.streams:7} {r.client:8} {r.tok_s:8.0f} {r.cpu_us_per_chunk:13.1f} {r.cpu_pct:6.0f}"
            f" {r.requests:9}      {fmt(r.ttft)}     {fmt(r.itl)}      {fmt(r.tpot)}  {flagged}"
        )
    print("\nTTFT error, its parts (ms, p50 / p99): send = send stamp -> server holds the whole request; read = server")
    print("sent the first token -> client stamped it (the two clocks are the same machine's)")
    for r in results:
        if r.send:
            print(f"{r.mode:6} {r.streams:7} {r.client:8}  send {fmt(r.send)}   read {fmt(r.read)}")
    by = {(r.mode, r.streams, r.client): r for r in results}
    print("\nTargets (issue 8):")
    for r in results:
        if r.client == "suite" and r.mode == "flood" and ("flood", r.streams, "aiohttp") in by:
            ratio = r.tok_s / by[("flood", r.streams, "aiohttp")].tok_s
            print(f"- flood, {r.streams} streams: suite / aiohttp tok/s = {ratio:.2f} (target >= 1.0)")
        if r.client == "suite" and r.mode == "timed" and r.streams == 64 and r.ttft:
            print(
                f"- timed, 64 streams: TTFT err p99 {r.ttft[1]:.2f} ms (<= 5), ITL err p99 {r.itl[1]:.2f} ms (<= 3), "
                f"TPOT err p99 {r.tpot[1]:.2f} ms (<= 1)"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", default="1,16,64,256,512", help="concurrent streams, timed mode")
    ap.add_argument("--flood-streams", default="16,64", help="concurrent streams, flood mode ('' to skip)")
    ap.add_argument("--warmup", type=float, default=5)
    ap.add_argument("--measure", type=float, default=15)
    ap.add_argument("--clients", default="suite,aiohttp")
    a = ap.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        print("warning: fewer than 2 CPUs: server and client share one", file=sys.stderr)
    clients = a.clients.split(",")
    results = []
    for mode, levels in (("timed", a.streams), ("flood", a.flood_streams)):
        if not levels:
            continue
        server = StreamServer(flood=mode == "flood")
        try:
            for streams in (int(s) for s in levels.split(",")):
                for client in clients:
                    r = measure(mode, client, streams, server, a.warmup, a.measure)
                    results.append(r)
                    print(f"{mode} {streams} {client}: {r.tok_s:.0f} tok/s, {r.cpu_pct:.0f} % CPU", flush=True)
        finally:
            server.stop()
    print(
        f"\nserver: timed = {TTFT_MS:g} ms TTFT, {ITL_MS:g} ms per token, {MAX_TOKENS} tokens; flood = whole streams "
        f"at once. Server on CPU {SERVER_CPU}, client on CPU {CLIENT_CPU}; {a.warmup:g} s warm-up, "
        f"{a.measure:g} s measured."
    )
    print_table(results)


if __name__ == "__main__":
    main()
