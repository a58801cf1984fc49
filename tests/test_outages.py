"""analysis/outages.py: the spans in which the server refused connections, found in synthetic records with known
answers; the closed loop's backoff schedule; the diagnosis lines, summary.json and the report of a run directory
that holds an outage (analysis.finish on files, no Locust)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from vllm_loadtest.analysis.finish import finish_run
from vllm_loadtest.analysis.outages import (
    BACKOFF_MAX_S,
    BACKOFF_MIN_S,
    OUTAGE_MIN_S,
    find_outages,
    next_backoff,
    outage_lines,
    refused,
)
from vllm_loadtest.analysis.records import RequestRecord

from tests.helpers.records import frame, rec

pytestmark = pytest.mark.unit

T0 = 1000.0
REFUSED = "ConnectionRefusedError: [Errno 111] Connection refused"
RESET = "ConnectionResetError: [Errno 104] Connection reset by peer"


def ok(i, t, users=4, duration=0.2) -> dict:
    r = rec(i, 0, users, T0 + t, 0.01, 5, 0.01, duration=duration)
    r["http_status"] = 200
    return r


def refusal(i, t, users=4, error=REFUSED, intended=None) -> dict:
    r = rec(i, 0, users, T0 + t, 0.01, 1, 0.01, status="error", error_type="connection_error", duration=0.0002)
    r["error"] = error
    r["intended_start_time"] = intended
    return r


def backoff_times(start: float, end: float, users: int = 4) -> list[float]:
    """When `users` closed-loop users backing off (10 ms doubling to 1 s) attempt between start and end."""
    times = []
    for _ in range(users):
        t, wait = start, 0.0
        while t < end:
            times.append(t)
            wait = next_backoff(wait, True)
            t += wait
    return sorted(times)


def steady(start: float, end: float, every: float = 0.25) -> list[float]:
    n = int((end - start) / every)
    return [start + k * every for k in range(n)]


def records(*rows_lists) -> pd.DataFrame:
    rows = [r for rows in rows_lists for r in rows]
    for i, r in enumerate(rows):
        r["request_id"] = f"r{i}"
    return frame(rows)


def test_backoff_doubles_from_10_ms_to_1_s_and_any_answer_resets_it():
    waits, w = [], 0.0
    for _ in range(10):
        w = next_backoff(w, True)
        waits.append(w)
    assert waits[:7] == pytest.approx([0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64])
    assert waits[7:] == [BACKOFF_MAX_S] * 3 and waits[0] == BACKOFF_MIN_S
    assert next_backoff(1.0, False) == 0.0 and next_backoff(0.0, False) == 0.0
    # A refusal is a connection error without any answer; a reset mid-stream (status 200) or an HTTP error is not.
    assert refused("connection_error", None)
    assert not refused("connection_error", 200) and not refused("http_503", 503) and not refused("timeout", None)


def test_an_outage_to_the_end_of_the_run():
    rows = records(
        [ok(i, t) for i, t in enumerate(steady(0, 6))],
        [refusal(i, t) for i, t in enumerate(backoff_times(6.1, 15))],
    )
    (outage,) = find_outages(rows, T0)
    assert outage.start_s == pytest.approx(6.1, abs=1e-3) and outage.to_end
    assert outage.attempts == len(backoff_times(6.1, 15)) and outage.refused == outage.attempts
    assert outage.users == 4 and not outage.open_loop
    (line,) = outage_lines([outage])
    start = f"The server refused connections from 6.1 s to the end of the run ({outage.attempts} attempts"
    assert line.startswith(start)
    assert "4 users backing off" in line and "not how it performs" in line
    assert "the last record so far" in outage_lines([outage], ended=False)[0]


def test_an_outage_in_the_middle_ends_at_the_last_refusal():
    rows = records(
        [ok(i, t) for i, t in enumerate(steady(0, 6))],
        [refusal(i, t) for i, t in enumerate(backoff_times(6.1, 9.3))],
        [ok(i, t) for i, t in enumerate(steady(9.4, 15))],
    )
    (outage,) = find_outages(rows, T0)
    last = max(backoff_times(6.1, 9.3))
    assert not outage.to_end and outage.end_s == pytest.approx(last, abs=1e-3)
    assert f"from 6.1 s to {last:.1f} s (" in outage.text()


def test_scattered_refusals_between_answers_are_not_an_outage():
    oks = [ok(i, t) for i, t in enumerate(steady(0, 15))]
    # A refusal now and then (a full accept queue), even three in a row within a few ms, is not an outage.
    blips = [refusal(i, t) for i, t in enumerate([2.0, 5.0, 8.0, 8.005, 8.01, 11.0])]
    assert find_outages(records(oks, blips), T0) == []
    # Without any refusal there is nothing to say; a run without records neither.
    assert find_outages(records(oks), T0) == [] and find_outages(records(), T0) == []


def test_a_short_span_matters_only_when_nothing_answered_after_it():
    oks = [ok(i, t) for i, t in enumerate(steady(0, 10))]
    brief = backoff_times(5.0, 5.5)  # half a second, well under OUTAGE_MIN_S
    assert max(brief) - min(brief) < OUTAGE_MIN_S and len(brief) >= 3
    assert find_outages(records(oks, [refusal(i, t) for i, t in enumerate(brief)]), T0) == []
    # The same half second at the end of the run: the server was still down when the run ended.
    (outage,) = find_outages(records(oks, [refusal(i, t) for i, t in enumerate(backoff_times(10.0, 10.5))]), T0)
    assert outage.to_end


def test_http_errors_are_answers_and_timeouts_or_cut_offs_neither_count_nor_break():
    refusals = [refusal(i, t) for i, t in enumerate(backoff_times(3.0, 8.0))]
    busy = rec(0, 0, 4, T0 + 5.0, 0.01, 1, 0.01, status="error", error_type="http_503", duration=0.001)
    busy["http_status"] = 503
    (first, second) = find_outages(records([ok(0, 0.0)], refusals, [busy]), T0)
    assert first.end_s < 5.0 < second.start_s  # the 503 came from a server that was up
    stalled = rec(0, 0, 4, T0 + 4.0, 0.01, 1, 0.01, status="error", error_type="timeout", duration=2.0)
    cut = rec(0, 0, 4, T0 + 5.0, 0.01, 1, 0.01, status="error", error_type="cut_off", duration=0.5)
    (outage,) = find_outages(records([ok(0, 0.0)], refusals, [stalled, cut]), T0)
    assert outage.attempts == len(refusals)


def test_resets_and_the_open_loop_are_named_as_such():
    resets = [refusal(i, t, error=RESET) for i, t in enumerate(backoff_times(2.0, 6.0))]
    (outage,) = find_outages(records([ok(0, 0.0)], resets), T0)
    assert outage.refused == 0 and "reset connections before answering" in outage.text()
    mixed = [refusal(0, 1.9, error=RESET), *[refusal(i, t) for i, t in enumerate(backoff_times(2.0, 6.0))]]
    assert "refused or reset connections" in find_outages(records([ok(0, 0.0)], mixed), T0)[0].text()
    scheduled = [refusal(i, 2.0 + i * 0.1, intended=T0 + 2.0 + i * 0.1) for i in range(40)]
    (outage,) = find_outages(records([ok(0, 0.0)], scheduled), T0)
    assert outage.open_loop and outage.users is None and outage.attempts == 40
    assert "sent on schedule, not backed off" in outage.text()


def test_offsets_count_from_the_first_record_without_a_start_time():
    rows = records([ok(0, 1.0)], [refusal(i, t) for i, t in enumerate(backoff_times(4.0, 8.0))])
    assert find_outages(rows, None)[0].start_s == pytest.approx(3.0, abs=1e-3)


def test_the_end_of_a_run_says_it_in_the_console_summary_and_report(tmp_path):
    """A run directory with an outage: the diagnosis lines hold it (after the diagnosis, before the worker lines),
    summary.json lists it, summary.md and the report's Diagnosis section show it; the exit verdict is unchanged."""
    from vllm_loadtest.analysis.records import RecordWriter

    rows = [ok(i, t) for i, t in enumerate(steady(0.5, 6))]
    rows += [refusal(i, t) for i, t in enumerate(backoff_times(6.1, 15))]
    writer = RecordWriter(tmp_path / "records" / "local.jsonl")
    for i, r in enumerate(rows):
        writer.write(RequestRecord(**{**r, "request_id": f"r{i}"}))
    writer.close()
    timeline = [{"step": 0, "users": 4, "start_time": T0, "measure_start": T0, "end_time": T0 + 15}]
    run = {"started_at": T0, "finished_at": T0 + 15, "timeline": timeline, "options": {"max_error_rate": "0"}}
    run["workers"] = [{"worker": "w9", "client_id": "c9", "connected_at": T0, "missing_at": T0 + 7}]
    (tmp_path / "run.json").write_text(json.dumps(run))
    console: list[str] = []
    outcome = finish_run(tmp_path, echo=console.append)
    line = outcome.diagnosis_lines[len(outcome.diagnosis.text)]
    assert line.startswith("The server refused connections from 6.1 s to the end of the run")
    assert outcome.diagnosis_lines[-1].startswith("Worker w9 went missing")
    assert line in "\n".join(console) and line in (tmp_path / "summary.md").read_text()
    summary = json.loads((tmp_path / "summary.json").read_text())
    (entry,) = summary["outages"]
    assert entry["start_s"] == pytest.approx(6.1, abs=1e-3) and entry["to_end"]
    assert entry["attempts"] == len(backoff_times(6.1, 15)) == summary["errors"]["connection_error"]
    page = (tmp_path / "report.html").read_text()
    diagnosis = page[page.index("<h2>Diagnosis</h2>") : page.index("</ul>", page.index("<h2>Diagnosis</h2>"))]
    assert "refused connections from 6.1 s" in diagnosis
    workers = page[page.index("<h2>Workers</h2>") :]
    assert "refused connections" not in workers[: workers.index("</ul>")]  # only the worker lines there
    assert outcome.errors_over_limit  # errors over --max-error-rate still fail the run


