"""GPU energy end to end (issue 35): real headless Locust runs against tests/fakeserver.py with --gpu-metrics-url
pointing at fake dcgm-exporters at a known constant power (tests/fakedcgm.py --power-w: its energy counter is the
exact integral of that power). The joules per output token in steps.csv equal power x window / output tokens within
5 %, with the window and the tokens from the run's own steps.csv, under 1 s scrapes that never fall on a window's
edge; a GPU host without the counter is left out and counted; a counter reset mid-run is read as a restart; the run's
totals per GPU are in summary.json, the console prints the Energy table and the report has its part."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from vllm_loadtest.analysis.energy import ENERGY_METRICS

from tests.helpers.runs import locust
from tests.helpers.servers import FakeDCGM

pytestmark = pytest.mark.contract

WATTS = (300.0, 450.0)  # the two GPUs of the host that exports the counter


def _run(server_url: str, run_dir, interval: str, *urls: str):
    gpus = [a for url in urls for a in ("--gpu-metrics-url", url)]
    # Windows of 4 s after a 1 s warm-up: several scrapes inside each, none on an edge but by chance.
    return locust("--host", server_url, "--steps", "1,2", "--step-duration", "5s", "--step-warmup", "1s",
                  "--max-tokens", "16", "--run-dir", str(run_dir), "--scrape-interval", interval, *gpus)  # fmt: skip


def test_joules_per_output_token_equal_power_times_window_over_tokens_within_5_percent(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "5", "--itl-ms", "2")
    known = FakeDCGM(["--gpus", "2", "--hostname", "node-a", "--power-w", ",".join(map(str, WATTS))])
    without = FakeDCGM(["--gpus", "1", "--hostname", "node-b", "--uuid-prefix", "0b0b0b0b", "--no-energy"])
    run_dir = tmp_path / "run"
    try:
        proc = _run(server.url, run_dir, "1", known.metrics_url, without.metrics_url)
    finally:
        known.stop()
        without.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = pd.read_csv(run_dir / "steps.csv")
    records = pd.read_parquet(run_dir / "requests.parquet")
    assert len(steps) == 2
    for row in steps.to_dict(orient="records"):
        window, tokens = row["window_s"], row["output_tokens"]
        assert window >= 3.5 and tokens > 0, row
        assert row["gpus"] == 3 and row["energy_gpus"] == 2  # node-b's GPU has no counter: left out, counted
        truth = sum(WATTS) * window
        assert row["energy_j"] == pytest.approx(truth, rel=0.05), row["step"]
        assert row["energy_per_output_token_j"] == pytest.approx(truth / tokens, rel=0.05), row["step"]
        assert row["energy_power_w"] == pytest.approx(sum(WATTS) / 2, rel=0.05)
        ends = records["start_time"] + records["e2e_s"]
        done = (records["status"] == "ok") & (ends >= row["window_start_time"]) & (ends < row["window_end_time"])
        assert row["energy_per_request_j"] == pytest.approx(row["energy_j"] / done.sum(), rel=1e-9)
        assert row["energy_per_output_token_j_ci_low"] <= row["energy_per_output_token_j"]
        assert row["energy_per_output_token_j"] <= row["energy_per_output_token_j_ci_high"]

    energy = json.loads((run_dir / "summary.json").read_text())["energy"]
    window = float(steps["window_s"].sum())
    assert energy["steps"] == [0, 1] and energy["gpus"] == 2 and energy["window_s"] == pytest.approx(window)
    assert energy["energy_j"] == pytest.approx(sum(WATTS) * window, rel=0.05)
    assert energy["output_tokens"] == int(steps["output_tokens"].sum())
    assert energy["energy_per_output_token_j"] == pytest.approx(sum(WATTS) * window / energy["output_tokens"], rel=0.05)
    by_gpu = {g["gpu_key"]: g for g in energy["per_gpu"]}
    assert set(by_gpu) == {"node-a/0", "node-a/1"}
    for g, watts in enumerate(WATTS):
        assert by_gpu[f"node-a/{g}"]["energy_j"] == pytest.approx(watts * window, rel=0.05)
        assert set(by_gpu[f"node-a/{g}"]["steps"]) == {"0", "1"}
    assert "\nEnergy (" in proc.stdout and "J/token" in proc.stdout
    assert "<h2>Energy</h2>" in (run_dir / "report.html").read_text(encoding="utf-8")


def test_a_counter_reset_mid_run_is_read_as_a_restart_and_no_counter_is_no_energy(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "5", "--itl-ms", "2")
    # The counter restarts from 0 a few seconds in: inside the run, whichever window. Scrapes every 0.25 s: the
    # energy of the one interval that holds the reset (drawn before it) is what the restart loses.
    resets = FakeDCGM(["--gpus", "1", "--hostname", "node-r", "--power-w", "400", "--energy-reset-after", "6"])
    run_dir = tmp_path / "run"
    try:
        proc = _run(server.url, run_dir, "0.25", resets.metrics_url)
    finally:
        resets.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = pd.read_parquet(run_dir / "metrics.parquet")
    counter = metrics[metrics["metric"].isin(ENERGY_METRICS)].sort_values("timestamp")["value"]
    assert (counter.diff() < 0).sum() == 1  # the reset is in the data, once
    steps = pd.read_csv(run_dir / "steps.csv")
    for row in steps.to_dict(orient="records"):
        assert row["energy_gpus"] == 1
        assert row["energy_j"] == pytest.approx(400.0 * row["window_s"], rel=0.05), row["step"]

    # A run whose exporter has no energy counter: every energy column empty, never 0; no console table.
    bare_dir = tmp_path / "bare"
    none = FakeDCGM(["--gpus", "1", "--hostname", "node-n", "--no-energy"])
    try:
        proc = _run(server.url, bare_dir, "1", none.metrics_url)
    finally:
        none.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    bare = pd.read_csv(bare_dir / "steps.csv", keep_default_na=False)
    assert (bare["gpus"] == 1).all()
    assert all((bare[c] == "").all() for c in bare.columns if c.startswith("energy_")), bare.filter(like="energy_")
    assert json.loads((bare_dir / "summary.json").read_text())["energy"] is None
    assert "\nEnergy (" not in proc.stdout
