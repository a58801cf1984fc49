"""How many records per second one master merges before it falls behind.

Real Locust processes on the real transport: one master (`--master`, pinned to CPU 0, alone) and N workers (pinned
to CPU 1 with this script and tests/fakeserver.py, which only answers the preflight and /metrics), all running
tests/benchmarks/intake_locustfile.py: the suite's plugin and step shape, and a user that fires `llm_request`
with a realistic record (256 one-token chunks, full-precision offsets: ~6 KB a line) at a fixed rate per user.
So every record takes the path of a streaming user's: the worker's own file, its RecordShipper (a batch every
0.5 s), Locust's zmq/msgpack message, the master's WorkerLedger writing records/received/<worker>.jsonl and firing
llm_worker_records. The steps ramp the offered rate (--rates, records/s: users = rate / --user-rate). Run on
demand; prints a table; asserts nothing.

    .venv/bin/python -m tests.benchmarks.bench_master_intake [--rates 1000,2000,5000,10000] [--level-s 12]
        [--workers 2] [--modes headless,webui] [--repeat 1] [--checkouts .] [--dir /tmp]

Definitions (each level's window: its step's start + 1 s to its end, from the master's run.json timeline):
- offered rec/s: records the workers wrote to their own files that ended (start_time + e2e_s) in the window /
  window length; merged rec/s: records whose line reached the master's received file in the window / window
  length; tok/s: merged rec/s x 256 output tokens;
- arrival on disk: the first moment this script (polling the received files' sizes every 10 ms) saw the file long
  enough to hold the line; lag = arrival - the record's end; p50 / p99 over the records that ended in the window
  (a record that never arrived counts as infinitely late); it contains the shipper's 0.5 s batching (0.25 s mean);
- trend: lag p50 of the window's last third - its first third (a backlog that grows shows as a positive trend);
- keeps up: every record arrived, lag p99 < 1.5 s and trend < 0.2 s (the lag stays bounded);
- master CPU %: its CPU time (user + system, sampled every 0.1 s, interpolated to the window's edges) / window
  length; µs/rec: that CPU time / merged records (1 core / µs/rec = the master's ceiling); RSS: its largest in
  the window; workers CPU %: all workers together (they share CPU 1 with this script: above ~90 % they, not the
  master, limit the offered rate);
- exact: each received file is byte for byte a prefix of that worker's own file (the records the master holds are
  exactly what the worker wrote, in order).
`--modes`: headless; webui: the master with its web UI (`--autostart`), whose LLM tab parses every line it
receives; watched: the same with a browser's poll of /stats/requests every 2 s, which the LLM tab answers with its
live table on every record so far (page s: the slowest answer in the window);
`--checkouts A,B` runs the master and workers from each checkout in turn (before/after a change, alternating).
"""

from __future__ import annotations

import argparse
import os
import signal
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
import psutil
from vllm_loadtest.analysis.records import LISTS_MARKER  # everything before it is a record's scalar fields

ROOT = Path(__file__).resolve().parents[2]
LOCUSTFILE = Path(__file__).resolve().parent / "intake_locustfile.py"
MASTER_CPU, OTHERS_CPU = 0, 1
CHUNKS = 256
POLL_S = 0.01
SKIP_S = 1.0  # each level's first second: its users are starting


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Sampler:
    """CPU seconds and RSS of some processes, sampled with wall-clock times."""

    def __init__(self, pids: list[int]) -> None:
        self.procs = [psutil.Process(p) for p in pids]
        self.samples: list[tuple[float, float, float]] = []  # (time, cpu s summed, rss bytes summed)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            cpu = rss = 0.0
            for p in self.procs:
                try:
                    t = p.cpu_times()
                    cpu += t.user + t.system
                    rss += p.memory_info().rss
                except psutil.Error:
                    pass
            self.samples.append((time.time(), cpu, rss))
            self._stop.wait(0.1)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def cpu_between(self, start: float, end: float) -> float:
        ts, cpu, _ = np.array(self.samples).T
        return float(np.interp(end, ts, cpu) - np.interp(start, ts, cpu))

    def rss_max(self, start: float, end: float) -> float:
        ts, _, rss = np.array(self.samples).T
        inside = (ts >= start) & (ts <= end)
        return float(rss[inside].max()) if inside.any() else float("nan")