def test_users_backing_off_from_a_refused_port_stop_at_once(tmp_path):
    """In process, against a port nobody listens on: a few attempts a second, each a record, not a tight loop; and
    a user in its 1 s backoff is stopped at once even with a stop timeout (it waits as Locust's waiting state)."""
    import socket
    import time

    import gevent
    from locust.env import Environment
    from locust.event import Events
    from vllm_loadtest.analysis.records import load_records
    from vllm_loadtest.locustfiles import plugin
    from vllm_loadtest.locustfiles.openai_user import OpenAIStreamingUser

    from tests.helpers.inprocess import parse_options

    class User(OpenAIStreamingUser):
        pass

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    host = f"http://127.0.0.1:{s.getsockname()[1]}"
    s.close()  # nothing listens there now
    opts = parse_options("--host", host, "--run-dir", str(tmp_path), "--headless", "--model", "m")
    env = Environment(user_classes=[User], events=Events(), parsed_options=opts, host=host)
    env.stop_timeout = 30  # a user busy in its task would get this long to finish it
    runner = env.create_local_runner()
    stopped: list[float] = []  # when test_stop fired: the users are gone (registered first: before the results)
    env.events.test_stop.add_listener(lambda **_kw: stopped.append(time.monotonic()))
    plugin.register(env)
    runner.start(2, spawn_rate=100)
    # Both users reach the 1 s cap at 1.27 s and next try at 2.27 s: stopped at 2.4 s, most of that wait is left.
    gevent.sleep(2.4)
    began = time.monotonic()
    runner.stop()
    runner.quit()
    stopping = stopped[0] - began
    records = load_records(tmp_path)
    assert (records["error_type"] == "connection_error").all() and records["http_status"].isna().all()
    # 2 users x (8 attempts by 1.27 s, then one at 2.27 s): 18; a tight loop made thousands.
    assert 2 * 7 <= len(records) <= 2 * (9 + 2), len(records)
    assert stopping < 0.5, stopping  # not the rest of a 1 s backoff, nor the 30 s stop timeout
