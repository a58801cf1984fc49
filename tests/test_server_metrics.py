import math

import pandas as pd
import pytest
from vllm_loadtest.analysis.server_metrics import (
    GENERATION_TOKENS,
    KV_CACHE,
    SUCCESS,
    UP,
    counter_increase,
    counter_total,
    histogram_quantile,
    load_metrics,
    merge_scrapes,
    parse_samples,
    scrape_line,
    server_info,
    step_server_table,
)

from tests.helpers.paths import FIXTURES

pytestmark = pytest.mark.unit

REAL = (FIXTURES / "vllm-0.32-cpu-metrics.txt").read_text()


def test_parses_real_vllm_metrics_with_prometheus_client():
    samples = parse_samples(REAL)
    assert all(name.startswith("vllm:") for name, _, _ in samples)
    assert counter_total(samples, GENERATION_TOKENS) == 65286.0
    assert counter_total(samples, SUCCESS) == 256.0
    assert counter_total(samples, SUCCESS, model="tiny") == 256.0
    assert counter_total(samples, SUCCESS, model="other") == 0.0
    buckets = [s for s in samples if s[0] == "vllm:time_to_first_token_seconds_bucket"]
    assert buckets and all("le" in labels for _, labels, _ in buckets)


def test_v0_engine_names_are_mapped():
    text = '# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{model_name="m"} 0.5\n'
    assert parse_samples(text) == [(KV_CACHE, {"model_name": "m"}, 0.5)]


def test_garbage_raises_so_the_scraper_records_a_gap():
    with pytest.raises(ValueError):
        parse_samples("<html>this is not prometheus</html>\n{")


def write_scrapes(run_dir, scrapes):
    with open(run_dir / "metrics.jsonl", "wb") as f:
        for t, samples, error in scrapes:
            f.write(scrape_line(t, samples, error))


def test_gaps_are_up_zero_and_steps_summarize_their_window(tmp_path):
    def s(kv, running, waiting, preempt):
        lab = {"engine": "0", "model_name": "tiny"}
        return [
            (KV_CACHE, lab, kv),
            ("vllm:num_requests_running", lab, running),
            ("vllm:num_requests_waiting", lab, waiting),
            ("vllm:num_preemptions_total", lab, preempt),
        ]

    write_scrapes(
        tmp_path,
        [
            (0.0, s(0.1, 1, 0, 0), None),
            (1.0, s(0.2, 1, 0, 0), None),
            (2.0, None, "ConnectionRefusedError: [Errno 111]"),
            (3.0, s(0.9, 14, 3, 5), None),
            (4.0, s(1.0, 14, 9, 12), None),
        ],
    )
    metrics = merge_scrapes(tmp_path)
    up = metrics[metrics["metric"] == UP]
    assert list(up["value"]) == [1, 1, 0, 1, 1]
    assert "ConnectionRefusedError" in up["labels"].iloc[2]
    timeline = [
        {"step": 0, "users": 1, "start_time": 0, "measure_start": 0.0, "end_time": 2.5},
        {"step": 1, "users": 16, "start_time": 2.5, "measure_start": 2.5, "end_time": 5.0},
        {"step": 2, "users": 32, "start_time": 5.0, "measure_start": 5.0, "end_time": 9.0},
    ]
    t = step_server_table(load_metrics(tmp_path), timeline, model="tiny").set_index("step")
    assert t.loc[0, "kv_cache_usage_mean"] == pytest.approx(0.15)
    assert t.loc[1, "kv_cache_usage_max"] == 1.0 and t.loc[1, "waiting_max"] == 9
    assert t.loc[1, "preemptions"] == 12
    assert math.isnan(t.loc[2, "kv_cache_usage_max"])  # no scrape inside the window: missing, not 0


def test_no_metrics_gives_missing_columns():
    t = step_server_table(None, [{"step": 0, "users": 1, "start_time": 0, "measure_start": 0, "end_time": 1}])
    assert pd.isna(t.iloc[0]["kv_cache_usage_max"])


def test_real_scrape_drops_created_samples_and_filters_by_model():
    names = {name for name, _, _ in parse_samples(REAL)}
    assert not any(n.endswith("_created") for n in names)
    text = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{model_name="a"} 3\n'
        'vllm:num_requests_running{model_name="b"} 7\n'
        "# TYPE vllm:engine_sleep_state gauge\n"
        "vllm:engine_sleep_state 0\n"
    )
    assert parse_samples(text, model="b") == [
        ("vllm:num_requests_running", {"model_name": "b"}, 7.0),
        ("vllm:engine_sleep_state", {}, 0.0),
    ]


def series(points):
    return pd.Series([v for _, v in points], index=[t for t, _ in points], dtype=float)


def test_counter_increase_with_a_gap_and_a_restart():
    # 10 -> 14 (+4), gap, server restarts: 2 (+2 since the restart), 5 (+3)
    s = series([(0, 10), (1, 12), (2, 14), (4, 2), (5, 5)])
    assert counter_increase(s, 0.5, 5) == pytest.approx(2 + 2 + 2 + 3)
    assert counter_increase(s, 0, 2) == 4  # baseline: the scrape at the window's start
    assert math.isnan(counter_increase(s, 5, 9))  # no scrape after the window started: unknown, not 0
    # A series first seen after scraping began started from 0 (vLLM creates label sets on first use).
    assert counter_increase(series([(3, 4), (4, 6)]), 2, 4, first_scrape=0) == 6
    # Scraping began inside the window: count from the first scrape, never guess what came before it.
    assert counter_increase(series([(3, 4), (4, 6)]), 2, 4, first_scrape=3) == 2


