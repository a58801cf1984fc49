"""How much one load-generator process takes in, what each chunk costs it, and how exact its stamps stay.

Starts tests/benchmarks/streamserver.py pinned to one core and drives, pinned to the other core and one at a time,
alternating in rounds: the suite's own user (a real headless `locust -f locustfiles/vllm_streaming.py` run, one
process) and the baselines (tests/benchmarks/aiohttp_client.py, tests/benchmarks/vllm_client.py):
- `bulk`: asyncio + aiohttp + uvloop reading the body in bulk (`iter_any()`, events split on the blank line, one
  stdlib `json.loads` per event), as vLLM's `bench serve` reads: the baseline the targets are stated against;
- `bulk-orjson`: the same decoding with orjson: stronger than any client we know of, a second reference;
- `lines`: the same reading line by line (`async for line in resp.content`): the weak reference of earlier figures;
- `vllm`: vLLM's own request function (`async_request_openai_completions`), with the Python of the embedded
  server's environment, when vLLM is installed there (`python -m embedded_vllm install`); skipped otherwise.
Run on demand; prints a table; asserts nothing.

    .venv/bin/python -m tests.benchmarks.bench_generator [--streams 1,16,64,256,512] [--flood-streams 16,64]
        [--warmup 5] [--measure 15] [--rounds 3] [--clients suite,bulk,bulk-orjson,lines,vllm]
        [--timed-tokens 64] [--flood-tokens 256]

A client `suite:PATH` runs the suite of another checkout (e.g. a `git worktree` of the commit before a change), so
that a change to the per-chunk path is measured against its predecessor in the same run.

Definitions (every figure over the measured window: [first request + warm-up, + measure]):
- tok/s: token chunks that arrived in the window x tokens per chunk / window length;
- CPU µs/chunk: the client process's CPU time in the window (user + system, sampled from /proc every 0.1 s and
  interpolated to the window's edges) / token chunks that arrived in it; CPU %: that time / window length;
- capacity (tok/CPU-s): tokens per second of the client's CPU = tok/s / (CPU % / 100): what one process takes in
  when it is the bottleneck (equal to tok/s at 100 % CPU; above it when the server, not the client, set the pace);
- errors (timed mode only; requests that started and finished inside the window, joined on X-Request-Id):
  TTFT error = client TTFT - (server's first send - server's receipt of the whole request): it contains the
  client's send delay (stamp taken, request not yet on the wire) and its read delay;
  ITL error = each client inter-chunk gap - the server's gap between the same two sends;
  TPOT error = client TPOT - server (last send - first send) / (tokens - 1).
  Shown as p50 / p99 of the absolute error, in ms.
- flagged: the suite's own verdict in steps.csv (generator_bound), when that column exists.
With several rounds, each client's row is its best round (highest capacity; for the errors, the round with the
lowest TTFT error p99), and "spread" gives the lowest and highest capacity over the rounds.
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
from functools import partial
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import psutil

ROOT = Path(__file__).resolve().parents[2]
# Swapped with --swap-cpus: on a VM the two cores need not cost the same (interrupts, the other tenant).
SERVER_CPU, CLIENT_CPU = int(os.environ.get("BENCH_SERVER_CPU", 1)), int(os.environ.get("BENCH_CLIENT_CPU", 0))
TTFT_MS, ITL_MS = 50.0, 10.0
# Issue 21's targets: against the bulk baseline at 64 streams (flood), at 512 timed streams, at 64 timed streams.
CAPACITY_RATIO, CPU_US_PER_CHUNK_512, TTFT_ERR_P99_MS = 1.3, 20.0, 1.5


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


def run_suite(
    url: str, users: int, seconds: float, out: Path, tokens: int, root: Path = ROOT
) -> tuple[pd.DataFrame, CpuSampler, bool | None]:
    args = [
        sys.executable, "-m", "locust", "-f", str(root / "locustfiles" / "vllm_streaming.py"), "--headless",
        "--host", url, "--steps", str(users), "--step-duration", f"{seconds:g}s", "--step-warmup", "0s",
        "--max-tokens", str(tokens), "--metrics-url", "off", "--stop-timeout", "0", "--run-dir", str(out),
        "--max-error-rate", "100%", "--only-summary",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(root)}  # another checkout's suite (suite:PATH) imports its own modules
    proc = subprocess.Popen(
        ["taskset", "-c", str(CLIENT_CPU), *args], cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env=env,
    )  # fmt: skip
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


def _run_baseline(
    args: list[str], users: int, seconds: float, out: Path, tokens: int, cwd: Path = ROOT
) -> tuple[pd.DataFrame, CpuSampler, None]:
    out.mkdir(parents=True)
    args = [
        *args, "--users", str(users), "--seconds", f"{seconds:g}", "--max-tokens", str(tokens),
        "--out", str(out / "records.jsonl"), "--cpu", str(CLIENT_CPU),
    ]  # fmt: skip
    proc = subprocess.Popen(args, cwd=cwd, stderr=subprocess.PIPE)
    sampler = CpuSampler(proc.pid)
    _, err = proc.communicate(timeout=seconds + 120)
    sampler.stop()
    if proc.returncode != 0:
        raise RuntimeError(f"{args[:3]} exited {proc.returncode}: {err.decode()[-2000:]}")
    return pd.DataFrame(orjson.loads(line) for line in (out / "records.jsonl").read_bytes().splitlines()), sampler, None


def aiohttp_runner(read: str, decoder: str):
    def run(url: str, users: int, seconds: float, out: Path, tokens: int):
        args = [
            sys.executable,
            "-m",
            "tests.benchmarks.aiohttp_client",
            "--url",
            url,
            "--read",
            read,
            "--json",
            decoder,
        ]
        return _run_baseline(args, users, seconds, out, tokens)

    return run


def vllm_python() -> Path | None:
    """The Python of the embedded server's environment when vLLM is installed there, else None."""
    sys.path.insert(0, str(ROOT))
    from embedded_vllm.server import cache_dir

    python = cache_dir() / "venv" / "bin" / "python"
    if not python.exists():
        return None
    check = subprocess.run([str(python), "-c", "import vllm.benchmarks.lib.endpoint_request_func"], capture_output=True)
    return python if check.returncode == 0 else None


