"""`python -m analysis report A --compare B` on two real runs against the fake server with different token gaps:
the comparison is printed and shown in the report, each difference judged against both runs' own intervals (or
said not to be judgeable when a run's steps.csv has none)."""

from __future__ import annotations

import re
import subprocess
import sys

import pandas as pd
import pytest
from vllm_loadtest.analysis.compare import compare_runs
from vllm_loadtest.analysis.records import REQUESTS_FILE
from vllm_loadtest.analysis.report import REPORT_FILE
from vllm_loadtest.analysis.run import STEPS_FILE
from vllm_loadtest.analysis.uncertainty import quantile_interval

from tests.helpers.paths import ROOT
from tests.helpers.runs import locust

pytestmark = pytest.mark.contract


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """A: 2 ms token gaps; B: 8 ms. Steps long enough for a p95's interval (100+ requests a step even on a loaded
    machine, where the client adds some 50 ms to every request)."""
    from tests.conftest import FakeServer

    root = tmp_path_factory.mktemp("compare")
    runs = {}
    for name, itl in (("fast", "2"), ("slow", "8")):
        server = FakeServer(["--ttft-ms", "5", "--itl-ms", itl])
        try:
            runs[name] = root / name
            proc = locust("--host", server.url, "--steps", "4,8", "--step-duration", "5s", "--step-warmup", "0s",
                          "--max-tokens", "8", "--run-dir", str(runs[name]))  # fmt: skip
        finally:
            server.stop()
        assert proc.returncode == 0, proc.stderr[-3000:]
    return runs


# A quarter of the token gap is -75 %; the client's own time per token (parse, stamp, gevent scheduling) adds to both
# runs' gaps and pulls the ratio toward 0. The gaps are 4x apart, not 2x, because on CI's loaded 2-core machine the
# client's share is large: with 2 ms against 4 ms, TPOT p95 read -38 % +- 3 % and aggregate tok/s only +27 % (every
# request carried some 50 ms of client time against 14 ms of token gaps). The point is a difference far beyond both
# runs' noise, in the right direction and of about the right size.
TPOT_GAP_MIN = 0.25
TPOT_GAP_MAX = 0.9  # a slow run disturbed more than the fast one can read below the ideal -75 %
# The same 8 tokens in requests some 42 ms shorter at the server: with 50 ms of client time a request, about +60 %.
TOK_GAIN_MIN = 0.3


def report(run_dir, *others) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "analysis", "report", str(run_dir), "--compare", *map(str, others)]
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=180)


def test_the_report_command_prints_the_comparison_and_the_report_shows_it(two_runs):
    proc = report(two_runs["fast"], two_runs["slow"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    section = proc.stdout.split("\nComparison:\n", 1)[1].split("\n\n", 1)[0]
    lines = [line.removeprefix("- ") for line in section.splitlines()]
    assert lines[0].startswith("fast against slow, steps matched by users")
    assert any(line.startswith("At 8 users: aggregate tok/s") for line in lines)
    assert any(line.startswith("At 4 users: aggregate tok/s") for line in lines)
    assert "within-run noise only" in lines[-1]
    fast = pd.read_csv(two_runs["fast"] / STEPS_FILE)
    step4 = next(line for line in lines if line.startswith("At 4 users"))
    if "tpot_p95_s_ci_low" in fast.columns and "tpot_p95_s_ci_low" in pd.read_csv(two_runs["slow"] / STEPS_FILE):
        # Both runs carry intervals: a quarter of the token gap is far beyond their noise.
        tpot = re.search(r"TPOT p95: (-[\d.]+) % ± ([\d.]+) %", step4)  # one decimal below 10 %
        low, high = -100 * TPOT_GAP_MAX, -100 * TPOT_GAP_MIN
        assert tpot and low <= float(tpot.group(1)) <= high and float(tpot.group(2)) < 25, step4
    else:
        # This branch's steps.csv has no intervals yet: the difference is given, and said not to be judgeable.
        assert re.search(r"TPOT p95 -\d+ %: cannot be judged \(no intervals in fast and slow\)", step4), step4
        assert any("has no confidence intervals" in line for line in lines)
    page = (two_runs["fast"] / REPORT_FILE).read_text(encoding="utf-8")
    assert "<h2>Comparison: fast against slow</h2>" in page and "within-run noise only" in page


def with_intervals(run_dir) -> pd.DataFrame:
    """steps.csv with interval columns built here from the run's own records: order-statistic intervals for the
    p95s; for aggregate tok/s, +-5 % (the batch-means interval's job, another module's)."""
    table = pd.read_csv(run_dir / STEPS_FILE)
    records = pd.read_parquet(run_dir / REQUESTS_FILE)
    ok = records[(records["status"] == "ok") & ~records["warmup"].astype(bool)]
    for column, source in (("ttft_p95_s", "ttft_s"), ("tpot_p95_s", "tpot_s")):
        bounds = [quantile_interval(ok.loc[ok["step"] == s, source].dropna(), 0.95) for s in table["step"]]
        table[column + "_ci_low"] = [b.low for b in bounds]
        table[column + "_ci_high"] = [b.high for b in bounds]
    table["aggregate_tok_s_ci_low"] = table["aggregate_tok_s"] * 0.95
    table["aggregate_tok_s_ci_high"] = table["aggregate_tok_s"] * 1.05
    return table


def test_with_intervals_in_both_real_runs_the_token_gap_is_significant(two_runs):
    fast, slow = with_intervals(two_runs["fast"]), with_intervals(two_runs["slow"])
    assert fast["tpot_p95_s_ci_low"].notna().all(), fast[["requests", "tpot_p95_s_ci_low"]]
    c = compare_runs(fast, slow, "fast", "slow")
    assert [s.load_text for s in c.steps] == ["4 users", "8 users"] and c.missing_intervals == []
    for step in c.steps:
        tok, _, tpot = step.differences
        assert tpot.significant and -TPOT_GAP_MAX <= tpot.relative <= -TPOT_GAP_MIN, tpot
        assert tok.significant and tok.relative > TOK_GAIN_MIN, tok  # the same tokens in shorter requests
    assert all(line.count("cannot be judged") == 0 for line in c.lines())
    # The same tables through the command: B's injected intervals are read from its steps.csv.
    slow.to_csv(two_runs["slow"] / STEPS_FILE, index=False)
    proc = report(two_runs["fast"], two_runs["slow"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "At 4 users: aggregate tok/s" in proc.stdout
    if "tpot_p95_s_ci_low" in pd.read_csv(two_runs["fast"] / STEPS_FILE).columns:
        assert "no intervals in" not in proc.stdout  # both runs carry intervals now
    else:
        assert "no intervals in fast)" in proc.stdout  # slow's, injected, are read; fast's own are not computed yet
