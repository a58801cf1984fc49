"""Trace replay (--trace) end to end: real `locust` processes replaying trace files against the fake server, which
answers each request with exactly its max_tokens tokens and records when it received it (GET /truth).

Every row must be sent once, at its offset from the replay's start (intended_start_time exact, the actual send a
little later), with max_tokens = its output length; the run ends by itself after the last row's answer; two
workers split the rows without overlap; bad input stops the run with one line, exit code 3 and nothing sent.
Timing tolerances are generous (a shared 2-core machine): the schedule's error is bounded loosely, not measured.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from vllm_loadtest.analysis.run import STEPS_FILE, SUMMARY_FILE

from tests.helpers.badinput import first_error
from tests.helpers.runs import cluster, locust, wait_until
from tests.helpers.servers import FakeServer

FAST = ["--ttft-ms", "15", "--itl-ms", "2"]


def write_trace(path: Path, n: int, seed: int = 1, max_gap_ms: int = 100, shared: bool = True) -> list[dict]:
    """A Mooncake-format trace of `n` rows: gaps of 0..max_gap_ms (some rows at the same time), short prompts and
    answers; rows share their first hash_id block."""
    rng = random.Random(seed)
    rows, t = [], 1_000  # a trace's clock need not start at 0: offsets count from its first row
    for i in range(n):
        t += rng.choice([0, rng.randint(1, max_gap_ms)])
        blocks = [0, 1 + i % 4] if shared else [100 + i]
        rows.append(
            {
                "timestamp": t,
                "input_length": rng.randint(20, 60),
                "output_length": rng.randint(2, 16),
                "hash_ids": blocks,
            }
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def offsets(rows: list[dict], start_s: float = 0.0, speed: float = 1.0) -> np.ndarray:
    first = rows[0]["timestamp"] / 1000
    return np.array([(r["timestamp"] / 1000 - first - start_s) / speed for r in rows])


def replay(server, run_dir: Path, trace: Path, *args: str, report: bool = False, timeout: int = 120):
    proc = locust(
        "--host", server.url, "--trace", str(trace), "--trace-block-tokens", "16", "--step-warmup", "0s",
        "--run-dir", str(run_dir), *([] if report else ["--no-report"]), *args, timeout=timeout,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = pd.read_parquet(run_dir / "requests.parquet")
    run = json.loads((run_dir / "run.json").read_text())
    return proc, records, run


@pytest.mark.contract
def test_every_row_is_sent_once_at_its_offset_with_its_output_length_and_the_run_ends_by_itself(fake_server, tmp_path):
    server = fake_server(*FAST)
    trace = tmp_path / "trace.jsonl"
    rows = write_trace(trace, 80)
    proc, records, run = replay(
        server, tmp_path / "r", trace, "--step-duration", "1s", "--max-users", "30", report=True
    )

    # Every row once, and nothing else.
    assert sorted(records["trace_row"].tolist()) == list(range(len(rows)))
    assert (records["status"] == "ok").all(), records["error"].dropna().unique()
    records = records.sort_values("trace_row").reset_index(drop=True)
    # Its intended send time is the replay's start plus its offset (exactly: both are computed), ...
    start = run["timeline"][0]["start_time"]
    intended = records["intended_start_time"].to_numpy() - start
    assert intended == pytest.approx(offsets(rows), abs=1e-4)
    # ... it is sent at that time or a little later (never before), and the server received it then.
    lag = records["schedule_lag_s"].to_numpy()
    assert (lag > -0.002).all()
    assert np.percentile(lag, 50) < 0.02 and np.percentile(lag, 99) < 0.1, np.percentile(lag, [50, 99, 100])
    truth = server.get("/truth")
    received = np.array([truth[i]["recv_wall"] for i in records["request_id"]]) - records["intended_start_time"]
    assert np.percentile(received, 99) < 0.1
    # max_tokens is the row's output length, and the fake server answered exactly that many tokens.
    expected = np.array([r["output_length"] for r in rows])
    assert (records["max_tokens"].to_numpy() == expected).all()
    assert (records["output_tokens"].to_numpy() == expected).all()
    assert sorted(p["max_tokens"] for p in server.get("/prompts")["prompts"]) == sorted(expected.tolist())
    # The prompts have the row's input length (the fake server's /tokenize counts words, as its usage does).
    assert (records["prompt_tokens"].to_numpy() == np.array([r["input_length"] for r in rows])).all()

    # The run ended by itself, soon after the last answer: its last window closed as "fixed", not stopped.
    timeline = run["timeline"]
    last_answer = float((records["start_time"] + records["duration_s"]).max())
    assert timeline[-1]["end_reason"] == "fixed"
    assert last_answer <= timeline[-1]["end_time"] < last_answer + 3.0
    # Steps are consecutive 1 s windows of the replay, each at its rows per second.
    span = offsets(rows)[-1]
    assert [t["step"] for t in timeline] == list(range(int(span // 1) + 1))
    for k, entry in enumerate(timeline):
        assert entry["start_time"] == pytest.approx(start + k, abs=1e-6)
        lo, hi = entry["trace_window"]
        in_window = int(((offsets(rows) >= lo) & (offsets(rows) < hi)).sum()) if k < len(timeline) - 1 else None
        if in_window is not None:
            assert entry["trace_rows"] == in_window
            assert entry["rate_rps"] == pytest.approx(in_window / (hi - lo))
        assert (records["step"] == k).sum() == entry["trace_rows"]
    last = timeline[-1]  # measured until the run ended: its rate is over that time, as its achieved_rps
    assert last["rate_rps"] == pytest.approx(last["trace_rows"] / (last["end_time"] - last["start_time"]))
    assert sum(t["trace_rows"] for t in timeline) == len(rows)
    steps = pd.read_csv(tmp_path / "r" / STEPS_FILE)
    assert list(steps["rate_rps"]) == pytest.approx([t["rate_rps"] for t in timeline])
    assert (steps["users"] == 30).all()
    assert "Open loop" in proc.stdout
    # run.json and summary.json say what was replayed.
    summary = json.loads((tmp_path / "r" / SUMMARY_FILE).read_text())
    for entry in (run["trace"], summary["trace"]):
        assert entry["path"] == str(trace) and entry["format"] == "mooncake" and entry["rows"] == len(rows)
        assert entry["speed"] == 1.0 and entry["start_s"] == 0.0 and entry["duration_s"] is None
    assert summary["trace"]["rows_sent"] == summary["trace"]["rows_ok"] == len(rows)
    assert 0 < run["trace"]["ideal_prefix_hit_rate"] < 1  # its rows share their first block
    # Its windows are read as the trace's load over time, not as a sweep: no knee is claimed.
    diagnosis = proc.stdout.split("Diagnosis:")[-1]
    assert summary["diagnosis"]["knee_step"] is None and "knee lies" not in diagnosis and "No knee" not in diagnosis
    assert "no knee is looked for" in diagnosis
    # The report shows the windows as steps (its per-step charts are the trace's load over time).
    html = (tmp_path / "r" / "report.html").read_text()
    assert "plotly" in html.lower() and "req/s" in html


@pytest.mark.contract
def test_a_slice_of_the_trace_replayed_faster(fake_server, tmp_path):
    server = fake_server(*FAST)
    trace = tmp_path / "trace.jsonl"
    rows = write_trace(trace, 160, seed=2, max_gap_ms=80)  # ~6 s of trace
    full = offsets(rows)
    start_s, duration_s, speed = 1.0, 3.0, 2.0
    chosen = [i for i, t in enumerate(full) if start_s <= t < start_s + duration_s]
    _, records, run = replay(
        server, tmp_path / "r", trace, "--trace-start", "1s", "--trace-duration", "3", "--trace-speed", "2",
        "--step-duration", "0.5", "--max-users", "20",
    )  # fmt: skip
    assert sorted(records["trace_row"].tolist()) == chosen
    records = records.sort_values("trace_row")
    start = run["timeline"][0]["start_time"]
    expected = (full[chosen] - start_s) / speed
    assert records["intended_start_time"].to_numpy() - start == pytest.approx(expected, abs=1e-4)
    # The windows are 0.5 s of replay time (1 s of the trace at speed 2), up to the last row's.
    assert [t["step"] for t in run["timeline"]] == list(range(int(expected[-1] // 0.5) + 1))
    assert sum(t["trace_rows"] for t in run["timeline"]) == len(chosen)
    assert run["trace"]["rows"] == len(chosen) and run["trace"]["span_s"] == pytest.approx(1.5)
    assert run["trace"]["speed"] == 2.0 and run["trace"]["start_s"] == 1.0 and run["trace"]["duration_s"] == 3.0


@pytest.mark.contract
def test_run_time_stops_a_chat_replay_before_its_end(fake_server, tmp_path):
    server = fake_server(*FAST)
    trace = tmp_path / "trace.jsonl"
    rows = write_trace(trace, 100, max_gap_ms=400)  # ~10 s of trace
    proc, records, run = replay(
        server, tmp_path / "r", trace, "--step-duration", "1s", "-t", "4s", "--max-users", "8", "--endpoint", "chat",
        "--ignore-eos",
    )  # fmt: skip
    assert 0 < len(records) < len(rows)
    assert records["trace_row"].is_unique
    assert run["timeline"][-1]["end_reason"] == "run_stopped"
    assert "--run-time" in proc.stderr
    # On the chat endpoint each row is one user message of its input length (the chat template counted).
    sent = server.get("/prompts")["prompts"]
    assert all(p["prompt"] is None and p["messages"][0]["role"] == "user" for p in sent)
    ok = records[records["status"] == "ok"]
    assert (ok["prompt_tokens"].to_numpy() == np.array([rows[i]["input_length"] for i in ok["trace_row"]])).all()


@pytest.mark.contract
def test_rows_due_while_the_pool_is_busy_are_sent_late_never_skipped(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "100", "--itl-ms", "1")  # ~110 ms a request: 3 users serve ~27 rows/s
    trace = tmp_path / "burst.jsonl"
    # 30 rows at one instant, then 10 spread over a second: a burst the pool of 3 cannot send on time.
    rows = [{"timestamp": 0, "input_length": 20, "output_length": 4, "hash_ids": [i]} for i in range(30)]
    rows += [{"timestamp": 1000 + 100 * i, "input_length": 20, "output_length": 4, "hash_ids": [99]} for i in range(10)]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc, records, _ = replay(server, tmp_path / "r", trace, "--step-duration", "1s", "--max-users", "3")
    assert sorted(records["trace_row"].tolist()) == list(range(len(rows)))  # all sent, once
    burst = records[records["trace_row"] < 30].sort_values("start_time")
    lag = burst["schedule_lag_s"].to_numpy()
    assert lag[-1] > 0.6 and lag[-1] > lag[0] + 0.5  # the last of the burst waited for ten rounds of the pool
    assert (records["status"] == "ok").all()
    assert "BEHIND" in proc.stdout


@pytest.mark.contract
def test_two_workers_send_each_row_exactly_once(fake_server, tmp_path):
    server = fake_server(*FAST)
    trace = tmp_path / "trace.jsonl"
    rows = write_trace(trace, 60, seed=3, max_gap_ms=80)
    run_dir = tmp_path / "r"
    args = ["--trace", str(trace), "--trace-block-tokens", "16", "--step-duration", "1s", "--step-warmup", "0s",
            "--max-users", "20", "--run-dir", str(run_dir), "--no-report"]  # fmt: skip
    with cluster(tmp_path, 2, server.url, *args) as (master, workers):
        assert master.wait(timeout=120) == 0, (tmp_path / "master.log").read_text()[-3000:]
        assert wait_until(lambda: all(w.poll() is not None for w in workers), 30)
    records = pd.read_parquet(run_dir / "requests.parquet")
    assert sorted(records["trace_row"].tolist()) == list(range(len(rows)))
    assert records["worker"].nunique() == 2
    # The server saw each row's request once: as many requests as rows, every id of the records.
    truth = server.get("/truth")
    assert len(truth) == len(rows) and set(truth) == set(records["request_id"])
    run = json.loads((run_dir / "run.json").read_text())
    start = run["timeline"][0]["start_time"]
    records = records.sort_values("trace_row")
    # Each at its time: a row's intended time is its worker's receipt of the begin message + the row's offset. The
    # receipt lags the timeline's start by the message's trip (56 ms once on a busy machine), so each worker's rows
    # are checked against that worker's own start, exactly, and the starts only for their order.
    expected = pd.Series(offsets(rows), index=records.index)
    base = records["intended_start_time"] - expected
    for worker, own in base.groupby(records["worker"]):
        assert own.max() - own.min() < 1e-3, (worker, own.describe())  # one start per worker: every row on time
        assert own.min() >= start - 1e-3, (worker, own.min() - start)  # never before the begin was sent
    assert run["timeline"][-1]["end_reason"] == "fixed"
    assert run["trace"]["rows"] == len(rows) and run["trace"]["prompts"]["tokenizer"] == "/tokenize"


# --- bad input: one line, exit code 3, nothing sent ----------------------------------------------------------
@pytest.fixture(scope="module")
def server():
    """One fake server for the in-process cases: none of them may send it a completion."""
    server = FakeServer([])
    yield server
    assert server.get("/truth") == {} and server.get("/stats")["requests"] == 0
    server.stop()


@pytest.fixture(scope="module")
def good_trace(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("trace") / "trace.jsonl"
    write_trace(path, 10)
    return path


@pytest.mark.unit
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--rates", "2"], "drop --rates 2"),
        (["--find-capacity", "rate", "--slo", "ttft_p95=1s"], "drop --find-capacity rate"),
        (["--turns", "3"], "drop --turns 3"),
        (["--steps", "1,2"], "drop --steps 1,2"),
        (["--step-duration", "auto"], "--step-duration auto does not apply to --trace"),
        (["--dataset", "synthetic:8"], "drop --dataset synthetic:8"),
        (["--max-tokens-dist", "uniform:1:4"], "drop --max-tokens-dist"),
        (["--trace-speed", "0"], "--trace-speed 0.0 must be positive"),
        (["--trace-speed", "-1"], "must be positive"),
        (["--trace-start", "soon"], "--trace-start 'soon' is not a duration"),
        (["--trace-duration", "0s"], "--trace-duration '0s' must be positive"),
        (["--trace-block-tokens", "0"], "--trace-block-tokens 0 must be at least 1"),
        (["--trace-start", "1h"], "selects no row"),
        (["--max-users", "0"], "--max-users 0 must be at least 1"),
        # The trace of 10 rows spans well under 5 s: the default warm-up would leave nothing measured.
        (["--step-warmup", "5s"], "--step-warmup 5s covers the replay's whole first window"),
    ],
)
def test_bad_trace_options_are_refused_before_any_load(server, good_trace, tmp_path, args, expected):
    line = first_error("--host", server.url, "--trace", str(good_trace), *args, "--run-dir", str(tmp_path / "r"))
    assert expected in line, line


@pytest.mark.unit
def test_trace_flags_without_a_trace_are_refused(server, tmp_path):
    line = first_error("--host", server.url, "--trace-speed", "2", "--run-dir", str(tmp_path / "r"))
    assert "--trace-speed 2.0 only applies with --trace" in line


@pytest.mark.unit
@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (
            '{"timestamp": 0, "input_length": 8, "output_length": 4, "hash_ids": [1]}\n{"timestamp": 5,\n',
            ":2: not JSON",
        ),
        ("", "is empty"),
        ("hello\n", "not a known trace format"),
    ],
    ids=["bad-line", "empty", "unknown-format"],
)
def test_a_bad_trace_file_is_named_with_its_line(server, tmp_path, content, expected):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    line = first_error("--host", server.url, "--trace", str(path), "--run-dir", str(tmp_path / "r"))
    assert expected in line and "bad.jsonl" in line, line


@pytest.mark.unit
def test_a_missing_trace_file_is_named(server, tmp_path):
    line = first_error("--host", server.url, "--trace", str(tmp_path / "nope.jsonl"), "--run-dir", str(tmp_path / "r"))
    assert "nope.jsonl" in line, line


@pytest.mark.contract
def test_a_run_with_a_bad_trace_line_stops_with_one_line_exit_3_and_nothing_sent(fake_server, tmp_path):
    server = fake_server()
    path = tmp_path / "bad.jsonl"
    write_trace(path, 5)
    path.write_text(path.read_text() + '{"timestamp": 9999, "input_length": "many", "output_length": 4}\n')
    proc = locust("--host", server.url, "--trace", str(path), "--run-dir", str(tmp_path / "r"))
    assert proc.returncode == 3, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "bad.jsonl:6" in errors[0], proc.stderr[-2000:]
    assert server.get("/truth") == {} and server.get("/stats")["requests"] == 0


@pytest.mark.unit
def test_a_trace_replay_is_diagnosed_per_window_without_a_knee():
    """A trace's windows are its own load over time, not a sweep: the same table read as a rate curve has a knee
    (and the disturbed window is an outlier), read as a replay only the windows' own verdicts (saturation)."""
    from vllm_loadtest.analysis.diagnosis import diagnose

    t = pd.DataFrame({"step": [0, 1, 2, 3, 4], "users": [100] * 5, "rate_rps": [1.0, 2.0, 4.0, 8.0, 3.0],
                      "aggregate_tok_s": [100.0, 200.0, 400.0, 410.0, 150.0],
                      "kv_cache_usage_max": [0.1, 0.2, 0.6, 1.0, 0.3], "waiting_mean": [0, 0, 0, 12.0, 0],
                      "waiting_max": [0, 0, 0, 20, 0], "preemptions": [0, 0, 0, 0, 0]})  # fmt: skip
    assert diagnose(t).knee_step is not None
    d = diagnose(t, curve=False)
    assert d.knee_step is None and d.knee_range is None and d.outlier_steps == [] and d.unstable_steps == []
    assert d.saturated_step == 3 and d.saturated_rate_rps == 8.0
    text = "\n".join(d.text)
    assert "knee is looked for" in d.text[0]  # said, so an empty diagnosis does not read as "nothing found"
    assert "knee lies" not in text and "No knee" not in text and "past its batch limit" in text


