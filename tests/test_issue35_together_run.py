"""Issue 35's four features in one run, as a user combines them: --repeat 3 of a --lora-mix against a server with
two adapters that speculates (4 drafted, 2 accepted), a dcgm-exporter at known constant power. Each feature's own
run test holds it alone; here the pooled steps of a repeated run must still carry every section, and each file
the truth: the adapters' shares inside their bounds, the acceptance rate exact, the joules per token the power
times the window over the tokens, every trial inside its step's across-trial interval."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.helpers.runs import locust
from tests.helpers.servers import FakeDCGM

pytestmark = [pytest.mark.contract]

WATTS = (300.0, 450.0)


def test_a_repeated_lora_mix_on_a_speculating_server_with_gpu_energy(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "20", "--itl-ms", "10", "--lora", "a1=10,a2=20", "--spec-decode", "4:2")
    dcgm = FakeDCGM(["--gpus", "2", "--power-w", ",".join(map(str, WATTS))])
    run_dir = tmp_path / "run"
    try:
        proc = locust(
            "--host", server.url, "--max-tokens", "32", "--steps", "2,4", "--step-duration", "4s",
            "--step-warmup", "1s", "--repeat", "3", "--lora-mix", "fake-model:1,a1:1,a2:2",
            "--gpu-metrics-url", dcgm.metrics_url, "--run-dir", str(run_dir), timeout=240,
        )  # fmt: skip
    finally:
        dcgm.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps, trials, models = (pd.read_csv(run_dir / f) for f in ("steps.csv", "trials.csv", "models.csv"))
    assert len(steps) == 2 and len(trials) == 6
    # models.csv pools a plan step's trials as steps.csv does: one row per plan step and model.
    assert sorted(zip(models["step"], models["model"])) == [(s, m) for s in (0, 1) for m in ("a1", "a2", "fake-model")]
    assert (models.groupby("step")["sent"].sum() == models.groupby("step")["step_sent"].first()).all()
    assert (models["share_low"] <= models["share"]).all() and (models["share"] <= models["share_high"]).all()
    for frame in (steps, trials):  # the fake accepts exactly 2 of every 4 drafted tokens
        assert frame["spec_acceptance_rate"].tolist() == pytest.approx([0.5] * len(frame), abs=0.01)
        assert frame["spec_acceptance_length_mean"].tolist() == pytest.approx([3.0] * len(frame), abs=0.01)
    for _, r in trials.iterrows():  # the power is constant: energy = watts x window, to the run's own window
        truth = sum(WATTS) * r["window_s"] / r["output_tokens"]
        assert r["energy_per_output_token_j"] == pytest.approx(truth, rel=0.05)
    for _, r in steps.iterrows():
        own = trials.loc[trials["plan_step"] == r["step"], "aggregate_tok_s"]
        assert r["aggregate_tok_s_trials_ci_low"] <= own.min() and own.max() <= r["aggregate_tok_s_trials_ci_high"]
    summary = json.loads((run_dir / "summary.json").read_text())
    for key in ("energy", "spec_decode", "per_model", "lora_mix", "trials"):
        assert summary.get(key) is not None, key
    assert summary["spec_decode"]["acceptance_rate"] == pytest.approx(0.5, abs=0.01)
