"""The web UI end to end in a real headless Chromium (Debian's chromium): the user's path against the embedded vLLM,
the page's own behaviour at a run's end and during a download against the fake server.

A user's path through Locust's web UI (not headless): fill the start form with the suite's own options, start the
run, watch the LLM tab fill with numbers, download the records and the report of the run so far, let the run end
by itself, and find the results in the run directory. Screenshots of each stage are left in the test's tmp_path,
and one is taken whenever a selector fails.

Selectors are what a user reads: the "Custom parameters" accordion, form fields by their label (Locust titles an
option's label from its name, followed by its help in parentheses), the START button, tabs and links by their text,
the header's "Status". Locust's UI is a React app (Material UI) whose element ids are generated: none is used.
"""

from __future__ import annotations

import io
import itertools
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from vllm_loadtest.analysis.records import REQUESTS_FILE
from vllm_loadtest.analysis.report import REPORT_FILE
from vllm_loadtest.analysis.run import STEPS_FILE

from tests.browser import PNG_SIGNATURE, chromium, open_page, png_size, require_chromium, screenshot
from tests.helpers.net import free_port
from tests.helpers.paths import ROOT

# `vllm` comes with the vllm_server fixture (tests/conftest.py); the page's own behaviour is checked on the fake server.
pytestmark = [pytest.mark.browser, pytest.mark.contract]
# The fake server's timing for the tests about the page, not the server: a stream of tokens 10 ms apart.
FAKE_TIMING = ("--ttft-ms", "30", "--itl-ms", "10")

VIEWPORT = (1400, 900)
LIVE_ROWS_TIMEOUT_S = 90
LLM_TAB = re.compile(r"^LLM$")
REPORT_LINK = re.compile(r"HTML report of the run so far")
RECORDS_LINK = re.compile(r"raw request records so far")

# The LLM tab's columns that hold numbers, by their titles (locustfiles/webui.py COLUMNS).
NUMERIC = [
    "Requests ok",
    "Errors",
    "Aggregate tok/s",
    "Per-request tok/s",
    "TTFT p50 (ms)",
    "TTFT p95 (ms)",
    "TTFT p99 (ms)",
    "TPOT p50 (ms)",
    "TPOT p95 (ms)",
]

# The table of the open tab as rendered: [{column title: cell text}], or null while there is no table.
TABLE_JS = """() => {
    const table = document.querySelector('table');
    if (!table) return null;
    const titles = Array.from(table.querySelectorAll('thead th')).map(th => th.textContent.trim());
    return Array.from(table.querySelectorAll('tbody tr')).map(tr => Object.fromEntries(
        Array.from(tr.querySelectorAll('td')).map((td, i) => [titles[i], td.textContent.trim()])));
}"""


# The header's Status once the run started (Locust shows the state in a span after the "Status" label).
STARTED_JS = """() => {
    const m = (document.querySelector('header') || {innerText: ''}).innerText.match(/Status\\s+(\\S+)/);
    return m !== null && /^(spawning|running)$/i.test(m[1]);
}"""


class StaleLLMTab(AssertionError):
    """The LLM tab still presents a finished run as running."""


class LoadGeneratorStalled(AssertionError):
    """Something the web UI did froze the load generator: every stream in flight shows the same long gap."""


