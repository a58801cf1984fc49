"""How a capacity search's result is shown: the report's Capacity section (the result's line, every probe in the
order it ran, the probe path on the batching curve), load-ordered lines in every chart over steps, summary.md led by
the capacity instead of the SLO gate, and the probe column on the console and in the web UI's rows.

On a synthetic run directory with known answers, finished by analysis.finish (tests/helpers/capacity_run.py): probes
at 1, 2, 4, 8, 6, 5 users, in that order; the capacity is 5 users and 6 users fail."""

from __future__ import annotations

import html
import math
import re

import pandas as pd
import pytest
from vllm_loadtest.analysis import capacity
from vllm_loadtest.analysis.finish import finish_run
from vllm_loadtest.analysis.live import live_table
from vllm_loadtest.analysis.report import batching_curve, capacity_figure, capacity_html, latency_figure
from vllm_loadtest.analysis.slo import parse_slo
from vllm_loadtest.analysis.steps import format_table

from tests.helpers.capacity_run import LOADS, STEP_S, T0, write_capacity_run

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    return finish_run(write_capacity_run(tmp_path_factory.mktemp("capacity")))


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return finish_run(write_capacity_run(tmp_path_factory.mktemp("plain"), searched=False))


def test_the_synthetic_search_finds_5_users_and_6_fail(searched):
    result = searched.capacity
    assert result["max_users"] == 5 and result["first_failing"]["users"] == 6 and not result["uncertain"]
    assert [p["users"] for p in result["probes"]] == LOADS
    assert [p["verdict"] for p in result["probes"]] == ["pass", "pass", "pass", "fail", "fail", "pass"]


def section(page: str, title: str) -> str:
    start = page.index(f"<h2>{title}</h2>")
    end = page.find("<h2>", start + 1)
    return page[start : end if end > 0 else len(page)]


def test_the_report_leads_with_the_capacity_and_lists_the_probes_in_run_order(searched):
    page = (searched.run_dir / "report.html").read_text(encoding="utf-8")
    assert page.index("<h2>Capacity</h2>") < page.index("<h2>Diagnosis</h2>")
    part = section(page, "Capacity")
    line = searched.capacity["line"]
    assert line.startswith("Capacity: 5 users") and html.escape(line) in part
    rows = re.findall(r"<tr class='probe-(\w+)'>(.*?)</tr>", part)
    assert [verdict for verdict, _ in rows] == ["pass", "pass", "pass", "fail", "fail", "pass"]
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", r) for _, r in rows]
    assert [c[0] for c in cells] == ["1", "2", "3", "4", "5", "6"]
    assert [c[2] for c in cells] == ["1 user", "2 users", "4 users", "8 users", "6 users", "5 users"]
    # Each objective's value with its interval and verdict, the probe's aggregate tok/s with its interval.
    assert re.fullmatch(r"3\d\d\.\d ms \(CI 3\d\d\.\d ms to 3\d\d\.\d ms\): fail", cells[3][4]), cells[3][4]
    assert re.fullmatch(r"2\d\.\d ms \(CI 2\d\.\d ms to 2\d\.\d ms\): pass", cells[5][4]), cells[5][4]
    assert re.fullmatch(r"\d+\.\d \(CI \d+\.\d to \d+\.\d\)", cells[0][5]), cells[0][5]
    assert "ttft_p95 (limit 100.0 ms)" in part
    assert part.count("Plotly.newPlot(") == 1  # the probe path
    # The gate's FAILED is not the run's verdict: the probes beyond the capacity break the objectives on purpose.
    assert "<h2>SLO gate</h2>" not in page and "SLO gate FAILED" not in page
    assert "not this run&#x27;s verdict" in section(page, "SLO objectives per step")


def test_the_probe_path_joins_the_probes_in_run_order_and_marks_the_capacity(searched):
    fig = capacity_figure(searched.capacity)
    curve, path, *markers = fig.data
    assert list(curve.x) == sorted(LOADS) and list(path.x) == LOADS  # the curve in load order, the path as run
    by_name = {t.name: t for t in markers}
    assert list(by_name["pass"].x) == [1, 2, 4, 5] and list(by_name["pass"].text) == ["1", "2", "3", "6"]
    assert list(by_name["fail"].x) == [8, 6] and list(by_name["fail"].text) == ["4", "5"]
    assert "uncertain" not in by_name  # no trace for a verdict no probe had
    assert sorted(s.x0 for s in fig.layout.shapes) == [5, 6]
    # On a log axis an annotation sits in log10 units: at log10(load), else the axis would stretch to the load.
    notes = {a.text: a.x for a in fig.layout.annotations}
    assert notes["capacity: 5 users"] == pytest.approx(math.log10(5))
    assert notes["first failing: 6 users"] == pytest.approx(math.log10(6))


