"""Is every ok record in requests.parquet exact, the requests in flight at the stop included? Run on demand, prints.

One real headless run of the suite (a `locust` process pinned to one core) against tests/benchmarks/streamserver.py
in timed mode (pinned to the other core; it logs when it received each request and sent each token), a single
closed-loop step ending with the run while every user is mid-stream, `--stop-timeout` long enough for the in-flight
streams to finish. Every ok record of requests.parquet is joined with the server's log on X-Request-Id:

    TTFT error = ttft_s - (server's first send - server's receipt of the request)

and shown for the measured records, for those that were in flight when the load generator began to stop (`measured`
false), and for each 100 ms of send times before the stop. An exact client keeps both groups within the accuracy
bound (1.5 ms); a stall of the event loop at the stop shows as errors of tens of ms in the second group.

    .venv/bin/python -m tests.benchmarks.bench_last_records [--users 64] [--seconds 20] [--tokens 128] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from tests.benchmarks.bench_generator import CLIENT_CPU, ROOT, StreamServer

BOUND_MS = 1.5


def run(server: StreamServer, users: str, seconds: float, tokens: int, out: Path) -> tuple[pd.DataFrame, list[float]]:
    args = [
        "taskset", "-c", str(CLIENT_CPU), sys.executable, "-m", "locust", "-f", str(ROOT / "locustfiles" /
        "vllm_streaming.py"), "--headless", "--host", server.url, "--steps", str(users), "--step-duration",
        f"{seconds:g}s", "--step-warmup", "2s", "--max-tokens", str(tokens), "--metrics-url", "off",
        "--stop-timeout", "10", "--run-dir", str(out), "--only-summary",
    ]  # fmt: skip
    server.get("/reset")
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=seconds + 120)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"locust exited {proc.returncode}: {proc.stderr[-2000:]}")
    truth = server.get("/truth")
    records = pd.read_parquet(out / "requests.parquet")
    records = records[(records["status"] == "ok") & records["request_id"].isin(truth)].copy()
    server_ttft = [truth[r]["sent"][0] - truth[r]["received"] for r in records["request_id"]]
    records["ttft_err_ms"] = (records["ttft_s"].to_numpy() - np.asarray(server_ttft)) * 1000
    # Its two parts: the send stamp -> the server held the request; the server's first send -> the client's stamp.
    records["send_ms"] = (np.array([truth[r]["received"] for r in records["request_id"]]) - records["start_time"]) * 1e3
    first = np.array([truth[r]["sent"][0] for r in records["request_id"]])
    records["read_ms"] = (records["start_time"] + records["ttft_s"] - first).to_numpy() * 1000
    timeline = json.loads((out / "run.json").read_text())["timeline"]
    stop = max(t["end_time"] for t in timeline)
    records["before_stop_s"] = stop - records["start_time"]
    return records, [t["start_time"] for t in timeline[1:]]


def describe(name: str, errors: pd.Series) -> str:
    if errors.empty:
        return f"{name:34} no records"
    a = errors.abs()
    over = int((a > BOUND_MS).sum())
    return (
        f"{name:34} {len(a):6} records  p50 {a.median():6.2f}  p99 {np.percentile(a, 99):7.2f}  max {a.max():7.2f} ms"
        f"  over {BOUND_MS} ms: {over}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--users", default="64", help="the steps' users (--steps): e.g. 32,64 for a step change too")
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        print("warning: fewer than 2 CPUs: server and client share one", file=sys.stderr)
    server = StreamServer(flood=False)
    try:
        for k in range(a.runs):
            with tempfile.TemporaryDirectory() as tmp:
                r, changes = run(server, a.users, a.seconds, a.tokens, Path(tmp) / "run")
            print(f"\nrun {k + 1}: {a.users} users, {a.seconds:g} s, {a.tokens} tokens (50 ms TTFT, 10 ms/token)")
            measured = r["measured"].fillna(False).astype(bool) if "measured" in r else pd.Series(True, index=r.index)
            print(describe("measured (steps.csv counts them)", r.loc[measured, "ttft_err_ms"]))
            print(describe("in flight at the stop", r.loc[~measured & ~r["warmup"], "ttft_err_ms"]))
            worst = r.loc[measured].nlargest(3, "ttft_err_ms")
            first = r["start_time"].min()
            for w in worst.itertuples():
                print(
                    f"  worst: {w.ttft_err_ms:6.2f} ms (send {w.send_ms:5.2f}, read {w.read_ms:5.2f}), sent "
                    f"{w.start_time - first:6.3f} s after the first request"
                )
            for change in changes:  # the requests whose first token came in the 0.5 s after a step began
                first_token = r["start_time"] + r["ttft_s"]
                around = r[(first_token >= change) & (first_token < change + 0.5)]
                print(describe("  first token < 0.5 s after a step change", around["ttft_err_ms"]))
            late = r[r["before_stop_s"] < 1.0]
            for lo in np.arange(0.0, 1.0, 0.1)[::-1]:
                part = late[(late["before_stop_s"] >= lo) & (late["before_stop_s"] < lo + 0.1)]["ttft_err_ms"]
                print(describe(f"  sent {lo * 1000:.0f}-{lo * 1000 + 100:.0f} ms before the stop", part))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
