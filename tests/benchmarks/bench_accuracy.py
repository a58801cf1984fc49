"""How close the client's TTFT/TPOT/ITL are to the truth, against the fake server with exact timing.

Runs the streaming user in process (a local runner) for a while against tests/fakeserver.py and compares
every request with the server's own send times (joined on X-Request-Id). Prints figures; asserts nothing.

    .venv/bin/python -m tests.benchmarks.bench_accuracy [--users 16] [--seconds 20]

Client error = (client start + measured offset) - (server's wall-clock send time). It contains only what the
client adds: building and sending the request, and reading and stamping the chunk. Delays inside the server
(including its own thread wake-ups) are real latency that the client must, and does, measure.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
from vllm_loadtest.analysis.records import load_records
from vllm_loadtest.locustfiles.openai_user import OpenAIStreamingUser

from tests.helpers.inprocess import run_in_process
from tests.helpers.servers import FakeServer


class User(OpenAIStreamingUser):
    pass


def q(values, qs=(50, 99, 100)) -> str:
    return " / ".join(f"{v * 1000:7.3f}" for v in np.percentile(np.asarray(values, dtype=float), qs))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--users", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--ttft-ms", default="50")
    ap.add_argument("--itl-ms", default="10")
    ap.add_argument("--max-tokens", default="64")
    a = ap.parse_args()
    server = FakeServer(["--ttft-ms", a.ttft_ms, "--itl-ms", a.itl_ms, "--multi-every", "7", "--empty-every", "5"])
    try:
        with tempfile.TemporaryDirectory() as tmp:
            run_in_process(User, server.url, Path(tmp), "--max-tokens", a.max_tokens, users=a.users, seconds=a.seconds)
            truth = server.get("/truth")
            records = load_records(Path(tmp))
    finally:
        server.stop()
    ok = records[(records["status"] == "ok") & records["request_id"].isin(truth)]
    # Skip the first second (all users start at once) and requests in flight at the stop.
    t0 = ok["start_time"].min()
    ok = ok[(ok["start_time"] > t0 + 1) & (ok["start_time"] + ok["duration_s"] < ok["start_time"].max())]
    t = [truth[r] for r in ok["request_id"]]
    first = np.array([x["first_sent_wall"] for x in t])
    last = np.array([x["last_sent_wall"] for x in t])
    n = np.array([x["tokens"] for x in t])
    ttft_err = ok["start_time"].to_numpy() + ok["ttft_s"].to_numpy() - first
    e2e_err = ok["start_time"].to_numpy() + ok["e2e_s"].to_numpy() - last
    tpot_err = ok["tpot_s"].to_numpy() - (last - first) / (n - 1)
    exact = all(
        r.output_tokens == x["tokens"] and list(r.chunk_tokens) == x["sizes"] for r, x in zip(ok.itertuples(), t)
    )
    print(
        f"{a.users} users, {len(ok)} requests measured, server: TTFT {a.ttft_ms} ms, {a.itl_ms} ms/token, "
        f"{a.max_tokens} tokens (every 7th chunk carries 2, every 5th token has empty text)"
    )
    print("                                  p50 /     p99 /     max  (ms)")
    print(f"client TTFT error:            {q(ttft_err)}")
    print(f"client E2E error:             {q(e2e_err)}")
    print(f"client TPOT error:            {q(tpot_err)}")
    print(f"measured TTFT:                {q(ok['ttft_s'])}")
    print(f"server's actual TTFT:         {q([x['ttft_s'] for x in t])}")
    print(f"measured TPOT:                {q(ok['tpot_s'])}")
    print(f"output tokens and per-chunk counts exact: {exact}")


if __name__ == "__main__":
    main()
