"""--step-duration auto against the embedded real vLLM (CPU build, tiny model): every step ends by its interval,
within --ci-target, or at --max-step-duration, flagged, with an interval that was still too wide.

Which of the two a step on this shared 2-core machine reaches is not the suite's to decide: the CPU server's own
throughput drifts (seen in CI: 2305 -> 1707 tok/s between the halves of a 4-user step, ±27 % after 60 s, and every
step of that run ended at the maximum). That every step ends by the target when the throughput is steady is proved
against the fake server, whose timing is exact (tests/test_adaptive_run.py); here, that both ends are honest on a
real server.

Select with `-m vllm`; the server starts once per session (tests/conftest.py)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from vllm_loadtest.analysis.adaptive import aggregate_interval
from vllm_loadtest.analysis.uncertainty import min_samples_for_quantile

from tests.helpers.runs import locust

pytestmark = [pytest.mark.vllm, pytest.mark.contract]

TARGET = 0.10
MAX_S = 15


def test_auto_steps_on_a_real_server_end_with_their_interval_within_the_target(vllm_server, tmp_path):
    run_dir = tmp_path / "run"
    proc = locust(
        "--host", vllm_server.url, "--steps", "1,8", "--step-duration", "auto", "--max-step-duration", f"{MAX_S}s",
        "--ci-target", f"{TARGET:.0%}", "--step-warmup", "3s", "--max-tokens", "64", "--ignore-eos",
        "--stop-timeout", "60", "--run-dir", str(run_dir), "--no-report",
        timeout=2 * MAX_S + 180,
    )  # fmt: skip
    print(proc.stdout[-3000:])  # the table and the step lengths, shown when an assertion fails
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads((run_dir / "run.json").read_text())
    timeline = run["timeline"]
    steps = pd.read_csv(run_dir / "steps.csv")
    records = pd.read_parquet(run_dir / "requests.parquet")
    assert [t["users"] for t in timeline] == [1, 8]
    # Each step ends by its interval or, flagged, by the maximum (see the module's docstring).
    reasons = [t["end_reason"] for t in timeline]
    assert set(reasons) <= {"ci_target", "max_duration"} and list(steps["end_reason"]) == reasons
    ok = records[records["status"] == "ok"]
    ends = (ok["start_time"] + ok["e2e_s"]).to_numpy(float)
    for t, row in zip(timeline, steps.itertuples(index=False)):
        measured = ok[(ok["step"] == t["step"]) & ok["measured"]]  # the requests the step table counts
        ci = aggregate_interval(  # an ok request without a token count adds none, as in the step table
            ends, ok["output_tokens"].fillna(0).to_numpy(float), t["measure_start"], t["end_time"],
            float(measured["e2e_s"].median()), ok["start_time"].to_numpy(float),
        )  # fmt: skip
        # The step table's own interval is the one the decision judged (missing in both when the window held too few
        # batches: a server the busy machine slowed).
        assert ci.low == pytest.approx(row.aggregate_tok_s_ci_low, nan_ok=True)
        assert ci.high == pytest.approx(row.aggregate_tok_s_ci_high, nan_ok=True)
        if t["end_reason"] == "ci_target":
            # The last check falls at the maximum itself, and an interval within the target there is a target end
            # (seen in CI: a 4-user step's check at 60.0 s found ±4.8 %), so the bound is the maximum, not below it.
            assert t["end_time"] - t["start_time"] <= MAX_S + 1.0, t
            assert measured["ttft_s"].notna().sum() >= min_samples_for_quantile(0.95), t
            # The decision was taken on the records the controller had at that moment; the step table's interval is
            # computed again from the complete records (the window's exact end, the requests that completed in its
            # last milliseconds, the final median E2E that sets the batches), so it may differ slightly (seen in a
            # fresh clone: decided at ±4.98 %, recomputed ±5.04 %).
            assert t["end_check"]["rel_half_width"] <= TARGET, t
            assert ci.relative_half_width <= TARGET * 1.05, (t, ci)
        else:  # flagged where it is read, and only when the last check found the interval too wide (or no interval)
            assert t["end_time"] - t["start_time"] == pytest.approx(MAX_S, abs=2.0), t
            check = t["end_check"]
            width, samples = check.get("rel_half_width"), check.get("ttft_samples")
            assert width is None or width > TARGET or samples < min_samples_for_quantile(0.95), t
            assert f"MAX: Step {t['step']} ({t['users']} users) reached --max-step-duration" in proc.stdout
    assert run["finished_at"] - run["started_at"] < 2 * MAX_S + 30
    assert "Step lengths:" in proc.stdout
    assert proc.stdout.count("interval within target") == reasons.count("ci_target")
