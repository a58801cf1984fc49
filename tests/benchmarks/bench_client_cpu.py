"""CPU per token chunk of the suite and of the bulk asyncio client, measured as users meet them (issue 36).

Starts a server pinned to one core and drives it, pinned to the other core and one at a time, alternating in
rounds (A B A B), with:
- `suite`: a real headless `locust -f locustfiles/vllm_streaming.py` run with the suite's DEFAULT options (only the
  workload is set: --host, --steps N, --step-duration, --max-tokens, --run-dir): its metrics scraper, self-checks,
  records and fresh connection per request included, as a user runs it;
- `bulk`: tests/benchmarks/aiohttp_client.py `--read bulk --json json` (asyncio + aiohttp + uvloop, the body read in
  bulk, one stdlib `json.loads` per event, as vLLM's `bench serve` reads).
Servers (both: one event per token, continuous usage, vLLM's JSON shape, chunked transfer encoding):
- `vllmhttp`: tests/benchmarks/vllmhttpserver.py, vLLM's own HTTP stack (uvicorn + Starlette StreamingResponse);
- `streamserver`: tests/benchmarks/streamserver.py, the raw asyncio server of bench_generator.

The figure, as issue 36 defines it: the CPU time (user + system) of the client's whole process tree (the process,
its children recursively, and what reaped children left in their parents' counters) over a window of --window s,
divided by the tokens the server's own counter (GET /counter) says it sent in that window. The window starts
--warmup s after the server counted the client's first token. Each figure is given with its spread (min-max over
the rounds); the ratio is bulk / suite µs per chunk per round (target >= 1.3: the suite at 1/1.3 of the bulk
client's CPU). With --error-streams, each client also runs at those stream counts, and its TTFT error p99 is
computed as bench_generator does (client TTFT - (server's first send - server's receipt), requests that started
and ended inside the window, joined on X-Request-Id). On vllmhttp the receipt is a user-space stamp taken when the
handler began, so its errors include the server's own delay in reading the request.

    .venv/bin/python -m tests.benchmarks.bench_client_cpu [--servers vllmhttp,streamserver] [--streams 256]
        [--ttft-ms 20] [--itl-ms 10] [--tokens 128] [--warmup 5] [--window 10] [--rounds 2]
        [--error-streams 64,512] [--suite-args "--keep-alive"] [--write-docs]

--write-docs replaces the block between the bench_client_cpu markers in docs/explanation/measurement.md with this
run's tables. Prints the machine's load averages before and after each measurement: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import psutil

from tests.benchmarks.bench_generator import CLIENT_CPU, SERVER_CPU, p50_p99_ms

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "explanation" / "measurement.md"
BEGIN, END = "<!-- bench_client_cpu:begin -->", "<!-- bench_client_cpu:end -->"
SERVER_MODULES = {"vllmhttp": "tests.benchmarks.vllmhttpserver", "streamserver": "tests.benchmarks.streamserver"}
TARGET_RATIO = 1.3
TAIL_S = 4.0  # the client runs this long past the window's planned end: it must still be running at the end


class Server:
    def __init__(self, kind: str, ttft_ms: float, itl_ms: float) -> None:
        args = [sys.executable, "-m", SERVER_MODULES[kind], "--cpu", str(SERVER_CPU)]
        args += ["--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms)]
        self.proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("listening on "):
            self.proc.kill()
            raise RuntimeError(f"{kind} did not start: {line!r}")
        self.url = f"http://127.0.0.1:{int(line.split()[-1])}"

    def get(self, path: str):
        with urllib.request.urlopen(self.url + path, timeout=120) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process tree: every live process's own, plus what its reaped children left it."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return float("nan")
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.Error:  # gone between the listing and the read: its time is in its parent's children_*
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def start_client(
    client: str, url: str, streams: int, tokens: int, seconds: float, out: Path, extra: tuple[str, ...] = ()
) -> subprocess.Popen:
    if client == "suite":
        args = [
            "taskset", "-c", str(CLIENT_CPU), sys.executable, "-m", "locust", "-f",
            str(ROOT / "locustfiles" / "vllm_streaming.py"), "--headless", "--host", url, "--steps", str(streams),
            "--step-duration", f"{seconds:.0f}s", "--max-tokens", str(tokens), "--run-dir", str(out), *extra,
        ]  # fmt: skip
    else:
        out.mkdir(parents=True)
        args = [
            sys.executable, "-m", "tests.benchmarks.aiohttp_client", "--url", url, "--read", "bulk", "--json", "json",
            "--users", str(streams), "--seconds", f"{seconds:g}", "--max-tokens", str(tokens),
            "--out", str(out / "records.jsonl"), "--cpu", str(CLIENT_CPU),
        ]  # fmt: skip
    return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def client_records(client: str, out: Path) -> pd.DataFrame:
    if client == "suite":
        records = pd.read_parquet(out / "requests.parquet")
        return records[records["status"] == "ok"]
    return pd.DataFrame(orjson.loads(line) for line in (out / "records.jsonl").read_bytes().splitlines())


def ttft_errors(records: pd.DataFrame, truth: dict, w0: float, w1: float) -> list[float]:
    """Client TTFT - (server's first send - its receipt), for requests that started and ended inside [w0, w1)."""
    errors = []
    for r in records.itertuples():
        t = truth.get(r.request_id)
        offsets = np.asarray(r.chunk_offsets_s)
        if t is None or not t["sent"] or r.start_time < w0 or len(offsets) == 0 or r.start_time + offsets[-1] >= w1:
            continue
        errors.append(offsets[0] - (t["sent"][0] - t["received"]))
    return errors


@dataclass
class Round:
    server: str
    client: str
    streams: int
    tok_s: float
    us_per_chunk: float
    cpu_pct: float
    load: tuple[float, float]  # 1-minute load average before and after
    ttft_p99_ms: float | None = None
    requests: int = 0


def wait_first_token(server: Server, proc: subprocess.Popen, before: int, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while server.get("/counter")["tokens"] == before:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"no token within {timeout:g} s: {proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.05)


def measure(server: Server, kind: str, client: str, streams: int, a: argparse.Namespace, errors: bool) -> Round:
    server.get("/reset")
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        extra = tuple(a.suite_args.split())
        proc = start_client(client, server.url, streams, a.tokens, a.warmup + a.window + TAIL_S, out, extra)
        try:
            wait_first_token(server, proc, server.get("/counter")["tokens"])
            time.sleep(a.warmup)
            cpu0, c0 = tree_cpu(proc.pid), server.get("/counter")
            time.sleep(a.window)
            cpu1, c1 = tree_cpu(proc.pid), server.get("/counter")
            if proc.poll() is not None:
                raise RuntimeError(f"{client} ended inside the window: {proc.stderr.read().decode()[-2000:]}")
            _, err = proc.communicate(timeout=a.warmup + a.window + 180)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if proc.returncode not in (0, 1):
            raise RuntimeError(f"{client} exited {proc.returncode}: {err.decode()[-2000:]}")
        tokens, span = c1["tokens"] - c0["tokens"], c1["time"] - c0["time"]
        r = Round(
            kind, client, streams, tokens / span, (cpu1 - cpu0) / tokens * 1e6, (cpu1 - cpu0) / span * 100,
            (load0, os.getloadavg()[0]),
        )  # fmt: skip
        if errors:
            e = ttft_errors(client_records(client, out), server.get("/truth"), c0["time"], c1["time"])
            r.requests = len(e)
            r.ttft_p99_ms = p50_p99_ms(e)[1] if e else None
    print(
        f"{kind} {streams} {client}: {r.tok_s:,.0f} tok/s, {r.us_per_chunk:.1f} µs/chunk, {r.cpu_pct:.0f} % CPU"
        + (f", TTFT err p99 {r.ttft_p99_ms:.2f} ms ({r.requests} requests)" if r.ttft_p99_ms is not None else "")
        + f"; load {r.load[0]:.2f} -> {r.load[1]:.2f}",
        flush=True,
    )
    return r


def spread(values: list[float], f: str = "{:.1f}") -> str:
    lo, hi = min(values), max(values)
    return f.format(lo) if f.format(lo) == f.format(hi) else f"{f.format(lo)}-{f.format(hi)}"


@dataclass
class Results:
    args: argparse.Namespace
    rounds: list[Round] = field(default_factory=list)

    def of(self, server: str, client: str, streams: int) -> list[Round]:
        return [r for r in self.rounds if (r.server, r.client, r.streams) == (server, client, streams)]

    def cpu_table(self) -> list[str]:
        a = self.args
        rows = [
            "| server | suite µs/chunk | bulk µs/chunk | ratio bulk / suite (target >= 1.3) | tok/s suite / bulk |"
            " client CPU suite / bulk |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for kind in a.servers:
            s, b = self.of(kind, "suite", a.streams), self.of(kind, "bulk", a.streams)
            if not s or not b:
                continue
            ratios = [y.us_per_chunk / x.us_per_chunk for x, y in zip(s, b)]
            rows.append(
                f"| {kind} | {spread([r.us_per_chunk for r in s])} | {spread([r.us_per_chunk for r in b])} |"
                f" {spread(ratios, '{:.2f}')} | {spread([r.tok_s for r in s], '{:,.0f}')} /"
                f" {spread([r.tok_s for r in b], '{:,.0f}')} | {spread([r.cpu_pct for r in s], '{:.0f} %')} /"
                f" {spread([r.cpu_pct for r in b], '{:.0f} %')} |"
            )
        return rows

    def error_table(self) -> list[str]:
        a = self.args
        rows = [
            "| server | streams | suite TTFT err p99 (ms) | bulk TTFT err p99 (ms) | tok/s suite / bulk |"
            " µs/chunk suite / bulk |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for kind in a.servers:
            for n in [a.streams, *a.error_streams]:
                s, b = self.of(kind, "suite", n), self.of(kind, "bulk", n)
                if not s or not b:
                    continue
                err = [
                    spread([r.ttft_p99_ms for r in rs if r.ttft_p99_ms is not None] or [float("nan")], "{:.2f}")
                    for rs in (s, b)
                ]
                rows.append(
                    f"| {kind} | {n} | {err[0]} | {err[1]} | {spread([r.tok_s for r in s], '{:,.0f}')} /"
                    f" {spread([r.tok_s for r in b], '{:,.0f}')} | {spread([r.us_per_chunk for r in s])} /"
                    f" {spread([r.us_per_chunk for r in b])} |"
                )
        return rows

    def block(self, command: str) -> str:
        a = self.args
        loads = [x for r in self.rounds for x in r.load]
        lines = [
            BEGIN,
            f"Generated by `{command}` on {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC: {a.streams} timed "
            f"streams, {a.ttft_ms:g} ms TTFT, {a.itl_ms:g} ms per token, {a.tokens} tokens; server on CPU "
            f"{SERVER_CPU}, client on CPU {CLIENT_CPU}; {a.warmup:g} s after the first token, a {a.window:g} s window; "
            f"{a.rounds} rounds, the clients alternating (suite, bulk, suite, bulk, ...); each cell the min-max over "
            f"the rounds, the ratio per round. 1-minute load average during the run: {min(loads):.2f}-"
            f"{max(loads):.2f}.",
            "",
            *self.cpu_table(),
        ]
        lines += ["", "TTFT error p99 (the same server settings and rounds):", ""]
        lines += self.error_table()
        return "\n".join([*lines, END])


def write_docs(block: str) -> None:
    text = DOC.read_text()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{DOC}: no {BEGIN} ... {END} block to replace")
    DOC.write_text(pattern.sub(lambda _: block, text))
    print(f"wrote {DOC}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--servers", default="vllmhttp,streamserver")
    ap.add_argument("--clients", default="suite,bulk")
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--ttft-ms", type=float, default=20)
    ap.add_argument("--itl-ms", type=float, default=10)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--warmup", type=float, default=5)
    ap.add_argument("--window", type=float, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--error-streams", default="", help="also these stream counts, for the TTFT error p99 (64,512)")
    ap.add_argument("--suite-args", default="", help="options added to the suite's defaults (e.g. --keep-alive)")
    ap.add_argument("--write-docs", action="store_true", help=f"replace the marked block in {DOC.name}")
    a = ap.parse_args()
    a.servers = a.servers.split(",")
    a.error_streams = [int(n) for n in a.error_streams.split(",") if n]
    clients = a.clients.split(",")
    results = Results(a)
    for kind in a.servers:
        server = Server(kind, a.ttft_ms, a.itl_ms)
        try:
            for n in [a.streams, *a.error_streams]:
                for _ in range(a.rounds):
                    for client in clients:
                        results.rounds.append(measure(server, kind, client, n, a, errors=True))
        finally:
            server.stop()
    command = "python -m tests.benchmarks.bench_client_cpu " + " ".join(sys.argv[1:])
    block = results.block(command.replace(" --write-docs", ""))
    print("\n" + block)
    if a.write_docs:
        write_docs(block)


if __name__ == "__main__":
    main()
