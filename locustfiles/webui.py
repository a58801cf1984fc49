"""The LLM tab in Locust's web UI (master or local runner only): live per-step numbers, and downloads.

Built on Locust's own extension points, no custom React build: `template_args` keys `extended_tabs`,
`extended_tables` and `extended_csv_files`, and rows injected as `extended_stats` into `/stats/requests`, which
the UI polls every couple of seconds. The numbers come from `analysis.live`, i.e. the same step table as the
final report. Cells are plain text: the UI renders them as text, so server-provided strings cannot run.

The tab owns its state and listens to events itself: test_start (a new run: its run directory, whose run.json
holds the step timeline), the suite's llm_request (a finished request of this process) and llm_worker_records (a
batch of records a worker shipped to the master), and test_stop (the run's end has been written: its final rows).

The live charts (`/llm/charts`, linked from the Download Data tab) poll `/llm/charts.json`, built by
`analysis.live_charts` from the same cached live table as the tab's rows, the run's timeline and the new lines of the
run's metrics.jsonl (read incrementally, a few ms at most per refresh); plotly.js is served by `/llm/plotly.min.js`
from the installed plotly package, so the page works offline.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from flask import Response, request

from ..analysis import glossary, live_charts
from ..analysis.live import LiveRecords, latest_gauges, live_table
from ..analysis.prometheus_text import SCRAPES_FILE
from ..analysis.records import RECORDS_DIR
from ..analysis.run import read_run
from .charts_page import PAGE as CHARTS_PAGE
from .options import api_key

logger = logging.getLogger("vllm_loadtest.webui")

TAB = "llm"
# `python -m` of the analysis package beside this one: vllm_loadtest.analysis, installed or in a checkout.
ANALYSIS_PACKAGE = __package__.rpartition(".")[0] + ".analysis"
REFRESH_MIN_S = 1.0  # the live table is recomputed at most this often, however many browsers poll
# The live table is computed on every record so far, so its cost grows with the run: it may take at most this share
# of the event loop, which also receives the workers' records (and, in a local run, stamps every stream). A long
# run's table is then refreshed less often, and the intake is never slowed down by it.
LIVE_SHARE = 0.2
# A started run's test_start listeners (the suite's detects the server, reads its tokenizer and /metrics: ~0.5 s, more
# on a loaded machine) run before Locust sets the state to spawning: for at most this long after a successful
# POST /swarm, an answer of /stats/requests that still says "ready" (or "stopped") says "spawning" (see _inject).
START_GRACE_S = 120.0


def refresh_hold_s(compute_s: float) -> float:
    """How long one computation of the live table is served: max(REFRESH_MIN_S, its duration / LIVE_SHARE)."""
    return max(REFRESH_MIN_S, compute_s / LIVE_SHARE)


def _live_table_of(live: LiveRecords, columns: dict[str, list], timeline: list[dict], now: float):
    records = live.frame(columns)
    return records, live_table(records, timeline, now)


def _off_loop(fn: Callable, *args):
    """fn(*args) in gevent's pool of native threads, the calling greenlet waiting and the event loop running."""
    import gevent

    return gevent.get_hub().threadpool.apply(fn, args)


# (row key, title) of the tab's columns, from the glossary: its web UI list, titles and formats (latencies in ms).
COLUMNS = [(c.key, c.title) for c in glossary.web_columns()]


MASK = "********"
NOSNIFF = {"X-Content-Type-Options": "nosniff"}  # the browser takes JSON for JSON, never for a page


@dataclass
class LiveView:
    """One computation of the run so far, shared by the tab's rows and the charts' data until REFRESH_MIN_S passed."""

    rows: list[dict] = field(default_factory=list)
    table: object = None  # the live step table (a DataFrame), None before any record
    timeline: list[dict] = field(default_factory=list)
    records: object = None  # the records frame it was computed from
    now: float = 0.0  # time.time() of the computation


