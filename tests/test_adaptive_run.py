"""--step-duration auto end to end: real `locust` processes against the fake server, whose requests are short, so
steps end in a few seconds. Each step ends when its aggregate tok/s interval (recomputed here from the records with
analysis/uncertainty, and steps.csv's own when it has one) is within --ci-target, or at --max-step-duration,
flagged; the run says why each step ended and how long it took."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from vllm_loadtest.analysis.run import STEPS_FILE
from vllm_loadtest.analysis.uncertainty import batch_count, batch_means, min_samples_for_quantile

from tests.helpers.runs import locust

pytestmark = [pytest.mark.contract]


def run(server, run_dir, *args: str):
    proc = locust(
        "--host", server.url, "--max-tokens", "8", "--run-dir", str(run_dir), "--no-report", *args, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = pd.read_parquet(run_dir / "requests.parquet")
    steps = pd.read_csv(run_dir / STEPS_FILE)
    return proc, records, steps, json.loads((run_dir / "run.json").read_text())


def intervals(records: pd.DataFrame, timeline: list[dict]) -> list:
    """Each step's aggregate tok/s batch-means interval, from the records: tokens of the ok requests completed in
    the measured window, batches of at least 4 median E2Es of the step's measured ok requests."""
    ok = records[records["status"] == "ok"]
    ends = (ok["start_time"] + ok["e2e_s"]).to_numpy()
    out = []
    for t in timeline:
        start, end = t["measure_start"], t["end_time"]
        measured = ok[(ok["step"] == t["step"]) & ~ok["warmup"]]
        k = batch_count(end - start, float(measured["e2e_s"].median()))
        out.append(batch_means(ends, ok["output_tokens"].to_numpy(float), start, end, k))
    return out


def ttft_samples(records: pd.DataFrame, step: int) -> int:
    return int(((records["step"] == step) & ~records["warmup"] & (records["status"] == "ok")
                & records["ttft_s"].notna()).sum())  # fmt: skip


def assert_within_target(steps: pd.DataFrame, records: pd.DataFrame, timeline: list[dict], target: float) -> None:
    for t, ci in zip(timeline, intervals(records, timeline)):
        assert ci.relative_half_width <= target, (t, ci)
        assert ttft_samples(records, t["step"]) >= min_samples_for_quantile(0.95), t
    if "aggregate_tok_s_ci_low" in steps.columns:  # the step table's own interval, once it has one
        half = (steps["aggregate_tok_s_ci_high"] - steps["aggregate_tok_s_ci_low"]) / 2
        assert (half / steps["aggregate_tok_s"] <= target).all(), steps[["aggregate_tok_s_ci_low", "aggregate_tok_s"]]


def assert_each_step_ended_for_its_reason(
    out: str, steps: pd.DataFrame, records: pd.DataFrame, timeline: list[dict], target: float, max_s: float
) -> None:
    """A step ends at --ci-target with its interval within the target, or at the maximum, flagged. Which one is up
    to the machine (in CI's loaded 2-core machine a 20 s step's interval stayed at +-14 %); the stopping rule itself
    is proven on synthetic streams in test_adaptive.py."""
    early = [t for t in timeline if t["end_reason"] == "ci_target"]
    for t in early:
        # The interval the rule judged, on the records the controller had then; a worker's records that arrive
        # later can widen the final one (0.12 live against 0.23 recomputed, on a loaded machine).
        assert t["end_check"]["rel_half_width"] <= target, t
        assert ttft_samples(records, t["step"]) >= min_samples_for_quantile(0.95), t
    for t in timeline:
        length = t["end_time"] - t["start_time"]
        if t["end_reason"] == "ci_target":  # at a check point, the last of which may fall on the maximum
            assert length <= max_s + 0.5, t
        else:
            assert t["end_reason"] == "max_duration" and length >= max_s - 0.5, t
            width, samples = t["end_check"].get("rel_half_width"), t["end_check"].get("ttft_samples")
            assert width is None or width > target or samples < min_samples_for_quantile(0.95), t
            flag = f"Step {t['step']} ({t['users']} users) reached --max-step-duration {max_s:g} s before its"
            assert f"MAX: {flag}" in out, out[-3000:]
    assert out.count("interval within target (aggregate tok/s ±") == len(early)


def test_auto_steps_end_when_their_interval_is_within_the_target(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "5", "--itl-ms", "1")  # ~15 ms a request
    proc, records, steps, run_json = run(
        server, tmp_path / "r", "--steps", "1,8", "--step-duration", "auto", "--max-step-duration", "12s",
        "--ci-target", "5%", "--step-warmup", "1s",
    )  # fmt: skip
    timeline = run_json["timeline"]
    assert list(steps["end_reason"]) == [t["end_reason"] for t in timeline]
    # Appended (steps.csv only gains columns): after every column before them, before the later sections.
    columns = list(steps.columns)
    at = columns.index("end_reason")
    assert columns[at : at + 2] == ["end_reason", "probe"]
    assert at + 2 == columns.index("ttfo_p50_s")  # the reasoning section (issue 18) was appended after them
    assert_each_step_ended_for_its_reason(proc.stdout, steps, records, timeline, 0.05, 12)
    total = run_json["finished_at"] - run_json["started_at"]
    options = run_json["options"]
    assert (options["step_duration"], options["max_step_duration"], options["ci_target"]) == ("auto", "12s", "5%")
    out = proc.stdout
    assert "Step lengths:" in out and f"The run took {total:.1f} s" in out


def test_a_tiny_maximum_ends_every_step_and_flags_it(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "5", "--itl-ms", "1")
    proc, _records, steps, run_json = run(
        server, tmp_path / "r", "--steps", "1,2", "--step-duration", "auto", "--max-step-duration", "2s",
        "--ci-target", "1%", "--step-warmup", "0s",
    )  # fmt: skip
    timeline = run_json["timeline"]
    assert [t["end_reason"] for t in timeline] == ["max_duration", "max_duration"], timeline
    assert list(steps["end_reason"]) == ["max_duration", "max_duration"]
    assert all(1.5 < t["end_time"] - t["start_time"] < 4 for t in timeline), timeline
    for step, users in ((0, 1), (1, 2)):
        flag = f"Step {step} ({users} users) reached --max-step-duration 2 s before its interval narrowed to 1 %: "
        assert f"MAX: {flag}" in proc.stdout  # the end-of-run section
        assert flag in proc.stderr  # and the log when it happened


def test_auto_rate_steps_across_worker_processes(fake_server, tmp_path):
    """Open loop (--rates) on a master and two workers: the master judges the records the workers ship."""
    server = fake_server("--ttft-ms", "5", "--itl-ms", "1")
    proc, records, steps, run_json = run(
        server, tmp_path / "r", "--rates", "60,120", "--max-users", "16", "--processes", "2",
        "--step-duration", "auto", "--max-step-duration", "30s", "--ci-target", "20%", "--step-warmup", "1s",
    )  # fmt: skip
    timeline = run_json["timeline"]
    assert records["worker"].nunique() == 2
    assert_each_step_ended_for_its_reason(proc.stdout, steps, records, timeline, 0.20, 30)
