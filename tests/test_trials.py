"""Repeated runs (--repeat N, analysis/trials.py): synthetic trials with exactly known values.

A plan of two steps run three times, each trial's step with its own known tok/s and latencies: each trial's row
(trials.csv) is the step table of that trial's step alone, the pooled row of steps.csv is the one over the union of
the trials' requests and windows, the across-trial interval is the hand-computed t-interval and contains every
trial's value, and report --compare judges on the across-trial intervals when both runs have them."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from vllm_loadtest.analysis import trials as tr
from vllm_loadtest.analysis.compare import compare_runs
from vllm_loadtest.analysis.glossary import percentile
from vllm_loadtest.analysis.run import compute_tables
from vllm_loadtest.analysis.steps import step_table
from vllm_loadtest.analysis.uncertainty import end_to_end, rate_interval, windows_rate_interval

from tests.helpers.records import frame, rec

pytestmark = pytest.mark.unit

USERS = (1, 2)
TRIALS = 3
WINDOW = 10.0
# Tokens per request of (trial, plan step): one request a second, so the trial's tok/s is exactly this number.
TOKENS = {(1, 0): 10, (2, 0): 20, (3, 0): 30, (1, 1): 40, (2, 1): 44, (3, 1): 47}
TTFT = {1: 0.05, 2: 0.10, 3: 0.15}  # each trial's TTFT


def _timeline() -> list[dict]:
    out = []
    for k in range(TRIALS * len(USERS)):
        plan_step, trial = k % len(USERS), k // len(USERS) + 1
        start = k * WINDOW
        out.append({"step": k, "users": USERS[plan_step], "start_time": start, "measure_start": start,
                    "end_time": start + WINDOW, "rate_rps": None, "plan_step": plan_step, "trial": trial,
                    "trials": TRIALS})  # fmt: skip
    return out


def _records() -> pd.DataFrame:
    rows, i = [], 0
    for entry in _timeline():
        n = TOKENS[(entry["trial"], entry["plan_step"])]
        for s in range(int(WINDOW)):  # sent at +0.1 s, done within 0.5 s: every request completes in its window
            rows.append(rec(i, entry["step"], entry["users"], entry["start_time"] + s + 0.1, TTFT[entry["trial"]],
                            n, 0.005))  # fmt: skip
            i += 1
    return frame(rows)


def test_each_trials_row_is_the_step_table_of_that_trials_step_alone():
    records, timeline = _records(), _timeline()
    _table, per_trial = compute_tables(records, timeline, None, None)
    assert len(per_trial) == TRIALS * len(USERS)
    for entry, row in zip(timeline, per_trial.to_dict(orient="records")):
        assert (row["trial"], row["plan_step"], row["step"]) == (entry["trial"], entry["plan_step"], entry["step"])
        assert row["aggregate_tok_s"] == pytest.approx(TOKENS[(entry["trial"], entry["plan_step"])])
        alone = step_table(records, tr.separate([entry])).iloc[0]
        for name in ("requests", "aggregate_tok_s", "ttft_p50_s", "tpot_p99_s", "aggregate_tok_s_ci_low"):
            assert row[name] == pytest.approx(alone[name], nan_ok=True)


def test_the_pooled_row_is_computed_over_the_union_of_the_trials():
    records, timeline = _records(), _timeline()
    table, _ = compute_tables(records, timeline, None, None)
    assert table["step"].tolist() == [0, 1] and table["users"].tolist() == list(USERS)
    row = table.iloc[0]
    union = records[records["step"].isin([0, 2, 4])]
    assert row["requests"] == len(union) == 30
    assert row["output_tokens"] == union["output_tokens"].sum()
    assert row["aggregate_tok_s"] == pytest.approx((10 + 20 + 30) * 10 / (3 * WINDOW))
    assert row["ttft_p50_s"] == pytest.approx(percentile(union["ttft_s"], 50))
    assert row["ttft_p99_s"] == pytest.approx(percentile(union["ttft_s"], 99))
    assert row["trials"] == TRIALS


def test_the_across_trial_interval_is_the_t_interval_and_contains_every_trial():
    table, per_trial = compute_tables(_records(), _timeline(), None, None)
    for plan_step in (0, 1):
        values = np.array([TOKENS[(t, plan_step)] for t in (1, 2, 3)], dtype=float)
        half = stats.t.ppf(0.975, 2) * values.std(ddof=1) / math.sqrt(3)
        row = table.iloc[plan_step]
        assert row["aggregate_tok_s_trials_mean"] == pytest.approx(values.mean())
        assert row["aggregate_tok_s_trials_ci_low"] == pytest.approx(max(values.mean() - half, 0.0))  # a rate >= 0
        assert row["aggregate_tok_s_trials_ci_high"] == pytest.approx(values.mean() + half)
        assert (row["aggregate_tok_s_trials_min"], row["aggregate_tok_s_trials_max"]) == (values.min(), values.max())
        own = per_trial[per_trial["plan_step"] == plan_step]["aggregate_tok_s"]
        assert ((own >= row["aggregate_tok_s_trials_ci_low"]) & (own <= row["aggregate_tok_s_trials_ci_high"])).all()
    ttft = np.array(list(TTFT.values()))
    assert table.iloc[0]["ttft_p50_s_trials_mean"] == pytest.approx(ttft.mean())


@pytest.mark.parametrize("n", [2, 3])
def test_for_two_and_three_trials_the_interval_always_contains_every_trial(n):
    """t(0.975, 1) / sqrt(2) = 8.98 and t(0.975, 2) / sqrt(3) = 2.48 standard deviations: wider than any value's
    distance from the mean (at most sqrt((n - 1)) * s / ... ), so every trial is inside, whatever the values."""
    rng = np.random.default_rng(3)
    for _ in range(2000):
        values = rng.lognormal(0, 1, n) * rng.choice([1, 1000])
        ci = tr.trial_interval(values)
        assert ci.low <= values.min() and values.max() <= ci.high


def test_disagreeing_trials_are_flagged_when_their_own_intervals_do_not_overlap():
    assert tr.disagree(np.array([4000.0, 5900.0]), np.array([4950.0, 6800.0])) is True  # the 4478 / 6397
    assert tr.disagree(np.array([4000.0, 4900.0]), np.array([4950.0, 5800.0])) is False
    assert tr.disagree(np.array([4000.0, math.nan]), np.array([4950.0, math.nan])) is None
    table, _ = compute_tables(_records(), _timeline(), None, None)
    # Every trial's tok/s here is exact (one request a second): intervals narrow, values 10 / 20 / 30 far apart.
    assert table.iloc[0]["trials_disagree"] is True


def test_a_run_without_repeat_has_no_trials_and_no_across_trial_section():
    records = _records()
    timeline = tr.separate(_timeline())
    table, per_trial = compute_tables(records, timeline, None, None)
    assert per_trial is None and len(table) == len(timeline)
    assert not set(tr.TRIAL_COLUMNS) & set(table.columns)  # steps.csv as it always was
    assert tr.console_lines(table) == [] and tr.trials_summary(table, None) is None


def test_windows_laid_end_to_end_and_one_window_is_the_plain_rate_interval():
    t = np.array([0.5, 10.5, 25.0, 31.0, 45.0])
    assert end_to_end(t, [(0, 10), (30, 40)]).tolist()[:2] == [0.5, pytest.approx(math.nan, nan_ok=True)]
    assert end_to_end(t, [(0, 10), (30, 40)])[3] == pytest.approx(11.0)
    starts = np.arange(0, 20, 0.5)
    ends, tokens = starts + 0.3, np.full(starts.size, 8.0)
    one = windows_rate_interval(starts, ends, tokens, [(2.0, 18.0)], 8)
    assert one == rate_interval(starts, ends, tokens, 2.0, 18.0, 8)
    two = windows_rate_interval(starts, ends, tokens, [(0.0, 8.0), (10.0, 18.0)], 8)
    assert two.value == pytest.approx(16.0)


def _compare_table(tok, within_rel, trials_rel) -> pd.DataFrame:
    """One step at 8 users: tok/s with a within-step interval of ± within_rel and an across-trial one of ± trials_rel
    (None: no trials)."""
    row = {"step": 0, "users": 8, "rate_rps": math.nan, "aggregate_tok_s": tok}
    for m, v in (("aggregate_tok_s", tok), ("ttft_p95_s", 0.1), ("tpot_p95_s", 0.01)):
        row[m], row[m + "_ci_low"], row[m + "_ci_high"] = v, v * (1 - within_rel), v * (1 + within_rel)
        if trials_rel is not None:
            row[m + "_trials_mean"] = v
            row[m + "_trials_ci_low"], row[m + "_trials_ci_high"] = v * (1 - trials_rel), v * (1 + trials_rel)
    return pd.DataFrame([row])


def test_compare_uses_the_across_trial_intervals_when_both_runs_have_them():
    # Within-step intervals of ± 2 % call a 10 % difference real; trials that wander ± 15 % say it is noise.
    mine, other = _compare_table(5500, 0.02, 0.15), _compare_table(5000, 0.02, 0.15)
    tok = compare_runs(mine, other, "A", "B").steps[0].differences[0]
    assert tok.trials and tok.significant is False
    within = compare_runs(_compare_table(5500, 0.02, None), _compare_table(5000, 0.02, None), "A", "B")
    assert within.steps[0].differences[0].significant is True and not within.steps[0].differences[0].trials
    # And the other way: wide within-step intervals (± 15 %), trials that agree closely (± 2 %): a real difference.
    tok = compare_runs(_compare_table(5500, 0.15, 0.02), _compare_table(5000, 0.15, 0.02), "A", "B")
    assert tok.steps[0].differences[0].significant is True
    lines = tok.lines()
    assert "aggregate tok/s across trials: +10 %" in lines[1] and any("across trials is judged" in x for x in lines)
    assert not any(x.startswith("Judged against within-run noise only") for x in lines)  # every one across trials
    # A lower bound clipped at 0 (few trials far apart) does not narrow the half-width compared against.
    wide = _compare_table(5500, 0.02, 1.5)
    wide["aggregate_tok_s_trials_ci_low"] = 0.0
    far = compare_runs(wide, _compare_table(5000, 0.02, 0.02), "A", "B").steps[0].differences[0]
    assert far.half_width == pytest.approx(1.1 * math.hypot(1.5, 0.02))
    # Only one run repeated: the within-step intervals, as before.
    one = compare_runs(_compare_table(5500, 0.15, 0.02), _compare_table(5000, 0.15, None), "A", "B")
    assert one.steps[0].differences[0].significant is False and not one.steps[0].differences[0].trials


def test_the_summary_and_console_show_each_trial_and_the_across_trial_interval():
    table, per_trial = compute_tables(_records(), _timeline(), None, None)
    summary = tr.trials_summary(table, per_trial)
    assert summary["trials"] == 3 and [s["step"] for s in summary["steps"]] == [0, 1]
    tok = summary["steps"][0]["aggregate_tok_s"]
    assert [t["value"] for t in tok["per_trial"]] == pytest.approx([10, 20, 30])
    assert tok["trials_ci"][0] <= 10 and tok["trials_ci"][1] >= 30
    lines = tr.console_lines(table)
    assert lines[1].startswith("Trials (--repeat") and len(lines) == 2 + 1 + 2


def test_the_live_view_shows_each_trials_step_as_it_runs():
    from vllm_loadtest.analysis.live import live_table

    timeline = _timeline()
    table, _ = live_table(_records(), timeline, now=timeline[-1]["end_time"])
    assert table["step"].tolist() == list(range(6))  # one row per timeline entry, as the live charts draw them
    assert table["aggregate_tok_s"].tolist() == pytest.approx([TOKENS[(t["trial"], t["plan_step"])] for t in timeline])


def test_a_plan_steps_verdict_is_its_trials_when_they_agree():
    from types import SimpleNamespace

    v = {k: SimpleNamespace(regime=r) for k, r in enumerate(["memory_bound", "neither", "memory_bound",
                                                              "compute_bound", "memory_bound", "neither"])}  # fmt: skip
    out = tr.plan_verdicts(v, _timeline())
    assert set(out) == {0} and out[0] is v[4]  # plan step 1's trials disagree: no verdict for it
    assert tr.plan_verdicts(v, tr.separate(_timeline())) is v  # without --repeat: as they were


def test_a_run_stopped_during_a_later_trial_pools_what_ran():
    timeline = _timeline()[:3]  # stopped in trial 2's first step: plan step 1 has a single trial
    records = _records()
    records = records[records["step"] < 3]
    table, per_trial = compute_tables(records, timeline, None, None)
    assert len(per_trial) == 3 and table["trials"].tolist() == [2, 1]
    assert table.iloc[0]["aggregate_tok_s"] == pytest.approx(15.0)  # (10 + 20) tokens/s over two equal windows
    assert math.isnan(table.iloc[1]["aggregate_tok_s_trials_ci_low"])  # one trial: no across-trial interval
    assert table.iloc[1]["aggregate_tok_s_trials_mean"] == pytest.approx(40.0)
