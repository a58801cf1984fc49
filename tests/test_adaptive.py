"""Adaptive steps (--step-duration auto): the stopping rule on synthetic completion streams with known answers, the
live accumulator fed like the controller feeds it, its options, and the end-of-run lines."""

from __future__ import annotations

import math

import numpy as np
import orjson
import pandas as pd
import pytest
from vllm_loadtest.analysis import adaptive as a
from vllm_loadtest.analysis.records import SCHEMA, RequestRecord, parse_lines
from vllm_loadtest.analysis.uncertainty import min_samples_for_quantile
from vllm_loadtest.locustfiles import options as options_mod

from tests.helpers.badinput import first_error

pytestmark = pytest.mark.unit

E2E = 0.4  # s: a batch is BATCH_E2E_MULTIPLE (1) E2E = 0.4 s, the first look at max(2 s, 10 batches) = 4 s
NEED = min_samples_for_quantile(0.95)


def stream(seconds: float, rate: float, tokens: float, noise: float = 0.0, seed: int = 0) -> tuple:
    """Completions every 1/rate s for `seconds`, each of `tokens` tokens times a lognormal(0, noise) factor."""
    rng = np.random.default_rng(seed)
    ends = np.arange(0, seconds, 1 / rate)
    return ends, tokens * np.exp(rng.normal(0, noise, ends.size))


def first_stop(ends, weights, ttft_samples=10_000, target=0.05, max_s=120.0, warmup=0.0, poll=1.0):
    """Poll the rule once a second as the shape does (only completions so far visible); the first stopping poll."""
    last, t = 0.0, poll
    while True:
        seen = ends < t
        d = a.decide(ends[seen], weights[seen], E2E, ttft_samples, warmup, t, t, max_s, target, last)
        if d.checked:
            last = d.window_s
        if d.stop:
            return d, t
        t += poll


def test_a_steady_stream_ends_at_the_first_check_point_past_the_target():
    ends, weights = stream(200, rate=20, tokens=50)
    d, t = first_stop(ends, weights)
    first = a.next_check_s(0.0, E2E)
    assert first == 4.0 and d.reason == a.CI_TARGET and d.stop and t == first  # the first look already suffices
    assert d.rel_half_width <= 0.05 and d.value == pytest.approx(1000, rel=0.02)


def test_before_the_first_check_point_the_interval_is_not_looked_at():
    ends, weights = stream(200, rate=20, tokens=50)
    d = a.decide(ends[ends < 3], weights[ends < 3], E2E, NEED, 0.0, 3.0, 3.0, 120.0, 0.05)
    assert not d.checked and not d.stop and math.isnan(d.rel_half_width)
    # looks come at fixed growing windows, not every poll: after a look at 4 s the next is at 5 s
    d = a.decide(ends, weights, E2E, 0, 0.0, 4.5, 4.5, 120.0, 0.05, last_check_s=4.0)
    assert not d.checked and a.next_check_s(4.0, E2E) == 5.0 and a.next_check_s(40.0, E2E) == 50.0


def test_a_noisy_stream_runs_longer_and_still_ends_within_the_target():
    steady, _ = first_stop(*stream(300, rate=20, tokens=50))
    d, _t = first_stop(*stream(300, rate=20, tokens=50, noise=0.8, seed=0))
    assert d.reason == a.CI_TARGET and d.rel_half_width <= 0.05
    assert d.window_s > 3 * steady.window_s, (d, steady)