def test_every_chart_over_steps_draws_its_lines_in_load_order(searched):
    tables = {"run": searched.table}
    assert list(searched.table["users"]) == LOADS  # steps.csv stays in run order
    for fig in (batching_curve(tables), latency_figure(tables)):
        for trace in fig.data:
            assert list(trace.x) == sorted(LOADS), trace.name
    agg = batching_curve(tables).data[0]
    by_users = searched.table.set_index("users")["aggregate_tok_s"]
    assert list(agg.y) == [by_users[u] for u in sorted(LOADS)]  # each value moved with its load
    rate = pd.DataFrame({"step": [0, 1, 2], "users": [64, 64, 64], "rate_rps": [4.0, 1.0, 2.0],
                         "aggregate_tok_s": [40.0, 10.0, 20.0], "per_request_tok_s_mean": [5.0, 5.0, 5.0]})  # fmt: skip
    assert list(batching_curve({"rate": rate}).data[0].x) == [1.0, 2.0, 4.0]


def test_summary_md_leads_with_the_capacity_and_shows_each_probe(searched):
    page = (searched.run_dir / "summary.md").read_text(encoding="utf-8")
    bullets = [line for line in page.splitlines() if line.startswith("- ")]
    assert bullets[0] == f"- {searched.capacity['line']}"
    assert "SLO gate FAILED" not in page and "not met" not in page
    table = [line for line in page.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| probe | users | requests |") and table[0].endswith("| SLOs | verdict |")
    assert [row.split(" | ")[0:2] for row in table[1:]] == [[f"| {n + 1}", str(u)] for n, u in enumerate(LOADS)]
    assert table[4].endswith("| **broken** | **fail** |") and table[6].endswith("| met | pass |")


def test_a_run_of_fixed_steps_shows_no_capacity_and_keeps_its_gate(plain):
    assert plain.capacity is None and plain.table["probe"].isna().all()
    page = (plain.run_dir / "report.html").read_text(encoding="utf-8")
    assert "<h2>Capacity</h2>" not in page and "SLO gate FAILED" in section(page, "SLO gate")
    md = (plain.run_dir / "summary.md").read_text(encoding="utf-8")
    assert "- SLO gate FAILED" in md and "| users | requests |" in md and "probe" not in md and "verdict" not in md
    assert "probe" not in format_table(plain.table).splitlines()[1]


def test_the_console_table_shows_the_probe_order_of_a_search(searched):
    lines = format_table(searched.table).splitlines()
    assert lines[1].split()[-1] == "probe"
    assert [int(line.split()[-1]) for line in lines[2 : 2 + len(LOADS)]] == [1, 2, 3, 4, 5, 6]
    assert "Probe 6: 5 users: pass" in searched.console


def test_the_live_table_carries_each_steps_probe(searched):
    timeline = searched.run["timeline"]
    table, _ = live_table(searched.records, timeline, T0 + len(LOADS) * STEP_S)
    assert list(table["probe"]) == [1, 2, 3, 4, 5, 6]
    plain_timeline = [{k: v for k, v in t.items() if k != "probe"} for t in timeline]
    table, _ = live_table(searched.records, plain_timeline, T0 + len(LOADS) * STEP_S)
    assert "probe" not in table.columns


def result_of(mode: str, loads: list[float], verdicts: list[str]) -> dict:
    """A capacity result built by analysis.capacity from probes with the given verdicts (ttft_p95=100ms)."""
    objective = parse_slo("ttft_p95=100ms")[0]
    probes = []
    for n, (load, verdict) in enumerate(zip(loads, verdicts), start=1):
        value = {"pass": 0.05, "fail": 0.2, "uncertain": 0.1}[verdict]
        check = capacity.Check(objective.name, objective.threshold, value, value * 0.9, value * 1.1, verdict)
        probes.append(capacity.Probe(n, n - 1, load, verdict, [check], 10.0 * n, 9.0 * n, 11.0 * n, 50))
    table = pd.DataFrame({"step": [p.step for p in probes]})
    return capacity.result(mode, probes, "ttft_p95=100ms", table, {}, capacity.LIMIT_SLO)


def test_a_rate_search_and_an_uncertain_result_are_shown_as_such():
    rate = result_of(capacity.RATE, [1.0, 2.0, 4.0, 3.0], ["pass", "pass", "fail", "uncertain"])
    part = capacity_html(rate)
    assert rate["uncertain"] and "uncertain between 2 req/s and 3 req/s" in rate["line"]
    assert "color:#d80" in part[: part.index("</p>")]  # the line in the uncertain colour, not the found one
    assert re.findall(r"<tr class='probe-(\w+)'>", part) == ["pass", "pass", "fail", "uncertain"]
    assert "<td>3 req/s</td>" in part and "requests/s (intended)" in capacity_figure(rate).layout.xaxis.title.text
    none = result_of(capacity.USERS, [1.0], ["fail"])
    assert none["max_users"] is None and "color:#b00" in capacity_html(none)
    assert [s.x0 for s in capacity_figure(none).layout.shapes] == [1]  # only the first failing load is marked


def test_the_capacity_section_escapes_its_text():
    result = result_of(capacity.USERS, [1.0, 2.0], ["pass", "fail"])
    result["line"] = "Capacity: <script>alert(1)</script>"
    result["objectives"] = {"<b>x</b>": 0.1}
    part = capacity_html(result)
    part = part[: part.index("<div")]  # the figure's own script follows
    assert "<script>" not in part and "&lt;script&gt;" in part and "<b>" not in part
