"""The web UI's live charts (/llm/charts) in a real headless Chromium, against the fake server: reached from the
Download Data tab's link, filled while a stepped run goes on, offline (plotly.js served by the suite), the final
points equal to steps.csv, under --web-base-path, and server text shown as text."""

from __future__ import annotations

import json
import os
import re
import signal
import urllib.error
import urllib.request

import pandas as pd
import pytest

from tests.browser import chromium, open_page, png_size, require_chromium, screenshot
from tests.helpers.net import free_port, get, post, wait_for
from tests.helpers.runs import start_locust, wait_until

pytestmark = [pytest.mark.contract, pytest.mark.browser]

HOSTILE = "<script>alert('x')</script>"
CHARTS_LINK = re.compile(r"LLM: live charts")

# Per chart div: how many points each trace has that are not null, and whether it has error bars.
CHARTS_JS = """() => Object.fromEntries(['tok', 'kv', 'ttft', 'tpot'].map(id => {
    const gd = document.getElementById(id);
    return [id, (gd.data || []).map(t => ({
        name: String(t.name),
        points: (t.y || []).filter(v => v !== null && v !== undefined && !Number.isNaN(v)).length,
        error_bars: !!(t.error_y && t.error_y.visible),
        rendered: !!gd._fullLayout && gd.querySelector('.main-svg') !== null,
    }))];
}))"""

# The tok/s chart has points for `steps` steps and the KV-cache trace has data.
FILLED_JS = """steps => {
    const tok = document.getElementById('tok').data, kv = document.getElementById('kv').data;
    const count = t => (t && t.y ? t.y.filter(v => v !== null && !Number.isNaN(v)).length : 0);
    return tok && kv && count(tok[0]) >= steps && count(kv[0]) > 0;
}"""


def charts_json(url: str) -> dict:
    return json.loads(get(url))


def test_live_charts_fill_during_a_stepped_run_and_end_equal_to_steps_csv(fake_server, tmp_path):
    require_chromium()
    server = fake_server("--ttft-ms", "20", "--itl-ms", "5")
    port = free_port()
    ui = f"http://127.0.0.1:{port}"
    run_dir = tmp_path / "run"
    proc = start_locust(
        ["--host", server.url, "--web-host", "127.0.0.1", "--web-port", str(port), "--run-dir", str(run_dir),
         "--scrape-interval", "0.5"],
        tmp_path / "locust.log",
    )  # fmt: skip
    try:
        wait_for(ui + "/")
        assert b"/llm/charts" in get(ui + "/")  # the link, in the Download Data tab's list
        assert charts_json(ui + "/llm/charts.json")["steps"] == []  # no run yet: an empty payload
        started = post(
            ui + "/swarm",
            {"host": server.url, "steps": "1,2,4", "step_duration": "5s", "step_warmup": "1s", "max_tokens": "16"},
        )
        assert started["success"], started
        with chromium() as browser, open_page(browser, ui + "/", allow=(ui + "/",)) as (page, log):
            # As a user: the Download Data tab lists the charts; its link opens them.
            page.get_by_role("tab", name=re.compile(r"^download data$", re.IGNORECASE)).click()
            page.get_by_role("link", name=CHARTS_LINK).click()
            page.wait_for_url(ui + "/llm/charts")
            try:
                page.wait_for_function(FILLED_JS, arg=2, timeout=60_000, polling=500)
            except Exception as e:
                screenshot(page, tmp_path / "charts-timeout.png")
                raise AssertionError(f"charts not filled: {page.evaluate(CHARTS_JS)}; errors {log.errors}") from e
            during = page.evaluate(CHARTS_JS)
            png_during = screenshot(page, tmp_path / "charts-during.png")
            # Let the run end: the page keeps polling and shows the final numbers.
            assert wait_until(lambda: (run_dir / "steps.csv").exists(), timeout=60, interval=0.5)
            assert wait_until(lambda: charts_json(ui + "/llm/charts.json")["state"] == "stopped", 30, 0.5)
            page.wait_for_function(  # the page's next refreshes show the final numbers
                "() => document.getElementById('state').textContent === 'stopped'"
                " && document.getElementById('tok').data[0].y.filter(v => v !== null).length === 3",
                timeout=20_000,
                polling=500,
            )
            after = page.evaluate(CHARTS_JS)
            shown_state = page.locator("#state").inner_text()
            png_after = screenshot(page, tmp_path / "charts-after.png")
            final = charts_json(ui + "/llm/charts.json")
            assert not log.errors, log.errors
            assert not log.foreign_requests, f"the charts page reached outside 127.0.0.1: {log.foreign_requests}"
            assert any(u.endswith("/llm/plotly.min.js") for u in log.requests), log.requests
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    for chart in during.values():
        assert chart and all(t["rendered"] for t in chart), during
    assert during["tok"][0]["points"] >= 2 and during["kv"][0]["points"] > 0
    assert (
        after["tok"][0]["points"] == 3
        and after["ttft"][0]["points"] > 0
        and after["tpot"][1]["points"] + after["tpot"][2]["points"] > 0
    )
    assert shown_state == "stopped"
    # The final points are steps.csv's: the same step table, computed by the same code.
    steps = pd.read_csv(run_dir / "steps.csv")
    assert [s["users"] for s in final["steps"]] == steps["users"].tolist() == [1, 2, 4]
    for point, (_, row) in zip(final["steps"], steps.iterrows()):
        assert point["aggregate_tok_s"] == pytest.approx(row["aggregate_tok_s"], rel=1e-9)
        assert point["ttft_p95_s"] == pytest.approx(row["ttft_p95_s"], rel=1e-9)
        assert point["end"] is not None and not point["running"]
        if "aggregate_tok_s_ci_low" in steps.columns:  # once the step table has intervals: drawn as error bars
            assert point["ci_low"] == pytest.approx(row["aggregate_tok_s_ci_low"], rel=1e-9, nan_ok=True)
    assert after["tok"][0]["error_bars"] == ("aggregate_tok_s_ci_low" in steps.columns)
    kv = [v for v in final["server"]["kv_cache_usage"] if v is not None]
    assert kv and max(kv) > 0  # the fake server's KV cache: running / 8
    # A gap is a failed scrape, drawn as one: on a loaded 2-core machine a scrape can time out (seen in a fresh
    # clone: 1 gap), so the charts must count exactly the failed scrapes the run recorded, not none.
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    failed = sum(1 for scrape in lines if scrape.get("source") is None and scrape.get("samples") is None)
    assert final["server"]["gaps"] == failed
    for png in (png_during, png_after):
        width, height = png_size(png)
        assert width >= 1400 and height >= 700 and png.stat().st_size > 30_000, (png, width, height)