def test_the_maximum_ends_a_step_whose_interval_stays_wide_and_flags_it():
    ends, weights = stream(100, rate=2, tokens=50, noise=1.0, seed=1)
    d, t = first_stop(ends, weights, max_s=20.0, target=0.01)
    assert d.stop and d.reason == a.MAX_DURATION and t == 20.0 and d.checked
    assert d.rel_half_width > 0.01  # its interval at the end, for the flag line
    line = a.max_duration_line(3, 16, 20.0, 0.01, d.rel_half_width)
    assert line.startswith("Step 3 (16 users) reached --max-step-duration 20 s before its interval narrowed to 1 %: ±")
    assert a.max_duration_line(0, 1, 120, 0.05, math.nan).endswith(": no interval")
    assert a.max_duration_line(0, 1, 120, 0.05, 0.03, 150).endswith(
        "with 150 of the 200 TTFT samples its p95 needs (±3.0 %)"
    )


def test_a_step_that_qualifies_at_its_maximum_ended_by_its_interval():
    ends, weights = stream(200, rate=20, tokens=50)
    d = a.decide(ends[ends < 4.5], weights[ends < 4.5], E2E, NEED, 0.0, 4.5, 4.5, 4.5, 0.05, last_check_s=4.0)
    assert d.stop and d.reason == a.CI_TARGET and d.checked
    d = a.decide(ends[ends < 4.5], weights[ends < 4.5], E2E, NEED - 1, 0.0, 4.5, 4.5, 4.5, 0.05, last_check_s=4.0)
    assert d.stop and d.reason == a.MAX_DURATION


def test_too_few_ttft_samples_keep_a_narrow_step_going():
    ends, weights = stream(200, rate=20, tokens=50)
    narrow = a.decide(ends[ends < 10], weights[ends < 10], E2E, NEED - 1, 0.0, 10.0, 10.0, 120.0, 0.05)
    assert narrow.checked and narrow.rel_half_width <= 0.05 and not narrow.stop and narrow.reason is None
    enough = a.decide(ends[ends < 10], weights[ends < 10], E2E, NEED, 0.0, 10.0, 10.0, 120.0, 0.05)
    assert enough.stop and enough.reason == a.CI_TARGET and NEED == 200


def test_nothing_completed_is_no_interval_and_never_a_stop_before_the_maximum():
    empty = np.array([], dtype=float)
    d = a.decide(empty, empty, None, 0, 0.0, 30.0, 30.0, 120.0, 0.05)
    assert not d.stop and not d.checked
    d = a.decide(empty, empty, None, 0, 0.0, 120.0, 120.0, 120.0, 0.05)
    assert d.stop and d.reason == a.MAX_DURATION and math.isnan(d.rel_half_width)
    assert d.to_dict()["rel_half_width"] is None  # JSON has no NaN
    # still in its warm-up: the window has not begun
    assert not a.decide(empty, empty, E2E, 0, 50.0, 45.0, 45.0, 120.0, 0.05).checked


def test_stopping_at_check_points_keeps_the_intervals_honest():
    """Over many seeded noisy steps stopped by the rule, the stopped interval holds the true rate about 95 % of the
    time (looking every poll and stopping at the first narrow interval would make it optimistic)."""
    true_rate, hits, runs = 20 * 50 * math.exp(0.6**2 / 2), 0, 200  # the lognormal's mean: exp(sigma^2 / 2)
    for seed in range(runs):
        d, _t = first_stop(*stream(400, rate=20, tokens=50, noise=0.6, seed=seed), target=0.03)
        hits += abs(d.value - true_rate) <= d.rel_half_width * d.value
    assert hits / runs >= 0.9, hits / runs


def row(r: RequestRecord) -> dict:
    """A record as the controller's record bus hands it on (locustfiles/recordbus.py)."""
    return {name: getattr(r, name) for name in SCHEMA.names}


def record(step=0, warmup=False, start=100.0, e2e=0.2, tokens=8, status="ok", ttft=0.05) -> RequestRecord:
    return RequestRecord("id", "w", step, 4, warmup, start, "completions", "m", status=status, ttft_s=ttft,
                         e2e_s=e2e, output_tokens=tokens, chunk_offsets_s=[0.05, 0.2], chunk_tokens=[1, 7])  # fmt: skip


