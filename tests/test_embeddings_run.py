"""--endpoint embeddings end to end: a real `locust` process at 8 users against the fake server's /v1/embeddings
(batches of 4 inputs of exactly 32 tokens). Every request carries its batch (the server's own count of inputs and
prompt tokens per X-Request-Id), and each record's E2E time (send stamp to the arrival of the body's last byte) is
the server's own (receipt to the send of that byte) within 2 ms at p99, the suite's timing claim for streams.

The client's stamps are the kernel's receive times, so the tests beside it in the parallel suite move them little."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.helpers.runs import locust

pytestmark = [pytest.mark.contract]


def test_every_request_carries_its_batch_and_e2e_is_the_servers_within_2_ms(fake_server, tmp_path):
    # A per-input cost too, so the bodies' times differ with nothing but the server's own work.
    server = fake_server("--embed-ms", "10", "--embed-per-input-ms", "1", "--embed-dim", "384")
    run_dir = tmp_path / "run"
    proc = locust(
        "--host", server.url, "--endpoint", "embeddings", "--batch-size", "4", "--dataset", "synthetic:32",
        "--steps", "8", "--step-duration", "6s", "--step-warmup", "0s", "--no-report", "--run-dir", str(run_dir),
        "--print-stats", timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Locust's own table (--print-stats brings it back): one entry per request.
    assert "POST     /v1/embeddings" in proc.stdout + proc.stderr
    records = pd.read_parquet(run_dir / "requests.parquet")
    truth = server.get("/truth")
    ok = records[records["status"] == "ok"]
    failed = records[records["status"] != "ok"]
    assert (failed["error_type"] == "cut_off").all(), failed["error_type"].value_counts().to_dict()
    assert len(ok) >= 500, len(ok)  # enough for a p99 (8 users x 6 s at >= 14 ms a request: up to ~3400)
    assert ok["request_id"].isin(truth).all()
    t = pd.DataFrame([truth[r] for r in ok["request_id"]], index=ok.index)
    assert (t["inputs"] == 4).all() and (ok["inputs"] == 4).all()
    assert (t["prompt_tokens"] == 128).all() and (ok["prompt_tokens"] == t["prompt_tokens"]).all()
    assert all(n == [32] * 4 for n in t["input_tokens"])
    # Both clocks are the machine's: the record's send stamp + E2E against the server's send of the last byte.
    err = ok["start_time"] + ok["e2e_s"] - t["last_sent_wall"]
    server_e2e_err = ok["e2e_s"] - t["e2e_s"]  # the request path and the response path, both ways
    print(
        f"E2E error p50 {err.abs().median() * 1e3:.3f} ms p99 {np.percentile(err.abs(), 99) * 1e3:.3f} ms; "
        f"client - server E2E p99 {np.percentile(server_e2e_err, 99) * 1e3:.3f} ms; {len(ok)} requests"
    )
    assert np.percentile(err.abs(), 99) < 0.002
    assert (ok["e2e_s"] >= 0.014).all()  # never before the server's 10 ms + 4 x 1 ms
    stats = server.get("/stats")
    # Every answered request had its 4 inputs, but the preflight's probe of one (locustfiles/preflight.py).
    assert stats["inputs"] == 4 * (stats["embeddings"] - 1) + 1
