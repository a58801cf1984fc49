"""The replay half of trace replay: a 100,000-row trace file replayed by one load process against a fast fake
server. Run on demand (not in the suite), on a quiet machine; prints figures, asserts nothing about timing.

.venv/bin/python -m tests.benchmarks.bench_trace_replay [--rows 100000] [--rate 200] [--seconds 30]
    [--mean-input 2000] [--max-users 100]

Prints how long the run took to start the replay (from launching `locust` to the replay's first window: reading the
whole file, calibrating the prompts against the server's /tokenize, building the first bodies, spawning the pool),
then, over the first `--seconds` of the trace (--trace-duration), the rows sent against the rows scheduled, the
achieved rate, and the schedule lag (actual send stamp - intended send time) p50 / p99 / max, and per 10 s window the
self-check's event-loop lag and CPU of the load process.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from vllm_loadtest.analysis.run import STEPS_FILE

from tests.benchmarks.bench_trace_load import write_mooncake_trace
from tests.helpers.runs import locust
from tests.helpers.servers import FakeServer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rate", type=float, default=200.0, help="the trace's arrival rate (requests/s)")
    parser.add_argument("--seconds", type=float, default=30.0, help="--trace-duration: the replayed slice")
    parser.add_argument("--mean-input", type=int, default=2000, help="mean prompt tokens of the trace's rows")
    parser.add_argument("--max-users", type=int, default=100)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        trace = write_mooncake_trace(tmp_path / "trace.jsonl", args.rows, rate=args.rate, mean_input=args.mean_input)
        size_mb = trace.stat().st_size / 1e6
        # Fast: the first token at once, 4 tokens a request whatever max_tokens says (the schedule is measured,
        # not the server).
        server = FakeServer(["--ttft-ms", "1", "--itl-ms", "0", "--tokens", "4"])
        try:
            run_dir = tmp_path / "run"
            launched = time.time()
            proc = locust(
                "--host", server.url, "--trace", str(trace), "--trace-duration", f"{args.seconds:g}",
                "--max-users", str(args.max_users), "--step-duration", "10s", "--step-warmup", "0s",
                "--run-dir", str(run_dir), "--no-report", timeout=int(args.seconds * 4 + 300),
            )  # fmt: skip
        finally:
            server.stop()
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr[-3000:])
            return 1
        run = json.loads((run_dir / "run.json").read_text())
        records = pd.read_parquet(run_dir / "requests.parquet")
        steps = pd.read_csv(run_dir / STEPS_FILE)

    timeline = run["timeline"]
    start = timeline[0]["start_time"]
    scheduled = run["trace"]["rows"]
    lag = records["schedule_lag_s"].to_numpy(dtype=float)
    sent = records["start_time"].to_numpy(dtype=float)
    print(f"trace: {args.rows} rows ({size_mb:.1f} MB), {args.rate:g} req/s, mean input {args.mean_input} tokens")
    print(f"replay started {start - launched:.2f} s after launching locust")
    print(
        f"slice of {args.seconds:g} s: {len(records)} of {scheduled} rows sent (each once: "
        f"{records['trace_row'].is_unique}), {(records['status'] == 'ok').sum()} ok, achieved "
        f"{len(records) / max(sent.max() - sent.min(), 1e-9):.1f} req/s"
    )
    p50, p99 = np.percentile(lag, [50, 99])
    print(f"schedule lag: p50 {p50 * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms, max {lag.max() * 1e3:.2f} ms")
    for _, row in steps.iterrows():
        print(
            f"step {int(row['step'])}: {row['rate_rps']:.1f} req/s scheduled, {row['achieved_rps']:.1f} sent; lag "
            f"p99 {row['schedule_lag_p99_s'] * 1e3:.2f} ms; event-loop lag p99 {row['generator_lag_p99_s'] * 1e3:.1f} "
            f"ms, max {row['generator_lag_max_s'] * 1e3:.1f} ms; CPU max {row['generator_cpu_max']:.0%}"
        )
    end = timeline[-1]
    print(f"the run ended {end['end_time'] - start:.1f} s after the replay's start ({end['end_reason']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