@pytest.mark.unit
def test_the_plan_holds_a_trace_s_rows_in_windows_each_slot_carrying_its_row():
    """OpenLoopPlan.begin_trace: slots in time order, each with its row (position), its window (step) and its
    intended time; --step-warmup in the first window only; late rows are still taken; the callback fires once the
    last row is answered, at once for a process without rows."""
    from vllm_loadtest.locustfiles.openloop import OpenLoopPlan
    from vllm_loadtest.locustfiles.trace_run import windows

    offsets_all = np.array([0.0, 0.2, 0.2, 0.9, 1.0, 1.5, 2.4, 2.5])
    wins = windows(offsets_all, 2.5, 1.0)
    assert wins == [(0.0, 1.0, 4), (1.0, 2.0, 2), (2.0, 2.5, 2)]  # the last window closed: it holds the last row
    positions = np.arange(1, 8, 2)  # rank 1 of 2
    plan, done = OpenLoopPlan(), []
    plan.on_trace_done = lambda: done.append(True)
    plan.begin_trace(offsets_all[positions], positions, wins, 1.0, users=10, warmup_s=0.5, now=100.0, now_wall=1e9)
    slots = [plan.take() for _ in positions]
    assert plan.take() is None
    assert [s.position for s in slots] == [1, 3, 5, 7]
    assert [s.step for s in slots] == [0, 0, 1, 2]
    assert [s.intended for s in slots] == pytest.approx(100.0 + offsets_all[positions])
    assert [s.intended_wall for s in slots] == pytest.approx(1e9 + offsets_all[positions])
    assert [s.warmup for s in slots] == [True, False, False, False]  # 0.2 < 0.5 in window 0; none later
    assert [s.segment.rate_rps for s in slots] == [4.0, 4.0, 2.0, 4.0]  # rows / window length (0.5 s for the last)
    assert all(s.users == 10 and s.valid() for s in slots)
    for _ in positions[:-1]:
        plan.answer()
    assert not done and not plan.trace_done
    plan.answer()
    assert done == [True] and plan.trace_done
    # A process with no row is done at once.
    empty, empty_done = OpenLoopPlan(), []
    empty.on_trace_done = lambda: empty_done.append(True)
    empty.begin_trace(np.array([]), np.array([], dtype=np.int64), wins, 1.0, users=1, warmup_s=0.0)
    assert empty_done == [True] and empty.take() is None


@pytest.mark.unit
def test_stopping_a_replay_ends_every_window():
    """plan.finish(): the rows not yet due belong to no step any more (a waiting user stops), in every window."""
    from vllm_loadtest.locustfiles.openloop import OpenLoopPlan
    from vllm_loadtest.locustfiles.trace_run import windows

    offsets_all = np.array([0.0, 1.5, 2.5, 3.5])
    plan = OpenLoopPlan()
    plan.begin_trace(offsets_all, np.arange(4), windows(offsets_all, 3.5, 1.0), 1.0, users=2, warmup_s=0.0, now=0.0)
    first = plan.take()
    second = plan.take()
    plan.finish(now=1.0)
    assert first.valid() and not second.valid()  # 0.0 was due before the stop, 1.5 was not
    assert plan.overdue(now=10.0) == 0  # nothing after the stop is counted as missed
