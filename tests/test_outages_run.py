"""The server SIGKILLed mid-step under a real `locust` run: closed-loop users back off instead of storming the dead
port (every attempt still a record), the end of the run says when the server refused connections; an open-loop
run keeps its schedule while the server is down."""

from __future__ import annotations

import json
import math
import subprocess
import time

import numpy as np
import pandas as pd
import pytest
from vllm_loadtest.analysis.outages import next_backoff

from tests.helpers.paths import ROOT
from tests.helpers.runs import locust_command, wait_until
from tests.helpers.servers import FakeServer

pytestmark = pytest.mark.contract

USERS = 4


def attempts_within(seconds: float) -> int:
    """The most attempts one backing-off user makes in `seconds` if each attempt took no time (the upper bound)."""
    n, t, wait = 0, 0.0, 0.0
    while t <= seconds:
        n += 1
        wait = next_backoff(wait, True)
        t += wait
    return n


def run_and_kill(tmp_path, kill_after_s: float, *args: str) -> tuple[str, int, float, pd.DataFrame, dict]:
    """A headless run against a fake server that is SIGKILLed `kill_after_s` after its first request; the console,
    the exit code, the kill's wall-clock time, the records and summary.json."""
    server = FakeServer(["--ttft-ms", "5", "--itl-ms", "2"])
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        locust_command("--host", server.url, "--step-warmup", "0s", "--max-tokens", "16", "--scrape-interval", "0.5",
                       "--run-dir", str(run_dir), "--csv", str(tmp_path / "locust"), *args),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert wait_until(lambda: server.get("/stats")["requests"] > 0, timeout=60), "the load never started"
        time.sleep(kill_after_s)
        server.proc.kill()  # SIGKILL: no goodbye, the port refuses connections from now on
        killed_at = time.time()
        server.proc.wait(5)
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
        server.stop()
    records = pd.read_parquet(run_dir / "requests.parquet")
    summary = json.loads((run_dir / "summary.json").read_text())
    return out, proc.returncode, killed_at, records, summary


def test_closed_loop_users_back_off_from_a_dead_server_and_the_diagnosis_says_so(tmp_path):
    out, code, killed_at, records, summary = run_and_kill(
        tmp_path, 5.0, "--steps", str(USERS), "--step-duration", "12s"
    )
    assert code == 1, out[-3000:]  # errors over the default --max-error-rate of 0: exit 1, as before
    after = records[records["start_time"] > killed_at + 0.05]  # a connect racing the kill may still have succeeded
    assert len(after) and (after["error_type"].isin(["connection_error", "cut_off"])).all(), after["error"].unique()
    assert after["error"].str.contains("ConnectionRefused").any()

    # Bounded by the backoff: each user at most the schedule's attempts in the time left (10 ms doubling to 1 s:
    # ~1 a second), plus slack for the in-flight request the kill reset. A tight loop sent thousands a second.
    left = records["start_time"].max() - killed_at
    bound = USERS * (attempts_within(left) + 2)
    assert USERS * 7 <= len(after) <= bound, (len(after), left, bound)
    assert bound < 200  # orders of magnitude below the storm (110,019 requests in 9 s)

    # Every attempt is one record, as Locust's own statistics count them.
    stats = pd.read_csv(tmp_path / "locust_stats.csv").set_index("Name").loc["Aggregated"]
    cut = records["error_type"] == "cut_off"
    assert stats["Request Count"] == int((~cut).sum()) and stats["Failure Count"] == int(
        ((~cut) & (records["status"] == "error")).sum()
    )

    # The end of the run says when the server refused connections, in the console and summary.json.
    (outage,) = summary["outages"]
    started_at = summary["started_at"]
    assert outage["to_end"] and outage["start_s"] == pytest.approx(killed_at - started_at, abs=1.0)
    assert outage["attempts"] >= len(after[after["error_type"] == "connection_error"])
    assert outage["users"] == USERS and not outage["open_loop"]
    line = next(t for t in out.splitlines() if "refused" in t and "connections from" in t)
    assert f"from {outage['start_s']:.1f} s to the end of the run ({outage['attempts']} attempts" in line
    assert f"{USERS} users backing off" in line


def test_an_open_loop_keeps_its_schedule_while_the_server_is_down(tmp_path):
    rate = 20.0
    out, code, killed_at, records, summary = run_and_kill(
        tmp_path, 3.0, "--rates", str(rate), "--arrival", "constant", "--max-users", "8", "--step-duration", "8s",
        "--max-error-rate", "100%",
    )  # fmt: skip
    assert code == 0, out[-3000:]
    after = records[records["intended_start_time"] > killed_at + 0.05].sort_values("intended_start_time")
    assert (after["error_type"].isin(["connection_error", "cut_off"])).all(), after["error"].unique()
    # Every intended send after the kill is sent and recorded, evenly spaced at the rate (none skipped, none held
    # back by a backoff), and sent about when it was due.
    intended = after["intended_start_time"].to_numpy()
    assert np.diff(intended) == pytest.approx(np.full(len(intended) - 1, 1 / rate), abs=1e-6)
    left = records["intended_start_time"].max() - killed_at
    assert len(after) >= math.floor(left * rate) - 1
    assert after["schedule_lag_s"].median() < 0.05
    (outage,) = summary["outages"]
    assert outage["open_loop"] and outage["to_end"] and outage["attempts"] >= len(after) - 1
    assert "sent on schedule, not backed off" in out