def test_live_charts_under_web_base_path_show_server_text_as_text(fake_server, tmp_path):
    require_chromium()
    server = fake_server("--hostile", "--model", HOSTILE + "model", "--metrics", "flaky")
    port = free_port()
    ui = f"http://127.0.0.1:{port}/lt"
    proc = start_locust(
        ["--host", server.url, "--web-host", "127.0.0.1", "--web-port", str(port), "--web-base-path", "/lt",
         "--model", HOSTILE + "model", "--run-dir", str(tmp_path / "run"), "--scrape-interval", "0.5"],
        tmp_path / "locust.log",
    )  # fmt: skip
    try:
        wait_for(ui + "/llm/charts")
        assert b"/lt/llm/charts" in get(ui + "/")
        for path in ("/llm/charts", "/llm/charts.json", "/llm/plotly.min.js"):  # only under the base path
            with pytest.raises(urllib.error.HTTPError) as e:
                get(f"http://127.0.0.1:{port}{path}")
            assert e.value.code == 404, path
        # plotly.js is cached by the browser: the same ETag answers 304.
        with urllib.request.urlopen(ui + "/llm/plotly.min.js", timeout=10) as r:
            etag, size = r.headers["ETag"], len(r.read())
        assert etag and size > 1_000_000
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(urllib.request.Request(ui + "/llm/plotly.min.js", headers={"If-None-Match": etag}))
        assert e.value.code == 304
        post(ui + "/swarm", {"steps": "2", "step_duration": "6s", "step_warmup": "0s", "max_tokens": "8"})
        dialogs: list[str] = []
        with chromium() as browser, open_page(browser, ui + "/llm/charts", allow=(ui + "/",)) as (page, log):
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.wait_for_function(
                "() => document.getElementById('model').textContent.includes('model')"
                " && document.getElementById('error').textContent.includes('scrape error')",
                timeout=30_000,
                polling=500,
            )
            page.wait_for_function(FILLED_JS, arg=1, timeout=30_000, polling=500)
            model_shown = page.locator("#model").inner_text()
            scripts = page.evaluate("document.querySelectorAll('script').length")
            screenshot(page, tmp_path / "charts-base-path.png")
            with urllib.request.urlopen(ui + "/llm/charts.json", timeout=10) as r:
                headers = r.headers
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    assert model_shown == HOSTILE + "model" and not dialogs, (model_shown, dialogs)
    assert scripts == 2  # the page's own two: plotly.min.js and its code; none from the server's text
    assert not log.errors and not log.foreign_requests, (log.errors, log.foreign_requests)
    # JSON only ever read as JSON: a browser opening it directly shows text, never a page.
    assert headers["Content-Type"] == "application/json" and headers["X-Content-Type-Options"] == "nosniff"
