"""Bursty arrivals (--arrival gamma --burstiness B): the gamma times, their split between load processes, the
step message that carries B to the workers, the options' validation, and the inter-arrival analysis of what was
sent (analysis/arrivals.py) with its report section. Pure: no Locust run (the runs are in
tests/test_arrivals_gamma_run.py)."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from vllm_loadtest.analysis import arrivals as arr
from vllm_loadtest.analysis.report import CDF_RANKS, CDF_TAIL_RANKS, arrivals_figure, arrivals_html
from vllm_loadtest.analysis.schedule import ARRIVALS, arrival_times
from vllm_loadtest.locustfiles.openloop import OpenLoopPlan
from vllm_loadtest.locustfiles.startup import check_options
from vllm_loadtest.locustfiles.tracker import StepTracker

from tests.helpers.badinput import first_error
from tests.helpers.inprocess import parse_options

pytestmark = pytest.mark.unit

N = 20_000


def take(iterator, n):
    return list(itertools.islice(iterator, n))


def gamma_gaps(rate, b, seed=1, n=N, **kw):
    return np.diff(take(arrival_times(rate, "gamma", seed, burstiness=b, **kw), n), prepend=0.0)


# --- the times -------------------------------------------------------------------------------------------------
def test_gamma_is_an_arrival_process():
    assert "gamma" in ARRIVALS


@pytest.mark.parametrize("b", [0.3, 1.0, 4.0])
def test_gamma_gaps_have_mean_one_over_the_rate_and_cv_one_over_root_b(b):
    rate = 5.0
    gaps = gamma_gaps(rate, b)
    assert (gaps >= 0).all()
    cv = 1 / math.sqrt(b)
    # Sampling error: the mean's relative sd is CV / sqrt(n); the CV's sd, for a gamma of shape k, is
    # sqrt((k + 1) / (2 k^2) / n) (delta method). Five of each: a seeded stream, not a flaky bound.
    assert gaps.mean() == pytest.approx(1 / rate, rel=5 * cv / math.sqrt(N))
    assert arr.cv(gaps) == pytest.approx(cv, abs=5 * math.sqrt((b + 1) / (2 * b * b) / N))
    # And the gaps are gamma(shape b, scale 1 / (rate b)), not merely of that mean and CV.
    assert stats.kstest(gaps, stats.gamma(a=b, scale=1 / (rate * b)).cdf).pvalue > 1e-3


def test_gamma_times_are_reproducible_from_the_seed():
    a = take(arrival_times(3.0, "gamma", 7, burstiness=0.5), 100)
    assert a == take(arrival_times(3.0, "gamma", 7, burstiness=0.5), 100)
    assert a != take(arrival_times(3.0, "gamma", 8, burstiness=0.5), 100)
    assert a != take(arrival_times(3.0, "gamma", 7, burstiness=0.6), 100)


@pytest.mark.parametrize("processes", [2, 3, 5])
def test_the_processes_shares_together_are_exactly_the_single_process_stream(processes):
    whole = take(arrival_times(6.0, "gamma", "s:0", burstiness=0.25), 3000)
    shares = [
        take(arrival_times(6.0, "gamma", "s:0", rank=r, processes=processes, burstiness=0.25), 3000 // processes)
        for r in range(processes)
    ]
    for r, share in enumerate(shares):
        assert share == whole[r::processes][: len(share)]  # the same floats, not approximately
    merged = sorted(t for share in shares for t in share)
    assert merged == whole[: len(merged)]


@pytest.mark.parametrize(("b", "bound"), [(0.25, lambda c: c < 1.8), (4.0, lambda c: c > 0.7)])
def test_independent_gamma_streams_would_add_up_towards_poisson_which_is_why_the_stream_is_shared(b, bound):
    """Four independent streams at rate / 4 (what Poisson does, per rank) lose the burstiness asked for: B = 0.25's
    bursts are smoothed (CV 1.68 here, for 2), B = 4's regularity is lost (0.80, for 0.5)."""
    processes = 4
    independent = sorted(
        t for r in range(processes) for t in take(arrival_times(8.0 / processes, "gamma", f"x{r}", burstiness=b), 5000)
    )
    horizon = min(
        take(arrival_times(8.0 / processes, "gamma", f"x{r}", burstiness=b), 5000)[-1] for r in range(processes)
    )
    summed_cv = arr.cv(np.diff([t for t in independent if t < horizon]))
    shared = sorted(
        t
        for r in range(processes)
        for t in take(arrival_times(8.0, "gamma", "x", rank=r, processes=processes, burstiness=b), 5000)
    )
    assert bound(summed_cv), summed_cv  # towards 1 with more processes
    cv = 1 / math.sqrt(b)
    assert arr.cv(np.diff(shared)) == pytest.approx(cv, abs=5 * math.sqrt((b + 1) / (2 * b * b) / len(shared)))


