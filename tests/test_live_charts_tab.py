"""The live charts' routes on a real Locust web UI in this process (locustfiles/webui.py): a backlog of scrapes read
by a greenlet a budget at a time, one computation shared by every poll, plotly.js cached by its ETag and never
touched by the API key's redaction."""

from __future__ import annotations

import json
import sys
import time

import gevent
import locust  # noqa: F401 - first: it monkey-patches the standard library for gevent
import pytest
from locust.env import Environment
from locust.event import EventHook, Events
from plotly.offline import get_plotlyjs
from vllm_loadtest.analysis.prometheus_text import parse_samples, scrape_line
from vllm_loadtest.analysis.run import write_run
from vllm_loadtest.locustfiles import webui
from vllm_loadtest.locustfiles.distributed import RECORDS_EVENT
from vllm_loadtest.locustfiles.plugin import SUITE_EVENTS

from tests.helpers.inprocess import parse_options
from tests.helpers.paths import FIXTURES

pytestmark = pytest.mark.unit


@pytest.fixture
def tab(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["locust"])  # Locust's web UI parses the command line for its start form
    options = parse_options("--host", "http://127.0.0.1:9", "--run-dir", str(tmp_path / "run"), "--api-key", "test")
    env = Environment(events=Events(), parsed_options=options)
    for name in {*SUITE_EVENTS, RECORDS_EVENT}:
        setattr(env.events, name, EventHook())
    env.create_local_runner()
    env.create_web_ui("127.0.0.1", 0)
    tab = webui.LLMTab(env, latest_samples=lambda: None)
    yield tab
    if env.web_ui.server is not None:  # started once the test yielded to gevent
        env.web_ui.stop()
    env.web_ui.greenlet.kill()


def start_run(tab, tmp_path, scrapes: int) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    now = time.time()
    step = {"step": 0, "users": 1, "start_time": now - scrapes, "measure_start": now - scrapes, "end_time": None}
    write_run(run_dir, {"timeline": [{**step, "rate_rps": None}]})
    samples = parse_samples((FIXTURES / "vllm-0.32-cpu-metrics.txt").read_text())  # a real vLLM scrape, 32 KB
    (run_dir / "metrics.jsonl").write_bytes(b"".join(scrape_line(now - scrapes + i, samples) for i in range(scrapes)))
    tab._on_test_start(tab.environment)


def test_a_backlog_of_scrapes_is_read_a_budget_at_a_time(tab, tmp_path, monkeypatch):
    start_run(tab, tmp_path, scrapes=600)  # ten minutes of 1 s scrapes: 19 MB
    client = tab.environment.web_ui.app.test_client()
    first = json.loads(client.get("/llm/charts.json").data)
    assert first["server"]["catching_up"] and 0 < first["server"]["scrapes"] < 600  # not all in one refresh
    assert tab._catching_up is not None
    tab._catching_up.join(timeout=60)
    assert tab._scrapes.scrapes == 600 and not tab._scrapes.behind
    monkeypatch.setattr(webui, "REFRESH_MIN_S", 0.0)
    gevent.sleep(0)
    later = json.loads(client.get("/llm/charts.json").data)
    assert later["server"]["scrapes"] == 600 and not later["server"]["catching_up"]
    assert len(later["server"]["kv_cache_usage"]) == 600


def test_every_poll_within_the_refresh_interval_gets_the_same_computation(tab, tmp_path, monkeypatch):
    start_run(tab, tmp_path, scrapes=3)
    client = tab.environment.web_ui.app.test_client()
    calls = []
    original = webui.live_charts.chart_data
    monkeypatch.setattr(webui.live_charts, "chart_data", lambda *a, **k: calls.append(1) or original(*a, **k))
    bodies = {client.get("/llm/charts.json").data for _ in range(20)}
    assert len(bodies) == 1 and len(calls) == 1


def test_plotly_is_served_whole_and_cached(tab):
    client = tab.environment.web_ui.app.test_client()
    first = client.get("/llm/plotly.min.js")
    # --api-key test: the redaction of the key must not touch plotly.js, which holds the word "test".
    assert first.status_code == 200 and first.data == get_plotlyjs().encode()
    assert first.headers["Cache-Control"].startswith("public")
    again = client.get("/llm/plotly.min.js", headers={"If-None-Match": first.headers["ETag"]})
    assert again.status_code == 304 and not again.data
    page = client.get("/llm/charts")
    assert page.status_code == 200 and b'src="plotly.min.js"' in page.data and b'fetch("charts.json"' in page.data


def test_a_change_of_the_runners_state_is_never_answered_from_the_cache(tab, tmp_path, monkeypatch):
    """Locust's page stops polling at its first answer whose state is not spawning/running: that answer must be
    computed under the new state, however long the last computation is otherwise held (seen in CI: an empty view
    held at the run's cleanup left the page empty for good)."""
    start_run(tab, tmp_path, scrapes=1)
    runner = tab.environment.runner
    computed = []
    original = tab._compute
    monkeypatch.setattr(tab, "_compute", lambda state=None: computed.append(state) or original(state))
    monkeypatch.setattr(webui, "refresh_hold_s", lambda compute_s: 3600.0)  # as if each computation were slow
    runner.state = "running"
    tab.view()
    tab.view()
    assert computed == ["running"]
    # No record yet, so no rows: such a view is held no longer than the minimum, whatever it cost.
    assert tab._hold_s == webui.REFRESH_MIN_S
    tab._cache = (time.monotonic(), "running", webui.LiveView(rows=[{"scope": "current step"}]))
    tab._hold_s = 3600.0
    assert tab.view().rows == [{"scope": "current step"}] and computed == ["running"]  # held: same state
    runner.state = "cleanup"
    tab.view()
    assert computed == ["running", "cleanup"]
    tab.view()
    assert computed == ["running", "cleanup"]  # and then held again under the new state


def test_a_started_run_is_spawning_to_the_page_while_its_test_start_runs(tab):
    """Locust fires test_start before it sets the state to spawning; the page, already showing the run, took a
    "ready" answer in between for the truth and went back to the start form, polling no more."""
    from flask import Response

    runner = tab.environment.runner
    runner.state = "ready"
    tab._note_start(Response('{"success": false, "message": "bad input"}'))
    assert tab._starting_state("ready") == "ready"  # a refused start starts nothing
    tab._note_start(Response('{"success": true}'))
    assert tab._starting_state("ready") == "spawning"
    assert tab._starting_state("running") == "running"
    assert tab._starting_state("ready") == "ready"  # Locust's state moved on: the override is over
    runner.state = "stopped"  # a second run, started from the finished one's page
    tab._note_start(Response('{"success": true}'))
    assert tab._starting_state("stopped") == "spawning"
    tab._started = (time.monotonic() - webui.START_GRACE_S - 1, "stopped")
    assert tab._starting_state("stopped") == "stopped"  # a start that never went through is not spawning forever
