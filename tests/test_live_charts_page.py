"""The live charts page (locustfiles/charts_page.py) in Chromium on data the step table will have once it carries
intervals and suspect flags: error bars drawn from aggregate_tok_s_ci_low/high, suspect steps marked on every chart.
The page and its data are served by the browser's request routing (no Locust): the same bytes the web UI serves."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from plotly.offline import get_plotlyjs
from vllm_loadtest.analysis.live_charts import ScrapeTail, chart_data, to_json
from vllm_loadtest.analysis.prometheus_text import scrape_line
from vllm_loadtest.analysis.server_metrics import KV_CACHE, RUNNING, WAITING
from vllm_loadtest.locustfiles.charts_page import PAGE

from tests.browser import chromium, require_chromium, screenshot

pytestmark = pytest.mark.browser

ORIGIN = "http://127.0.0.1:1"  # never reached: every request is answered by the routing below
T0 = 1_700_000_000.0
STEP_S = 20.0

# The tok/s trace as plotly holds it, the suspect annotations, and the red (suspect) rectangles of the KV chart.
PAGE_JS = """() => {
    const tok = document.getElementById('tok'), kv = document.getElementById('kv');
    const t = tok.data[0];
    return {
        y: t.y, symbols: t.marker.symbol,
        error_bars: !!(t.error_y && t.error_y.visible), plus: t.error_y ? t.error_y.array : null,
        minus: t.error_y ? t.error_y.arrayminus : null,
        annotations: (tok.layout.annotations || []).map(a => a.text),
        suspect_shapes: (kv.layout.shapes || []).filter(s => s.fillcolor === '#e53935').length,
        kv_labels: (kv.layout.annotations || []).map(a => a.text),
        drawn_error_bars: tok.querySelectorAll('.errorbar').length,
    };
}"""


def payload(tmp_path) -> bytes:
    users = [1, 2, 4, 8]
    timeline = [
        {"step": i, "users": u, "start_time": T0 + i * STEP_S, "measure_start": T0 + i * STEP_S + 2,
         "end_time": T0 + (i + 1) * STEP_S if i < 3 else None, "rate_rps": None}
        for i, u in enumerate(users)
    ]  # fmt: skip
    table = pd.DataFrame(
        {
            "step": [0, 1, 2, 3],
            "users": users,
            "requests": [300, 310, 600, 100],
            "aggregate_tok_s": [600.0, 650.0, 1750.0, 2900.0],
            "aggregate_tok_s_ci_low": [580.0, 600.0, 1700.0, math.nan],  # the running step: no interval yet
            "aggregate_tok_s_ci_high": [620.0, 700.0, 1800.0, math.nan],
            "ttft_p95_s": [0.02, 0.05, 0.03, 0.04],
            "tpot_p95_s": [0.002, 0.006, 0.003, 0.004],
            "stable": [True, True, False, None],
            "outlier": [False, True, False, None],
        }
    )
    rng = np.random.default_rng(3)
    n = 3000
    start = T0 + np.sort(rng.uniform(0, 78, n))
    records = pd.DataFrame(
        {"start_time": start, "e2e_s": np.full(n, 0.4), "ttft_s": rng.gamma(4, 0.005, n),
         "tpot_s": rng.gamma(4, 0.0008, n), "status": ["ok"] * n}
    )  # fmt: skip
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(
        b"".join(
            scrape_line(T0 + t, [(KV_CACHE, {}, min(1.0, t / 60)), (WAITING, {}, max(0.0, t - 60) / 4),
                                 (RUNNING, {}, 2 ** (t // STEP_S))])
            for t in np.arange(-0.5, 80, 0.5).tolist()
        )
    )  # fmt: skip
    tail = ScrapeTail(path)
    tail.read()
    return to_json(chart_data(table, timeline, records, tail, T0 + 80, "running", "tiny"))


def test_error_bars_and_suspect_steps_are_drawn(tmp_path):
    require_chromium()
    data = payload(tmp_path)
    served = {
        "/llm/charts": (PAGE.encode(), "text/html"),
        "/llm/charts.json": (data, "application/json"),
        "/llm/plotly.min.js": (get_plotlyjs().encode(), "text/javascript"),
    }
    errors: list[str] = []
    foreign: list[str] = []

    def answer(route):
        url = route.request.url
        path = url[len(ORIGIN) :] if url.startswith(ORIGIN) else None
        if path in served:
            body, kind = served[path]
            route.fulfill(status=200, body=body, content_type=kind)
        else:
            foreign.append(url)
            route.abort()

    with chromium() as browser:
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        context.route("**/*", answer)
        page = context.new_page()
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(ORIGIN + "/llm/charts")
        page.wait_for_function("() => (window.llmChartsRefreshed || 0) >= 1", timeout=30_000)
        shown = page.evaluate(PAGE_JS)
        notes = page.locator("#notes").inner_text()
        png = screenshot(page, tmp_path / "charts-with-intervals.png")
        context.close()
    assert not errors and not foreign, (errors, foreign)
    assert shown["y"] == [600.0, 650.0, 1750.0, 2900.0]
    assert shown["error_bars"] and shown["drawn_error_bars"] > 0
    assert shown["plus"][:3] == [20.0, 50.0, 50.0] and shown["minus"][:3] == [20.0, 50.0, 50.0]
    assert math.isnan(shown["plus"][3])  # the running step has no bar
    # Step 1 (an outlier) and step 2 (unstable) are suspect; the running step is drawn hollow.
    assert shown["symbols"] == ["circle", "x", "x", "circle-open"]
    assert shown["annotations"] == ["outlier", "unstable"]
    assert shown["suspect_shapes"] == 2 and sum("(suspect)" in t for t in shown["kv_labels"]) == 2
    assert "No intervals" not in notes
    assert png.stat().st_size > 30_000
