"""The glossary as the registry of every column: what a real run writes is declared there, the lists and tables
derived from it match what is written, docs/reference/metrics.md is its output, and nothing imports in a cycle."""

from __future__ import annotations

import ast
import math
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from vllm_loadtest.analysis import glossary as g
from vllm_loadtest.analysis.generator import GENERATOR_COLUMNS
from vllm_loadtest.analysis.live import FIELDS
from vllm_loadtest.analysis.records import SCHEMA, single_model
from vllm_loadtest.analysis.report import REPORT_FILE, table_html
from vllm_loadtest.analysis.schedule import OPEN_LOOP_COLUMNS, open_loop_columns
from vllm_loadtest.analysis.server_metrics import SERVER_BOUND_COLUMNS, SERVER_COLUMNS
from vllm_loadtest.analysis.steps import STEP_COLUMNS, UNCERTAINTY_COLUMNS, format_table

from tests.conftest import ROOT, FakeServer
from tests.test_headless import short_run

STEP_SECTIONS = (g.STEP, g.SERVER, g.GENERATOR, g.OPEN_LOOP, g.UNCERTAINTY, g.SERVER_BOUNDS, g.STEP_END, g.REASONING,
                 g.EMBEDDINGS, g.RERANK, g.GPU, g.ENERGY, g.LORA, g.SPEC, g.TRIALS)  # fmt: skip


def undeclared(written: list[str], sections: tuple[str, ...]) -> list[str]:
    """The written columns the glossary does not declare in one of these sections."""
    declared = {c.name for s in sections for c in g.columns(s)}
    return [name for name in written if name not in declared]


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """One short real run (Locust subprocess, fake server with /metrics): its run directory and console output."""
    server = FakeServer(["--ttft-ms", "5", "--itl-ms", "1"])
    try:
        run_dir = tmp_path_factory.mktemp("registry") / "run"
        proc = short_run(server.url, run_dir)
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir, proc.stdout


@pytest.mark.contract
def test_every_column_a_real_run_writes_is_declared_in_the_glossary(real_run):
    run_dir, _ = real_run
    steps = pd.read_csv(run_dir / "steps.csv")
    records = pq.read_schema(run_dir / "requests.parquet").names
    missing = undeclared(list(steps.columns), STEP_SECTIONS)
    assert not missing, f"steps.csv columns not declared in analysis/glossary/: {missing}"
    missing = undeclared(records, (g.REQUESTS,))
    assert not missing, f"requests.parquet columns not declared in analysis/glossary/: {missing}"
    assert undeclared(["ttft_p50_s", "brand_new_metric_s"], STEP_SECTIONS) == ["brand_new_metric_s"]


@pytest.mark.contract
def test_the_derived_lists_are_the_columns_written_in_order(real_run):
    run_dir, _ = real_run
    steps = pd.read_csv(run_dir / "steps.csv")
    assert list(steps.columns) == (
        STEP_COLUMNS
        + SERVER_COLUMNS
        + GENERATOR_COLUMNS
        + OPEN_LOOP_COLUMNS
        + UNCERTAINTY_COLUMNS
        + SERVER_BOUND_COLUMNS
        + g.names(g.STEP_END)
        + g.names(g.REASONING)
        + g.names(g.EMBEDDINGS)
        + g.names(g.RERANK)
        + g.names(g.GPU)
        + g.names(g.ENERGY)
        + g.names(g.LORA)
        + g.names(g.SPEC)
    )
    for section, derived in ((g.STEP, STEP_COLUMNS), (g.SERVER, SERVER_COLUMNS), (g.GENERATOR, GENERATOR_COLUMNS),
                             (g.OPEN_LOOP, OPEN_LOOP_COLUMNS), (g.UNCERTAINTY, UNCERTAINTY_COLUMNS),
                             (g.SERVER_BOUNDS, SERVER_BOUND_COLUMNS)):  # fmt: skip
        assert derived == g.names(section)
    assert pq.read_schema(run_dir / "requests.parquet").names == g.names(g.REQUESTS) == SCHEMA.names
    # The columns computed in the modules are the declared ones, no more, no fewer.
    ok = pd.DataFrame({"ttft_s": [0.1], "e2e_s": [0.2], "schedule_lag_s": [0.01]})
    assert list(open_loop_columns(ok, ok, 1, 1.0, 2.0)) == OPEN_LOOP_COLUMNS
    data = g.StepData(pd.DataFrame({"ttft_s": [0.1], "e2e_s": [0.2], "tpot_s": [0.01], "output_tokens": [11]}),
                      0, 0, 11, 1.0, np.array([0.01]))  # fmt: skip
    assert ["step", "users", *g.step_values(data)] == STEP_COLUMNS
    assert set(FIELDS) <= set(SCHEMA.names) and {"ttft_s", "e2e_s", "tpot_s", "output_tokens"} <= set(FIELDS)