def run_vllm(url: str, users: int, seconds: float, out: Path, tokens: int):
    python = vllm_python()
    args = [str(python), str(ROOT / "tests" / "benchmarks" / "vllm_client.py"), "--url", url]
    return _run_baseline(args, users, seconds, out, tokens, cwd=out.parent)  # not ROOT: vLLM's own imports only


CLIENTS = {
    "suite": run_suite,
    "bulk": aiohttp_runner("bulk", "json"),
    "bulk-orjson": aiohttp_runner("bulk", "orjson"),
    "lines": aiohttp_runner("lines", "orjson"),
    "vllm": run_vllm,
}
BASELINE = "bulk"


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
    spread: tuple[float, float] | None = None  # lowest and highest capacity over the rounds

    @property
    def capacity(self) -> float:
        """Tokens per CPU-second of the client: tok/s / (CPU % / 100)."""
        return self.tok_s / (self.cpu_pct / 100) if self.cpu_pct > 0 else float("nan")


def p50_p99_ms(errors: list[float] | np.ndarray) -> tuple[float, float] | None:
    a = np.abs(np.asarray(errors, dtype=float)) * 1000
    return (float(np.percentile(a, 50)), float(np.percentile(a, 99))) if len(a) else None


def measure(
    mode: str, client: str, streams: int, server: StreamServer, warmup: float, window: float, tokens: int
) -> Result:
    server.get("/reset")
    with tempfile.TemporaryDirectory() as tmp:
        run = CLIENTS.get(client) or partial(run_suite, root=Path(client.partition(":")[2]).resolve())
        records, cpu, flagged = run(server.url, streams, warmup + window + 1, Path(tmp) / "run", tokens)
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


def best_of(rounds: list[Result]) -> Result:
    """A client's best round: the highest capacity (flood) or the lowest TTFT error p99 (timed), with the spread."""
    if rounds[0].mode == "timed" and all(r.ttft for r in rounds):
        best = min(rounds, key=lambda r: r.ttft[1])
    else:
        best = max(rounds, key=lambda r: r.capacity)
    capacities = [r.capacity for r in rounds]
    best.spread = (min(capacities), max(capacities))
    return best


