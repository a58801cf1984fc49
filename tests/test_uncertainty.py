"""Confidence intervals: exact small cases, and coverage checked by simulation (about 95 % of the intervals hold
the true value over many seeded runs)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from vllm_loadtest.analysis.uncertainty import (
    Interval,
    batch_count,
    batch_means,
    lag1_autocorrelation,
    min_samples_for_quantile,
    quantile_interval,
    t_interval,
)

pytestmark = pytest.mark.unit


def test_t_interval_of_known_values():
    ci = t_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    # mean 3, s = 1.5811, t(4, 0.975) = 2.7764: half width 1.9632
    assert ci.value == 3.0 and ci.n == 5
    assert ci.half_width == pytest.approx(1.9632, abs=1e-4)
    assert t_interval([7.0]).note == "too few samples" and math.isnan(t_interval([7.0]).low)
    assert t_interval([]).note == "no samples"


def test_quantile_interval_needs_enough_samples_for_its_tail():
    rng = np.random.default_rng(1)
    assert min_samples_for_quantile(0.99) == 1000 and min_samples_for_quantile(0.5) == 20
    small = quantile_interval(rng.exponential(size=40), 0.99)
    assert small.note == "too few samples" and math.isnan(small.high) and not math.isnan(small.value)
    big = quantile_interval(rng.exponential(size=2000), 0.99)
    assert big.note is None and big.low < big.value < big.high


def test_quantile_interval_ranks_match_the_binomial_rule():
    # n = 100, median: the textbook 95 % order-statistic interval is [x_(40), x_(61)].
    x = np.arange(1, 101, dtype=float)
    ci = quantile_interval(x, 0.5)
    assert (ci.low, ci.high) == (40.0, 61.0)


def test_quantile_interval_coverage_by_simulation():
    rng = np.random.default_rng(20261201)
    true_p95 = math.exp(1.6448536269514722 * 0.5)  # lognormal(0, 0.5)
    hits = trials = 0
    for _ in range(1000):
        ci = quantile_interval(rng.lognormal(0.0, 0.5, size=300), 0.95)
        trials += 1
        hits += ci.contains(true_p95)
    # Order-statistic intervals are conservative: at least 95 % nominal, seen 95-97 %.
    assert 0.93 <= hits / trials <= 0.99, hits / trials


def closed_loop_completions(rng, users: int, duration: float, tokens: int, mean_e2e: float):
    """Completion times of a closed loop: each user sends again as soon as its request ends (E2E gamma, shape 4)."""
    times = []
    for _ in range(users):
        t = rng.uniform(0, mean_e2e)  # users out of phase, as after a warm-up
        while t < duration:
            t += rng.gamma(4.0, mean_e2e / 4.0)
            times.append(t)
    times = np.array(times)
    return times, np.full(times.size, float(tokens))


def test_batch_means_point_estimate_is_the_window_rate():
    t = np.array([0.5, 1.5, 2.5, 9.9, 10.0])
    w = np.array([10, 10, 10, 10, 99])
    ci = batch_means(t, w, 0.0, 10.0, batches=5)
    assert ci.value == pytest.approx(4.0)  # 40 tokens in [0, 10): the event at 10.0 is outside


def test_batch_means_coverage_by_simulation():
    """A stationary closed loop: 16 users, 256 tokens each, E2E mean 2 s: true rate 16 * 256 / 2 = 2048 tok/s."""
    rng = np.random.default_rng(7)
    true_rate = 16 * 256 / 2.0
    hits, trials, widths = 0, 400, []
    for _ in range(trials):
        t, w = closed_loop_completions(rng, 16, 130.0, 256, 2.0)
        k = batch_count(120.0, 2.0)
        ci = batch_means(t, w, 10.0, 130.0, batches=k)
        hits += ci.contains(true_rate)
        widths.append(ci.relative_half_width)
    assert 0.90 <= hits / trials <= 0.99, hits / trials
    assert np.median(widths) < 0.05  # and narrow enough to be useful


def test_batch_means_says_when_a_step_is_too_short():
    ci = batch_means([1.0, 2.0], [5.0, 5.0], 0.0, 4.0, batches=batch_count(4.0, 2.0))
    assert ci.note == "step too short for an interval" and math.isnan(ci.low) and ci.value == 2.5


def test_correlated_batches_are_merged():
    # A slow drift makes adjacent batches alike; merging keeps the interval from being too narrow.
    t = np.linspace(0, 100, 10_000, endpoint=False)
    w = 1.0 + 0.5 * np.sin(t / 100 * math.pi)
    assert lag1_autocorrelation(np.sin(np.linspace(0, math.pi, 20))) > 0.5
    ci = batch_means(t, w, 0.0, 100.0, batches=20)
    assert ci.n < 20  # merged pairwise (20 -> 10 -> 5) while neighbours stayed alike


def test_interval_helpers():
    ci = Interval(100.0, 95.0, 105.0, 10)
    assert ci.half_width == 5.0 and ci.relative_half_width == 0.05 and ci.contains(100.0) and not ci.contains(106)


def test_the_special_functions_give_scipy_stats_own_quantiles_and_intervals():
    """analysis/ uses scipy.special (importing scipy.stats cost a Locust process about 0.6 CPU-s more): its
    functions are the distributions' quantiles and cdfs that scipy.stats computes, and Wilson's interval is
    binomtest's."""
    from scipy import special, stats
    from vllm_loadtest.analysis.arrivals import expected_cdf
    from vllm_loadtest.analysis.uncertainty import wilson_interval

    for df in (1, 4, 30):
        assert special.stdtrit(df, 0.975) == pytest.approx(stats.t.ppf(0.975, df), rel=1e-12)
    assert special.ndtri(0.975) == pytest.approx(stats.norm.ppf(0.975), rel=1e-12)
    ranks = np.arange(0, 21)
    assert special.bdtr(ranks, 20, 0.95) == pytest.approx(stats.binom.cdf(ranks, 20, 0.95), rel=1e-12)
    x = np.array([-1.0, 0.0, 0.3, 1.0, 4.0, math.nan])
    expected = stats.gamma.cdf(x, a=2.5, scale=1 / 2.5)
    assert np.allclose(expected_cdf(x, "gamma", 2.5), expected, rtol=1e-12, equal_nan=True)
    for k, n in ((0, 10), (3, 50), (50, 50), (1, 1)):
        ci = stats.binomtest(k, n).proportion_ci(0.95, method="wilson")
        got = wilson_interval(k, n)
        assert (got.low, got.high) == pytest.approx((ci.low, ci.high), abs=1e-12)
