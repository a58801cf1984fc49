"""A real run's end (finish_run) with dcgm-exporter scrapes in its metrics.jsonl: steps.csv carries the regime and
its intervals, the console prints the GPU table, the diagnosis names the regime, summary.json holds it, and the
report draws the GPU section; the same run without GPU scrapes shows none of it.

The scrapes are written into the run directory after a real Locust run against the fake server (the scraper of GPU
endpoints is issue 20's part A; its own tests run it against a fake dcgm-exporter)."""

from __future__ import annotations

import json

import numpy as np
import orjson
import pandas as pd
import pytest
from vllm_loadtest.analysis.energy import ENERGY_COLUMNS
from vllm_loadtest.analysis.finish import finish_run
from vllm_loadtest.analysis.lora import LORA_COLUMNS
from vllm_loadtest.analysis.roofline import MEMORY_BOUND, VERDICT_COLUMNS
from vllm_loadtest.analysis.spec_decode import SPEC_COLUMNS

from tests.helpers.gpu import URL, labels, use_gpu_series
from tests.helpers.runs import short_run

pytestmark = pytest.mark.contract


def add_gpu_scrapes(run_dir, every: float = 0.1) -> None:
    """One memory-bound H100 (DRAM 0.82, SM 0.31, noisy) scraped every `every` s over the whole run, appended to
    metrics.jsonl as the scraper writes a scrape (its source named)."""
    timeline = json.loads((run_dir / "run.json").read_text())["timeline"]
    start, end = timeline[0]["start_time"], max(t["end_time"] for t in timeline)
    rng = np.random.default_rng(3)
    with open(run_dir / "metrics.jsonl", "ab") as f:
        for t in np.arange(start, end, every):
            lab = labels(0)
            samples = [
                ("DCGM_FI_DEV_GPU_UTIL", lab, 97.0),
                ("DCGM_FI_PROF_DRAM_ACTIVE", lab, 0.82 + 0.01 * rng.normal()),
                ("DCGM_FI_PROF_SM_ACTIVE", lab, 0.31 + 0.01 * rng.normal()),
                ("DCGM_FI_DEV_FB_USED", lab, 61440.0),
                ("DCGM_FI_DEV_POWER_USAGE", lab, 500 + rng.normal()),
            ]
            f.write(orjson.dumps({"t": float(t), "source": URL, "samples": samples, "error": None}) + b"\n")


def test_a_run_with_gpu_scrapes_reads_its_roofline_regime(fake_server, tmp_path, monkeypatch):
    use_gpu_series(monkeypatch)
    server = fake_server("--ttft-ms", "20", "--itl-ms", "5")
    run_dir = tmp_path / "run"
    proc = short_run(server.url, run_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "GPU (dcgm-exporter" not in proc.stdout  # no GPU endpoint: no GPU table
    plain = pd.read_csv(run_dir / "steps.csv")
    tail = VERDICT_COLUMNS + ENERGY_COLUMNS + LORA_COLUMNS + SPEC_COLUMNS  # the verdict ends GPU; energy, LoRA
    assert list(plain.columns[-len(tail) :]) == tail
    assert plain[VERDICT_COLUMNS + ENERGY_COLUMNS].isna().all().all()

    add_gpu_scrapes(run_dir)
    outcome = finish_run(run_dir)
    steps = pd.read_csv(run_dir / "steps.csv")
    assert list(steps["gpu_regime"]) == [MEMORY_BOUND, MEMORY_BOUND]
    assert (steps["gpu_dram_active_ci_low"] < 0.82).all() and (steps["gpu_dram_active_ci_high"] > 0.82).all()
    assert "GPU (dcgm-exporter" in outcome.console and MEMORY_BOUND in outcome.console
    line = next(t for t in outcome.diagnosis_lines if "memory-bandwidth-bound" in t)
    assert " users decode is memory-bandwidth-bound: DRAM active 0.8" in line
    summary = json.loads((run_dir / "summary.json").read_text())
    assert MEMORY_BOUND in summary["diagnosis"]["gpu_regime"].values()
    assert [s["gpu_regime"] for s in summary["steps"]] == [MEMORY_BOUND, MEMORY_BOUND]
    report = (run_dir / "report.html").read_text(encoding="utf-8")
    assert "<h2>GPUs</h2>" in report and "node-1/0" in report
