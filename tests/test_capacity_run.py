"""--find-capacity from the command line, as a user runs it: real Locust processes against a fake server of 8 slots
(20 ms TTFT, 5 ms per token, 32 tokens; a 9th request waits a whole request for a slot), whose capacity within
--slo ttft_p95=100ms is exactly 8 users. The pure side, with known answers: tests/test_capacity.py.

Each search runs against a fake server of its own: the server's slots are shared by all its clients."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.helpers.runs import locust

pytestmark = pytest.mark.contract

SLOTS = ["--ttft-ms", "20", "--itl-ms", "5", "--tokens", "32", "--max-running", "8"]
SEARCH = ["--slo", "ttft_p95=100ms", "--step-duration", "6s", "--step-warmup", "1s", "--max-tokens", "32"]
# The server's ceiling: 8 slots, each request holding one for 20 ms + 31 x 5 ms = 175 ms.
CEILING_RPS = 8 / 0.175


def assert_server_finished_only_recorded_requests(records: pd.DataFrame, server_ok: int) -> None:
    """Every request the server finished is in the records: ok, or cut off by a pause between probes in the instant
    after the server sent its last byte and before the client read it (the user is stopped then)."""
    ok = int((records["status"] == "ok").sum())
    cut = int((records["error_type"] == "cut_off").sum())
    assert ok <= server_ok <= ok + cut, (ok, server_ok, cut)


def search_args(server, run_dir: Path, *args: str) -> list[str]:
    return ["--host", server.url, *SEARCH, *args, "--run-dir", str(run_dir)]


def capacity_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())["capacity"]


def console_capacity(stdout: str) -> str:
    """The console's one capacity sentence (the first line of its Capacity section)."""
    lines = [
        line.removeprefix("- ") for line in stdout.splitlines() if line.removeprefix("- ").startswith("Capacity: ")
    ]
    assert len(lines) == 1, stdout[-3000:]
    return lines[0]


def assert_probes_recorded(run_dir: Path, result: dict, key: str) -> pd.DataFrame:
    """steps.csv holds every probe as a step, `probe` numbering them in the order they ran, as summary.json does."""
    steps = pd.read_csv(run_dir / "steps.csv").sort_values("step")
    assert steps["probe"].tolist() == list(range(1, len(steps) + 1))
    assert [p["probe"] for p in result["probes"]] == steps["probe"].tolist()
    column = "users" if key == "users" else "rate_rps"
    assert steps[column].tolist() == pytest.approx([p[key] for p in result["probes"]])
    return steps


def assert_live_decisions_match(run_dir: Path, result: dict) -> None:
    """The search acted on live verdicts (run.json's timeline, `probe_check`) made on the controller from the
    records as they arrived (a master: shipped by its workers); judged again on the complete records at the end,
    every probe has the same verdict, on about as many requests."""
    timeline = json.loads((run_dir / "run.json").read_text())["timeline"]
    live = [entry["probe_check"] for entry in sorted(timeline, key=lambda t: t["probe"])]
    assert [p["verdict"] for p in live] == [p["verdict"] for p in result["probes"]]
    for seen, final in zip(live, result["probes"], strict=True):
        assert abs(seen["requests"] - final["requests"]) <= 0.1 * final["requests"], (seen, final)
    assert timeline[-1]["capacity_limit"] == result["limit"]


