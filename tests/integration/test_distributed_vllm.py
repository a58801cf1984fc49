"""Master + 2 worker processes on loopback against the real vLLM: merged totals equal the server's counters, no
duplicates, both workers contribute; and the same with one worker SIGKILLed mid-run."""

from __future__ import annotations

import json
import os
import signal
import socket
import time

import pandas as pd
import pytest
from vllm_loadtest.analysis.records import RECORDS_DIR

from tests.helpers.runs import cluster
from tests.helpers.vllm import finished_counts

pytestmark = [pytest.mark.vllm, pytest.mark.contract]


@pytest.mark.parametrize("kill_one", [False, True], ids=["two-workers", "one-worker-killed"])
def test_master_and_two_workers_against_vllm(vllm_server_b, tmp_path, kill_one):
    before = finished_counts(vllm_server_b.url)
    run_dir = tmp_path / "run"
    host = socket.gethostname()
    with cluster(
        tmp_path, 2, vllm_server_b.url, "--steps", "2,8", "--step-duration", "10s", "--step-warmup", "2s",
        "--max-tokens", "48", "--ignore-eos", "--stop-timeout", "60", "--run-dir", str(run_dir),
    ) as (master, workers):  # fmt: skip
        victim_file = run_dir / RECORDS_DIR / f"{host}-{workers[1].pid}.jsonl"
        if kill_one:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not (victim_file.exists() and victim_file.stat().st_size > 0):
                time.sleep(0.2)
            time.sleep(3)
            os.kill(workers[1].pid, signal.SIGKILL)
        assert master.wait(240) == 0, (tmp_path / "master.log").read_text()[-3000:]
        workers[0].wait(30)
    after = finished_counts(vllm_server_b.url)
    records = pd.read_parquet(run_dir / "requests.parquet")
    assert not records["request_id"].duplicated().any()
    names = {f"{host}-{w.pid}" for w in workers}
    assert set(records["worker"]) == names  # both workers contributed
    ok = records[records["status"] == "ok"]
    server_ok, server_tokens = after[0] - before[0], after[1] - before[1]
    run = json.loads((run_dir / "run.json").read_text())
    if not kill_one:
        assert len(ok) == len(records) == server_ok  # --stop-timeout let every stream finish
        assert ok["output_tokens"].sum() == server_tokens
        assert all(w["records_reported"] == w["records_received"] for w in run["workers"])
    else:
        # Everything the dead worker had recorded is kept; the survivor ran on and finished its streams.
        written = pd.read_json(victim_file, lines=True)
        assert set(written["request_id"]) <= set(records["request_id"])
        victim = f"{host}-{workers[1].pid}"
        survivor = records[records["worker"] != victim]
        assert (survivor["status"] == "ok").all() and (survivor["step"] == 1).any()
        # The server may have finished a few streams the dead worker never read: at most one per user it had.
        assert 0 <= server_ok - len(ok) <= 4
        assert (ok["output_tokens"] == 48).all()
        entry = next(w for w in run["workers"] if w["worker"] == victim)
        assert entry["missing_at"] is not None
        assert f"Worker {victim} went missing" in (run_dir / "report.html").read_text()
