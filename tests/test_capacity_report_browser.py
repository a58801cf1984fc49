"""The report of a capacity search renders in Chromium: its Capacity section's probe path and every other chart
draw, with no JavaScript error (a synthetic run directory finished by analysis.finish: no Locust)."""

from __future__ import annotations

import pytest
from vllm_loadtest.analysis.finish import finish_run

from tests.browser import chromium, open_page, require_chromium
from tests.helpers.capacity_run import LOADS, write_capacity_run

pytestmark = pytest.mark.browser

CHARTS_JS = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(gd => ({
    title: gd._fullLayout && gd._fullLayout.title ? gd._fullLayout.title.text : '',
    rendered: !!(gd._fullLayout && gd.querySelector('.main-svg')),
    points: gd.querySelectorAll('.scatterlayer .point').length,
    xrange: gd._fullLayout && gd._fullLayout.xaxis ? gd._fullLayout.xaxis.range : null,
}))"""


def test_the_capacity_report_renders_in_chromium(tmp_path):
    require_chromium()
    outcome = finish_run(write_capacity_run(tmp_path / "run"))
    report = outcome.files["report.html"]
    figures = report.read_text(encoding="utf-8").count("Plotly.newPlot(")
    with chromium() as browser, open_page(browser, report.as_uri(), viewport=(1400, 900)) as (page, log):
        page.wait_for_function(
            "n => { const p = document.querySelectorAll('.js-plotly-plot');"
            " return p.length === n && Array.from(p).every(gd => gd._fullLayout && gd.querySelector('.main-svg')); }",
            arg=figures,
            timeout=60_000,
        )
        charts = page.evaluate(CHARTS_JS)
        line = page.inner_text("#capacity-line")
        assert not log.errors, log.errors
    assert line == outcome.capacity["line"]
    first = charts[0]
    assert first["title"].startswith("Capacity search") and first["rendered"]
    assert first["points"] >= len(LOADS)  # every probe drawn as a marker
    # The log axis spans the probed loads, not the marks' annotations (log10(1) .. log10(8), with a margin).
    low, high = first["xrange"]
    assert -0.5 < low < 0 and 0.9 < high < 1.5, first["xrange"]
    assert all(c["rendered"] for c in charts), charts
