"""The LLM tab in Locust's web UI (master or local runner only): live per-step numbers, and downloads.

Built on Locust's own extension points, no custom React build: `template_args` keys `extended_tabs`,
`extended_tables` and `extended_csv_files`, and rows injected as `extended_stats` into `/stats/requests`, which
the UI polls every couple of seconds. The numbers come from `analysis.live`, i.e. the same step table as the
final report. Cells are plain text: the UI renders them as text, so server-provided strings cannot run.

The tab owns its state and listens to events itself: test_start (a new run: its run directory, whose run.json
holds the step timeline), the suite's llm_request (a finished request of this process) and llm_worker_records (a
batch of records a worker shipped to the master), and test_stop (the run's end has been written: its final rows).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path

from flask import Response, request

from ..analysis import glossary
from ..analysis.live import LiveRecords, latest_gauges, live_table
from ..analysis.records import RECORDS_DIR
from ..analysis.run import read_run
from .distributed import RECORDS_EVENT
from .options import api_key

logger = logging.getLogger("vllm_loadtest.webui")

TAB = "llm"
# `python -m` of the analysis package beside this one: vllm_loadtest.analysis, installed or in a checkout.
ANALYSIS_PACKAGE = __package__.rpartition(".")[0] + ".analysis"
REFRESH_MIN_S = 1.0  # the live table is recomputed at most this often, however many browsers poll

# (row key, title) of the tab's columns, from the glossary: its web UI list, titles and formats (latencies in ms).
COLUMNS = [(c.key, c.title) for c in glossary.web_columns()]


MASK = "********"


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
        self._final: list[dict] | None = None  # the last run's rows, once its end has been written
        self._cache: tuple[float, list[dict]] = (0.0, [])
        events = environment.events
        events.test_start.add_listener(self._on_test_start)
        events.test_stop.add_listener(self._on_test_stop)
        events.llm_request.add_listener(self._on_record)
        getattr(events, RECORDS_EVENT).add_listener(self._on_worker_records)
        web_ui = environment.web_ui
        web_ui.template_args["extended_tabs"] = [{"title": "LLM", "key": TAB}]
        web_ui.template_args["extended_tables"] = [
            {"key": TAB, "structure": [{"key": k, "title": t} for k, t in COLUMNS]}
        ]
        # Under --web-base-path Locust serves everything below that prefix (a reverse proxy's path): so do these.
        base = (getattr(environment.parsed_options, "web_base_path", None) or "").rstrip("/")
        web_ui.template_args["extended_csv_files"] = [
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

    # --- events -----------------------------------------------------------------------------------------
    def _on_test_start(self, environment, **_kw) -> None:
        # Listens after the plugin's test_start, which has set the run's directory on the options.
        run_dir = environment.parsed_options.run_dir
        self.run_dir = Path(run_dir) if run_dir else None
        self.live.reset()
        self._final = None
        self._cache = (0.0, [])

    def _on_record(self, record, **_kw) -> None:
        self.live.add_record(record)

    def _on_worker_records(self, lines: bytes, **_kw) -> None:
        self.live.add_lines(lines)

    def _on_test_stop(self, environment, **_kw) -> None:
        # Listens after the plugin's test_stop: every worker's records have arrived and run.json holds the final
        # timeline, so these rows are the final table's, kept until the next run.
        self._final = None
        self._cache = (0.0, [])
        try:
            self._final = self._compute()
        except Exception:  # the LLM tab must never fail the run (an exception here would set its exit code)
            logger.exception("cannot compute the LLM tab's final rows")

    # --- live rows ------------------------------------------------------------------------------------
    def rows(self) -> list[dict]:
        now = time.monotonic()
        if now - self._cache[0] < REFRESH_MIN_S:
            return self._cache[1]
        rows = self._compute()
        self._cache = (now, rows)
        return rows

    def _compute(self) -> list[dict]:
        if self._final is not None:
            return self._final
        timeline = (read_run(self.run_dir).get("timeline") or []) if self.run_dir is not None else []
        if not timeline:
            return []
        gauges = latest_gauges(self.latest_samples(), self.environment.parsed_options.model or None)
        running = self.environment.runner.state in ("spawning", "running")
        table, whole = live_table(self.live.frame(), timeline, time.time())
        rows = []
        if len(table):
            current = table.iloc[-1].to_dict()
            rows.append(_row("current step" if running else "last step", current, gauges))
        if whole:
            rows.append(_row("whole run", whole, gauges))
        return rows

    def _inject(self, response: Response) -> Response:
        if not request.path.endswith("/stats/requests") or response.status_code != 200:  # also under a base path
            return response
        try:
            data = json.loads(response.get_data())
            data["extended_stats"] = [{"key": TAB, "data": self.rows()}]
            response.set_data(json.dumps(data))
        except Exception:  # the LLM tab must never break Locust's own stats page
            logger.exception("cannot compute the LLM tab's rows")
        return response

    def _stats_json(self) -> Response:
        return Response(json.dumps(self.rows()), mimetype="application/json")

    # --- the API key never reaches the browser -----------------------------------------------------------
    def _secrets(self) -> list[str]:
        key = api_key(self.environment.parsed_options)
        return [key] if key and len(key) >= 4 else []

    def _redact(self, response: Response) -> Response:
        """Replace the API key in anything the web UI sends (the start form pre-fills options with their values)."""
        secrets = self._secrets()
        if not secrets or response.direct_passthrough or response.is_streamed:
            return response
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