def test_histogram_quantile_interpolates_like_prometheus():
    buckets = {0.1: 10, 0.2: 30, 0.5: 40, math.inf: 40}
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.15)  # rank 20: halfway through (0.1, 0.2]
    assert histogram_quantile(0.125, buckets) == pytest.approx(0.05)  # rank 5: halfway through (0, 0.1]
    assert histogram_quantile(0.99, buckets) == pytest.approx(0.2 + 0.3 * (39.6 - 30) / 10)
    assert math.isnan(histogram_quantile(0.99, {0.1: 1, math.inf: 5}))  # in +Inf: unknown
    assert math.isnan(histogram_quantile(0.5, {0.1: 0, math.inf: 0}))


def test_server_columns_from_known_series(tmp_path):
    """Two steps with exactly known server series, one scrape lost and a counter reset in the second step."""
    lab = {"engine": "0", "model_name": "tiny"}
    other = {"engine": "0", "model_name": "other"}

    def scrape(t, hits, queries, waiting_cap, ttft_buckets, preempt):
        out = [
            (KV_CACHE, lab, 0.1 * t),
            (KV_CACHE, other, 0.99),  # another model on the same server: must not count
            ("vllm:num_requests_waiting_by_reason", {**lab, "reason": "capacity"}, waiting_cap),
            ("vllm:num_requests_waiting_by_reason", {**lab, "reason": "deferred"}, 0.0),
            ("vllm:prefix_cache_hits_total", lab, hits),
            ("vllm:prefix_cache_queries_total", lab, queries),
            ("vllm:num_preemptions_total", lab, preempt),
        ]
        cumulative = 0.0
        for le, n in ttft_buckets:
            cumulative += n
            out.append(("vllm:time_to_first_token_seconds_bucket", {**lab, "le": str(le)}, cumulative))
        out.append(("vllm:time_to_first_token_seconds_count", lab, cumulative))
        out.append(("vllm:time_to_first_token_seconds_sum", lab, 0.05 * cumulative))
        return out

    zero = [(0.1, 0), (1.0, 0), ("+Inf", 0)]
    write_scrapes(
        tmp_path,
        [
            (0.0, scrape(0, 0, 0, 0, zero, 0), None),
            (1.0, scrape(1, 50, 100, 1, [(0.1, 10), (1.0, 0), ("+Inf", 0)], 1), None),
            (2.0, scrape(2, 100, 400, 3, [(0.1, 20), (1.0, 0), ("+Inf", 0)], 2), None),
            # step 1 from t=2.5: a lost scrape, then the server restarted (counters from 0 again)
            (3.0, None, "ReadTimeout"),
            (4.0, scrape(4, 30, 60, 5, [(0.1, 0), (1.0, 4), ("+Inf", 0)], 0), None),
            (5.0, scrape(5, 90, 120, 2, [(0.1, 0), (1.0, 8), ("+Inf", 0)], 3), None),
        ],
    )
    metrics = merge_scrapes(tmp_path)
    timeline = [
        {"step": 0, "users": 1, "start_time": 0, "measure_start": 0.0, "end_time": 2.5},
        {"step": 1, "users": 2, "start_time": 2.5, "measure_start": 2.5, "end_time": 5.5},
    ]
    # Client side of the TTFT gap: requests whose first token arrived between the scrapes at 0 and 2 (step 0)
    # and at 2 and 5 (step 1), whatever step they started in.
    records = pd.DataFrame(
        {
            "status": ["ok", "ok", "error", "ok", "ok"],
            "start_time": [0.5, 1.0, 1.0, 1.9, 3.0],
            "ttft_s": [0.06, 0.08, None, 0.3, 0.7],
        }
    )
    t = step_server_table(metrics, timeline, model="tiny", records=records).set_index("step")
    assert t.loc[0, "ttft_gap_mean_s"] == pytest.approx(0.07 - 0.05)
    assert t.loc[1, "ttft_gap_mean_s"] == pytest.approx(0.5 - 0.05)
    assert t.loc[0, "kv_cache_usage_max"] == pytest.approx(0.2)  # the other model's 0.99 is filtered out
    assert t.loc[0, "waiting_capacity_max"] == 3 and t.loc[1, "waiting_capacity_max"] == 5
    assert t.loc[0, "waiting_deferred_max"] == 0
    assert t.loc[0, "prefix_cache_hit_rate"] == pytest.approx(100 / 400)
    # step 1: after the restart, 30 hits of 60, then +60 of +60
    assert t.loc[1, "prefix_cache_hit_rate"] == pytest.approx(90 / 120)
    assert t.loc[1, "preemptions"] == 3  # 0 and 3 after the restart
    # step 0: 30 observations all <= 0.1 s; step 1: 12 observations in (0.1, 1.0]
    assert t.loc[0, "server_ttft_mean_s"] == pytest.approx(0.05)
    # Both steps' observations sit in one wide bucket: the quantiles are only their bounds (interpolation said
    # p50 = 50 ms, 550 ms and p99 = 991 ms: the buckets' middles, not the requests').
    assert math.isnan(t.loc[0, "server_ttft_p50_s"]) and math.isnan(t.loc[1, "server_ttft_p50_s"])
    assert math.isnan(t.loc[1, "server_ttft_p99_s"])
    assert (t.loc[0, "server_ttft_p50_low_s"], t.loc[0, "server_ttft_p50_high_s"]) == (0.0, 0.1)
    assert t.loc[1, "server_ttft_p50_low_s"] == 0.1 and t.loc[1, "server_ttft_p99_high_s"] == 1.0
    assert math.isnan(t.loc[0, "server_queue_time_mean_s"])  # not scraped: missing, not 0
    assert server_info(metrics) == {}
