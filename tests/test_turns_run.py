"""Per-turn results end to end: a real `locust` conversation run (--turns 3, chat and completions) against the fake
server's simulated prefix cache (--prefix-cache): every record carries the server's cached tokens, turns.csv's hit
rate rises with the turn, the console, summary.json and the report show it, and `python -m analysis report`
rebuilds the same turns.csv; the report's per-turn chart renders with data in Chromium."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pandas as pd
import pytest
from vllm_loadtest.analysis import glossary as g

from tests.helpers.paths import ROOT
from tests.helpers.runs import locust

pytestmark = pytest.mark.contract

BLOCK = 8  # the fake server's cache block, in its tokens
TOKENS = 8  # max_tokens: each answer " tok1 ... tok8" is 8 of its tokens


@pytest.mark.parametrize("endpoint", ["chat", "completions"])  # completions: the history as concatenated text
def test_a_conversation_runs_prefix_cache_hit_rate_rises_with_the_turn(fake_server, tmp_path, endpoint):
    server = fake_server("--ttft-ms", "20", "--itl-ms", "5", "--prefix-cache", str(BLOCK))
    run_dir = tmp_path / "run"
    # 1000 distinct user messages: no conversation's first turn repeats an earlier one (that would be a cache hit).
    proc = locust(
        "--host", server.url, "--endpoint", endpoint, "--turns", "3", "--dataset", "synthetic:32", "--num-prompts",
        "1000", "--max-tokens", str(TOKENS), "--steps", "2", "--step-duration", "4s", "--step-warmup", "0s",
        "--stop-timeout", "5", "--run-dir", str(run_dir),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = pd.read_parquet(run_dir / "requests.parquet")
    ok = records[records["status"] == "ok"]
    assert len(ok) >= 12 and ok["cached_prompt_tokens"].notna().all()
    # Each turn after the first finds the whole conversation so far in the cache, in whole blocks: the previous
    # prompt and its answer (history_tokens), and nothing of the new user message.
    later = ok[ok["turn"] > 1]
    assert len(later) >= 4
    assert (later["cached_prompt_tokens"] == later["history_tokens"] // BLOCK * BLOCK).all()
    assert (ok.loc[ok["turn"] == 1, "cached_prompt_tokens"] == 0).all()

    turns = pd.read_csv(run_dir / "turns.csv")
    assert list(turns.columns) == g.names(g.TURNS)  # every column written is declared in the glossary
    assert turns["turn"].tolist() == [1, 2, 3], turns.to_dict("records")
    rates = turns["prefix_cache_hit_rate"].tolist()
    assert rates[0] == 0 and rates[0] < rates[1] < rates[2], rates
    assert turns["prompt_tokens_mean"].is_monotonic_increasing and (turns["prefix_cache_requests"] > 0).all()
    assert (turns["requests"] == turns["prefix_cache_requests"]).all()
    assert "Per turn" in proc.stdout and proc.stdout.index("Batching curve") < proc.stdout.index("Per turn")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [t["turn"] for t in summary["turns"]] == [1, 2, 3]
    assert summary["turns"][2]["prefix_cache_hit_rate"] == pytest.approx(rates[2])
    assert "<h2>Per turn</h2>" in (run_dir / "report.html").read_text(encoding="utf-8")

    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    for name in ("turns.csv", "summary.json", "report.html"):
        (copy / name).unlink()
    rebuilt = subprocess.run(
        [sys.executable, "-m", "analysis", "report", str(copy)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
    pd.testing.assert_frame_equal(pd.read_csv(copy / "turns.csv"), turns)
    assert "Per turn" in rebuilt.stdout and "<h2>Per turn</h2>" in (copy / "report.html").read_text(encoding="utf-8")


@pytest.mark.browser
def test_the_per_turn_chart_renders_with_data_in_chromium(fake_server, tmp_path):
    from tests.browser import chromium, open_page, require_chromium
    from tests.test_report_browser import ALL_RENDERED_JS, CHARTS_JS

    require_chromium()
    server = fake_server("--ttft-ms", "5", "--itl-ms", "1", "--prefix-cache", str(BLOCK))
    run_dir = tmp_path / "run"
    proc = locust(
        "--host", server.url, "--endpoint", "chat", "--turns", "3", "--dataset", "synthetic:32", "--num-prompts",
        "500", "--max-tokens", str(TOKENS), "--steps", "2", "--step-duration", "2s", "--step-warmup", "0s",
        "--run-dir", str(run_dir),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = run_dir / "report.html"
    figures = report.read_text(encoding="utf-8").count("Plotly.newPlot(")
    with chromium() as browser, open_page(browser, report.as_uri(), viewport=(1400, 900)) as (page, log):
        page.wait_for_function(ALL_RENDERED_JS, arg=figures, timeout=60_000)
        charts = page.evaluate(CHARTS_JS)
        assert not log.errors, log.errors
    (chart,) = [c for c in charts if any(t["name"] == "prefix-cache hit rate (%)" for t in c["traces"])]
    points = {t["name"]: t["points"] for t in chart["traces"]}
    assert points == {"TTFT p50 (ms)": 3, "TTFT p95 (ms)": 3, "prompt tokens (mean)": 3, "prefix-cache hit rate (%)": 3}
    assert chart["svg_traces"] == 4, chart
