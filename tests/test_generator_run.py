"""The load generator's self-checks in real runs: an overloaded run that must be flagged generator-bound, and a
master + 2 workers run whose samples all reach generator.parquet (the figures themselves: tests/test_generator.py).

Tests running beside it in the parallel suite only add to the lag the overloaded run must find."""

from __future__ import annotations

import json
import math
import socket

import numpy as np
import pandas as pd
import pytest
from vllm_loadtest.analysis.adaptive import STEP_END_COLUMNS
from vllm_loadtest.analysis.batch import BATCH_COLUMNS
from vllm_loadtest.analysis.diagnosis import LOAD_GENERATOR
from vllm_loadtest.analysis.energy import ENERGY_COLUMNS
from vllm_loadtest.analysis.generator import CPU_BOUND, GENERATOR_COLUMNS, GENERATOR_DIR, GENERATOR_FILE, LAG_BOUND_S
from vllm_loadtest.analysis.gpu import GPU_COLUMNS
from vllm_loadtest.analysis.lora import LORA_COLUMNS
from vllm_loadtest.analysis.reasoning import REASONING_COLUMNS
from vllm_loadtest.analysis.records import RECEIVED_DIR
from vllm_loadtest.analysis.report import REPORT_FILE, SUMMARY_FILE
from vllm_loadtest.analysis.schedule import OPEN_LOOP_COLUMNS
from vllm_loadtest.analysis.server_metrics import SERVER_BOUND_COLUMNS
from vllm_loadtest.analysis.spec_decode import SPEC_COLUMNS
from vllm_loadtest.analysis.steps import UNCERTAINTY_COLUMNS

from tests.helpers.runs import cluster, locust

pytestmark = [pytest.mark.contract]


def test_a_single_overloaded_process_is_flagged_generator_bound(fake_server, tmp_path):
    """One process, 64 users, a server that streams 256 tokens as fast as it can: far more chunks per second than
    one Python process reads. The run must say so: steps.csv, the console, summary.json and the report."""
    server = fake_server("--ttft-ms", "1", "--itl-ms", "0")
    run_dir = tmp_path / "r"
    proc = locust(
        "--host", server.url, "--steps", "64", "--step-duration", "5s", "--step-warmup", "1s",
        "--max-tokens", "256", "--run-dir", str(run_dir),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = pd.read_csv(run_dir / "steps.csv")
    # The self-check columns, then the later sections (open loop, intervals, server bounds, step end): only added at
    # the end.
    tail = GENERATOR_COLUMNS + OPEN_LOOP_COLUMNS + UNCERTAINTY_COLUMNS + SERVER_BOUND_COLUMNS + STEP_END_COLUMNS
    tail += REASONING_COLUMNS + BATCH_COLUMNS + GPU_COLUMNS + ENERGY_COLUMNS + LORA_COLUMNS + SPEC_COLUMNS
    assert list(steps.columns[-len(tail) :]) == tail
    row = steps.iloc[0]
    assert row.generator_processes == 1 and row.users_achieved_mean > 0
    assert row.generator_lag_p99_s > LAG_BOUND_S or row.generator_cpu_max > CPU_BOUND, row
    assert bool(row.generator_bound) is True
    assert "GENERATOR-BOUND steps 0 (64 users)" in proc.stdout and "--processes N" in proc.stdout
    summary = json.loads((run_dir / SUMMARY_FILE).read_text())
    assert summary["steps"][0]["generator_bound"] is True
    assert summary["diagnosis"]["binding"] == {"0": LOAD_GENERATOR}
    assert any("the load generator binds" in t for t in summary["diagnosis"]["text"])
    page = (run_dir / REPORT_FILE).read_text()
    assert "GENERATOR-BOUND steps 0 (64 users)" in page and "Load generator self-checks" in page
    samples = pd.read_parquet(run_dir / GENERATOR_FILE)
    assert samples["worker"].nunique() == 1 and samples["lag_s"].map(len).sum() > 0
    assert (samples["users_intended"] == 64).all() and (samples["interval_s"] > 0).all()


def test_every_worker_of_a_cluster_ships_its_samples_to_the_master(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "20", "--itl-ms", "5")
    run_dir = tmp_path / "run"
    with cluster(
        tmp_path, 2, server.url, "--steps", "2,4", "--step-duration", "3s", "--step-warmup", "0s",
        "--max-tokens", "16", "--stop-timeout", "10", "--run-dir", str(run_dir),
    ) as (master, workers):  # fmt: skip
        assert master.wait(120) == 0, (tmp_path / "master.log").read_text()[-3000:]
        for w in workers:
            w.wait(30)
    names = {f"{socket.gethostname()}-{w.pid}" for w in workers}
    samples = pd.read_parquet(run_dir / GENERATOR_FILE)
    assert set(samples["worker"]) == names  # the master generates no load: no samples of its own
    assert {p.stem for p in (run_dir / GENERATOR_DIR / RECEIVED_DIR).glob("*.jsonl")} == names
    # Each worker's shipped copy holds every row its own file holds (its last one was sent before its final message).
    for name in names:
        own = pd.read_json(run_dir / GENERATOR_DIR / f"{name}.jsonl", lines=True)
        shipped = pd.read_json(run_dir / GENERATOR_DIR / RECEIVED_DIR / f"{name}.jsonl", lines=True)
        assert np.array_equal(own["timestamp"].to_numpy(), shipped["timestamp"].to_numpy())
    steps = pd.read_csv(run_dir / "steps.csv")
    # Each step counts the processes with samples in its window: both, unless a busy machine starved the samplers
    # through a whole 3 s window (seen in stress runs: 1, and in a fresh clone's make test 0, in the first step), so
    # the count is the samples' own, and a window without any is missing (NaN), never 0.
    timeline = json.loads((run_dir / "run.json").read_text())["timeline"]
    for entry, row in zip(timeline, steps.itertuples()):
        inside = samples[(samples["timestamp"] >= entry["measure_start"]) & (samples["timestamp"] < entry["end_time"])]
        count = inside["worker"].nunique()
        if count:
            assert row.generator_processes == count, (entry["step"], row.generator_processes)
        else:
            assert math.isnan(row.generator_processes), (entry["step"], row.generator_processes)
    assert steps["generator_processes"].max() == 2 and steps["users_achieved_mean"].notna().all()