@pytest.mark.contract
def test_the_console_shows_the_glossary_headers(real_run):
    run_dir, stdout = real_run
    table = pd.read_csv(run_dir / "steps.csv")
    assert format_table(table) in stdout
    for section in (g.STEP, g.SERVER, g.GENERATOR):
        title = g.SECTIONS[section].title
        header = stdout.split(title + "\n", 1)[1].splitlines()[0].split()
        expected = " ".join(h for _, h in g.SECTIONS[section].shown()).split()
        if section == g.STEP and table["generator_bound"].map(g.flagged).any():
            expected.append("generator")  # the BOUND marker column, shown only when a step was flagged (a busy machine)
        if section == g.STEP:
            expected.append("stable")  # every step's steadiness, in every run
        if section == g.STEP and table["outlier"].map(g.flagged).any():
            expected.append("outlier")
        assert header == expected, (section, header)


@pytest.mark.contract
@pytest.mark.browser
def test_the_reports_step_table_has_the_glossary_titles_in_ms_and_scrolls_sideways(real_run):
    from tests.browser import chromium, open_page

    run_dir, _ = real_run
    page_html = (run_dir / REPORT_FILE).read_text(encoding="utf-8")
    table = pd.read_csv(run_dir / "steps.csv")
    assert "<th title='" in page_html and ">TTFT p50 (ms)</th>" in page_html and ">ttft_p50_s</th>" not in page_html
    ttft_ms = f"<td>{table['ttft_p50_s'].iloc[0] * 1000:.1f}</td>"
    assert ttft_ms in table_html(table)
    probe = """() => { const box = document.querySelector('table.steps').parentElement;
        box.scrollLeft = 400;
        return {scroll: box.scrollLeft, box: box.clientWidth, table: box.scrollWidth,
                page: document.documentElement.scrollWidth, viewport: window.innerWidth,
                first: getComputedStyle(document.querySelector('table.steps td')).position}; }"""
    with chromium() as browser, open_page(browser, (run_dir / REPORT_FILE).as_uri(), viewport=(1000, 800)) as (p, _):
        box = p.evaluate(probe)
    assert box["table"] > box["box"], box  # wider than its box: ~60 columns
    assert box["scroll"] == 400, box  # the box scrolls sideways
    assert box["page"] <= box["viewport"], box  # the page itself does not run past the window's edge
    assert box["first"] == "sticky", box  # the step column stays in view


@pytest.mark.unit
def test_the_reports_table_highlights_flagged_steps_and_keeps_unknown_columns():
    table = pd.DataFrame(
        {"step": [0, 1], "users": [1, 2], "ttft_p50_s": [0.0123, math.nan], "generator_bound": [True, False],
         "schedule_behind": [None, True], "from_a_future_version": [0.5, 1.0]}
    )  # fmt: skip
    out = table_html(table)
    rows = re.findall(r"<tr[^>]*>.*?</tr>", out)
    assert "class='flagged' title='generator-bound'" in rows[1] and "title='behind schedule'" in rows[2]
    assert "<td>12.3</td>" in rows[1] and "<td>-</td>" in rows[2]  # ms; missing is -, never 0
    assert "<td>BOUND</td>" in rows[1] and ">from_a_future_version</th>" in out and "<td>0.5</td>" in rows[1]


@pytest.mark.unit
def test_formats():
    assert g.format_value(0.01234, "ms1") == "12.3" and g.format_value(0.01234, "ms2") == "12.34"
    assert g.format_value(0.125, "pct0") == "12%" and g.format_value(3.0, "int") == "3"
    assert g.format_value("all", "int") == "all" and g.format_value(2.0, "g") == "2"
    assert g.format_value(True, "flag", "BOUND") == "BOUND" and g.format_value(False, "flag", "BOUND") == "ok"
    for missing in (None, math.nan, np.nan, pd.NA):
        assert g.format_value(missing, "ms1") == "-" and g.format_value(missing, "flag", "BOUND") == "-"
    with pytest.raises(ValueError, match="unknown format"):
        g.Column("x", g.STEP, "s", "x", fmt="seconds")


