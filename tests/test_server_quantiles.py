"""The server's histogram quantiles in steps.csv and on the console: never a number its buckets and mean do not allow.

On bucket data like the issue's (every queue time in vLLM's first bucket, 0 to 0.3 s, mean 0.017 ms), on sampled
data whose true quantiles are known, and on the real vLLM 0.32 capture through the step table."""

from __future__ import annotations

import io
import math

import numpy as np
import pandas as pd
import pytest
from vllm_loadtest.analysis import glossary as g
from vllm_loadtest.analysis.histograms import from_columns, quantile_bounds
from vllm_loadtest.analysis.server_metrics import (
    QUEUE_HISTOGRAM,
    TTFT_HISTOGRAM,
    histogram_quantile,
    merge_scrapes,
    parse_samples,
    scrape_line,
    step_server_table,
)
from vllm_loadtest.analysis.steps import format_table

from tests.helpers.paths import FIXTURES

pytestmark = pytest.mark.unit

LAB = {"engine": "0", "model_name": "tiny"}
QUEUE_BOUNDS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, math.inf]  # vLLM 0.32's request_queue_time buckets
TTFT_BOUNDS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, math.inf]
TIMELINE = [{"step": 0, "users": 4, "start_time": 0.0, "measure_start": 0.5, "end_time": 2.0}]


def histogram(metric: str, values: np.ndarray, bounds: list[float]) -> list[tuple[str, dict, float]]:
    """The samples of one histogram holding these observations (le: less or equal, as Prometheus)."""
    out = [
        (metric + "_bucket", {**LAB, "le": "+Inf" if math.isinf(b) else str(b)}, float((values <= b).sum()))
        for b in bounds
    ]
    return [*out, (metric + "_count", LAB, float(values.size)), (metric + "_sum", LAB, float(values.sum()))]


def step_row(tmp_path, samples: list) -> dict:
    """One step whose window holds these observations: an empty scrape before it, the histograms inside it."""
    with open(tmp_path / "metrics.jsonl", "wb") as f:
        f.write(scrape_line(0.0, [], None))
        f.write(scrape_line(1.0, samples, None))
    return step_server_table(merge_scrapes(tmp_path), TIMELINE, model="tiny").iloc[0].to_dict()


def console_server_table(row: dict) -> str:
    """The console's server table of that step, as the end of a run prints it (analysis.steps.format_table)."""
    text = format_table(pd.DataFrame([{**row, "users": 4, "kv_cache_usage_max": 0.5}]))
    return text.split(g.SECTIONS[g.SERVER].title, 1)[1].split("\n\n", 1)[0]


def test_the_issues_queue_time_is_its_bounds_not_a_median_of_150_ms(tmp_path):
    """500 queue times of 0.017 ms on average, all in the first bucket: interpolation said p50 150 ms, p99 297 ms."""
    queue = np.full(500, 0.000017)
    row = step_row(tmp_path, histogram(QUEUE_HISTOGRAM, queue, QUEUE_BOUNDS))
    assert row["server_queue_time_mean_s"] == pytest.approx(0.000017)
    assert math.isnan(row["server_queue_time_p50_s"]) and math.isnan(row["server_queue_time_p99_s"])
    assert row["server_queue_time_p50_low_s"] == 0.0
    assert row["server_queue_time_p50_high_s"] == pytest.approx(2 * 0.000017)  # Markov: median <= 2 * mean
    assert row["server_queue_time_p99_high_s"] == pytest.approx(100 * 0.000017)
    text = console_server_table(row)
    assert "< 1.7" in text and "150" not in text and "297" not in text  # the console shows p99
    # What interpolation said, for the record: the bucket's middle, impossible beside that mean.
    cumulative = {b: float((queue <= b).sum()) for b in QUEUE_BOUNDS}
    assert histogram_quantile(0.5, cumulative) == pytest.approx(0.15)