# --- Locust with its web UI -----------------------------------------------------------------------------------
def tail(path: Path, n: int = 4000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else "(no log)"


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


@contextmanager
def locust_web_ui(host: str, tmp_path: Path):
    """`locust -f locustfiles/vllm_streaming.py` with its web UI on loopback; yields (url, run_dir, log path).

    Always stopped afterwards: SIGTERM to its process group, SIGKILL if it lingers."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    run_dir = tmp_path / "run"
    log_path = tmp_path / "locust.log"
    cmd = [sys.executable, "-m", "locust", "-f", "locustfiles/vllm_streaming.py", "--host", host]
    cmd += ["--web-host", "127.0.0.1", "--web-port", str(port), "--run-dir", str(run_dir)]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail(f"locust exited with {proc.returncode} before its web UI answered:\n{tail(log_path)}")
            try:
                with urllib.request.urlopen(url + "/", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"locust's web UI did not answer at {url} within 60 s:\n{tail(log_path)}")
            time.sleep(0.3)
        yield url, run_dir, log_path
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(15)


def wait_for_run_end(url: str, run_dir: Path, timeout_s: float, log_path: Path) -> None:
    """Until Locust says the run stopped and the suite has written its results and moved the tab to "last step".

    Asked of the server, not read from the page: Locust's UI stops polling at the first state other than
    spawning/running, so its header can stay at "cleanup" for good."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = get_json(url + "/stats/requests")["state"]
        scopes = [r["scope"] for r in get_json(url + "/llm/stats")]
        files = all((run_dir / f).is_file() for f in (REQUESTS_FILE, STEPS_FILE, REPORT_FILE))
        if state == "stopped" and files and scopes[:1] == ["last step"]:
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"the run did not end within {timeout_s:.0f} s: state {state}, LLM scopes {scopes}, "
                f"run dir {sorted(p.name for p in run_dir.iterdir()) if run_dir.is_dir() else None}\n{tail(log_path)}"
            )
        time.sleep(0.5)


# --- the page ---------------------------------------------------------------------------------------------------
def record_states(page) -> list[tuple[float, str]]:
    """The (wall-clock time, state) of every /stats/requests answer the page receives: what its header shows."""
    states: list[tuple[float, str]] = []

    def on_response(response) -> None:
        if response.url.endswith("/stats/requests") and response.ok:
            try:
                states.append((time.time(), response.json()["state"]))
            except Exception as e:  # the page navigated away meanwhile
                states.append((time.time(), f"unreadable: {e}"))

    page.on("response", on_response)
    return states


@contextmanager
def explained(page, png: Path, what: str, states: list | None = None):
    """On any failure inside, save a screenshot and say what the page was showing and which states it received."""
    try:
        yield
    except Exception as e:
        try:
            screenshot(page, png)
            text = page.locator("body").inner_text(timeout=5000)[-2000:]
        except Exception as inner:  # the page itself may be gone
            text = f"(no page text: {inner})"
        seen = f"\nstates the page received: {[(time.strftime('%H:%M:%S', time.localtime(t)), s) for t, s in states]}"
        raise AssertionError(
            f"{what} failed: {e}\nscreenshot: {png}{seen if states else ''}\npage text:\n{text}"
        ) from e


def start_run(page, tmp_path: Path, states: list, *, steps: str, duration: str, warmup: str, max_tokens: int) -> None:
    """Fill the start form's custom parameters like a user, with ignore EOS on, and press START."""
    with explained(page, tmp_path / "form-failed.png", "filling the start form", states):
        page.get_by_role("button", name="Custom parameters").click()
        fields = {
            r"^Steps\b": steps,
            r"^Step Duration\b": duration,
            r"^Step Warmup\b": warmup,
            r"^Max Tokens\b(?! Dist)": str(max_tokens),  # not --max-tokens-dist
        }
        for label, value in fields.items():
            field = page.get_by_label(re.compile(label))
            field.fill(value)
            assert field.input_value() == value, label
        page.get_by_label(re.compile(r"^Ignore Eos\b")).check()
        screenshot(page, tmp_path / "form.png")
        clicked = time.time()
        page.get_by_role("button", name=re.compile(r"^start$", re.IGNORECASE)).click()
        page.wait_for_function(STARTED_JS, timeout=30_000)
        page.wait_for_timeout(3000)  # more than one poll: the page must stay on the run (locustfiles/webui.py)
        after = [s for t, s in states if t > clicked]
        assert "ready" not in after, f"after START the page was told 'ready' and went back to the form: {after}"