class Poller:
    """A browser with Locust's page open: GET /stats/requests every 2 s (the page's own interval), which the LLM
    tab answers with its live table, computed on every record so far."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.times: list[tuple[float, float]] = []  # (when, seconds the answer took)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(2.0):
            t0 = time.time()
            try:
                with urllib.request.urlopen(self.url + "/stats/requests", timeout=60) as r:
                    r.read()
            except OSError:
                continue
            self.times.append((t0, time.time() - t0))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class Tail:
    """Polls the sizes of the master's received files: (time, size) per file, to date each line's arrival."""

    def __init__(self, received: Path) -> None:
        self.received = received
        self.sizes: dict[str, list[tuple[float, int]]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        names: list[str] = []
        last_glob = 0.0
        while not self._stop.is_set():
            now = time.time()
            if now - last_glob > 0.2:
                names = sorted(p.name for p in self.received.glob("*.jsonl")) if self.received.is_dir() else []
                last_glob = now
            for name in names:
                try:
                    size = os.stat(self.received / name).st_size
                except OSError:
                    continue
                series = self.sizes.setdefault(name, [])
                if not series or series[-1][1] != size:
                    series.append((now, size))
            self._stop.wait(POLL_S)

    def last_change(self) -> float:
        return max((s[-1][0] for s in self.sizes.values() if s), default=0.0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Level:
    checkout: str
    mode: str
    target: float
    offered: float
    merged: float
    lag_p50: float
    lag_p99: float
    trend: float
    missing: int
    master_cpu_pct: float
    us_per_record: float
    rss_mib: float
    workers_cpu_pct: float
    page_s: float  # watched: the slowest answer to the page's poll in the window

    @property
    def keeps_up(self) -> bool:
        # Lag only: merged and offered differ by a batch at the window's edges (0.5 s of one worker's records).
        return self.missing == 0 and self.lag_p99 < 1.5 and self.trend < 0.2


def parse_own(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(line end offsets, record ends) of a worker's own records file."""
    data = path.read_bytes()
    ends_at, rec_end = [], []
    pos = 0
    while True:
        nl = data.find(b"\n", pos)
        if nl < 0:
            break
        line = data[pos:nl]
        cut = line.find(LISTS_MARKER)
        r = orjson.loads(line[:cut] + b"}" if cut > 0 else line)
        ends_at.append(nl + 1)
        rec_end.append(r["start_time"] + r["e2e_s"])
        pos = nl + 1
    return np.array(ends_at, dtype=np.int64), np.array(rec_end)


def exact_prefix(own: Path, received: Path) -> bool:
    size = received.stat().st_size
    with open(own, "rb") as a, open(received, "rb") as b:
        while size > 0:
            n = min(size, 1 << 24)
            if a.read(n) != b.read(n):
                return False
            size -= n
    return True


