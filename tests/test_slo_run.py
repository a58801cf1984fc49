"""--slo as a pipeline's gate: real runs whose exit code, console and summary.md say whether the objectives held."""

import json

import pandas as pd
import pytest
from vllm_loadtest.analysis.run import efficiency_ceiling

from tests.helpers.runs import locust

pytestmark = pytest.mark.contract


def _gated_run(fake_server, tmp_path, slo: str, *args: str):
    server = fake_server("--ttft-ms", "30", "--itl-ms", "2")
    run_dir = tmp_path / "run"
    proc = locust(
        "--host", server.url, "--steps", "2", "--step-duration", "3s", "--step-warmup", "1s", "--max-tokens", "8",
        "--run-dir", str(run_dir), "--slo", slo, "--no-report", *args,
    )  # fmt: skip
    return proc, run_dir


def test_gate_passes_when_the_objectives_hold(fake_server, tmp_path):
    args = ("--memory-bandwidth-gbs", "1000", "--model-bytes", "1GB")  # a 1000 tokens/s ceiling
    proc, run_dir = _gated_run(fake_server, tmp_path, "ttft_p95=2s,error_rate=0%", *args)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "SLO gate PASSED" in proc.stdout
    page = (run_dir / "summary.md").read_text()
    assert "SLO gate PASSED" in page and "| 2 |" in page
    assert json.loads((run_dir / "run.json").read_text())["options"]["slo"] == "ttft_p95=2s,error_rate=0%"
    # The ceiling: measured = 1 / TPOT p50 of the (only) step, against 1000 GB/s / 1 GB.
    tpot = pd.read_csv(run_dir / "steps.csv")["tpot_p50_s"].iloc[0]
    ceiling = efficiency_ceiling(run_dir, pd.read_csv(run_dir / "steps.csv"))
    assert ceiling["decode_ceiling_tok_s"] == pytest.approx(1000.0)
    assert ceiling["decode_efficiency"] == pytest.approx(1 / tpot / 1000.0)
    assert "Efficiency ceiling:" in proc.stdout and f"{1 / tpot:.1f} tokens/s" in proc.stdout


def test_gate_fails_the_run_exactly_when_an_objective_breaks(fake_server, tmp_path):
    # The fake server sends its first token after 30 ms: a 5 ms TTFT objective cannot hold.
    proc, run_dir = _gated_run(fake_server, tmp_path, "ttft_p50=5ms")
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "SLO gate FAILED" in proc.stdout and "Step 0 (2 users): ttft_p50 <= 5.0 ms" in proc.stdout
    assert "**broken**" in (run_dir / "summary.md").read_text()