def print_table(results: list[Result]) -> None:
    print(
        "\nmode   streams client         tok/s  capacity (spread)             CPU µs/chunk  CPU %  requests"
        "  TTFT err p50 p99  ITL err p50 p99  TPOT err p50 p99  flagged"
    )
    for r in results:
        flagged = "-" if r.flagged is None else ("yes" if r.flagged else "no")
        spread = f"({r.spread[0]:8.0f}-{r.spread[1]:8.0f})" if r.spread else " " * 19
        print(
            f"{r.mode:6} {r.streams:7} {r.client:12} {r.tok_s:8.0f} {r.capacity:9.0f} {spread}"
            f" {r.cpu_us_per_chunk:13.1f}"
            f" {r.cpu_pct:6.0f} {r.requests:9}      {fmt(r.ttft)}     {fmt(r.itl)}      {fmt(r.tpot)}  {flagged}"
        )
    print("\nTTFT error, its parts (ms, p50 / p99): send = send stamp -> server holds the whole request; read = server")
    print("sent the first token -> client stamped it (the two clocks are the same machine's)")
    for r in results:
        if r.send:
            print(f"{r.mode:6} {r.streams:7} {r.client:12}  send {fmt(r.send)}   read {fmt(r.read)}")
    by = {(r.mode, r.streams, r.client): r for r in results}
    print("\nTargets (issue 21):")
    for r in results:
        if r.client != "suite":
            continue
        if r.mode == "flood":
            for base in ("bulk", "bulk-orjson", "lines", "vllm"):
                other = by.get(("flood", r.streams, base))
                if other:
                    target = f" (target >= {CAPACITY_RATIO})" if base == BASELINE and r.streams == 64 else ""
                    print(
                        f"- flood, {r.streams} streams: suite / {base} capacity = {r.capacity / other.capacity:.2f}"
                        f", tok/s = {r.tok_s / other.tok_s:.2f}{target}"
                    )
        if r.mode == "timed" and r.streams == 512:
            print(f"- timed, 512 streams: CPU {r.cpu_us_per_chunk:.1f} µs/chunk (target <= {CPU_US_PER_CHUNK_512:g})")
        if r.mode == "timed" and r.streams == 64 and r.ttft:
            print(
                f"- timed, 64 streams: TTFT err p99 {r.ttft[1]:.2f} ms (target <= {TTFT_ERR_P99_MS}), ITL err p99 "
                f"{r.itl[1]:.2f} ms, TPOT err p99 {r.tpot[1]:.2f} ms"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", default="1,16,64,256,512", help="concurrent streams, timed mode ('' to skip)")
    ap.add_argument("--flood-streams", default="16,64", help="concurrent streams, flood mode ('' to skip)")
    ap.add_argument("--warmup", type=float, default=5)
    ap.add_argument("--measure", type=float, default=15)
    ap.add_argument("--rounds", type=int, default=3, help="rounds per level, the clients alternating in each")
    ap.add_argument("--clients", default="suite,bulk,bulk-orjson,lines,vllm")
    ap.add_argument("--timed-tokens", type=int, default=64, help="tokens per request, timed mode")
    ap.add_argument("--flood-tokens", type=int, default=256, help="tokens per request, flood mode")
    a = ap.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        print("warning: fewer than 2 CPUs: server and client share one", file=sys.stderr)
    clients = a.clients.split(",")
    if "vllm" in clients and vllm_python() is None:
        print("vllm: skipped (vLLM is not installed in the embedded server's environment)", file=sys.stderr)
        clients.remove("vllm")
    results = []
    for mode, levels, tokens in (("timed", a.streams, a.timed_tokens), ("flood", a.flood_streams, a.flood_tokens)):
        if not levels:
            continue
        server = StreamServer(flood=mode == "flood")
        try:
            for streams in (int(s) for s in levels.split(",")):
                rounds: dict[str, list[Result]] = {c: [] for c in clients}
                for k in range(a.rounds):
                    for client in clients:
                        r = measure(mode, client, streams, server, a.warmup, a.measure, tokens)
                        rounds[client].append(r)
                        print(
                            f"{mode} {streams} {client} round {k + 1}: {r.tok_s:.0f} tok/s, {r.cpu_pct:.0f} % CPU, "
                            f"{r.capacity:.0f} tok/CPU-s", flush=True,
                        )  # fmt: skip
                results += [best_of(rounds[c]) for c in clients]
        finally:
            server.stop()
    print(
        f"\nserver: timed = {TTFT_MS:g} ms TTFT, {ITL_MS:g} ms per token, {a.timed_tokens} tokens; flood = whole "
        f"streams of {a.flood_tokens} tokens at once. Server on CPU {SERVER_CPU}, client on CPU {CLIENT_CPU}; "
        f"{a.warmup:g} s warm-up, {a.measure:g} s measured, best of {a.rounds} round(s), the clients alternating."
    )
    print_table(results)


if __name__ == "__main__":
    main()
