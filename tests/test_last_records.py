"""The requests in flight when the run stops (issue 21): their records are complete and exact, and
requests.parquet says that the step table does not count them (`measured`)."""

import json

import pandas as pd
import pytest

from tests.helpers.runs import locust


@pytest.mark.unit
def test_locusts_stop_no_longer_looks_up_its_caller():
    """Runner.stop()'s debug line called inspect.stack(): 30-40 ms of a blocked event loop at the stop, which
    delayed the first-token stamps of the streams still in flight (tests/benchmarks/bench_last_records.py)."""
    import inspect

    import locust.runners
    from locust.env import Environment
    from vllm_loadtest.locustfiles.plugin import register

    register(Environment(events=locust.events))
    with pytest.raises(RuntimeError, match="blocks the event loop"):
        locust.runners.inspect.stack()
    assert locust.runners.inspect.getframeinfo is inspect.getframeinfo  # the rest of inspect as it is


@pytest.mark.contract
def test_the_requests_in_flight_at_the_stop_are_ok_and_not_measured(fake_server, tmp_path):
    # 300 ms streams, users started together: the run stops with every user mid-stream, and --stop-timeout lets
    # them finish, so their records are ok (and exact) but outside every step's window.
    server = fake_server("--ttft-ms", "50", "--itl-ms", "25")
    run_dir = tmp_path / "run"
    proc = locust(
        "--host", server.url, "--steps", "4", "--step-duration", "4s", "--step-warmup", "1s", "--max-tokens", "11",
        "--stop-timeout", "5", "--run-dir", str(run_dir), "--metrics-url", "off",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = pd.read_parquet(run_dir / "requests.parquet")
    stop = max(t["end_time"] for t in json.loads((run_dir / "run.json").read_text())["timeline"])
    in_flight = records["start_time"] + records["duration_s"] > stop
    assert in_flight.sum() >= 1, "no request was in flight at the stop: the test proves nothing"
    assert (records.loc[in_flight, "status"] == "ok").all(), records.loc[in_flight, ["status", "error_type"]]
    assert not records.loc[in_flight, "measured"].any()
    assert records.loc[~in_flight & records["warmup"], "measured"].eq(False).all()
    assert records.loc[~in_flight & ~records["warmup"], "measured"].all()
    # The step table counts exactly the measured ok records.
    steps = pd.read_csv(run_dir / "steps.csv")
    measured_ok = records["measured"] & (records["status"] == "ok")
    assert int(steps.loc[0, "requests"]) == int(measured_ok.sum())
