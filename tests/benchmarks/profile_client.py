"""Where the suite's load process spends its CPU at N timed streams: a py-spy sampling profile, split by part.

Starts a server (bench_client_cpu's: vllmhttp or streamserver) pinned to one core and the suite with its default
options pinned to the other, then, --warmup s after the server counted the first token, samples the locust process
with py-spy (`record --nonblocking`: the process is never paused, so its timing is not disturbed; py-spy itself runs
on the server's core) for --seconds with `--gil` (only the samples in which the main thread held the GIL), and
splits them into parts, by the first frame from the leaf that names one:
- hub: gevent's hub (its loop and the callbacks it runs) when no part below is on the stack;
- wait: waiting for the socket to become readable (`wait(readable)` in locustfiles/stream_client.py: arming the
  watcher and switching to the hub);
- recv: the `recvmsg` call (the system call and its receive stamp);
- split + parser call: the rest of the read loop (finding the last newline, splitting the lines, calling the
  parser for each, the bookkeeping);
- llhttp: geventhttpclient's llhttp parser (`feed`, and its body callback);
- SSE + orjson: analysis/sse.py's StreamParser (orjson's decode included);
- connect: getting a connected socket (a fresh connection per request by default);
- send: sending the request; record: finishing, serializing and writing each request's record;
- other: the rest (Locust, the self-checks, ...); its top functions are printed.
Without --native, time in C (llhttp, orjson, the system calls) counts for the Python line that called it.
Caveat, measured: py-spy cannot tell gevent's hub asleep in epoll from work. Without `--gil` the idle samples carry
the last greenlet's stack; with it, the samples holding the GIL were still ~2x the main thread's CPU time from /proc
(printed with the table). The split is of py-spy's samples, a picture of where the loop is, not exact CPU shares.

    .venv/bin/python -m tests.benchmarks.profile_client [--server vllmhttp] [--streams 256] [--ttft-ms 20]
        [--itl-ms 10] [--tokens 128] [--warmup 5] [--seconds 10] [--rate 250] [--write-docs]

--write-docs replaces the block between the profile_client markers in docs/explanation/measurement.md.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import linecache
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from tests.benchmarks.bench_client_cpu import DOC, ROOT, Server, start_client, wait_first_token
from tests.benchmarks.bench_generator import SERVER_CPU

BEGIN, END = "<!-- profile_client:begin -->", "<!-- profile_client:end -->"
PARTS = ("hub", "wait", "recv", "split + parser call", "llhttp", "SSE + orjson", "connect", "send", "record", "other")
FRAME = re.compile(r"^(?P<func>.*) \((?P<file>.*):(?P<line>\d+)\)$")
READ_LOOP = {"wait(readable)": "wait", "recvmsg(": "recv", "feed(data)": "llhttp", "sendall(": "send"}


def part_of_line(func: str, file: str, line: int) -> str | None:
    """The part a frame names, or None to look further toward the root."""
    func = func.rpartition(".")[2]  # py-spy names methods Class.method
    if file.endswith("analysis/sse.py"):
        return "SSE + orjson"
    if file.endswith("locustfiles/stream_client.py"):
        if func == "_on_body":
            return "llhttp"
        if func == "stream":
            text = linecache.getline(str(ROOT / file), line)
            for needle, part in READ_LOOP.items():
                if needle in text:
                    return part
            return "connect" if "get_socket" in text else "split + parser call"
        if "get_socket" in func or "connect" in func.lower():
            return "connect"
    if "connectionpool" in file or func in ("create_connection", "get_socket"):
        return "connect"
    if file.endswith("kinds/streaming.py") and func in ("_finish", "record"):
        return "record"
    if file.endswith(("locustfiles/tracker.py", "locustfiles/output.py", "analysis/records.py")):
        return "record"
    return None


def classify(stack: list[str]) -> str:
    """The part of one sampled stack (root first, as py-spy's raw format lists it)."""
    for frame in reversed(stack):
        m = FRAME.match(frame)
        if m:
            part = part_of_line(m["func"], m["file"], int(m["line"]))
            if part:
                return part
    if any("gevent/hub.py" in f or "gevent/_" in f for f in stack[:2]):
        return "hub"
    return "other"


def split(raw: str) -> tuple[collections.Counter, collections.Counter, int]:
    """Samples per part of the main thread. py-spy's `--gil` keeps the samples in which the thread held the GIL:
    gevent's hub lets it go while it sleeps in epoll, and without `--gil` py-spy counted that sleep under the last
    greenlet's stack (the parts' samples then exceeded the thread's CPU time in /proc by 2x)."""
    threads: dict[str, list[tuple[list[str], int]]] = collections.defaultdict(list)
    for row in raw.splitlines():
        stack_text, _, count = row.rpartition(" ")
        if not count.isdigit():
            continue
        frames = stack_text.split(";")
        thread = next((f for f in frames if f.startswith("thread ")), "")
        stack = [f for f in frames if not f.startswith(("process ", "thread "))]
        threads[thread].append((stack, int(count)))
    # The main thread runs the users; gevent's threadpool threads (idle, waiting on a lock) are left out.
    main = max(threads.values(), key=lambda rows: sum(n for s, n in rows if any("stream_client" in f for f in s)))
    parts: collections.Counter = collections.Counter()
    other: collections.Counter = collections.Counter()
    for stack, n in main:
        part = classify(stack)
        parts[part] += n
        if part == "other" and stack:
            other[stack[-1]] += n
    return parts, other, sum(parts.values())


def thread_cpu(pid: int) -> float:
    """CPU seconds of a process's main thread (its thread id is its pid)."""
    return next(t.user_time + t.system_time for t in psutil.Process(pid).threads() if t.id == pid)


def profile(a: argparse.Namespace) -> tuple[str, int, float]:
    server = Server(a.server, a.ttft_ms, a.itl_ms)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            proc = start_client("suite", server.url, a.streams, a.tokens, a.warmup + a.seconds + 6, Path(tmp) / "r")
            try:
                wait_first_token(server, proc, server.get("/counter")["tokens"])
                time.sleep(a.warmup)
                out = Path(tmp) / "profile.txt"
                spy = [
                    "taskset", "-c", str(SERVER_CPU), str(Path(sys.executable).with_name("py-spy")), "record",
                    "--pid", str(proc.pid), "--nonblocking", "--rate", str(a.rate), "--duration", f"{a.seconds:g}",
                    "--format", "raw", "--threads", "--gil", "--output", str(out),
                ]  # fmt: skip
                c0, cpu0, t0 = server.get("/counter"), thread_cpu(proc.pid), time.time()
                done = subprocess.run(spy, capture_output=True, text=True, timeout=a.seconds + 60)
                c1, cpu1, t1 = server.get("/counter"), thread_cpu(proc.pid), time.time()
                if done.returncode != 0 or not out.exists():
                    raise RuntimeError(f"py-spy failed ({done.returncode}): {done.stderr[-2000:]}")
                proc.communicate(timeout=a.warmup + a.seconds + 180)
                tok_s = int((c1["tokens"] - c0["tokens"]) / (c1["time"] - c0["time"]))
                return out.read_text(), tok_s, (cpu1 - cpu0) / (t1 - t0)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    finally:
        server.stop()


def table(parts: collections.Counter, total: int) -> list[str]:
    rows = ["| part | share of the samples holding the GIL |", "|---|---:|"]
    rows += [f"| {p} | {100 * parts[p] / total:.0f} % |" for p in PARTS]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", default="vllmhttp", choices=("vllmhttp", "streamserver"))
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--ttft-ms", type=float, default=20)
    ap.add_argument("--itl-ms", type=float, default=10)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--warmup", type=float, default=5)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    ap.add_argument("--raw", type=Path, help="keep py-spy's raw (collapsed) stacks here")
    ap.add_argument("--write-docs", action="store_true", help=f"replace the marked block in {DOC.name}")
    a = ap.parse_args()
    load0 = os.getloadavg()[0]
    raw, tok_s, cpu_fraction = profile(a)
    load1 = os.getloadavg()[0]
    if a.raw:
        a.raw.write_text(raw)
    parts, other, total = split(raw)
    rounds = round(a.rate * a.seconds)
    shown = [x for x in sys.argv[1:] if x != "--write-docs"]
    if "--raw" in shown:  # where this run kept its stacks: not part of how to rerun it
        del shown[shown.index("--raw") : shown.index("--raw") + 2]
    command = " ".join(["python -m tests.benchmarks.profile_client", *shown])
    block = "\n".join(
        [
            BEGIN,
            f"Generated by `{command}` on {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC: the suite (default "
            f"options) at {a.streams} timed streams against {a.server} ({a.ttft_ms:g} ms TTFT, {a.itl_ms:g} ms per "
            f"token, {a.tokens} tokens; {tok_s:,} tok/s by the server's count). The main thread was on the CPU "
            f"{100 * cpu_fraction:.0f} % of the window (/proc); {total:,} of {rounds:,} samples "
            f"({100 * total / rounds:.0f} %) held the GIL (hub: its Python and Cython work; libev and epoll, without "
            f"the GIL, are not in them); "
            f"1-minute load average {load0:.2f} before, {load1:.2f} after.",
            "",
            *table(parts, total),
            END,
        ]
    )
    print(block)
    print("\nother, by leaf frame:")
    for frame, n in other.most_common(15):
        print(f"  {100 * n / total:5.1f} %  {frame}")
    if a.write_docs:
        text = DOC.read_text()
        pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
        if not pattern.search(text):
            raise SystemExit(f"{DOC}: no {BEGIN} ... {END} block to replace")
        DOC.write_text(pattern.sub(lambda _: block, text))
        print(f"wrote {DOC}")


if __name__ == "__main__":
    main()
