"""Open-loop load (--rates): the arrival times, the per-process plan, the step columns, the verdict and the
diagnosis. Pure: no Locust run, no server (the real runs are in tests/test_openloop_run.py)."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from vllm_loadtest.analysis import glossary
from vllm_loadtest.analysis.batch import BATCH_COLUMNS
from vllm_loadtest.analysis.diagnosis import diagnose
from vllm_loadtest.analysis.reasoning import REASONING_COLUMNS
from vllm_loadtest.analysis.schedule import (
    OPEN_LOOP_COLUMNS,
    arrival_times,
    format_open_loop,
    is_behind,
    lag_bound_s,
    parse_rates,
)
from vllm_loadtest.analysis.steps import UNCERTAINTY_COLUMNS, format_table, step_table
from vllm_loadtest.locustfiles.openloop import OpenLoopPlan

from tests.helpers.records import frame, rec

pytestmark = pytest.mark.unit


def take(iterator, n):
    return list(itertools.islice(iterator, n))


# --- arrival times --------------------------------------------------------------------------------------------
def test_constant_arrivals_are_evenly_spaced():
    assert take(arrival_times(4.0, "constant", 0), 5) == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0])


def test_constant_arrivals_of_several_processes_interleave_into_the_whole_rate():
    shares = [take(arrival_times(6.0, "constant", 0, rank=r, processes=3), 4) for r in range(3)]
    for share in shares:  # each process: evenly spaced at rate / processes
        assert np.diff(share) == pytest.approx([0.5] * 3)
    together = sorted(t for share in shares for t in share)
    assert np.diff(together) == pytest.approx([1 / 6] * 11)


def test_poisson_arrivals_have_the_rate_and_exponential_gaps():
    times = np.array(take(arrival_times(5.0, "poisson", 42), 20000))
    gaps = np.diff(times, prepend=0.0)
    assert (gaps > 0).all()
    assert 1 / gaps.mean() == pytest.approx(5.0, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)  # exponential: coefficient of variation 1


def test_poisson_arrivals_are_reproducible_from_the_seed():
    assert take(arrival_times(3.0, "poisson", 7), 50) == take(arrival_times(3.0, "poisson", 7), 50)
    assert take(arrival_times(3.0, "poisson", 7), 50) != take(arrival_times(3.0, "poisson", 8), 50)
    # Two processes of one run draw different streams, each at half the rate.
    a = take(arrival_times(8.0, "poisson", 7, rank=0, processes=2), 4000)
    b = take(arrival_times(8.0, "poisson", 7, rank=1, processes=2), 4000)
    assert a != b and 4000 / a[-1] == pytest.approx(4.0, rel=0.06)


@pytest.mark.parametrize("text", ["", "0", "1,-2", "fast", "1,nan", "inf"])
def test_bad_rates(text):
    with pytest.raises(ValueError, match="--rates"):
        parse_rates(text)


def test_rates_parse():
    assert parse_rates("0.5, 1,2,4") == [0.5, 1.0, 2.0, 4.0]


def test_rates_and_steps_are_alternatives():
    from vllm_loadtest.locustfiles import options as options_mod

    from tests.helpers.inprocess import parse_options

    with pytest.raises(ValueError, match="--rates 1,2 and --steps 4 are alternatives"):
        options_mod.check(parse_options("--rates", "1,2", "--steps", "4"))
    with pytest.raises(ValueError, match="--max-users"):
        options_mod.check(parse_options("--rates", "1,2", "--max-users", "0"))
    options_mod.check(parse_options("--rates", "1,2"))  # with the default --steps: fine


# --- the per-process plan -------------------------------------------------------------------------------------
def test_plan_hands_out_each_intended_time_once_in_order():
    plan = OpenLoopPlan()
    assert plan.take() is None  # before the first rate step
    plan.begin(0, 10, 4.0, 1.0, "constant", 0, now=100.0, now_wall=1_000.0)
    slots = [plan.take() for _ in range(6)]
    assert [s.intended for s in slots] == pytest.approx([100.0, 100.25, 100.5, 100.75, 101.0, 101.25])
    assert [s.intended_wall for s in slots] == pytest.approx([1_000.0, 1_000.25, 1_000.5, 1_000.75, 1_001.0, 1_001.25])
    assert [s.warmup for s in slots] == [True, True, True, True, False, False]
    assert {s.step for s in slots} == {0} and {s.users for s in slots} == {10}


def test_a_step_change_keeps_the_backlog_and_drops_the_old_steps_later_times():
    plan = OpenLoopPlan()
    plan.begin(0, 10, 2.0, 0.0, "constant", 0, now=0.0, now_wall=0.0)
    first = plan.take()  # t = 0.0, sent; 0.5 .. 2.5 not yet taken (all users busy: a backlog)
    future = None
    plan.begin(1, 10, 10.0, 0.0, "constant", 0, now=3.0, now_wall=3.0)
    late = [plan.take() for _ in range(5)]  # the old step's due times come first, late, with their own step
    assert first.intended == 0.0
    assert [s.intended for s in late] == pytest.approx([0.5, 1.0, 1.5, 2.0, 2.5])
    assert {s.step for s in late} == {0}
    future = plan.take()  # 3.0 would be the old step's next time: past its end, so the new step's first
    assert (future.step, future.intended) == (1, pytest.approx(3.0))
    assert plan.take().intended == pytest.approx(3.1)


def test_a_slot_taken_before_its_step_ended_is_not_sent_after():
    plan = OpenLoopPlan()
    plan.begin(0, 10, 1.0, 0.0, "constant", 0, now=0.0, now_wall=0.0)
    plan.take()
    waiting = plan.take()  # t = 1.0, a user waits for it
    assert waiting.valid()
    plan.begin(1, 10, 1.0, 0.0, "constant", 0, now=0.5, now_wall=0.5)
    assert not waiting.valid()
    assert plan.changed.is_set() is False  # a fresh event for the next change; the old one woke the waiters


def test_due_times_never_sent_are_counted_at_the_end():
    plan = OpenLoopPlan()
    plan.begin(0, 1, 10.0, 0.0, "constant", 0, now=0.0, now_wall=0.0)
    for _ in range(3):
        plan.take()  # 0.0, 0.1, 0.2 sent
    plan.finish(now=1.0)  # due until 1.0: 0.3 .. 0.9 never sent
    assert plan.overdue(now=5.0) == 7


def test_a_worker_sends_its_rank_s_share(monkeypatch):
    from vllm_loadtest.locustfiles.tracker import StepTracker

    env = SimpleNamespace(runner=SimpleNamespace(client_id="b"), parsed_options=None)
    tracker = StepTracker(env)
    data = {"step": 0, "users": 8, "warmup_s": 0.0, "rate_rps": 4.0, "arrival": "constant", "seed": 0}
    tracker._on_message(env, SimpleNamespace(data={**data, "ranks": {"a": 0, "b": 1}}))
    times = [tracker.plan.take().intended for _ in range(3)]
    start = tracker.plan._segments[0].start
    # 2 processes at 4 req/s together: this one every 0.5 s, offset by half of the whole rate's gap.
    assert [t - start for t in times] == pytest.approx([0.25, 0.75, 1.25])


# --- the step table -------------------------------------------------------------------------------------------
TIMELINE = [
    {"step": 0, "users": 4, "start_time": 0.0, "measure_start": 1.0, "end_time": 11.0, "rate_rps": 2.0},
    {"step": 1, "users": 4, "start_time": 11.0, "measure_start": 12.0, "end_time": 22.0, "rate_rps": 4.0},
]


def open_rec(i, step, intended, lag, ttft=0.1, n=5, itl=0.01, **kw):
    row = rec(i, step, 4, intended + lag, ttft, n, itl, **kw)
    row["intended_start_time"], row["schedule_lag_s"] = intended, lag
    return row


def open_loop_records():
    rows = [open_rec(i, 0, 1.0 + 0.5 * i, 0.001) for i in range(20)]  # on time at 2 req/s
    # Step 1 at 4 req/s: the client falls behind, each request later than the one before.
    rows += [open_rec(100 + i, 1, 12.0 + 0.25 * i, 0.1 * i) for i in range(20)]
    return frame(rows)


def test_step_table_reports_lag_intended_latencies_and_rates():
    t = step_table(open_loop_records(), TIMELINE).set_index("step")
    # The open-loop columns, then the intervals and suspect-step checks (added later: steps.csv only gains at its end).
    tail = OPEN_LOOP_COLUMNS + UNCERTAINTY_COLUMNS + REASONING_COLUMNS + BATCH_COLUMNS
    assert list(t.reset_index().columns[-len(tail) :]) == tail
    assert list(t["rate_rps"]) == [2.0, 4.0]
    assert t.loc[0, "achieved_rps"] == pytest.approx(20 / 10)
    assert t.loc[0, "schedule_lag_p50_s"] == pytest.approx(0.001)
    assert t.loc[0, "ttft_intended_p50_s"] == pytest.approx(t.loc[0, "ttft_p50_s"] + 0.001)
    assert not t.loc[0, "schedule_behind"]
    lags = 0.1 * np.arange(20)
    assert t.loc[1, "schedule_lag_p99_s"] == pytest.approx(np.percentile(lags, 99))
    assert t.loc[1, "schedule_lag_max_s"] == pytest.approx(1.9)
    assert t.loc[1, "ttft_intended_p99_s"] == pytest.approx(0.1 + np.percentile(lags, 99))
    assert t.loc[1, "e2e_intended_mean_s"] == pytest.approx(t.loc[1, "e2e_mean_s"] + lags.mean())
    assert t.loc[1, "schedule_behind"]
    # The per-request formulas of the glossary give the same numbers as the table's.
    step1 = open_loop_records().query("step == 1")
    lag = [glossary.schedule_lag_s(s, i) for s, i in zip(step1["start_time"], step1["intended_start_time"])]
    assert lag == pytest.approx(list(step1["schedule_lag_s"]))
    intended = [glossary.intended_s(v, g) for v, g in zip(step1["ttft_s"], lag)]
    assert np.percentile(intended, 99) == pytest.approx(t.loc[1, "ttft_intended_p99_s"])
    assert glossary.schedule_lag_s(5.0, None) is None and glossary.intended_s(0.1, None) is None


def test_closed_loop_rows_leave_the_open_loop_columns_empty():
    rows = frame([rec(i, 0, 1, 2.0 + i, 0.1, 5, 0.01) for i in range(5)])
    t = step_table(rows, [{"step": 0, "users": 1, "start_time": 0.0, "measure_start": 1.0, "end_time": 11.0}])
    assert math.isnan(t.loc[0, "rate_rps"]) and math.isnan(t.loc[0, "schedule_lag_p99_s"])
    assert math.isnan(t.loc[0, "ttft_intended_p50_s"]) and t.loc[0, "schedule_behind"] is None
    assert t.loc[0, "achieved_rps"] == pytest.approx(0.5)  # requests sent per second: there in every run
    assert "Open loop" not in format_table(t)


def test_lag_bound():
    assert lag_bound_s(1.0) == 0.05  # 10 % of 1 s, capped at 50 ms
    assert lag_bound_s(4.0) == pytest.approx(0.025)
    assert lag_bound_s(1000.0) == 0.005  # never below the event loop's own jitter
    assert is_behind(0.03, 4.0) and not is_behind(0.02, 4.0)
    assert is_behind(0.03, None) is None and is_behind(math.nan, 4.0) is None


def test_console_and_diagnosis_of_a_rate_run():
    table = step_table(open_loop_records(), TIMELINE)
    text = format_table(table)
    assert "Open loop" in text and "BEHIND" in text
    lines = format_open_loop(table)
    assert lines[-1].split()[-1] == "BEHIND" and lines[-2].split()[-1] == "ok"
    d = diagnose(table)
    behind = [line for line in d.text if "offered load not delivered" in line]
    assert len(behind) == 1 and "coordinated omission" in behind[0]
    assert behind[0].startswith("At 4 req/s, offered load not delivered: the client could not keep the schedule")


def test_the_knee_of_a_rate_run_is_keyed_on_the_rate():
    table = pd.DataFrame(
        {
            "step": [0, 1, 2, 3],
            "users": [1000] * 4,  # one pool at every step: users say nothing about the load
            "rate_rps": [1.0, 2.0, 4.0, 8.0],
            "aggregate_tok_s": [100.0, 200.0, 400.0, 410.0],
            "kv_cache_usage_max": [math.nan] * 4,
            "waiting_max": [math.nan] * 4,
            "preemptions": [math.nan] * 4,
        }
    )
    d = diagnose(table)
    assert (d.knee_step, d.knee_rate_rps) == (2, 4.0)
    assert "flattens at 4 req/s: the knee lies between 4 and 8 req/s" in d.text[0]
    assert "Going to 8 req/s changed it from 400 tok/s to 410 tok/s" in d.text[0]
    assert "doubling of the rate" in d.text[0]
    assert d.knee_range == [4.0, 8.0]
    assert set(d.binding) == {2, 3} and all(line.startswith("At ") and "req/s" in line for line in d.text[1:])


def test_a_waiting_user_sends_at_its_time_and_a_step_change_re_plans_it():
    import time

    import gevent

    plan = OpenLoopPlan()
    start = time.perf_counter()
    plan.begin(0, 1, 10.0, 0.0, "constant", 0, now=start, now_wall=time.time())
    assert plan.next_slot().intended == start  # due at once
    slot = plan.next_slot()  # waits until start + 0.1
    assert time.perf_counter() >= slot.intended == pytest.approx(start + 0.1)
    # A user waiting for a time after its step's end is woken by the change and takes the new step's first time.
    plan.begin(1, 1, 1.0, 0.0, "constant", 0)  # now: times now, now + 1 s, ...
    while plan.next_slot().step != 1:  # step 0's backlog first, if this machine was slow
        pass
    waiter = gevent.spawn(plan.next_slot)  # waits for now + 1 s
    gevent.sleep(0.02)
    new_start = time.perf_counter()
    plan.begin(2, 1, 100.0, 0.0, "constant", 0, now=new_start, now_wall=time.time())
    got = waiter.get(timeout=0.5)
    assert (got.step, got.intended) == (2, new_start)


def test_a_cpu_bound_load_generator_is_named_as_the_cause_of_the_lag():
    table = step_table(open_loop_records(), TIMELINE)
    table["generator_cpu_max"] = [0.3, 0.97]
    table["generator_bound"] = [False, True]
    line = next(t for t in diagnose(table).text if "offered load not delivered" in t)
    assert "97% CPU" in line and "add worker processes" in line and "coordinated omission" not in line
    table["generator_cpu_max"] = [0.3, 0.05]  # bound by event-loop lag only: milliseconds, not a backlog
    line = next(t for t in diagnose(table).text if "offered load not delivered" in t)
    assert "coordinated omission" in line and "--max-users" in line


def test_a_stopped_user_gives_its_slot_back():
    import gevent

    plan = OpenLoopPlan()
    plan.begin(0, 2, 1.0, 0.0, "constant", 0)
    plan.next_slot()  # t = 0: sent
    user = gevent.spawn(plan.next_slot)  # waits for t = 1 s
    gevent.sleep(0.01)
    user.kill()  # Locust stops a waiting user at once
    slot = plan.take()
    assert slot.intended == pytest.approx(plan._segments[0].start + 1.0)  # the same time, for the next free user
    plan.give_back(slot)  # stopped again, between taking it and sending it (the user's on_stop)
    assert plan.take() is slot
