"""--step-duration auto against the embedded real vLLM (CPU build, tiny model): every step ends by its interval,
within --ci-target, before --max-step-duration.

Select with `-m vllm`; the server starts once per session (tests/conftest.py)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from vllm_loadtest.analysis.adaptive import aggregate_interval
from vllm_loadtest.analysis.uncertainty import min_samples_for_quantile

from tests.helpers.runs import locust

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]

TARGET = 0.05
MAX_S = 60


def test_auto_steps_on_a_real_server_end_with_their_interval_within_the_target(vllm_server, tmp_path):
    run_dir = tmp_path / "run"
    proc = locust(
        "--host", vllm_server.url, "--steps", "1,4,16", "--step-duration", "auto", "--max-step-duration", f"{MAX_S}s",
        "--ci-target", f"{TARGET:.0%}", "--step-warmup", "5s", "--max-tokens", "64", "--ignore-eos",
        "--stop-timeout", "60", "--run-dir", str(run_dir), "--no-report",
        timeout=3 * MAX_S + 180,
    )  # fmt: skip
    print(proc.stdout[-3000:])  # the table and the step lengths, shown when an assertion fails
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads((run_dir / "run.json").read_text())
    timeline = run["timeline"]
    steps = pd.read_csv(run_dir / "steps.csv")
    records = pd.read_parquet(run_dir / "requests.parquet")
    assert [t["users"] for t in timeline] == [1, 4, 16]
    # Each step ends by its interval or, flagged, by the maximum: on this 2-core machine the CPU server's throughput
    # can drift by tens of percent over a minute (seen: a 4-user step's 3-s bins from 7.3 k to 11.3 k tokens, ±8 %
    # after 60 s), and then the suite must say so rather than claim 5 %. Most steps end by the target.
    reasons = [t["end_reason"] for t in timeline]
    assert set(reasons) <= {"ci_target", "max_duration"} and list(steps["end_reason"]) == reasons
    # At least one ends by the target. Requiring two failed once on a fresh clone just after installing vLLM: the
    # 4- and 16-user steps slowed by ~20 % between their halves (3133 -> 2543, 6001 -> 4959 tok/s, flagged
    # UNSTABLE) and ended at the maximum at ±15.6 % and ±11.5 %: the suite said so, which is what it must do.
    assert reasons.count("ci_target") >= 1, [t.get("end_check") for t in timeline]
    ok = records[records["status"] == "ok"]
    ends = (ok["start_time"] + ok["e2e_s"]).to_numpy(float)
    for t, row in zip(timeline, steps.itertuples(index=False)):
        measured = ok[(ok["step"] == t["step"]) & ~ok["warmup"]]
        ci = aggregate_interval(
            ends, ok["output_tokens"].to_numpy(float), t["measure_start"], t["end_time"],
            float(measured["e2e_s"].median()), ok["start_time"].to_numpy(float),
        )  # fmt: skip
        # The step table's own interval is the one the decision judged.
        assert ci.low == pytest.approx(row.aggregate_tok_s_ci_low)
        assert ci.high == pytest.approx(row.aggregate_tok_s_ci_high)
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
        else:  # flagged where it is read
            assert t["end_time"] - t["start_time"] == pytest.approx(MAX_S, abs=2.0), t
            assert f"MAX: Step {t['step']} ({t['users']} users) reached --max-step-duration" in proc.stdout
    assert run["finished_at"] - run["started_at"] < 3 * MAX_S + 30
    assert "Step lengths:" in proc.stdout
    assert proc.stdout.count("interval within target") == reasons.count("ci_target")