def swarm_status(page) -> str:
    """The header's Status value as shown (ready, running, cleanup, stopped ...)."""
    value = page.locator("header").get_by_text("Status", exact=True).locator("xpath=following-sibling::*[1]")
    return value.text_content(timeout=5000).strip().lower()


def open_llm_tab(page) -> None:
    page.get_by_role("tab", name=LLM_TAB).click()
    page.get_by_role("table").wait_for(state="visible", timeout=15_000)


def read_table(page) -> list[dict]:
    return page.evaluate(TABLE_JS) or []


def number(cell: str | None) -> float | None:
    """A numeric cell's value; None for '-' (missing) or anything that is not a plain number."""
    try:
        value = float(cell)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def has_live_numbers(rows: list[dict]) -> bool:
    """At least one row with a numeric aggregate tok/s and TTFT (not '-')."""
    return any(
        number(r.get("Aggregate tok/s")) is not None and number(r.get("TTFT p50 (ms)")) is not None for r in rows
    )


def wait_for_rows(page, ready, timeout_s: float, what: str) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    rows = read_table(page)
    while not ready(rows):
        assert time.monotonic() < deadline, f"{what} within {timeout_s:.0f} s; the LLM tab shows {rows}"
        page.wait_for_timeout(500)
        rows = read_table(page)
    return rows


def check_row(row: dict) -> None:
    """The values of one LLM-tab row make sense for a run against a healthy vLLM."""
    for column in NUMERIC:
        assert number(row[column]) is not None, f"{column} is not a number in {row}"
    assert int(row["Requests ok"]) > 0, row
    assert int(row["Errors"]) == 0, row
    assert number(row["Aggregate tok/s"]) > 0 and number(row["Per-request tok/s"]) > 0, row
    p50, p95, p99 = (number(row[f"TTFT {p} (ms)"]) for p in ("p50", "p95", "p99"))
    assert 0 < p50 <= p95 <= p99, f"TTFT percentiles out of order in {row}"
    assert 0 < number(row["TPOT p50 (ms)"]) <= number(row["TPOT p95 (ms)"]), row
    # One decimal for tok/s and TTFT, two for TPOT (sub-millisecond on a fast server).
    for column in ("Aggregate tok/s", "Per-request tok/s", "TTFT p50 (ms)", "TTFT p95 (ms)", "TTFT p99 (ms)"):
        assert re.fullmatch(r"\d+\.\d", row[column]), f"{column} formatted as {row[column]!r}"
    for column in ("TPOT p50 (ms)", "TPOT p95 (ms)"):
        assert re.fullmatch(r"\d+\.\d\d", row[column]), f"{column} formatted as {row[column]!r}"


def check_live_row(row: dict) -> None:
    """check_row, but for a current step that has finished no request yet (a busy machine's tab first filled just
    after the step changed, seen in a fresh clone): its measured values are missing ('-'), never 0."""
    if row["Scope"] == "current step" and row["Requests ok"] == "0" and row["Errors"] == "0":
        for column in NUMERIC[2:]:
            assert row[column] == "-", f"{column} of a step with no request yet is {row[column]!r}, not missing"
        return
    check_row(row)


def download(page, link_name: re.Pattern, dest: Path) -> tuple[Path, float, float, float]:
    """Click a link of the Download Data tab and save what the browser downloads.

    Returns (path, wall-clock click, answer, end): the answer is when the download began, i.e. when the server
    had built the file and sent its headers."""
    page.get_by_role("tab", name=re.compile(r"^download data$", re.IGNORECASE)).click()
    began = time.time()
    with page.expect_download(timeout=60_000) as info:
        page.get_by_role("link", name=link_name).click()
    dl = info.value
    answered = time.time()
    assert dl.failure() is None, f"download of {dl.url} failed: {dl.failure()}"
    dl.save_as(dest)
    return dest, began, answered, time.time()