def test_the_accumulator_keeps_every_completion_and_this_steps_measured_samples():
    acc = a.StepAccumulator()
    acc.add_rows([row(record())])
    assert acc.ends == []  # inactive (a fixed --step-duration): nothing kept
    acc.active = True
    acc.reset(1)
    acc.add_rows([row(record(step=0))])  # the last step's request, completed in this window: counts for the rate
    acc.add_rows([row(record(step=1, warmup=True))])  # sent in the warm-up: not measured
    acc.add_rows([row(record(step=1, e2e=0.3))])
    acc.add_rows([row(record(step=1, ttft=None))])
    acc.add_rows([row(record(step=1, status="error", e2e=None, tokens=None))])
    assert acc.ends == pytest.approx([100.2, 100.2, 100.3, 100.2]) and acc.tokens == [8, 8, 8, 8]
    assert acc.e2e == [0.3, 0.2] and acc.ttft_samples == 1


def test_the_accumulator_reads_a_workers_shipped_lines_as_the_records():
    local, shipped = a.StepAccumulator(), a.StepAccumulator()
    for acc in (local, shipped):
        acc.active = True
        acc.reset(1)
    records = [record(step=1, start=100 + i, e2e=0.1 * i, tokens=i) for i in range(1, 6)] + [record(step=0)]
    for r in records:
        local.add_rows([row(r)])
    lines = b"".join(orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE) for r in records)
    # A JSON object that is not a record of this suite's (another tool's line) is passed over, as a broken line is.
    shipped.add_rows(parse_lines(lines + b"not json\n" + b'{"step": 1}\n'))
    assert (shipped.ends, shipped.tokens, shipped.e2e, shipped.ttft_samples) == (
        local.ends, local.tokens, local.e2e, local.ttft_samples,
    )  # fmt: skip


def test_the_accumulator_remembers_its_looks_and_leaves_out_a_masters_last_second():
    acc = a.StepAccumulator(lag_s=1.0)
    acc.active = True
    acc.reset(0)
    for i in range(400):
        acc.add(0, False, i * 0.05, "ok", 0.05, 50, 0.01)
    assert not acc.decide(0.0, 2.5, 2.5, 120, 0.05).checked  # judged up to 1.5 s: before the first look
    d = acc.decide(0.0, 5.0, 5.0, 120, 0.05)
    assert d.checked and d.window_s == pytest.approx(4.0) and acc.last_check_s == pytest.approx(4.0)
    acc.reset(1)
    assert acc.last_check_s == 0 and acc.ends == []


def test_parse_ci_target():
    assert a.parse_ci_target("5%") == pytest.approx(0.05) and a.parse_ci_target("0.02") == 0.02
    for bad in ("0", "100%", "-1%", "tight", "1.5"):
        with pytest.raises(ValueError, match="--ci-target"):
            a.parse_ci_target(bad)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--step-duration", "auto", "--ci-target", "tight"], "--ci-target 'tight' is not a percentage"),
        (["--step-duration", "auto", "--ci-target", "0%"], "--ci-target '0%' must be above 0"),
        (["--step-duration", "auto", "--max-step-duration", "soon"], "--max-step-duration 'soon' is not a duration"),
        (["--step-duration", "auto", "--max-step-duration", "0s"], "--max-step-duration '0s' must be positive"),
        (["--step-duration", "auto", "--step-warmup", "30s", "--max-step-duration", "20s"], "shorter than --max-step"),
        (["--step-duration", "30s", "--ci-target", "2%"], "--ci-target 2% only applies with --step-duration auto"),
        (["--step-duration", "30s", "--max-step-duration", "60s"], "add --step-duration auto or drop"),
    ],
)
def test_bad_adaptive_options_are_one_line(args, expected, tmp_path):
    line = first_error("--host", "http://127.0.0.1:9", "--steps", "1", *args, "--run-dir", str(tmp_path / "r"))
    assert expected in line, line


