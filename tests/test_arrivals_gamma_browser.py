"""The report's inter-arrival chart of a real rate run, in headless Chromium: rendered, every curve with data."""

import pytest
from vllm_loadtest.analysis.report import REPORT_FILE

from tests.browser import chromium as launch
from tests.browser import open_page, require_chromium
from tests.helpers.runs import locust
from tests.test_report_browser import ALL_RENDERED_JS, CHARTS_JS

pytestmark = [pytest.mark.contract, pytest.mark.browser]

TITLE_JS = """() => Array.from(document.querySelectorAll('.js-plotly-plot'))
    .map(gd => (gd._fullLayout && gd._fullLayout.title && gd._fullLayout.title.text) || '')"""


def test_the_inter_arrival_chart_renders_with_every_curve(fake_server, tmp_path):
    require_chromium()
    server = fake_server("--ttft-ms", "5", "--itl-ms", "1")
    run_dir = tmp_path / "r"
    proc = locust(
        "--host", server.url, "--rates", "20", "--arrival", "gamma", "--burstiness", "0.5", "--step-duration", "3s",
        "--step-warmup", "0s", "--max-tokens", "4", "--run-dir", str(run_dir),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = run_dir / REPORT_FILE
    figures = report.read_text(encoding="utf-8").count("Plotly.newPlot(")
    with launch() as browser, open_page(browser, report.as_uri()) as (page, log):
        page.wait_for_function(ALL_RENDERED_JS, arg=figures, timeout=60_000)
        charts, titles = page.evaluate(CHARTS_JS), page.evaluate(TITLE_JS)
        assert not log.errors, log.errors
    mine = [c for c, t in zip(charts, titles, strict=True) if t.startswith("Gaps between consecutive requests")]
    assert len(mine) == 1, titles
    traces = {t["name"]: t["points"] for t in mine[0]["traces"]}
    assert set(traces) == {"sent (actual send times)", "intended", "expected: gamma, shape 0.5"}, traces
    assert all(points > 10 for points in traces.values()), traces
    assert mine[0]["svg_traces"] == 3