def check_page_log(log) -> None:
    """No JavaScript error (console error or uncaught exception), no request outside the UI's own server."""
    assert not log.errors, f"JavaScript errors in the web UI: {log.errors}"
    assert not log.foreign_requests, f"the web UI requested {log.foreign_requests}"


def silences(records: pd.DataFrame) -> pd.DataFrame:
    """Every interval during which requests were in flight and none of them received a chunk (wall clock):
    (gap_s, from_t, to_t, in_flight). A blocked load generator shows as one such silence as long as the block:
    the chunks the server sent meanwhile are read, and stamped, all at once afterwards."""
    starts = records["start_time"].to_numpy(dtype=float)
    ends = starts + records["duration_s"].fillna(0).to_numpy(dtype=float)
    chunks = [
        s + np.asarray(o if o is not None else [], dtype=float) for s, o in zip(starts, records["chunk_offsets_s"])
    ]
    arrivals = np.sort(np.concatenate([starts, *chunks]))
    rows = []
    for a, b in itertools.pairwise(arrivals):
        in_flight = int(((starts <= a) & (ends >= b)).sum())
        if in_flight:
            rows.append((b - a, a, b, in_flight))
    return pd.DataFrame(rows, columns=["gap_s", "from_t", "to_t", "in_flight"])