def test_auto_and_durations_are_accepted():
    assert options_mod.parse_step_duration("auto") is None and options_mod.parse_step_duration("AUTO") is None
    assert options_mod.parse_step_duration("2m") == 120.0


def test_end_reasons_per_step_and_missing_for_an_old_run():
    timeline = [{"step": 0, "end_reason": "ci_target"}, {"step": 1, "end_reason": "max_duration"}, {"step": 2}]
    assert a.end_reasons([0, 1, 2, 3, "all"], timeline) == ["ci_target", "max_duration", None, None, None]


def _run(step_duration: str, reasons: list[str]) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    timeline, records, t = [], [], 1000.0
    for step, reason in enumerate(reasons):
        length = 20.0 if reason == a.MAX_DURATION else 8.0
        timeline.append({"step": step, "users": 2**step, "start_time": t, "measure_start": t + 1,
                         "end_time": t + length, "end_reason": reason})  # fmt: skip
        rng = np.random.default_rng(step)
        starts = np.arange(t + 1, t + length - 0.2, 0.02)
        noise = 1.0 if reason == a.MAX_DURATION else 0.0
        tokens = np.maximum(1, 10 * np.exp(rng.normal(0, noise, starts.size))).round()
        records.append(pd.DataFrame({"step": step, "warmup": False, "start_time": starts, "e2e_s": 0.1,
                                     "status": "ok", "output_tokens": tokens}))  # fmt: skip
        t += length
    records = [r.assign(ttft_s=0.01) for r in records]
    run = {"started_at": 999.0, "finished_at": t + 0.5, "timeline": timeline,
           "options": {"step_duration": step_duration, "max_step_duration": "20s", "ci_target": "5%"}}  # fmt: skip
    return run, pd.DataFrame({"step": range(len(reasons))}), pd.concat(records, ignore_index=True)


def test_the_end_of_run_lines_give_the_total_time_and_each_steps_length_and_reason():
    lines = a.step_lengths_text(*_run("auto", [a.CI_TARGET, a.MAX_DURATION, a.RUN_STOPPED]))
    assert lines[0].startswith("The run took 37.5 s, its 3 step(s) 36.0 s, of at most 20s each")
    assert lines[1].startswith("Step 0 (1 users): 8.0 s, interval within target (aggregate tok/s ±")
    assert lines[2].startswith(
        "MAX: Step 1 (2 users) reached --max-step-duration 20 s before its interval narrowed to 5 %: ±"
    )
    assert lines[3].startswith("Step 2 (4 users): 8.0 s, cut short by the run's stop")
    fixed = a.step_lengths_text(*_run("30s", [a.FIXED, a.RUN_STOPPED]))
    assert fixed == ["The run took 17.5 s, its 2 step(s) 16.0 s (fixed --step-duration 30s); step 1 was cut short "
                     "by the run's stop"]  # fmt: skip


def test_the_end_of_run_lines_read_the_tables_interval_when_it_has_one():
    run, table, records = _run("auto", [a.CI_TARGET])
    table = table.assign(aggregate_tok_s=100.0, aggregate_tok_s_ci_low=97.0, aggregate_tok_s_ci_high=103.0)
    assert "±3.0 %" in a.step_lengths_text(run, table, records)[1]


def test_a_shipped_line_whose_fields_follow_the_lists_is_read_whole():
    acc = a.StepAccumulator()
    acc.active = True
    acc.reset(1)
    line = {"request_id": "x", "chunk_offsets_s": [0.01, 0.02], "step": 1, "warmup": False, "start_time": 5.0,
            "status": "ok", "e2e_s": 0.5, "output_tokens": 3, "ttft_s": 0.1}  # fmt: skip
    acc.add_rows(parse_lines(orjson.dumps(line) + b"\n"))
    assert acc.ends == [5.5] and acc.tokens == [3] and acc.ttft_samples == 1
