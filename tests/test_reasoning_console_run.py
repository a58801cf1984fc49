"""A reasoning run as a user meets it: real Locust against the fake server thinking before each answer (vLLM 0.32's
exact chat chunks): the console's Reasoning table shows TTFT and TTFO side by side with the reasoning share, steps.csv
holds the reasoning columns at its end, the report explains the difference and draws TTFO; a thought that never
closes reads "no answer", and the SLO gate on ttfo_p95 fails it. The TTFO accuracy against the server's send times is
tests/test_reasoning_run.py's."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from vllm_loadtest.analysis import glossary as g
from vllm_loadtest.analysis.batch import BATCH_COLUMNS
from vllm_loadtest.analysis.energy import ENERGY_COLUMNS
from vllm_loadtest.analysis.gpu import GPU_COLUMNS
from vllm_loadtest.analysis.lora import LORA_COLUMNS
from vllm_loadtest.analysis.reasoning import REASONING_COLUMNS
from vllm_loadtest.analysis.report import TTFT_TTFO
from vllm_loadtest.analysis.spec_decode import SPEC_COLUMNS
from vllm_loadtest.analysis.steps import format_table

from tests.helpers.runs import locust

pytestmark = pytest.mark.contract

TOKENS = 24


def run(server, run_dir, *args: str):
    proc = locust(
        "--host", server.url, "--endpoint", "chat", "--max-tokens", str(TOKENS), "--steps", "1,2",
        "--step-duration", "3s", "--step-warmup", "0s", "--run-dir", str(run_dir), *args, timeout=120,
    )  # fmt: skip
    return proc, pd.read_csv(run_dir / "steps.csv")


def reasoning_table(stdout: str) -> list[str]:
    title = g.SECTIONS[g.REASONING].title
    assert title in stdout, stdout[-3000:]
    return stdout.split(title + "\n", 1)[1].splitlines()


def test_a_reasoning_run_shows_ttft_and_ttfo_side_by_side_with_the_reasoning_share(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "20", "--itl-ms", "5", "--reasoning", "8")
    proc, steps = run(server, tmp_path / "run")
    assert proc.returncode == 0, proc.stderr[-3000:]
    tail = REASONING_COLUMNS + BATCH_COLUMNS + GPU_COLUMNS + ENERGY_COLUMNS + LORA_COLUMNS + SPEC_COLUMNS
    assert list(steps.columns[-len(tail) :]) == tail
    assert (steps["reasoning_share"] == 8 / TOKENS).all() and (steps["reasoning_tokens_mean"] == 8).all()
    assert (steps["no_answer_requests"] == 0).all()
    # The thought is 8 tokens: the first answer token comes 8 gaps (40 ms) after the first token, whatever the load.
    gap = steps["ttfo_p50_s"] - steps["ttft_p50_s"]
    assert ((gap > 0.035) & (gap < 0.08)).all(), gap.tolist()
    assert (steps["answer_tpot_p50_s"] > 0.004).all()
    lines = reasoning_table(proc.stdout)
    head = lines[0].split()
    assert head[:16] == ["step", "users", "Requests", "ok", "TTFT", "p50", "TTFO", "p50", "TTFT", "p95", "TTFO",
                         "p95", "TTFT", "p99", "TTFO", "p99"]  # fmt: skip
    assert "reasoning" in head and "share" in head
    first = lines[1].split()
    assert first[0] == "0" and first[3].rstrip("~") == f"{steps['ttft_p50_s'][0] * 1000:.1f}"
    assert first[4].rstrip("~") == f"{steps['ttfo_p50_s'][0] * 1000:.1f}" and "33%" in first
    assert format_table(steps) in proc.stdout  # the console is the table's, rebuilt from steps.csv alike
    page = (tmp_path / "run" / "report.html").read_text(encoding="utf-8")
    assert "<h2>Reasoning</h2>" in page and TTFT_TTFO in page and "TTFO p50 (first answer token)" in page


def test_a_thought_that_never_closes_reads_no_answer_and_fails_a_ttfo_objective(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "10", "--itl-ms", "2", "--reasoning", "1000")
    proc, steps = run(server, tmp_path / "run", "--slo", "ttfo_p95=5s")
    assert proc.returncode == 1, proc.stderr[-3000:]  # the gate failed: no user got an answer
    assert (steps["ttfo_p50_s"] == math.inf).all() and (steps["reasoning_share"] == 1.0).all()
    assert (steps["no_answer_requests"] == steps["requests"]).all()
    lines = reasoning_table(proc.stdout)
    assert "no answer" in lines[1] and any(line.startswith("No answer token in") for line in lines)
    assert "ttfo_p95 <= 5000.0 ms (no answer) not met" in proc.stdout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"][0]["ttfo_p50_s"] is None and summary["steps"][0]["no_answer_requests"] > 0
    assert summary["slo"]["steps"][0]["ttfo_p95_no_answer"] is True


def test_a_run_without_reasoning_prints_no_reasoning_table(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "10", "--itl-ms", "2")
    proc, steps = run(server, tmp_path / "run")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert g.SECTIONS[g.REASONING].title not in proc.stdout and "TTFO" not in proc.stdout
    assert (steps["ttfo_p50_s"] == steps["ttft_p50_s"]).all() and (steps["reasoning_share"] == 0).all()
    assert "<h2>Reasoning</h2>" not in (tmp_path / "run" / "report.html").read_text(encoding="utf-8")