# --- the tests --------------------------------------------------------------------------------------------------
def test_web_ui_run_in_chromium(vllm_server, tmp_path):
    """The acceptance path: start form, live LLM tab, downloads of the run so far, the run's own end, results."""
    require_chromium()  # fail at once, before starting anything, when Chromium is missing
    steps, duration_s, warmup_s, max_tokens = "1,4", 12, 2, 32
    started = time.monotonic()
    with locust_web_ui(vllm_server.url, tmp_path) as (url, run_dir, log_path):
        allow = (url + "/",)  # the page may talk to its own server only: not to vLLM, not to the Internet
        with chromium() as browser, open_page(browser, url + "/", allow=allow, viewport=VIEWPORT) as (page, log):
            states = record_states(page)
            form = {"steps": steps, "duration": f"{duration_s}s", "warmup": f"{warmup_s}s", "max_tokens": max_tokens}
            start_run(page, tmp_path, states, **form)

            # The LLM tab fills with numbers, and they move while the run goes on.
            with explained(page, tmp_path / "llm-tab-failed.png", "waiting for the LLM tab's rows", states):
                open_llm_tab(page)
                rows = wait_for_rows(page, has_live_numbers, LIVE_ROWS_TIMEOUT_S, "no row with numbers")
                live_after_s = time.monotonic() - started
                png = screenshot(page, tmp_path / "llm-tab.png", full_page=False)
                first_total = int(rows[-1]["Requests ok"])
                wait_for_rows(
                    page,
                    lambda r: r and number(r[-1]["Requests ok"]) and int(r[-1]["Requests ok"]) > first_total,
                    20,
                    "the whole run's request count did not grow",
                )
                status_while_running = swarm_status(page)
            assert [r["Scope"] for r in rows] == ["current step", "whole run"], rows
            for row in rows:
                check_live_row(row)
            current, whole = rows
            assert current["Step"] in ("0", "1") and current["Users"] in ("1", "4"), current
            assert whole["Step"] == "all" and int(whole["Requests ok"]) >= int(current["Requests ok"]), rows
            # The server's gauges, from the scrapes of vLLM's /metrics during the run.
            assert re.fullmatch(r"\d+%", current["KV cache (latest)"]), current
            # An instant's gauge: 0 when the scrape fell between a user's two requests.
            assert re.fullmatch(r"\d+", current["Running (latest)"]) and int(current["Running (latest)"]) <= 4
            assert re.fullmatch(r"\d+", current["Waiting (latest)"]), current
            assert status_while_running in ("running", "spawning"), status_while_running
            assert png.read_bytes()[:8] == PNG_SIGNATURE and png_size(png) == VIEWPORT, png_size(png)
            assert png.stat().st_size > 20_000, f"{png} is suspiciously small ({png.stat().st_size} bytes)"

            # Downloads of the run so far, from the Download Data tab (Locust lists extended_csv_files there).
            with explained(page, tmp_path / "downloads-failed.png", "downloading from the Download Data tab", states):
                report, t0, _, t1 = download(page, REPORT_LINK, tmp_path / "so-far-report.html")
                report_download_s = t1 - t0
                parquet, *_ = download(page, RECORDS_LINK, tmp_path / "so-far-requests.parquet")
                screenshot(page, tmp_path / "download-tab.png", full_page=False)
            html = report.read_text(encoding="utf-8")
            assert "vllm-loadtest report" in html and "Plotly.newPlot" in html, f"not a full report: {html[:300]!r}"
            data = parquet.read_bytes()
            assert data[:4] == b"PAR1" and data[-4:] == b"PAR1", f"not a Parquet file: {data[:64]!r}"
            so_far = pd.read_parquet(io.BytesIO(data))
            assert len(so_far) > 0 and (so_far["status"] == "ok").any(), so_far.head()

            # The run ends by itself after its two steps; after a reload the tab shows the final numbers.
            with explained(page, tmp_path / "run-end-failed.png", "waiting for the run's end", states):
                open_llm_tab(page)
                wait_for_run_end(url, run_dir, 2 * duration_s + 90, log_path)
                page.wait_for_timeout(3000)  # time for one more poll, should the page still make one
                unreloaded = read_table(page), swarm_status(page)
                screenshot(page, tmp_path / "llm-tab-after-run.png", full_page=False)
                page.reload()
                open_llm_tab(page)
                final_rows = wait_for_rows(page, has_live_numbers, 15, "no final rows after a reload")
                screenshot(page, tmp_path / "llm-tab-final.png", full_page=False)
                final_status = swarm_status(page)
            check_page_log(log)

    # The run directory: what the form asked for, what the downloads and the tab showed.
    table = pd.read_csv(run_dir / STEPS_FILE)
    assert list(table["users"]) == [1, 4], table
    assert (table["requests"] > 0).all() and (table["errors"] == 0).all(), table
    records = pd.read_parquet(run_dir / REQUESTS_FILE)
    ok = records[records["status"] == "ok"]
    assert len(ok) >= (so_far["status"] == "ok").sum() > 0
    assert (ok["output_tokens"] == max_tokens).all(), ok["output_tokens"].value_counts()  # --ignore-eos took
    final_report = (run_dir / REPORT_FILE).read_text(encoding="utf-8")
    assert "vllm-loadtest report" in final_report and "Plotly.newPlot" in final_report
    options = json.loads((run_dir / "run.json").read_text())["options"]
    asked = (form["steps"], form["duration"], form["warmup"])
    assert (options["steps"], options["step_duration"], options["step_warmup"]) == asked, options
    assert options["max_tokens"] == max_tokens and options["ignore_eos"] is True, options

    assert final_status == "stopped", final_status
    by_scope = {r["Scope"]: r for r in final_rows}
    assert list(by_scope) == ["last step", "whole run"], final_rows
    last = table.iloc[-1]
    assert by_scope["last step"]["Step"] == str(int(last["step"])) and by_scope["last step"]["Users"] == "4", by_scope
    assert int(by_scope["last step"]["Requests ok"]) == last["requests"], (by_scope, last.to_dict())
    assert abs(number(by_scope["last step"]["Aggregate tok/s"]) - last["aggregate_tok_s"]) <= 0.051, by_scope
    assert abs(number(by_scope["last step"]["TTFT p50 (ms)"]) - 1000 * last["ttft_p50_s"]) <= 0.051, by_scope
    assert int(by_scope["whole run"]["Requests ok"]) == table["requests"].sum(), (by_scope, table)
    for row in final_rows:
        check_row(row)

    print(
        f"\nLLM rows after {live_after_s:.0f} s; report download {report_download_s:.1f} s; run ended, "
        f"total {time.monotonic() - started:.0f} s; screenshots in {tmp_path}\n"
        f"without a reload after the run: status {unreloaded[1]!r}, scopes {[r['Scope'] for r in unreloaded[0]]}"
    )