def test_burstiness_one_in_one_process_is_the_poisson_stream():
    gamma = take(arrival_times(3.0, "gamma", 7, burstiness=1.0), 500)
    poisson = take(arrival_times(3.0, "poisson", 7), 500)
    assert gamma == pytest.approx(poisson, rel=1e-12)


def test_poisson_and_constant_times_are_unchanged():
    """The values the suite drew before gamma arrivals existed (main at e703d97): their seeds must not move."""
    assert take(arrival_times(3.0, "poisson", 7), 3) == [0.4028852719880139, 0.4144954497583494, 1.715813903466068]
    assert take(arrival_times(8.0, "poisson", "7:1", 1, 2), 3) == [
        0.07911117332037547,
        0.7016195720221752,
        1.2632726504707934,
    ]
    assert take(arrival_times(6.0, "constant", 0, 2, 3), 3) == pytest.approx([1 / 3, 5 / 6, 4 / 3])
    # burstiness is ignored by the other processes
    assert take(arrival_times(3.0, "poisson", 7, burstiness=0.2), 3) == take(arrival_times(3.0, "poisson", 7), 3)


@pytest.mark.parametrize("b", [0.0, -1.0, math.nan, math.inf, "x"])
def test_a_bad_burstiness_is_refused_by_the_times(b):
    with pytest.raises(ValueError, match="--burstiness"):
        next(arrival_times(1.0, "gamma", 0, burstiness=b))


# --- the plan and the step message -----------------------------------------------------------------------------
def test_the_plan_draws_its_times_with_the_burstiness():
    plan = OpenLoopPlan()
    plan.begin(0, 10, 4.0, 0.0, "gamma", 3, rank=1, processes=2, now=100.0, now_wall=1000.0, burstiness=0.25)
    got = [plan.take().intended - 100.0 for _ in range(20)]
    assert got == pytest.approx(take(arrival_times(4.0, "gamma", "3:0", 1, 2, burstiness=0.25), 20))
    plan.begin(0, 10, 4.0, 0.0, "poisson", 3, now=100.0, now_wall=1000.0)  # the old call, without burstiness
    assert plan.take().intended - 100.0 == pytest.approx(next(arrival_times(4.0, "poisson", "3:0")))


def tracker(**options):
    runner = SimpleNamespace(user_count=0, client_id="w1")
    env = SimpleNamespace(runner=runner, parsed_options=SimpleNamespace(**options))
    return StepTracker(env)


def first_times(plan: OpenLoopPlan, n: int = 10) -> list[float]:
    segment = plan._segments[-1]
    return [plan.take().intended - segment.start for _ in range(n)]


def test_a_local_rate_step_sends_gamma_times_with_the_runs_burstiness():
    t = tracker(arrival="gamma", seed=5, burstiness=0.5)
    t.begin_step(0, 10, 0.0, rate_rps=4.0)
    assert first_times(t.plan) == pytest.approx(take(arrival_times(4.0, "gamma", "5:0", burstiness=0.5), 10))


def test_a_worker_reads_the_burstiness_from_the_step_message():
    t = tracker(arrival="poisson", seed=0, burstiness=1.0)  # a worker's own options: its defaults
    data = {"step": 1, "users": 10, "warmup_s": 0.0, "rate_rps": 6.0, "arrival": "gamma", "seed": 9,
            "burstiness": 0.25, "ranks": {"w0": 0, "w1": 1}}  # fmt: skip
    t._on_message(None, SimpleNamespace(data=data))
    want = take(arrival_times(6.0, "gamma", "9:1", rank=1, processes=2, burstiness=0.25), 10)
    assert first_times(t.plan) == pytest.approx(want)
    # A master of an earlier version sends no burstiness: Poisson's B = 1.
    del data["burstiness"]
    data["step"] = 0
    t._on_message(None, SimpleNamespace(data=data))
    want = take(arrival_times(6.0, "gamma", "9:0", rank=1, processes=2, burstiness=1.0), 10)
    assert first_times(t.plan) == pytest.approx(want)


