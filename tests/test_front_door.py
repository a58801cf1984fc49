"""The front door (issue 34): `vllm-loadtest` as a user meets it, its help, version, typos, console and the runs that
measure nothing, against the fake server."""

import json
import os
import subprocess
import sys

import pandas as pd
import pytest
from vllm_loadtest.analysis import __version__
from vllm_loadtest.analysis.run import STEPS_FILE

from tests.helpers.paths import ROOT

pytestmark = pytest.mark.contract


def cli(*args: str, cwd=None, env=None, timeout=120) -> subprocess.CompletedProcess:
    """`vllm-loadtest ARGS` (the console script's module with this interpreter), its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "vllm_loadtest.cli", *args],
        cwd=cwd or ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_help_lists_the_suites_options_by_group_with_their_defaults():
    proc = cli("--help")
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert text.startswith("usage: vllm-loadtest") and "Usage: locust" not in text
    for group in ("Load plan options:", "Workload options:", "Request options:", "Server options:",
                  "SLO and capacity options:", "Output options:", "Distributed options:"):  # fmt: skip
        assert group in text
    flat = " ".join(text.split())
    assert "--steps X Comma-separated user counts, one load step each (default: 1,2,4,8,16,32,64)" in flat
    assert "--endpoint {chat,completions,embeddings,rerank}" in flat and "(default: completions)" in flat
    assert "--find-capacity {,users,rate}" in flat and "--slo X Service-level objectives" in flat
    assert "vllm-loadtest --help-locust" in flat
    assert "--step-duration X Length of each step, its warm-up included" in flat
    assert cli("run", "-h").stdout == text


def test_the_version_is_the_suites_and_locusts_own_help_is_one_flag_away():
    proc = cli("--version")
    assert proc.returncode == 0 and proc.stdout.startswith(f"vllm-loadtest {__version__} (Locust ")
    locust_help = cli("--help-locust")
    assert locust_help.returncode == 0 and "Usage: locust" in locust_help.stdout and "--web-port" in locust_help.stdout


@pytest.mark.parametrize(
    "args, expected",
    [
        (("--step-duratoin", "5s"), "error: unknown option --step-duratoin: did you mean --step-duration?"),
        (("run", "--headles"), "error: unknown option --headles: did you mean --headless?"),
        (("reprot", "runs/x"), "error: unknown command 'reprot': did you mean `vllm-loadtest report`?"),
    ],
)
def test_a_typo_is_one_line_that_names_the_fix_and_exit_code_3(args, expected, tmp_path):
    proc = cli(*args, cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.startswith(expected) and proc.stderr.count("\n") == 1 and not proc.stdout
    assert not (tmp_path / "reports").exists()  # nothing started


def test_a_headless_run_prints_a_line_per_step_and_ends_with_the_suites_verdict(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "20", "--itl-ms", "5")
    run_dir = tmp_path / "run"
    proc = cli("run", "--headless", "--host", server.url, "--steps", "1,2", "--step-duration", "3s",
               "--step-warmup", "1s", "--max-tokens", "8", "--run-dir", str(run_dir), cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout.splitlines()
    # Locust's request table neither every few seconds nor at the end; its ramp-up lines left out too.
    assert "Aggregated" not in proc.stdout + proc.stderr and "Ramping to" not in proc.stderr
    head = [i for i, line in enumerate(out) if line.lstrip().startswith("step") and "(latencies in ms)" in line]
    assert len(head) == 1
    lines = out[head[0] + 1 : head[0] + 3]
    assert [line.split()[:2] for line in lines] == [["0", "1"], ["1", "2"]]
    assert all(line.split()[-1] in ("ok", "UNSTABLE", "-") for line in lines)
    steps = pd.read_csv(run_dir / STEPS_FILE)
    assert list(steps["users"]) == [1, 2]
    # The step table always ends with whether each step was stable; the console's last lines are the suite's.
    curve = out.index(next(line for line in out if line.startswith("Batching curve")))
    assert out[curve + 1].split()[-1] == "stable"
    assert out[-1].startswith("Report: ") and out[-2].startswith("Results: ")
    rebuilt = cli("report", str(run_dir))
    assert rebuilt.returncode == 0, rebuilt.stderr[-2000:]
    assert pd.read_csv(run_dir / STEPS_FILE)["requests"].tolist() == steps["requests"].tolist()


def test_every_suite_option_is_read_from_locust_conf_and_from_its_variable(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "10", "--itl-ms", "2")
    (tmp_path / "locust.conf").write_text(
        f"host = {server.url}\nheadless = true\nsteps = 2\nstep-duration = 4s\nstep-warmup = 0s\n"
        f"run-dir = {tmp_path / 'run'}\n"
    )
    proc = cli(cwd=tmp_path, env={"LOCUST_MAX_TOKENS": "5", "LOCUST_SLO": "e2e_p99=30s"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    options = json.loads((tmp_path / "run" / "run.json").read_text())["options"]
    assert (options["steps"], options["step_duration"], options["max_tokens"]) == ("2", "4s", 5)
    assert options["slo"] == "e2e_p99=30s"
    records = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    assert set(records["max_tokens"]) == {5} and set(records["users"]) == {2}
    # The command line wins over both.
    again = cli("--steps", "1", "--run-dir", str(tmp_path / "again"), cwd=tmp_path, env={"LOCUST_MAX_TOKENS": "5"})
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((tmp_path / "again" / "run.json").read_text())["options"]["steps"] == "1"


def test_a_stream_that_trickles_bytes_fails_within_the_read_timeout(fake_server, tmp_path):
    # After three tokens the server sends a byte a second and never completes a line, for 60 s.
    server = fake_server("--ttft-ms", "10", "--itl-ms", "5", "--faults", "trickle=1", "--stall-s", "60")
    run_dir = tmp_path / "run"
    proc = cli("run", "--headless", "--host", server.url, "--steps", "2", "--step-duration", "6s", "--step-warmup",
               "0s", "--read-timeout", "2", "--max-tokens", "16", "--run-dir", str(run_dir), cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    records = pd.read_parquet(run_dir / "requests.parquet")
    timed_out = records[records["error_type"] == "timeout"]
    assert len(timed_out) >= 2 and (records["status"] != "ok").all()
    # Each ended 2 s after its last line (the watchdog looks every 0.5 s), far from the server's 60 s.
    assert timed_out["duration_s"].max() < 2 + 3, timed_out["duration_s"].describe()
    assert timed_out["error"].str.contains("no complete line from the server for").all()
    assert "No request completed" in proc.stdout


def test_a_run_in_which_no_request_completed_fails(fake_server, tmp_path):
    # The same trickle with the default read timeout: every request is still running when the run stops.
    server = fake_server("--ttft-ms", "10", "--itl-ms", "5", "--faults", "trickle=1", "--stall-s", "60")
    run_dir = tmp_path / "run"
    proc = cli("run", "--headless", "--host", server.url, "--steps", "2", "--step-duration", "3s", "--step-warmup",
               "0s", "--max-tokens", "16", "--run-dir", str(run_dir), cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Errors: 0 of 0 requests" in proc.stdout
    assert "No request completed: 0 failed and 2 were still running when the run stopped" in proc.stdout
    assert "step 0: no request completed in it (2 users)" in proc.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["ok"] == 0 and summary["cut_off"] == 2


def test_the_issues_command_writes_a_run_directory_and_the_default_warm_up_fits_a_short_step(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "10", "--itl-ms", "2")
    proc = cli("run", "--headless", "--host", server.url, "--steps", "2", "--step-duration", "5s", "--max-tokens",
               "8", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--step-warmup 1s: a fifth of each 5s step" in proc.stderr
    (run_dir,) = (tmp_path / "reports").iterdir()  # the default: reports/<UTC timestamp>/
    run = json.loads((run_dir / "run.json").read_text())
    assert run["options"]["step_warmup"] == "1s"
    for name in ("requests.parquet", "steps.csv", "summary.json", "report.html"):
        assert (run_dir / name).exists(), name
    (step,) = run["timeline"]
    assert step["measure_start"] - step["start_time"] == pytest.approx(1.0)  # the warm-up is inside the step