def _row(scope: str, stats: dict, gauges: dict) -> dict:
    """One row of the tab: the step table's values (`stats`) and the server's latest gauges, formatted as text."""
    values = {**stats, **gauges, "scope": scope}
    return {c.key: c.show(values.get(c.name), web=True) for c in glossary.web_columns()}


class LLMTab:
    """The tab of one web UI (master or local runner): registers its routes and its event listeners."""

    def __init__(self, environment, latest_samples: Callable[[], list | None]) -> None:
        self.environment = environment
        self.latest_samples = latest_samples  # the server's latest scrape (None when not scraped)
        self.live = LiveRecords()  # the finished requests of the current (or last) run
        self.run_dir: Path | None = None  # the current (or last) run's
        self._final: LiveView | None = None  # the last run's view, once its end has been written
        # (monotonic time, runner state, view) of the last computation: served to every poll for _hold_s while the
        # runner's state is the one it was computed under.
        self._cache: tuple[float, str | None, LiveView] = (0.0, None, LiveView())
        self._hold_s = REFRESH_MIN_S  # how long the cached view is served (refresh_hold_s of its computation)
        self._computing = False  # a computation of the live table is running (in gevent's thread pool)
        self._compute_lock = None  # a gevent lock, made on first use: one computation at a time
        # (monotonic time, state then) of the last successful POST /swarm that started a run (from ready or stopped)
        self._started: tuple[float, str] | None = None
        self._scrapes = live_charts.ScrapeTail(None)  # the run's metrics.jsonl, read incrementally for the charts
        self._charts: tuple[float, bytes] = (-math.inf, b"")
        self._latency = live_charts.LatencyBins()  # the charts' time bins: only the last ones are recomputed
        self._catching_up = None  # the greenlet reading a backlog of scrapes, a budget at a time
        # Read once, at startup (before any load): ~20 ms, then served from memory and cached by the browser.
        from plotly import __version__ as plotly_version
        from plotly.offline import get_plotlyjs

        self._plotlyjs = get_plotlyjs().encode()
        self._plotlyjs_etag = f'"plotly-{plotly_version}"'
        events = environment.events
        events.test_start.add_listener(self._on_test_start)
        events.test_stop.add_listener(self._on_test_stop)
        # Its records come from the controller's record bus (plugin.register subscribes `live.add_rows`).
        web_ui = environment.web_ui
        web_ui.template_args["extended_tabs"] = [{"title": "LLM", "key": TAB}]
        web_ui.template_args["extended_tables"] = [
            {"key": TAB, "structure": [{"key": k, "title": t} for k, t in COLUMNS]}
        ]
        # Under --web-base-path Locust serves everything below that prefix (a reverse proxy's path): so do these.
        base = (getattr(environment.parsed_options, "web_base_path", None) or "").rstrip("/")
        web_ui.template_args["extended_csv_files"] = [
            {"href": f"{base}/llm/charts", "title": "LLM: live charts (tok/s per step, TTFT/TPOT p95, KV cache)"},
            {"href": f"{base}/llm/requests.parquet", "title": "LLM: raw request records so far (requests.parquet)"},
            {"href": f"{base}/llm/report.html", "title": "LLM: HTML report of the run so far (report.html)"},
        ]
        app = web_ui.app
        app.after_request(self._inject)
        app.after_request(self._redact)  # registered last, runs first: Flask calls after_request in reverse
        app.before_request(self._unmask)
        auth = web_ui.auth_required_if_enabled
        app.add_url_rule(f"{base}/llm/stats", "llm_stats", auth(self._stats_json))
        app.add_url_rule(f"{base}/llm/requests.parquet", "llm_records", auth(self._records_download))
        app.add_url_rule(f"{base}/llm/report.html", "llm_report", auth(self._report_download))
        app.add_url_rule(f"{base}/llm/charts", "llm_charts", auth(self._charts_page))
        app.add_url_rule(f"{base}/llm/charts.json", "llm_charts_json", auth(self._charts_json))
        app.add_url_rule(f"{base}/llm/plotly.min.js", "llm_plotlyjs", auth(self._plotlyjs_file))

    # --- events -----------------------------------------------------------------------------------------
    def _on_test_start(self, environment, **_kw) -> None:
        # Listens after the plugin's test_start, which has set the run's directory on the options.
        run_dir = environment.parsed_options.run_dir
        self.run_dir = Path(run_dir) if run_dir else None
        self.live.reset()
        self._final = None
        self._cache, self._hold_s = (0.0, None, LiveView()), REFRESH_MIN_S
        self._charts = (-math.inf, b"")
        self._latency = live_charts.LatencyBins()
        model = environment.parsed_options.model or None  # as the scraper keeps only this model's samples
        self._scrapes = live_charts.ScrapeTail(self.run_dir / SCRAPES_FILE if self.run_dir else None, model)

    def _on_test_stop(self, environment, **_kw) -> None:
        # Listens after the plugin's test_stop: every worker's records have arrived and run.json holds the final
        # timeline, so these rows are the final table's, kept until the next run.
        self._final = None
        self._cache, self._hold_s = (0.0, None, LiveView()), REFRESH_MIN_S
        try:
            self._final = self._compute()
        except Exception:  # the LLM tab must never fail the run (an exception here would set its exit code)
            logger.exception("cannot compute the LLM tab's final rows")

    # --- live rows ------------------------------------------------------------------------------------
    def rows(self) -> list[dict]:
        return self.view().rows

    def view(self) -> LiveView:
        """The run so far, recomputed at most every refresh_hold_s(its last computation), however many poll, and
        at once when the runner's state changed since.

        Locust's page polls /stats/requests only while the state is spawning or running: the first answer with any
        other state (cleanup, stopping, stopped) is the last the page gets, and its rows stay on screen. A cached
        view from before that change must never be that answer (seen in CI: a view with no rows yet, held for
        seconds after a slow first computation, was served at the run's cleanup, and the page stayed empty)."""
        import gevent.lock

        state = str(self.environment.runner.state)
        at, cached_state, cached = self._cache
        if cached_state == state and (time.monotonic() - at < self._hold_s or self._computing):
            return cached  # a poll during a computation (in its thread) gets the last view, starts no other
        if self._compute_lock is None:
            self._compute_lock = gevent.lock.Semaphore()
        with self._compute_lock:  # a poll that needs a fresh view waits for the computation in flight, then decides
            at, cached_state, cached = self._cache
            state = str(self.environment.runner.state)
            if cached_state == state and time.monotonic() - at < self._hold_s:
                return cached  # computed while this poll waited
            now = time.monotonic()
            self._computing = True
            try:
                view = self._compute(state)
            finally:
                self._computing = False
            self._cache = (now, state, view)
            # A view without rows (no timeline or no record yet) says nothing about what the next one costs; the
            # first computation also pays for imports, which must not hold an empty table on screen for seconds.
            self._hold_s = refresh_hold_s(time.monotonic() - now) if view.rows else REFRESH_MIN_S
        self._read_scrapes()  # with Locust's own polling too: the charts find the scrapes read when they open
        return view

    def _compute(self, state: str | None = None) -> LiveView:
        """The tab's rows and the charts' inputs from the records so far, labelled by the runner's `state`."""
        if self._final is not None:
            return self._final
        timeline = (read_run(self.run_dir).get("timeline") or []) if self.run_dir is not None else []
        now = time.time()
        if not timeline:
            return LiveView(now=now)
        gauges = latest_gauges(self.latest_samples(), self.environment.parsed_options.model or None)
        running = (state if state is not None else self.environment.runner.state) in ("spawning", "running")
        # The table is computed on every record so far (seconds in a long, fast run): in a native thread, so the
        # event loop goes on receiving the workers' records meanwhile (the GIL changes hands every 5 ms); the columns
        # are copied here, where records are appended.
        records, (table, whole) = _off_loop(_live_table_of, self.live, self.live.snapshot(), timeline, now)
        rows = []
        if len(table):
            current = table.iloc[-1].to_dict()
            rows.append(_row("current step" if running else "last step", current, gauges))
        if whole:
            rows.append(_row("whole run", whole, gauges))
        return LiveView(rows, table if len(table) else None, timeline, records, now)

    def _note_start(self, response: Response) -> None:
        """A successful POST /swarm while no run is going on: a run is starting (see _starting_state)."""
        try:
            started = response.status_code == 200 and bool(json.loads(response.get_data()).get("success"))
        except Exception:  # not JSON: not a start
            started = False
        state = str(self.environment.runner.state)
        if started and state in ("ready", "stopped"):
            self._started = (time.monotonic(), state)

    def _starting_state(self, state: str) -> str:
        """The state the page is told: "spawning" while a started run's test_start is still running.

        Locust fires test_start before it sets the state to spawning, and its page, which set itself to running when
        the start succeeded, takes an answer saying "ready" for the truth: it shows the start form again and stops
        polling, with the run going on behind it (seen in a browser test: the page received only "ready" answers,
        one of them 2 s after the start, and its LLM tab stayed empty for good)."""
        if self._started is None:
            return state
        at, before = self._started
        if state != before or time.monotonic() - at > START_GRACE_S:
            self._started = None  # Locust's own state has moved on (or the start never went through)
            return state
        return "spawning"

    def _inject(self, response: Response) -> Response:
        if request.path.endswith("/swarm") and request.method == "POST":
            self._note_start(response)
            return response
        if not request.path.endswith("/stats/requests") or response.status_code != 200:  # also under a base path
            return response
        try:
            data = json.loads(response.get_data())
            data["state"] = self._starting_state(str(data.get("state")))
            data["extended_stats"] = [{"key": TAB, "data": self.rows()}]
            response.set_data(json.dumps(data))
        except Exception:  # the LLM tab must never break Locust's own stats page
            logger.exception("cannot compute the LLM tab's rows")
        return response

    def _stats_json(self) -> Response:
        return Response(json.dumps(self.rows()), mimetype="application/json")

    # --- live charts ----------------------------------------------------------------------------------
    def charts_data(self) -> bytes:
        """/llm/charts.json's body, rebuilt at most every REFRESH_MIN_S (on the cached view) however many poll."""
        now = time.monotonic()
        if now - self._charts[0] < REFRESH_MIN_S:
            return self._charts[1]
        view = self.view()
        self._read_scrapes()
        # After the run its final view stays; its charts end where the run's timeline ends.
        end = view.now
        if self._final is not None and view.timeline:
            end = max((float(t.get("end_time") or t["start_time"]) for t in view.timeline), default=end)
        data = live_charts.chart_data(
            view.table,
            view.timeline,
            view.records,
            self._scrapes if self._scrapes.path is not None else None,
            end if view.timeline else time.time(),
            str(self.environment.runner.state),
            self.environment.parsed_options.model or None,
            self._latency,
        )
        body = live_charts.to_json(data)
        self._charts = (now, body)
        return body

    def _read_scrapes(self) -> None:
        """The lines metrics.jsonl gained since the last read, a few ms at most; a backlog (charts opened late into a
        long run) is read by a greenlet of its own, one budget at a time with a pause between, so the event loop
        that stamps every stream is never held longer than one budget."""
        self._scrapes.read()
        if self._scrapes.behind and self._catching_up is None:
            import gevent

            def catch_up(tail: live_charts.ScrapeTail) -> None:
                try:
                    while tail.behind and tail is self._scrapes:
                        gevent.sleep(0.02)
                        tail.read()
                finally:
                    self._catching_up = None

            self._catching_up = gevent.spawn(catch_up, self._scrapes)

    def _charts_json(self) -> Response:
        try:
            body = self.charts_data()
        except Exception:  # the charts must never break the web UI: the page shows the failure and polls again
            logger.exception("cannot compute the LLM charts' data")
            return Response('{"error": "cannot compute the charts; see the Locust log"}', status=500,
                            mimetype="application/json")  # fmt: skip
        return Response(body, mimetype="application/json", headers={"Cache-Control": "no-store", **NOSNIFF})

    def _charts_page(self) -> Response:
        return Response(CHARTS_PAGE, mimetype="text/html", headers=NOSNIFF)

    def _plotlyjs_file(self) -> Response:
        headers = {"ETag": self._plotlyjs_etag, "Cache-Control": "public, max-age=86400", **NOSNIFF}
        if request.headers.get("If-None-Match") == self._plotlyjs_etag:
            return Response(status=304, headers=headers)
        return Response(self._plotlyjs, mimetype="text/javascript", headers=headers)

    # --- the API key never reaches the browser -----------------------------------------------------------
    def _secrets(self) -> list[str]:
        key = api_key(self.environment.parsed_options)
        return [key] if key and len(key) >= 4 else []

    def _redact(self, response: Response) -> Response:
        """Replace the API key in anything the web UI sends (the start form pre-fills options with their values)."""
        secrets = self._secrets()
        if not secrets or response.direct_passthrough or response.is_streamed:
            return response
        if request.path.endswith("/llm/plotly.min.js"):
            return response  # the installed package's file holds no key; a short key ("test") would break it
        body = response.get_data()
        changed = False
        for secret in secrets:
            for form in {secret, json.dumps(secret)[1:-1]}:  # as is, and as it appears inside JSON
                if form.encode() in body:
                    body = body.replace(form.encode(), MASK.encode())
                    changed = True
        if changed:
            response.set_data(body)
        return response

    def _unmask(self) -> None:
        """The start form sends the mask back for an unchanged key: keep the real one."""
        if request.path.endswith("/swarm") and request.form.get("api_key") == MASK:
            form = request.form.copy()
            form["api_key"] = self.environment.parsed_options.api_key
            request.form = form

    # --- downloads ------------------------------------------------------------------------------------
    def _snapshot(self, kind: str, filename: str, mimetype: str) -> Response:
        """Build a download in a separate process: pandas and plotly would hold this process's event loop (and with
        it every stream's timestamps) for seconds; gevent's subprocess waits for it cooperatively."""
        import tempfile

        from gevent import subprocess

        run_dir = self.run_dir
        if run_dir is None or not (run_dir / RECORDS_DIR).is_dir():
            return Response("no run yet: start one first\n", status=404, mimetype="text/plain")
        with tempfile.TemporaryDirectory(prefix="vllm-loadtest-") as tmp:
            out = Path(tmp) / filename
            proc = subprocess.run(
                [sys.executable, "-m", ANALYSIS_PACKAGE, "snapshot", str(run_dir), f"--{kind}", str(out)],
                capture_output=True,
                text=True,
                timeout=600,
            )
            if proc.returncode != 0 or not out.exists():
                logger.error("cannot build the %s of %s: %s", kind, run_dir, proc.stderr.strip()[-2000:])
                return Response(f"cannot build the {kind}; see the Locust log\n", status=500, mimetype="text/plain")
            data = out.read_bytes()
        return Response(
            data,
            mimetype=mimetype,
            headers={"Content-Disposition": f"attachment; filename={run_dir.name}-{filename}"},
        )

    def _records_download(self) -> Response:
        return self._snapshot("records", "requests.parquet", "application/vnd.apache.parquet")

    def _report_download(self) -> Response:
        return self._snapshot("report", "report.html", "text/html")


def register(environment, ctx) -> None:
    """The LLM tab on the controller's web UI, fed by the record bus (none headless, none on a worker)."""
    if getattr(environment, "web_ui", None) is None or not ctx.is_controller:
        return
    scraping = ctx.features.get("scraping")  # None: nothing is scraped (a scraper's samples also None until one)
    tab = LLMTab(environment, latest_samples=scraping.latest_samples if scraping is not None else lambda: None)
    ctx.bus.subscribe(tab.live.add_rows)