def test_users_mode_finds_the_8_slots(fake_server, tmp_path):
    server = fake_server(*SLOTS)
    run_dir = tmp_path / "run"
    proc = locust(*search_args(server, run_dir, "--find-capacity", "users"), timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = capacity_of(run_dir)
    assert result["mode"] == "users" and result["max_users"] == 8, result["line"]
    assert result["first_failing"]["users"] == 9 and "ttft_p95" in result["first_failing"]["objectives"]
    assert result["limit"] == "slo"
    # Doubling to the first break, then bisecting between 8 and 16 down to one user.
    assert [p["users"] for p in result["probes"]] == [1, 2, 4, 8, 16, 12, 10, 9]
    assert [p["passed"] for p in result["probes"]] == [True] * 4 + [False] * 4
    assert result["binding"]["resource"] == "KV cache"  # the fake server reports running / slots as its KV cache
    assert_probes_recorded(run_dir, result, "users")
    assert_live_decisions_match(run_dir, result)
    line = console_capacity(proc.stdout)
    assert line == result["line"]
    # In step, 9 users' requests wait a whole request (175 ms) for a slot; CPU contention spreads them over the slots
    # and shortens the wait, so beside the parallel e2e tests (CI, 2026-12-03) 9 users' p95 interval reached below
    # the limit: "uncertain between 8 and 9" is then the honest answer (as in the distributed search below).
    if result["uncertain"]:
        assert line.startswith("Capacity: uncertain between 8 users and 9 users: "), line
    else:
        assert line.startswith("Capacity: 8 users, the highest load meeting ttft_p95<=100ms; at 9 users ttft_p95 was ")
    # Every request the server finished is in the records (the pauses between probes lose none).
    records = pd.read_parquet(run_dir / "requests.parquet")
    assert_server_finished_only_recorded_requests(records, server.get("/stats")["ok"])


def test_rate_mode_finds_a_rate_below_the_ceiling(fake_server, tmp_path):
    # Serial: the verdicts between 28 and 34 req/s rest on a p95 of ~150 requests (too few for its interval, so
    # judged on its value) that CPU contention moves across the limit (two runs side by side on 2 cores gave 30 and
    # 34 req/s). One run (about 90 s): that a seed fixes the arrival times is tested on its own, where it is exact
    # (tests/test_openloop_run.py::test_poisson_times_follow_the_seeded_schedule); a second whole search here only
    # repeated it at the price of 90 s of the suite.
    server = fake_server(*SLOTS)
    run_dir = tmp_path / "run"
    proc = locust(*search_args(server, run_dir, "--find-capacity", "rate", "--seed", "7"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = capacity_of(run_dir)
    assert result["mode"] == "rate" and "max_users" not in result
    assert result["max_rate_rps"] is not None and 1 <= result["max_rate_rps"] < CEILING_RPS, result["line"]
    assert result["limit"] == "slo" and result["first_failing"]["rate_rps"] > result["max_rate_rps"]
    # Bisected to within --capacity-resolution (10 %) of the passing rate.
    assert result["first_failing"]["rate_rps"] - result["max_rate_rps"] <= 0.1 * result["max_rate_rps"]
    assert_probes_recorded(run_dir, result, "rate_rps")
    assert console_capacity(proc.stdout).startswith(f"Capacity: {result['max_rate_rps']:g} req/s, the highest")


def test_a_server_that_meets_no_objective_exits_1_with_capacity_none(fake_server, tmp_path):
    server = fake_server(*SLOTS)
    run_dir = tmp_path / "run"
    args = ["--host", server.url, "--find-capacity", "users", "--slo", "ttft_p95=5ms", "--step-duration", "3s",
            "--step-warmup", "0s", "--max-tokens", "32", "--run-dir", str(run_dir)]  # fmt: skip
    proc = locust(*args)
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = console_capacity(proc.stdout)
    assert line.startswith("Capacity: none: even 1 user breaks ttft_p95<=5ms: ttft_p95 was "), line
    result = capacity_of(run_dir)
    assert result["max_users"] is None and result["first_failing"]["users"] == 1 and result["limit"] == "slo"
    assert len(result["probes"]) == 1  # nothing below 1 user to bisect to
    # The one probe's records are on disk, as any run's.
    records = pd.read_parquet(run_dir / "requests.parquet")
    assert (records["status"] == "ok").sum() == server.get("/stats")["ok"] > 0
    assert_probes_recorded(run_dir, result, "users")
    assert (run_dir / "report.html").exists() and (run_dir / "summary.md").exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--find-capacity", "users"], "--find-capacity users needs objectives"),
        (["--find-capacity", "users", "--slo", "ttft_p95=1s", "--steps", "1,2"], "drop --steps 1,2"),
        (["--find-capacity", "rate", "--slo", "ttft_p95=1s", "--rates", "1,2"], "drop --rates 1,2"),
        (["--find-capacity", "users", "--slo", "ttft_p95=1s", "--capacity-resolution", "abc"],
         "--capacity-resolution 'abc' is not a percentage; use e.g. --capacity-resolution 10%"),
        (["--find-capacity", "users", "--slo", "ttft_p95=1s", "--capacity-resolution", "150%"],
         "--capacity-resolution '150%' must be above 0 and below 100%"),
        (["--find-capacity", "users", "--slo", "ttft_p95=1s", "--start-users", "0"], "--start-users 0 must be"),
        (["--find-capacity", "rate", "--slo", "ttft_p95=1s", "--start-rate", "0"],
         "--start-rate '0' must be a positive number"),
        (["--find-capacity", "rate", "--slo", "ttft_p95=1s", "--max-rate", "x"], "--max-rate 'x' is not a number"),
        (["--start-users", "5"], "--start-users 5 only applies with --find-capacity"),
    ],
    ids=["no-slo", "steps", "rates", "resolution-abc", "resolution-150", "start-users-0", "start-rate-0",
         "max-rate-x", "start-users-alone"],
)  # fmt: skip
def test_bad_capacity_input_is_one_line_exit_3_and_nothing_sent(fake_server, tmp_path, args, expected):
    server = fake_server(*SLOTS)
    proc = locust("--host", server.url, "--step-duration", "2s", "--step-warmup", "0s", *args,
                  "--run-dir", str(tmp_path / "run"))  # fmt: skip
    assert proc.returncode == 3, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.strip() and "INFO" not in line]
    assert len(errors) == 1 and errors[0].startswith("error: "), proc.stderr[-2000:]
    assert expected in errors[0]
    assert server.get("/stats")["requests"] == 0 and server.get("/truth") == {}