class StatsPoller:
    """Polls /stats/requests, as Locust's UI does but every 50 ms, in a thread: (state, LLM rows) of each answer."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.answers: list[tuple[str, list[dict]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = get_json(self.url + "/stats/requests")
            except (urllib.error.URLError, OSError):
                self._stop.wait(0.05)
                continue
            tabs = {t["key"]: t["data"] for t in data.get("extended_stats") or []}
            self.answers.append((data["state"], tabs.get("llm", [])))
            self._stop.wait(0.05)

    def __enter__(self) -> StatsPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(15)


class LoopProbe:
    """Asks Locust's web server for something trivial (/worker-count) every 50 ms, in a thread: (sent, latency).

    The web server runs in the gevent loop that also reads every user's stream: an answer that takes long means
    the whole load generator was blocked for that long."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            sent = time.time()
            try:
                get_json(self.url + "/worker-count")
            except (urllib.error.URLError, OSError):
                pass
            self.samples.append((sent, time.time() - sent))
            self._stop.wait(0.05)

    def __enter__(self) -> LoopProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(15)


def test_llm_tab_after_a_run_that_ended_by_itself(fake_server, tmp_path):
    """When the stepped run ends by itself, the page left open shows the run as finished: "last step" rows, with
    the server's gauges from the last scrape.

    Locust's UI polls /stats/requests only while the state is spawning or running: the first answer saying
    otherwise is the last one the page gets, and its rows stay on screen until a reload. So every answer with
    state "stopped" must carry the finished run's rows. A second client polls as the UI does, but every 50 ms,
    to see each answer of the run's end, not only the one the page happened to get."""
    require_chromium()
    server = fake_server(*FAKE_TIMING)
    with locust_web_ui(server.url, tmp_path) as (url, run_dir, log_path):
        with chromium() as browser, open_page(browser, url + "/", allow=(url + "/",), viewport=VIEWPORT) as (page, log):
            states = record_states(page)
            start_run(page, tmp_path, states, steps="2", duration="6s", warmup="1s", max_tokens=32)
            with (
                explained(page, tmp_path / "run-end-failed.png", "waiting for the run's end", states),
                StatsPoller(url) as polls,
            ):
                open_llm_tab(page)
                wait_for_rows(page, has_live_numbers, LIVE_ROWS_TIMEOUT_S, "no row with numbers")
                wait_for_run_end(url, run_dir, 90, log_path)
                page.wait_for_timeout(3000)  # time for one more poll, should the page still make one
                rows, status = read_table(page), swarm_status(page)
                screenshot(page, tmp_path / "llm-tab-after-run.png", full_page=False)
            check_page_log(log)
    final = [r["scope"] for r in polls.answers[-1][1]]
    assert final == ["last step", "whole run"], polls.answers[-1]
    table = pd.read_csv(run_dir / STEPS_FILE)
    scrapes = pd.read_parquet(run_dir / "metrics.parquet")
    assert len(scrapes) > 0, "the server's /metrics was not scraped"
    assert rows, "the LLM tab is empty after the run"

    problems = []
    if int(rows[0]["Requests ok"]) != table.iloc[-1]["requests"]:
        problems.append(
            f"the open page shows {rows[0]['Requests ok']} requests for the last step, steps.csv "
            f"{int(table.iloc[-1]['requests'])}"
        )
    stale = [(state, [r["scope"] for r in llm]) for state, llm in polls.answers if state == "stopped"]
    stale = [answer for answer in stale if answer[1] != final]
    if stale:
        problems.append(f"{len(stale)} answer(s) of /stats/requests with state 'stopped' carried rows {stale[0][1]}")
    shown = [r["Scope"] for r in rows]
    if shown != final:
        problems.append(f"the open page shows status {status!r} with rows {shown}")
    # README: the server's latest gauges come "from the last scrape; `-` when it failed". The scrapes succeeded (the
    # fake server's /metrics is vLLM's text).
    gauges = {c: rows[0][c] for c in ("KV cache (latest)", "Running (latest)", "Waiting (latest)")}
    if not re.fullmatch(r"\d+%", gauges["KV cache (latest)"]) or "-" in gauges.values():
        problems.append(
            f"after the run the server's gauges read {gauges}, though its /metrics was scraped "
            f"({len(scrapes)} samples)"
        )
    if problems:
        raise StaleLLMTab(
            "the run ended by itself, yet "
            + "; ".join(problems)
            + f" (screenshot {tmp_path / 'llm-tab-after-run.png'})"
        )