@pytest.mark.parametrize("seed", range(40))
def test_bounds_hold_the_true_quantiles_and_a_value_never_leaves_them(seed):
    """Sampled times with known empirical quantiles: the bounds contain them, the value (when given) lies inside the
    bounds and below mean / (1 - q)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(20, 3000))
    values = rng.lognormal(mean=rng.uniform(-6, 1), sigma=rng.uniform(0.05, 2.0), size=n)
    bounds = TTFT_BOUNDS if seed % 2 else QUEUE_BOUNDS
    buckets = {b: float((values <= b).sum()) for b in bounds}
    mean = float(values.mean())
    for q in (0.5, 0.9, 0.99):
        truth = float(np.quantile(values, q, method="inverted_cdf"))  # the observation of rank ceil(q * n)
        known = quantile_bounds(q, buckets, mean)
        assert known.low <= truth <= known.high, (q, truth, known)
        assert known.high <= max(mean / (1 - q), known.low) or known.high in bounds
        if not math.isnan(known.value):
            assert known.low <= known.value <= known.high and known.value <= mean / (1 - q)
            assert (known.high - known.low) / known.high <= 0.5


def test_a_narrow_bucket_keeps_its_interpolated_value(tmp_path):
    ttft = np.linspace(0.52, 0.74, 200)  # all in (0.5, 0.75]: narrow enough to read inside
    row = step_row(tmp_path, histogram(TTFT_HISTOGRAM, ttft, TTFT_BOUNDS))
    assert 0.5 <= row["server_ttft_p50_s"] <= 0.75
    assert (row["server_ttft_p50_low_s"], row["server_ttft_p50_high_s"]) == (0.5, 0.75)
    assert f"{row['server_ttft_p99_s'] * 1000:.0f}" in console_server_table(row)


def test_the_inf_bucket_is_bounded_by_the_mean_and_survives_steps_csv(tmp_path):
    ttft = np.full(10, 12.0)  # above vLLM's largest finite TTFT bound here (10 s)
    row = step_row(tmp_path, histogram(TTFT_HISTOGRAM, ttft, TTFT_BOUNDS))
    buf = io.StringIO()
    pd.DataFrame([row]).to_csv(buf, index=False)
    back = pd.read_csv(io.StringIO(buf.getvalue())).iloc[0].to_dict()
    # The +Inf bucket has no upper edge; the mean gives one: p99 <= 12 s / 0.01.
    assert back["server_ttft_p99_low_s"] == 10.0 and back["server_ttft_p99_high_s"] == pytest.approx(1200)
    assert "10000-1200000" in console_server_table(back)
    # Without a mean (no _sum/_count) the bound is inf, null once in summary.json: still read as "above".
    assert math.isinf(quantile_bounds(0.99, {10.0: 0.0, math.inf: 10.0}).high)
    assert from_columns(0.99, 10.0, None).text() == "> 10000 ms"


def test_no_observations_leave_every_quantile_column_missing(tmp_path):
    row = step_row(tmp_path, histogram(TTFT_HISTOGRAM, np.array([]), TTFT_BOUNDS))
    for name in ("server_ttft_p50_s", "server_ttft_p50_low_s", "server_ttft_p99_high_s", "server_queue_time_p50_s"):
        assert math.isnan(row[name]), name
    assert "-" in console_server_table(row)


def test_the_real_vllm_capture_reports_only_what_its_buckets_and_mean_allow(tmp_path):
    """vLLM 0.32 on CPU, 256 requests: interpolation put the queue-time median at 151 ms beside a mean of 24 ms."""
    samples = parse_samples((FIXTURES / "vllm-0.32-cpu-metrics.txt").read_text())
    row = step_row(tmp_path, samples)
    queue_mean, ttft_mean = 6.052261081001234 / 256, 30.011889696121216 / 256
    assert row["server_queue_time_mean_s"] == pytest.approx(queue_mean)
    assert row["server_ttft_mean_s"] == pytest.approx(ttft_mean)
    assert row["server_queue_time_p50_low_s"] == 0.0
    assert row["server_queue_time_p50_high_s"] == pytest.approx(2 * queue_mean)
    assert (row["server_queue_time_p99_low_s"], row["server_queue_time_p99_high_s"]) == (0.0, 0.3)
    assert row["server_ttft_p50_low_s"] == 0.1 and row["server_ttft_p50_high_s"] == pytest.approx(2 * ttft_mean)
    assert (row["server_ttft_p99_low_s"], row["server_ttft_p99_high_s"]) == (0.1, 0.25)
    for prefix, mean in (("server_ttft", ttft_mean), ("server_queue_time", queue_mean)):
        for q in (50, 99):
            value, low, high = (row[f"{prefix}_p{q}{s}"] for s in ("_s", "_low_s", "_high_s"))
            assert low <= high <= max(mean / (1 - q / 100), low) or high in (0.25, 0.3)
            assert math.isnan(value) or low <= value <= high  # here: all too wide for a value
    text = console_server_table(row)
    assert "100-250" in text and "< 300" in text
    # The interpolation it replaces contradicted the mean: a median above twice the mean is impossible.
    queue = {float(lab["le"]): v for name, lab, v in samples if name == QUEUE_HISTOGRAM + "_bucket"}
    assert histogram_quantile(0.5, queue) > 2 * queue_mean