def test_a_distributed_search_finds_8_too(fake_server, tmp_path):
    # A master and 2 workers on this machine: the master decides every probe on the records its workers ship.
    server = fake_server(*SLOTS)
    run_dir = tmp_path / "run"
    proc = locust(*search_args(server, run_dir, "--find-capacity", "users", "--processes", "2"), timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = capacity_of(run_dir)
    assert result["max_users"] == 8 and result["first_failing"]["users"] == 9, result["line"]
    assert_probes_recorded(run_dir, result, "users")
    assert_live_decisions_match(run_dir, result)
    # Two workers start their shares of 9 users a little apart, so their requests spread over the slots more than one
    # process's do: at 9 users TTFT p95 read 112-179 ms against the 100 ms limit, its interval reaching below the
    # limit in a run beside the parallel e2e tests. "Uncertain between 8 and 9" is then the honest answer; 8 is
    # the capacity either way, and no load above 8 is ever reported.
    line = console_capacity(proc.stdout)
    assert line.startswith(("Capacity: 8 users, ", "Capacity: uncertain between 8 users and 9 users: ")), line
    assert line == result["line"]
    records = pd.read_parquet(run_dir / "requests.parquet")
    assert_server_finished_only_recorded_requests(records, server.get("/stats")["ok"])
    assert records["worker"].nunique() == 2  # both workers sent load


def test_probes_of_adaptive_length_find_8_too(fake_server, tmp_path):
    # --step-duration auto: each probe runs until its interval is narrow (the light ones to --max-step-duration,
    # short of the 200 samples a p95's interval needs) and is judged the same way.
    server = fake_server(*SLOTS)
    run_dir = tmp_path / "run"
    adaptive = ["--step-duration", "auto", "--max-step-duration", "10s"]
    proc = locust(*search_args(server, run_dir, "--find-capacity", "users", *adaptive), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = capacity_of(run_dir)
    assert result["max_users"] == 8 and result["first_failing"]["users"] == 9, result["line"]
    steps = assert_probes_recorded(run_dir, result, "users")
    assert set(steps["end_reason"]) <= {"ci_target", "max_duration"} and "ci_target" in set(steps["end_reason"])
    assert_live_decisions_match(run_dir, result)
