"""A capacity search stopped by Ctrl-C (or SIGTERM) mid-probe, in both modes: the run stops within seconds (an early
version ran on for hours after a SIGINT), every file is written, and the result says the search did not finish
(`summary.json`'s capacity `limit` is null: the best load found so far is a lower bound, not the capacity)."""

import json
import signal
import subprocess

import pandas as pd
import pytest

from tests.helpers.paths import ROOT
from tests.helpers.runs import locust_command, wait_until

pytestmark = pytest.mark.contract


@pytest.mark.parametrize(("mode", "sig"), [("users", signal.SIGINT), ("rate", signal.SIGTERM)])
def test_a_stopped_capacity_search_ends_at_once_and_says_it_did_not_finish(fake_server, tmp_path, mode, sig):
    server = fake_server("--ttft-ms", "20", "--itl-ms", "5", "--tokens", "32", "--max-running", "8")
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        locust_command("--host", server.url, "--find-capacity", mode, "--slo", "ttft_p95=1s", "--step-duration",
                       "6s", "--step-warmup", "1s", "--max-tokens", "32", "--run-dir", str(run_dir)),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        # Stopped once the second probe is under way, whenever that is on a busy machine. The SLO is 50 times the
        # server's TTFT, so the first probe passes even when the machine slows the client (at 100 ms a busy fresh
        # clone failed it, and the search ended before a second probe began).
        assert wait_until(lambda: _probes_begun(run_dir) >= 2, timeout=90), proc.poll()
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)  # a search that goes on after the signal fails here
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode in (0, 1), err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    for name in ("requests.parquet", "steps.csv", "summary.json", "report.html"):
        assert (run_dir / name).exists(), name
    capacity = json.loads((run_dir / "summary.json").read_text())["capacity"]
    assert capacity["mode"] == mode and capacity["limit"] is None
    assert "The search did not finish (the run was stopped first)" in out
    assert len(pd.read_parquet(run_dir / "requests.parquet")) > 0
    # The probe the signal cut short was not judged live: it counts only on what its data showed (a pass, or a
    # fail on values), never as the first failing load for want of data.
    stopped = capacity["probes"][-1]
    assert stopped.get("interrupted") is True
    if not stopped["counted"]:
        assert capacity["first_failing"] is None or capacity["first_failing"]["step"] != stopped["step"]
        assert "stopped before it was judged: not counted" in out
    assert "no data" not in capacity["line"]


def _probes_begun(run_dir) -> int:
    try:
        return len(json.loads((run_dir / "run.json").read_text()).get("timeline") or [])
    except (OSError, ValueError):
        return 0
