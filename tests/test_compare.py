"""Two runs compared step by step (analysis/compare.py): a difference is stated only when it exceeds both runs' noise.

Synthetic step tables with known intervals: significantly up, significantly down, within the noise, intervals
missing (older runs), a step present in one run only, rate runs, and a rate run against a closed-loop one."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from vllm_loadtest.analysis.compare import NOISE_NOTE, compare_runs, relative_difference

pytestmark = pytest.mark.unit

METRICS = ("aggregate_tok_s", "ttft_p95_s", "tpot_p95_s")


def table(users, tok_s, ttft, tpot, rel_half=0.02, intervals=True, rate=None) -> pd.DataFrame:
    """Steps with these values, each with a symmetric interval of +- rel_half of its value."""
    t = pd.DataFrame(
        {"step": range(len(users)), "users": users, "aggregate_tok_s": tok_s, "ttft_p95_s": ttft, "tpot_p95_s": tpot}
    )
    t["rate_rps"] = rate if rate is not None else [math.nan] * len(users)
    if intervals:
        for m in METRICS:
            t[m + "_ci_low"], t[m + "_ci_high"] = t[m] * (1 - rel_half), t[m] * (1 + rel_half)
    return t


def test_the_half_width_of_a_relative_difference_adds_both_runs_noise_in_quadrature():
    d, h = relative_difference(112, 108, 116, 100, 97, 103)
    assert d == pytest.approx(0.12)
    assert h == pytest.approx(1.12 * math.hypot(4 / 112, 3 / 100))
    assert math.isnan(relative_difference(112, math.nan, math.nan, 100, 97, 103)[1])
    assert math.isnan(relative_difference(112, 108, 116, 0, 0, 0)[0])  # relative to nothing: undefined


def test_significant_up_and_down_are_stated_with_their_noise():
    mine = table([1, 2], [1120, 2000], [0.050, 0.1], [0.0080, 0.02])
    other = table([1, 2], [1000, 2000], [0.100, 0.1], [0.0100, 0.02])
    c = compare_runs(mine, other, "A", "B")
    first = c.steps[0]
    tok, ttft, tpot = first.differences
    assert tok.significant and tok.relative == pytest.approx(0.12)
    assert tok.text() == f"aggregate tok/s: +12 % ± {tok.half_width * 100:.0f} %"
    assert ttft.significant and ttft.relative == pytest.approx(-0.5) and ttft.stated().startswith("-50 % ± ")
    assert tpot.significant and tpot.relative == pytest.approx(-0.2)
    assert all(d.significant is False for d in c.steps[1].differences)  # equal: within the noise
    lines = c.lines()
    assert "relative to B" in lines[0] and lines[-1] == NOISE_NOTE and "within-run noise only" in NOISE_NOTE
    assert lines[1].startswith("At 1 users: aggregate tok/s: +12 % ± ") and "TTFT p95: -50 % ± " in lines[1]
    assert "At 2 users: aggregate tok/s: no significant difference (+0 % ± " in lines[2]


def test_a_difference_inside_the_noise_is_not_significant():
    mine = table([4], [1030], [0.1], [0.01], rel_half=0.05)
    other = table([4], [1000], [0.1], [0.01], rel_half=0.05)
    tok = compare_runs(mine, other, "A", "B").steps[0].differences[0]
    assert tok.significant is False and tok.relative == pytest.approx(0.03)
    assert tok.stated().startswith("no significant difference (+3 % ± 7 %")  # 1.03 * hypot(0.05, 0.05) = 7.3 %


def test_disturbed_data_is_not_called_significant_at_the_noise_it_has():
    """Seeded noisy pairs of runs of the same server: a wide interval keeps a chance difference from being stated."""
    rng = np.random.default_rng(7)
    called = 0
    for _ in range(200):
        a, b = 1000 * (1 + rng.normal(0, 0.03)), 1000 * (1 + rng.normal(0, 0.03))
        mine, other = table([8], [a], [0.1], [0.01], rel_half=0.06), table([8], [b], [0.1], [0.01], rel_half=0.06)
        called += bool(compare_runs(mine, other, "A", "B").steps[0].differences[0].significant)
    assert called <= 20  # about 5 % (10 of 200) for honest 95 % intervals (here 2 sigma); 20 is far in the tail


def test_older_runs_without_intervals_cannot_be_judged():
    mine = table([1, 2], [1200, 2000], [0.05, 0.1], [0.008, 0.02])
    other = table([1, 2], [1000, 2000], [0.10, 0.1], [0.010, 0.02], intervals=False)
    c = compare_runs(mine, other, "A", "old")
    assert c.missing_intervals == ["old"]
    tok = c.steps[0].differences[0]
    assert tok.significant is None and tok.relative == pytest.approx(0.2)
    assert tok.text() == "aggregate tok/s: +20 %, cannot be judged (no intervals in old)"
    assert c.steps[0].line() == (
        "At 1 users: aggregate tok/s +20 %, TTFT p95 -50 %, TPOT p95 -20 %: cannot be judged (no intervals in old)."
    )
    lines = c.lines()
    assert any("old's steps.csv has no confidence intervals" in line for line in lines)
    assert "significant" not in " ".join(lines[1:-1]).replace("no intervals", "").replace(
        "significant when the difference exceeds it", ""
    )


def test_a_step_without_an_interval_says_so():
    mine = table([1], [1200], [0.05], [0.008])
    mine.loc[0, ["ttft_p95_s_ci_low", "ttft_p95_s_ci_high"]] = math.nan  # too few requests for a p95's interval
    ttft = compare_runs(mine, table([1], [1000], [0.1], [0.01]), "A", "B").steps[0].differences[1]
    assert ttft.significant is None and "no interval at this step" in ttft.text()


def test_steps_present_in_one_run_only_are_named_not_compared():
    mine = table([1, 2, 4], [100, 200, 400], [0.1] * 3, [0.01] * 3)
    other = table([2, 4, 8], [200, 400, 800], [0.1] * 3, [0.01] * 3)
    c = compare_runs(mine, other, "A", "B")
    assert [s.load for s in c.steps] == [1, 2, 4, 8]
    assert c.steps[0].line() == "At 1 users: only in A, not compared."
    assert c.steps[3].line() == "At 8 users: only in B, not compared."
    assert c.steps[1].differences and c.steps[2].differences


def test_rate_runs_are_matched_by_rate_and_a_rate_run_is_not_matched_to_a_closed_loop():
    mine = table([8, 8], [100, 190], [0.1] * 2, [0.01] * 2, rate=[1.0, 2.0])
    other = table([8, 8], [100, 100], [0.1] * 2, [0.01] * 2, rate=[1.0, 2.0])
    c = compare_runs(mine, other, "A", "B")
    assert c.key == "rate_rps" and [s.load_text for s in c.steps] == ["1 req/s", "2 req/s"]
    assert c.steps[1].differences[0].significant and "by intended request rate" in c.lines()[0]
    closed = table([1, 2], [100, 200], [0.1] * 2, [0.01] * 2)
    c = compare_runs(mine, closed, "A", "B")
    assert c.steps == [] and "do not match by load" in c.lines()[0] and len(c.lines()) == 1


def test_a_load_run_twice_is_matched_in_order():
    mine = table([1, 4, 1], [100, 400, 130], [0.1] * 3, [0.01] * 3)
    other = table([1, 4, 1], [100, 400, 100], [0.1] * 3, [0.01] * 3)
    c = compare_runs(mine, other, "A", "B")
    assert [s.load_text for s in c.steps] == ["1 users", "1 users (repeat 2)", "4 users"]
    assert c.steps[1].differences[0].significant and not c.steps[0].differences[0].significant