# --- the options ---------------------------------------------------------------------------------------------
QUICK = ["--step-duration", "2s", "--step-warmup", "0s", "--max-tokens", "4"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--rates", "1", "--arrival", "gamma", "--burstiness", "0"], "--burstiness 0.0 must be a positive finite"),
        (["--rates", "1", "--arrival", "gamma", "--burstiness", "-2"], "--burstiness -2.0 must be a positive"),
        (["--rates", "1", "--arrival", "gamma", "--burstiness", "nan"], "must be a positive finite number"),
        (["--rates", "1", "--arrival", "gamma", "--burstiness", "inf"], "must be a positive finite number"),
        (["--rates", "1", "--arrival", "gamma", "--burstiness", "often"], "--burstiness"),  # the parser's float
        (["--rates", "1", "--burstiness", "0.5"], "--burstiness 0.5 only applies with --arrival gamma"),
        (["--rates", "1", "--arrival", "constant", "--burstiness", "4"], "this run's arrivals are constant"),
        (["--burstiness", "0.5"], "add --arrival gamma or drop --burstiness"),
    ],
)
def test_bad_burstiness_is_one_line(tmp_path, args, expected):
    line = first_error(*QUICK, *args, "--run-dir", str(tmp_path / "r"))
    assert expected in line, line


@pytest.mark.parametrize(
    "args",
    [
        ["--rates", "1,2", "--arrival", "gamma", "--burstiness", "0.25"],
        ["--rates", "1", "--arrival", "gamma"],  # B = 1: Poisson, by the gamma stream
        ["--arrival", "gamma"],  # a closed loop ignores --arrival, whichever: as poisson and constant always were
        ["--rates", "1", "--burstiness", "1"],
    ],
)
def test_good_arrivals_pass(args):
    options = parse_options("--headless", *QUICK, *args)
    check_options(options)
    assert isinstance(options.burstiness, float)


def test_the_web_uis_text_becomes_a_float():
    options = parse_options("--headless", *QUICK, "--rates", "1", "--arrival", "gamma")
    options.burstiness = "0.5"  # the start form hands back text
    check_options(options)
    assert options.burstiness == 0.5


# --- the analysis of what was sent -------------------------------------------------------------------------------
def records(steps: dict[int, tuple[np.ndarray, np.ndarray]], turn=None) -> pd.DataFrame:
    """Records of steps given as (intended times, actual send times)."""
    rows = []
    for step, (intended, actual) in steps.items():
        for i, (a, s) in enumerate(zip(intended, actual, strict=True)):
            rows.append({"request_id": f"{step}-{i}", "step": step, "start_time": s, "intended_start_time": a,
                         "turn": turn})  # fmt: skip
    return pd.DataFrame(rows)


def stream(rate, b, n, seed, t0=1000.0):
    return t0 + np.array(take(arrival_times(rate, "gamma", seed, burstiness=b), n))


def check_cv_interval(iv, cv, b):
    """The CV within 4 sd of the truth, inside its interval, whose half-width is about 1.96 sd (a seeded stream: one
    draw of a 95 % interval may miss; these bounds do not flake)."""
    sd = math.sqrt((b + 1) / (2 * b * b) / iv.n)  # a gamma of shape b (delta method)
    assert abs(iv.value - cv) < 4 * sd
    assert iv.low < iv.value < iv.high
    assert 0.5 * 1.96 * sd < iv.half_width < 2 * 1.96 * sd


def test_the_sent_gaps_of_a_stream_sent_on_time_are_the_streams():
    b = 0.25
    times = {0: stream(2.0, b, 2000, "a"), 1: stream(8.0, b, 4000, "b", t0=3000.0)}
    # Each process's stamps in its own order: shuffled, as records of several processes merge.
    frame = records({s: (t, t + 1e-4) for s, t in times.items()}).sample(frac=1.0, random_state=3)
    found = arr.inter_arrivals(frame, "gamma", b, {0: 2.0, 1: 8.0})
    assert [s.step for s in found.steps] == [0, 1]
    for s, n in zip(found.steps, (2000, 4000), strict=True):
        assert s.cv_sent.n == n - 1 and s.gaps_intended == n - 1
        assert s.cv_sent.value == pytest.approx(s.cv_intended)
        check_cv_interval(s.cv_sent, 2.0, b)
    # Pooled after scaling by each step's rate: the mean gap is 1 whatever the rate.
    assert len(found.sent) == 5998 and found.sent.mean() == pytest.approx(1.0, rel=0.1)
    check_cv_interval(found.pooled, 2.0, b)
    assert found.expected_cv == 2.0
    summary = found.to_dict()
    assert summary["process"] == "gamma" and summary["burstiness"] == 0.25
    assert [s["gaps"] for s in summary["steps"]] == [1999, 3999]


