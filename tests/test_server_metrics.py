import math

import pandas as pd
import pytest

from analysis.server_metrics import (
    GENERATION_TOKENS,
    KV_CACHE,
    SUCCESS,
    UP,
    counter_total,
    load_metrics,
    merge_scrapes,
    parse_samples,
    scrape_line,
    step_server_table,
)
from tests.conftest import FIXTURES

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
