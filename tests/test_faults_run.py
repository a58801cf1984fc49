"""The server dying and coming back in the middle of a real run."""

import subprocess
import time

import pandas as pd
import pytest

from tests.helpers.paths import ROOT
from tests.helpers.runs import locust_command
from tests.helpers.servers import FakeServer

pytestmark = pytest.mark.contract


def test_the_server_dying_and_coming_back_mid_run(tmp_path):
    """Requests while the server is gone are connection errors; after it is back the run carries on; the server's
    counters restarting from 0 are read as a restart, not as a negative increase."""
    first = FakeServer(["--ttft-ms", "5", "--itl-ms", "2"])
    port = first.port
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        locust_command("--host", first.url, "--steps", "2", "--step-duration", "9s", "--step-warmup", "0s",
                       "--max-tokens", "16", "--scrape-interval", "0.5", "--max-error-rate", "100%",
                       "--run-dir", str(run_dir)),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    second = None
    try:
        # Killed 3 s into the load, not 3 s after Locust's start: on a loaded machine Locust took longer than that to
        # start, and its preflight then met no server at all (exit 3).
        deadline = time.monotonic() + 60
        while first.get("/stats")["ok"] == 0 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        time.sleep(3)
        first.proc.kill()
        first.proc.wait(5)
        time.sleep(2)
        second = FakeServer(["--ttft-ms", "5", "--itl-ms", "2"], port=port)
        out, _ = proc.communicate(timeout=60)
        second_ok = second.get("/stats")["ok"]
    finally:
        if proc.poll() is None:
            proc.kill()
        for server in (first, second):
            if server is not None:
                server.stop()
    assert proc.returncode == 0, out[-3000:]
    records = pd.read_parquet(run_dir / "requests.parquet")
    t_kill = records["start_time"].min() + 3
    errors = records[records["error_type"] == "connection_error"]
    assert len(errors) > 0
    ok = records[records["status"] == "ok"]
    assert (ok["start_time"] < t_kill).any() and (ok["start_time"] > t_kill + 2.5).any()  # before and after
    assert second_ok > 0
    summary = pd.read_json(run_dir / "summary.json", typ="series")
    assert summary["errors"]["connection_error"] == len(errors)
    metrics = pd.read_parquet(run_dir / "metrics.parquet")
    up = metrics[metrics["metric"] == "up"]
    assert (up["value"] == 0).any() and up["value"].iloc[-1] == 1  # gaps while it was gone
    steps = pd.read_csv(run_dir / "steps.csv")
    assert steps["kv_cache_usage_max"].notna().all()
