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
    assert [t["end_reason"] for t in timeline] == ["ci_target"] * 3, [t.get("end_check") for t in timeline]
    assert list(steps["end_reason"]) == ["ci_target"] * 3
    ok = records[records["status"] == "ok"]
    ends = (ok["start_time"] + ok["e2e_s"]).to_numpy(float)
    for t in timeline:
        assert t["end_time"] - t["start_time"] < MAX_S, t
        measured = ok[(ok["step"] == t["step"]) & ~ok["warmup"]]
        assert measured["ttft_s"].notna().sum() >= min_samples_for_quantile(0.95), t
        ci = aggregate_interval(
            ends, ok["output_tokens"].to_numpy(float), t["measure_start"], t["end_time"],
            float(measured["e2e_s"].median()), ok["start_time"].to_numpy(float),
        )  # fmt: skip
        assert ci.relative_half_width <= TARGET, (t, ci)
    if "aggregate_tok_s_ci_low" in steps.columns:  # the step table's own interval agrees
        half = (steps["aggregate_tok_s_ci_high"] - steps["aggregate_tok_s_ci_low"]) / 2
        assert (half / steps["aggregate_tok_s"] <= TARGET).all(), steps
    assert run["finished_at"] - run["started_at"] < 3 * MAX_S + 30
    assert "Step lengths:" in proc.stdout and proc.stdout.count("interval within target") == 3
