"""report.html in a real headless Chromium: every chart renders with data, no JavaScript error, no network."""

import pytest
from vllm_loadtest.analysis.report import REPORT_FILE

from tests.browser import PNG_SIGNATURE, chromium, open_page, png_size, require_chromium, screenshot
from tests.helpers.runs import short_run

pytestmark = [pytest.mark.contract, pytest.mark.browser]

VIEWPORT = (1400, 900)

# Per chart: is it a rendered plotly graph, how many traces, how many points plotted, which SVG/WebGL layers.
CHARTS_JS = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(gd => ({
    id: gd.id,
    rendered: !!gd._fullLayout && gd.querySelector('.main-svg') !== null,
    width: gd._fullLayout ? gd._fullLayout.width : 0,
    traces: (gd._fullData || []).map(t => ({
        name: String(t.name), type: t.type, visible: t.visible,
        points: t._length || 0,
    })),
    svg_traces: gd.querySelectorAll('.scatterlayer .trace, .barlayer .trace').length,
    gl_canvases: gd.querySelectorAll('.gl-container canvas').length,
}))"""

ALL_RENDERED_JS = """n => {
    const plots = document.querySelectorAll('.js-plotly-plot');
    return plots.length === n && Array.from(plots).every(gd => gd._fullLayout && gd.querySelector('.main-svg'));
}"""


def test_report_renders_in_chromium(fake_server, tmp_path):
    require_chromium()  # fail at once, before the run, when Chromium is missing
    server = fake_server("--ttft-ms", "5", "--itl-ms", "1")  # /metrics up: the timeline gets server series
    run_dir = tmp_path / "run"
    proc = short_run(server.url, run_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = run_dir / REPORT_FILE
    html = report.read_text(encoding="utf-8")
    figures = html.count("Plotly.newPlot(")
    assert figures >= 4, f"expected the report's figures in {report}, found {figures} Plotly.newPlot calls"

    with chromium() as browser, open_page(browser, report.as_uri(), viewport=VIEWPORT) as (page, log):
        try:
            page.wait_for_function(ALL_RENDERED_JS, arg=figures, timeout=60_000)
        except Exception as e:  # report what is on the page, not just "timeout"
            raise AssertionError(f"charts did not all render: {page.evaluate(CHARTS_JS)}; errors {log.errors}") from e
        charts = page.evaluate(CHARTS_JS)
        png = screenshot(page, run_dir / "report.png")
        assert not log.errors, f"JavaScript errors in {report}: {log.errors}"

    assert len(charts) == figures, f"{len(charts)} rendered charts for {figures} figures"
    for chart in charts:
        assert chart["rendered"] and chart["width"] > 0, chart
        assert chart["traces"] and any(t["points"] > 0 for t in chart["traces"]), f"chart without data: {chart}"
        assert chart["svg_traces"] > 0, f"no scatter or bar trace drawn: {chart}"
        if any(t["type"].endswith("gl") for t in chart["traces"]):
            assert chart["gl_canvases"] > 0, f"WebGL trace without a canvas: {chart}"
    names = [t["name"] for chart in charts for t in chart["traces"] if t["points"] > 0]
    assert any("kv" in n.lower() for n in names), f"no server (KV-cache) series plotted: {names}"

    assert not log.foreign_requests, f"the report is not self-contained, it requested {log.foreign_requests}"
    assert report.as_uri() in log.requests, log.requests

    assert png.read_bytes()[:8] == PNG_SIGNATURE
    width, height = png_size(png)
    assert width >= VIEWPORT[0] and height > VIEWPORT[1], (width, height)  # full page: longer than the viewport
    assert png.stat().st_size > 50_000, f"{png} is suspiciously small ({png.stat().st_size} bytes)"