def run_once(
    checkout: Path, mode: str, rates: list[float], user_rate: float, level_s: float, workers: int, base: Path
) -> tuple[list[Level], str, float]:
    run_dir = base / "run"
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(checkout), "INTAKE_USER_RATE": f"{user_rate:g}", "INTAKE_CHUNKS": "256"}
    fake = subprocess.Popen(
        [sys.executable, str(checkout / "tests" / "fakeserver.py"), "--port", "0"], stdout=subprocess.PIPE, text=True
    )
    line = fake.stdout.readline()
    if not line.startswith("PORT "):
        fake.kill()
        raise RuntimeError(f"fake server did not start: {line!r}")
    host = f"http://127.0.0.1:{int(line.split()[1])}"
    users = [max(1, round(r / user_rate)) for r in rates]
    web_port = free_port()
    web = ["--autostart", "--web-host", "127.0.0.1", "--web-port", str(web_port)]
    ui = ["--headless"] if mode == "headless" else web
    master_args = [
        "taskset", "-c", str(MASTER_CPU), sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), *ui, "--master",
        "--expect-workers", str(workers), "--master-bind-host", "127.0.0.1", "--master-bind-port", str(port),
        "--host", host, "--steps", ",".join(map(str, users)), "--step-duration", f"{level_s:g}s",
        "--step-warmup", "0s", "--stop-timeout", "0", "--run-dir", str(run_dir), "--only-summary",
        "--max-error-rate", "100%",
    ]  # fmt: skip
    log = open(base / "master.log", "w")
    master = subprocess.Popen(master_args, cwd=checkout, env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)  # fmt: skip
    procs = [master]
    worker_args = [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--worker", "--master-host", "127.0.0.1",
        "--master-port", str(port),
    ]  # fmt: skip
    for i in range(workers):
        out = open(base / f"worker{i}.log", "w")
        popen = dict(cwd=checkout, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        procs.append(subprocess.Popen(worker_args, **popen))
    tail = Tail(run_dir / "records" / "received")
    msampler = Sampler([master.pid])
    wsampler = Sampler([p.pid for p in procs[1:]])
    poller = Poller(f"http://127.0.0.1:{web_port}") if mode == "watched" else None
    timeline: list[dict] = []
    try:
        deadline = time.time() + 90 + level_s * len(rates)
        while time.time() < deadline and master.poll() is None:
            try:
                timeline = orjson.loads((run_dir / "run.json").read_bytes())["timeline"]
            except (OSError, orjson.JSONDecodeError, KeyError):
                timeline = []
            if len(timeline) == len(users) and timeline[-1].get("end_time") is not None:
                break
            time.sleep(0.2)
        else:
            if master.poll() is not None:
                raise RuntimeError(f"the master exited {master.returncode}: see {base / 'master.log'}")
        drain_until = time.time() + 20
        while time.time() < drain_until and time.time() - tail.last_change() < 1.5:
            time.sleep(0.1)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        fake.kill()
        fake.wait()
        tail.stop()
        if poller is not None:
            poller.stop()
        msampler.stop()
        wsampler.stop()
    if len(timeline) < len(users):
        raise RuntimeError(f"the run did not reach its last step: see {base / 'master.log'}")

    # Every record's end and arrival (NaN: never arrived before the processes were killed).
    ends, arrivals, exact = [], [], True
    for own in sorted((run_dir / "records").glob("*.jsonl")):
        received = run_dir / "records" / "received" / own.name
        offsets, rec_end = parse_own(own)
        arrival = np.full(len(offsets), np.nan)
        series = tail.sizes.get(own.name)
        if received.exists() and series:
            exact &= exact_prefix(own, received)
            ts, sizes = np.array(series).T
            idx = np.searchsorted(sizes, offsets, side="left")  # the first poll whose size covers the line
            got = idx < len(sizes)
            arrival[got] = ts[idx[got]]
        ends.append(rec_end)
        arrivals.append(arrival)
    ends, arrivals = np.concatenate(ends), np.concatenate(arrivals)
    n_records = len(ends)
    record_bytes = sum(o.stat().st_size for o in (run_dir / "records").glob("*.jsonl")) / max(n_records, 1)
    levels = []
    for k, target in enumerate(rates):
        entry = timeline[k]
        w0 = entry["start_time"] + SKIP_S
        w1 = timeline[k + 1]["start_time"] if k + 1 < len(timeline) else entry["end_time"]
        span = w1 - w0
        inside = (ends >= w0) & (ends < w1)
        lag = arrivals[inside] - ends[inside]
        lag = np.where(np.isnan(lag), np.inf, lag)
        third = (ends[inside] - w0) < span / 3, (ends[inside] - w0) >= 2 * span / 3
        merged = int(((arrivals >= w0) & (arrivals < w1)).sum())
        cpu = msampler.cpu_between(w0, w1)

        def q(a: np.ndarray, p: float) -> float:
            return float(np.quantile(a, p, method="inverted_cdf")) if len(a) else float("nan")

        level = Level(
            str(checkout), mode, target, inside.sum() / span, merged / span, q(lag, 0.5), q(lag, 0.99),
            q(lag[third[1]], 0.5) - q(lag[third[0]], 0.5), int(np.isinf(lag).sum()), cpu / span * 100,
            cpu / max(merged, 1) * 1e6, msampler.rss_max(w0, w1) / 2**20, wsampler.cpu_between(w0, w1) / span * 100,
            max((d for t, d in (poller.times if poller else []) if w0 <= t < w1), default=float("nan")),
        )  # fmt: skip
        levels.append(level)
    note = f"exact: {'yes' if exact else 'NO'}; {n_records} records, ~{record_bytes:.0f} B each"
    return levels, note, record_bytes


def print_table(levels: list[Level]) -> None:
    head = (
        f"{'checkout':<16} {'mode':<8} {'target':>7} {'offered':>8} {'merged':>8} {'tok/s':>9} {'lag p50':>8} "
        f"{'lag p99':>8} {'trend':>6} {'miss':>5} {'CPU %':>6} {'µs/rec':>7} {'RSS MiB':>8} {'wrk CPU%':>8} "
        f"{'page s':>6} keeps up"
    )
    print(head)
    print("-" * len(head))
    for lv in levels:
        print(
            f"{Path(lv.checkout).name[:16]:<16} {lv.mode:<8} {lv.target:>7.0f} {lv.offered:>8.0f} {lv.merged:>8.0f} "
            f"{lv.merged * CHUNKS:>9.0f} {lv.lag_p50:>8.3f} {lv.lag_p99:>8.3f} {lv.trend:>6.3f} {lv.missing:>5d} "
            f"{lv.master_cpu_pct:>6.1f} {lv.us_per_record:>7.1f} {lv.rss_mib:>8.0f} {lv.workers_cpu_pct:>8.1f} "
            f"{lv.page_s:>6.2f} {'yes' if lv.keeps_up else 'NO'}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rates", default="1000,2000,5000,10000", help="offered records/s, one step each")
    ap.add_argument("--user-rate", type=float, default=100.0, help="records/s per simulated user")
    ap.add_argument("--level-s", type=float, default=12.0, help="seconds per rate")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--modes", default="headless,webui,watched")
    ap.add_argument("--repeat", type=int, default=1, help="rounds; each runs every checkout and mode in turn")
    ap.add_argument("--checkouts", default=str(ROOT), help="comma-separated checkouts to run the master from")
    ap.add_argument("--dir", default=None, help="where the run directories go (deleted after each run)")
    a = ap.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        print("warning: fewer than 2 CPUs: the master shares its core", file=sys.stderr)
    else:
        os.sched_setaffinity(0, {OTHERS_CPU})  # this script, the fake server and the workers: off the master's core
    rates = [float(r) for r in a.rates.split(",")]
    results: list[Level] = []
    for rnd in range(a.repeat):
        for checkout in (Path(c).resolve() for c in a.checkouts.split(",")):
            for mode in a.modes.split(","):
                with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
                    levels, note, _ = run_once(checkout, mode, rates, a.user_rate, a.level_s, a.workers, Path(tmp))
                results += levels
                print(f"round {rnd + 1} {checkout.name} {mode}: {note}", flush=True)
                print_table(levels)
    print(
        f"\nmaster on CPU {MASTER_CPU} alone; {a.workers} workers, the fake server and this script on CPU "
        f"{OTHERS_CPU}; "
        f"{a.user_rate:g} records/s per user, {CHUNKS} chunks per record, {a.level_s:g} s per rate "
        f"(the first {SKIP_S:g} s not measured)."
    )
    print_table(results)


if __name__ == "__main__":
    main()