def test_downloading_the_report_does_not_stall_the_run(fake_server, tmp_path):
    """A download during a run must not block the load generator, whose chunk timestamps are the measurements.

    Building the report in Locust's own process (pandas + plotly, seconds) blocked its gevent loop: every stream
    in flight got a gap as long as the build (seen: 0.9-3 s of silence in 4 streams while vLLM's decode steps take
    milliseconds). The downloads are now built in a separate process; this keeps it that way."""
    require_chromium()
    server = fake_server(*FAKE_TIMING)
    with locust_web_ui(server.url, tmp_path) as (url, run_dir, log_path):
        with chromium() as browser, open_page(browser, url + "/", allow=(url + "/",), viewport=VIEWPORT) as (page, log):
            states = record_states(page)
            start_run(page, tmp_path, states, steps="4", duration="12s", warmup="1s", max_tokens=64)
            with explained(page, tmp_path / "download-failed.png", "downloading the report during the run", states):
                open_llm_tab(page)
                wait_for_rows(page, has_live_numbers, LIVE_ROWS_TIMEOUT_S, "no row with numbers")
                with LoopProbe(url) as probe:
                    page.wait_for_timeout(2000)  # the probe's baseline
                    _, began, answered, _ = download(page, REPORT_LINK, tmp_path / "so-far-report.html")
                    page.wait_for_timeout(1000)
                wait_for_run_end(url, run_dir, 90, log_path)
            check_page_log(log)
    samples = pd.DataFrame(probe.samples, columns=["sent", "latency_s"])
    samples.assign(began=began, answered=answered).to_csv(tmp_path / "loop-probe.csv", index=False)  # for diagnosis
    during = samples[(samples["sent"] >= began - 0.1) & (samples["sent"] <= answered)]
    before = samples[samples["sent"] < began - 0.1]
    assert len(during) > 0 and len(before) > 0, probe.samples
    blocked = during["latency_s"].max()
    # A trivial request takes milliseconds (tens under load). A blocked loop answers it only after the report is
    # built, i.e. about as late as the download itself answered.
    limit = max(0.3, 0.5 * (answered - began))
    if blocked > limit:
        # What the blocked loop did to the measurements: the longest time the streams in flight received nothing.
        quiet = silences(pd.read_parquet(run_dir / REQUESTS_FILE))
        overlap = quiet[(quiet["to_t"] > began) & (quiet["from_t"] < answered)]
        streams = (
            f"{int(overlap.loc[overlap['gap_s'].idxmax(), 'in_flight'])} stream(s) in flight received nothing for "
            f"{overlap['gap_s'].max():.3f} s"
            if len(overlap)
            else "no stream was in flight"
        )
        raise LoadGeneratorStalled(
            f"during the report download (answered after {answered - began:.2f} s), Locust's web server took "
            f"{blocked:.2f} s to answer /worker-count (before the download: at most "
            f"{before['latency_s'].max():.3f} s): the gevent loop that reads the streams was blocked, {streams}, "
            "so those requests' ITL, TPOT and E2E include the download"
        )
