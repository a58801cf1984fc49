"""--repeat N in real headless runs against the fake server: the whole plan run N times, steps.csv one pooled row
per plan step with the across-trial section, trials.csv each trial's own row, and every across-trial interval holding
every trial's own tok/s (for 3 trials it always does: analysis/trials.py). A capacity search refuses --repeat."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest
from vllm_loadtest.analysis.report import REPORT_FILE, SUMMARY_FILE
from vllm_loadtest.analysis.trials import TRIAL_COLUMNS, TRIALS_FILE

from tests.helpers.badinput import first_error
from tests.helpers.paths import ROOT
from tests.helpers.runs import locust

pytestmark = [pytest.mark.contract]


def test_three_trials_of_a_two_step_plan(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "20", "--itl-ms", "5")
    run_dir = tmp_path / "run"
    proc = locust(
        "--host", server.url, "--steps", "1,2", "--step-duration", "3s", "--step-warmup", "0s", "--max-tokens", "16",
        "--repeat", "3", "--run-dir", str(run_dir), timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    for k in (1, 2, 3):
        assert f"trial {k}/3" in out, out[-3000:]  # the line of each step as it ends says its trial
    steps = pd.read_csv(run_dir / "steps.csv")
    trials = pd.read_csv(run_dir / TRIALS_FILE)
    assert len(steps) == 2 and steps["step"].tolist() == [0, 1] and steps["users"].tolist() == [1, 2]
    assert len(trials) == 6 and sorted(zip(trials["trial"], trials["plan_step"])) == [
        (t, s) for t in (1, 2, 3) for s in (0, 1)
    ]
    assert trials["step"].tolist() == list(range(6))  # the running step the records carry
    assert list(steps.columns[-len(TRIAL_COLUMNS) :]) == TRIAL_COLUMNS  # appended last
    assert (steps["trials"] == 3).all()
    for _, row in steps.iterrows():
        own = trials[trials["plan_step"] == row["step"]]["aggregate_tok_s"]
        assert own.notna().all() and len(own) == 3
        assert row["aggregate_tok_s_trials_ci_low"] <= own.min() and own.max() <= row["aggregate_tok_s_trials_ci_high"]
        assert row["aggregate_tok_s_trials_mean"] == pytest.approx(own.mean())
        assert row["requests"] == trials[trials["plan_step"] == row["step"]]["requests"].sum()  # pooled
    summary = json.loads((run_dir / SUMMARY_FILE).read_text())
    assert summary["trials"]["trials"] == 3 and len(summary["trials"]["steps"]) == 2
    assert len(summary["trials"]["steps"][0]["aggregate_tok_s"]["per_trial"]) == 3
    assert "Trials (--repeat" in out and str(run_dir / TRIALS_FILE) in out
    page = (run_dir / REPORT_FILE).read_text(encoding="utf-8")
    assert "<h2>Trials</h2>" in page and "Trial 3 tok/s" in page and "Across trials tok/s" in page
    run = json.loads((run_dir / "run.json").read_text())
    assert [(t["plan_step"], t["trial"]) for t in run["timeline"]] == [(s, t) for t in (1, 2, 3) for s in (0, 1)]
    # Rebuilt from the run's files, the run reads the same.
    written = {name: (run_dir / name).read_bytes() for name in ("steps.csv", TRIALS_FILE)}
    rebuilt = subprocess.run([sys.executable, "-m", "analysis", "report", str(run_dir)], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    assert rebuilt.returncode == 0, rebuilt.stderr[-2000:]
    assert {name: (run_dir / name).read_bytes() for name in written} == written


def test_two_trials_of_a_rate_plan(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "20", "--itl-ms", "5")
    run_dir = tmp_path / "run"
    proc = locust(
        "--host", server.url, "--rates", "4,8", "--max-users", "8", "--step-duration", "3s", "--step-warmup", "0s",
        "--max-tokens", "16", "--repeat", "2", "--run-dir", str(run_dir), timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "trial 2/2" in proc.stdout
    steps, trials = pd.read_csv(run_dir / "steps.csv"), pd.read_csv(run_dir / TRIALS_FILE)
    assert steps["rate_rps"].tolist() == [4, 8] and trials["rate_rps"].tolist() == [4, 8, 4, 8]
    assert (steps["trials"] == 2).all() and len(trials) == 4
    for _, row in steps.iterrows():
        own = trials[trials["plan_step"] == row["step"]]["aggregate_tok_s"]
        assert row["aggregate_tok_s_trials_ci_low"] <= own.min() and own.max() <= row["aggregate_tok_s_trials_ci_high"]


def test_repeat_is_refused_with_a_capacity_search(fake_server):
    server = fake_server("--ttft-ms", "20", "--itl-ms", "5")
    proc = locust(
        "--host", server.url, "--find-capacity", "users", "--slo", "ttft_p95=500ms", "--repeat", "2",
        "--step-duration", "2s", "--step-warmup", "0s",
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "--repeat 2 is not supported with --find-capacity" in errors[0], proc.stderr[-2000:]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--repeat", "0"], "--repeat 0 must be at least 1"),
        (["--repeat", "2", "--find-capacity", "rate", "--slo", "ttft_p95=1s"], "not supported with --find-capacity"),
    ],
)
def test_bad_repeats_are_one_line(args, expected):
    assert expected in first_error("--steps", "1", *args)