@pytest.mark.unit
def test_every_declaration_is_complete():
    sections = {*STEP_SECTIONS, g.REQUESTS, g.LIVE, g.TURNS, g.MODELS}
    for c in g.COLUMNS.values():
        assert c.section in sections and c.unit and c.meaning and "\n" not in c.meaning, c.name
        assert c.bounds is None or all(g.STEP_TABLE[n].section == g.SERVER_BOUNDS for n in c.bounds), c.name
        if c.section != g.REQUESTS:
            assert c.label, f"{c.name} needs a label (the report's and the web UI's title)"
        assert c.metric is None or c.metric in g.GLOSSARY, c.name
        assert (c.fmt in ("flag", "pass")) == (c.flag is not None), c.name
    for section in g.SECTIONS.values():
        assert all(header for _, header in section.shown()), section.key
    keys = [c.key for c in g.web_columns()]
    assert len(keys) == len(set(keys))


@pytest.mark.unit
def test_the_web_ui_columns_keep_their_keys_and_titles():
    from vllm_loadtest.locustfiles.webui import COLUMNS, _row

    assert COLUMNS == [
        ("scope", "Scope"), ("step", "Step"), ("probe", "Probe"), ("users", "Users"), ("rate_rps", "Rate (req/s)"),
        ("requests", "Requests ok"), ("errors", "Errors"), ("aggregate_tok_s", "Aggregate tok/s"),
        ("per_request_tok_s", "Per-request tok/s"), ("ttft_p50_ms", "TTFT p50 (ms)"), ("ttft_p95_ms", "TTFT p95 (ms)"),
        ("ttft_p99_ms", "TTFT p99 (ms)"), ("ttfo_p50_ms", "TTFO p50 (ms)"), ("ttfo_p95_ms", "TTFO p95 (ms)"),
        ("reasoning_share", "Reasoning share"), ("tpot_p50_ms", "TPOT p50 (ms)"), ("tpot_p95_ms", "TPOT p95 (ms)"),
        ("schedule_lag_p99_ms", "Schedule lag p99 (ms)"), ("kv_cache_usage", "KV cache (latest)"),
        ("running", "Running (latest)"), ("waiting", "Waiting (latest)"), ("stable", "Stable"), ("outlier", "Outlier"),
        ("inputs_per_s", "Inputs/s"), ("prompt_tok_s", "Prompt tok/s"), ("e2e_p95_ms", "E2E p95 (ms)"),
        ("documents_per_s", "Documents/s"),
    ]  # fmt: skip
    row = _row("whole run", {"step": "all", "users": 4, "requests": 10, "ttft_p50_s": 0.02049, "tpot_p50_s": 0.005,
                             "rate_rps": 2.0, "schedule_lag_p99_s": math.nan},
               {"kv_cache_usage": 0.25, "running": 2.0, "waiting": math.nan})  # fmt: skip
    assert row["scope"] == "whole run" and row["step"] == "all" and row["requests"] == "10"
    assert row["ttft_p50_ms"] == "20.5" and row["tpot_p50_ms"] == "5.00" and row["rate_rps"] == "2.00"
    assert row["schedule_lag_p99_ms"] == "-" and row["errors"] == "-" and row["kv_cache_usage"] == "25%"
    assert row["running"] == "2" and row["waiting"] == "-" and row["probe"] == "-"  # not a capacity search


@pytest.mark.unit
def test_docs_metrics_md_is_generated_from_the_glossary():
    path = ROOT / g.DOCS_FILE
    assert path.exists() and path.read_text(encoding="utf-8") == g.docs_markdown(), (
        f"{g.DOCS_FILE} differs from the glossary: regenerate it with `{g.DOCS_COMMAND}`"
    )
    for c in g.COLUMNS.values():
        assert f"| `{c.name}` |" in g.docs_markdown(), c.name


@pytest.mark.unit
def test_the_glossary_command_writes_and_prints_the_docs(tmp_path):
    out = tmp_path / "docs" / "metrics.md"
    run = [sys.executable, "-m", "analysis", "glossary"]
    proc = subprocess.run([*run, "--write", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert out.read_text(encoding="utf-8") == g.docs_markdown()
    printed = subprocess.run([*run, "--docs"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert printed.stdout == g.docs_markdown()
    readme_table = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert readme_table.stdout == g.markdown_table() + "\n"


def _imports(path) -> set[str]:
    """Every analysis.* module a file imports, at the top or inside a function (not under TYPE_CHECKING)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for n in ast.walk(node)
    }
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("analysis"):
            out.add(node.module)
            if node.module == "analysis":
                out |= {f"analysis.{a.name}" for a in node.names if (ROOT / "analysis" / f"{a.name}.py").exists()}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("analysis.")}
    return out - {"analysis"}


@pytest.mark.unit
def test_single_model():
    assert single_model(pd.DataFrame({"model": ["m", "m", None]})) == "m"
    assert single_model(pd.DataFrame({"model": ["a", "b"]})) is None
    assert single_model(pd.DataFrame({"model": pd.Series([], dtype=object)})) is None
    assert single_model(pd.DataFrame({"x": [1]})) is None