def test_a_backlog_sent_in_bursts_reads_burstier_than_intended():
    intended = 1000.0 + np.arange(600) / 4.0  # constant 4 req/s
    # Every 20th second the client stalls for 2 s: the requests due meanwhile leave together when it is back.
    actual = np.array([t if (t - 1000.0) % 20 >= 2 else 1000.0 + (t - 1000.0) // 20 * 20 + 2 for t in intended])
    found = arr.inter_arrivals(records({0: (intended, actual)}), "constant", None, {0: 4.0})
    step = found.steps[0]
    assert step.cv_intended == pytest.approx(0.0, abs=1e-9)
    assert step.cv_sent.low > 0.5  # clearly not constant, and the interval says so
    assert found.expected_cv == 0.0


def test_a_closed_loop_has_no_arrivals():
    frame = records({0: (np.arange(10.0), np.arange(10.0))})
    frame["intended_start_time"] = None
    assert arr.inter_arrivals(frame, "poisson", None, {0: 1.0}) is None
    assert arr.inter_arrivals(pd.DataFrame(), "poisson") is None


def test_only_a_conversations_first_turns_follow_the_arrivals():
    t = stream(4.0, 1.0, 400, "c")
    first = records({0: (t, t)}, turn=1)
    later = records({0: (t + 0.05, t + 0.05)}, turn=2)  # a later turn: right after its answer, not an arrival
    found = arr.inter_arrivals(pd.concat([first, later]), "poisson", None, {0: 4.0})
    assert found.steps[0].cv_sent.n == 399


def test_a_trace_step_is_scaled_by_its_mean_intended_gap():
    t = 1000.0 + np.cumsum(np.random.default_rng(0).exponential(0.5, 300))
    found = arr.inter_arrivals(records({0: (t, t)}), arr.TRACE, None, None)
    step = found.steps[0]
    assert math.isnan(step.rate_rps) and step.scale == pytest.approx(1 / np.diff(t).mean())
    assert found.sent.mean() == pytest.approx(1.0)
    assert found.expected_cv is None and found.expected_cdf(np.array([1.0])) is None


def test_few_gaps_have_no_interval():
    iv = arr.cv_interval(np.array([1.0, 2.0, 3.0]))
    assert iv.value == pytest.approx(0.5) and math.isnan(iv.low) and iv.note == "too few gaps"
    assert math.isnan(arr.cv(np.array([1.0])))


def test_the_expected_cdfs():
    x = np.array([0.5, 1.0, 2.0])
    assert arr.expected_cdf(x, "poisson") == pytest.approx(1 - np.exp(-x))
    assert arr.expected_cdf(x, "gamma", 1.0) == pytest.approx(1 - np.exp(-x))
    assert arr.expected_cdf(x, "gamma", 4.0) == pytest.approx(stats.gamma.cdf(x, a=4, scale=0.25))
    assert list(arr.expected_cdf(x, "constant")) == [0.0, 1.0, 1.0]
    assert arr.expected_cv("gamma", 0.25) == 2.0 and arr.expected_cv("constant") == 0.0


def test_the_process_of_a_runs_options():
    assert arr.process_of({"arrival": "gamma", "burstiness": 0.25}) == ("gamma", 0.25)
    assert arr.process_of({"arrival": "poisson", "burstiness": 1.0}) == ("poisson", None)
    assert arr.process_of({}) == ("poisson", None)
    assert arr.process_of({"trace": "t.jsonl", "arrival": "gamma"}) == ("trace", None)


def test_the_report_section_draws_a_bounded_cdf_with_the_expected_curve():
    t = stream(50.0, 0.25, 100_000, "big")
    found = arr.inter_arrivals(records({0: (t, t + 1e-3)}), "gamma", 0.25, {0: 50.0})
    fig = arrivals_figure(found)
    names = [trace.name for trace in fig.data]
    assert names == ["sent (actual send times)", "intended", "expected: gamma, shape 0.25"]
    for trace in fig.data:
        assert 0 < len(trace.x) <= CDF_RANKS + 2 * CDF_TAIL_RANKS + 2
    page = arrivals_html(found)
    assert "<h2>Inter-arrival times</h2>" in page and "Plotly.newPlot" in page and "2.00" in page
    assert arrivals_html(None) == ""


def test_the_cv_interval_covers_the_truth_about_as_often_as_it_says():
    """200 seeded gamma streams of 2000 gaps per shape: the 95 % interval held the true CV 92-96 % of the time when
    this was written (a percentile bootstrap of a skewed statistic is a little short: 80-86 % at 50 gaps, as
    docs/how-to/shape-the-workload.md says); never far below, and not a vacuous always-covering interval either."""
    rng = np.random.default_rng(11)
    for b in (0.25, 1.0, 4.0):
        truth = 1 / math.sqrt(b)
        hits = widths = 0.0
        for i in range(200):
            iv = arr.cv_interval(rng.gamma(b, 1 / b, size=2000), seed=i)
            hits += iv.low <= truth <= iv.high
            widths += iv.half_width / 200
        assert 0.88 <= hits / 200 <= 0.99, (b, hits / 200)
        sd = math.sqrt((b + 1) / (2 * b * b) / 2000)
        assert widths == pytest.approx(1.96 * sd, rel=0.3), (b, widths, sd)
