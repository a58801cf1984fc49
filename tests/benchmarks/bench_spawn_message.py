"""What a worker's spawn message costs: Locust as it is, and with the suite computing Locust's defaults once
(locustfiles/startup.py, compute_locust_defaults_once). Run on demand, prints.

Locust's worker filters the master's options at every spawn message (every step change) with
`k not in default_args_dict()`, which rebuilds and parses Locust's argument parser once per option in the message.

1. In this process: that filter over the options a master of the suite sends, timed in CPU ms, Locust's function
   and the suite's alternating (`--rounds` each).
2. Real `--processes` runs (`--runs` of each, alternating) against tests/benchmarks/streamserver.py in timed mode
   (it logs when it sent every token), `--spinners` processes keeping the machine busy: a worker's event loop
   blocked at a step change stamps the chunks that arrive meanwhile late. Per run: the exit code, the workers the
   master counted missing, the ok requests, and the inter-token error (client gap - server gap) of every chunk:
   p99, max and how many chunk gaps came out over 50 ms late.

    .venv/bin/python -m tests.benchmarks.bench_spawn_message [--rounds 5] [--runs 2] [--processes 4] [--spinners 0]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from tests.benchmarks.bench_generator import ROOT, StreamServer
from tests.helpers.burner import spin
from tests.helpers.net import free_port

LOCUSTFILE = ROOT / "tests" / "benchmarks" / "spawn_locustfile.py"
LATE_S = 0.050


def filter_cost(rounds: int) -> None:
    from locust import argument_parser
    from vllm_loadtest.locustfiles import startup

    import tests.benchmarks.spawn_locustfile as lf  # registers the suite's options

    options = vars(argument_parser.get_parser().parse_args(["-f", str(LOCUSTFILE), "--headless"]))
    startup.compute_locust_defaults_once()
    once = argument_parser.default_args_dict
    times: dict[str, list[float]] = {"as-is": [], "once": []}
    for _ in range(rounds):
        for name, fn in (("as-is", lf.LOCUST_AS_IS), ("once", once)):
            argument_parser.default_args_dict = fn
            t = time.process_time()
            kept = {k: v for k, v in options.items() if k not in argument_parser.default_args_dict()}
            times[name].append((time.process_time() - t) * 1000)
    print(f"spawn message filter: {len(options)} options, {len(kept)} of them the suite's")
    for name, ms in times.items():
        print(f"  {name:6s} median {np.median(ms):8.2f} CPU-ms (min {min(ms):.2f}, max {max(ms):.2f})")


def itl_errors(run_dir: Path, truth: dict) -> np.ndarray:
    records = pd.read_parquet(run_dir / "requests.parquet")
    errors = []
    for r in records[records["status"] == "ok"].itertuples():
        t = truth.get(r.request_id)
        offsets = np.asarray(r.chunk_offsets_s)
        if t is not None and len(t["sent"]) == len(offsets) > 1:
            errors.append(np.diff(offsets) - np.diff(t["sent"]))
    return np.concatenate(errors) if errors else np.array([])


def real_run(server: StreamServer, mode: str, processes: int) -> str:
    server.get("/reset")
    port = str(free_port())
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        args = [
            sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--host", server.url,
            "--processes", str(processes), "--master-bind-port", port, "--master-port", port,
            "--steps", "4,8,16,32", "--step-duration", "4s", "--step-warmup", "0s", "--max-tokens", "64",
            "--metrics-url", "off", "--stop-timeout", "10", "--run-dir", str(run_dir), "--only-summary",
        ]  # fmt: skip
        env = {**os.environ, "BENCH_LOCUST_DEFAULTS": mode}
        proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        if not (run_dir / "requests.parquet").exists():
            return f"exit {proc.returncode}, no requests.parquet: {proc.stderr[-300:]}"
        run = json.loads((run_dir / "run.json").read_text())
        missing = sum(w.get("missing_at") is not None for w in run.get("workers", []))
        errors = itl_errors(run_dir, server.get("/truth"))
        ok = int((pd.read_parquet(run_dir / "requests.parquet")["status"] == "ok").sum())
    if not len(errors):
        return f"exit {proc.returncode}, {missing} worker(s) missing, {ok} ok, no chunk to compare"
    return (
        f"exit {proc.returncode}, {missing} worker(s) missing, {ok:5d} ok, ITL error p99 "
        f"{np.percentile(errors, 99) * 1000:7.2f} ms, max {errors.max() * 1000:7.1f} ms, "
        f"{int((errors > LATE_S).sum())} of {len(errors)} gaps > {LATE_S * 1000:.0f} ms late"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--runs", type=int, default=2, help="real runs of each (0: none)")
    p.add_argument("--processes", type=int, default=4)
    p.add_argument("--spinners", type=int, default=0, help="busy processes beside the runs")
    a = p.parse_args()
    filter_cost(a.rounds)
    if not a.runs:
        return
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(a.spinners)]
    for s in spinners:
        s.start()
    server = StreamServer(flood=False)
    try:
        print(f"--processes {a.processes}, steps 4,8,16,32 x 4 s, {a.spinners} spinner(s)")
        for i in range(a.runs):
            for mode in ("as-is", "once"):
                print(f"  run {i + 1} {mode:6s} {real_run(server, mode, a.processes)}", flush=True)
    finally:
        server.stop()
        for s in spinners:
            s.terminate()


if __name__ == "__main__":
    main()
