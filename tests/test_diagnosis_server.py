"""The diagnosis's server sentences (queue time, TTFT gap) quote only numbers that hold: exact means, and a
histogram quantile as the bounds its buckets and mean allow, never an interpolation inside a wide bucket."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from vllm_loadtest.analysis.diagnosis import BATCH_SLOTS, COMPUTE, KV_CACHE, _binding_line, gap_sentence, queue_sentence

pytestmark = pytest.mark.unit

NAN = math.nan


def row(**values) -> pd.Series:
    base = {"step": 3, "users": 16, "kv_cache_usage_max": 1.0, "waiting_max": 27, "preemptions": 2847,
            "server_queue_time_mean_s": NAN, "server_queue_time_p99_s": NAN, "server_queue_time_p99_low_s": NAN,
            "server_queue_time_p99_high_s": NAN, "ttft_gap_mean_s": NAN, "server_ttft_mean_s": NAN}  # fmt: skip
    return pd.Series({**base, **values})


def test_the_issues_queue_time_is_quoted_as_its_mean_and_its_bounds():
    """The real run's server table said mean 0.017 ms, p50 150 ms, p99 297 ms: only the mean and the bound hold."""
    r = row(server_queue_time_mean_s=0.000017, server_queue_time_p99_low_s=0.0, server_queue_time_p99_high_s=0.0017)
    text = _binding_line(r, KV_CACHE)
    assert text.startswith("At 16 users the KV cache binds")
    assert "In vLLM's queue requests waited 0.017 ms on average, p99 < 1.7 ms." in text
    assert "150" not in text and "297" not in text


def test_a_quantile_pinned_down_by_a_narrow_bucket_is_quoted_as_a_value():
    r = row(server_queue_time_mean_s=0.62, server_queue_time_p99_s=0.81, server_queue_time_p99_low_s=0.8,
            server_queue_time_p99_high_s=1.0)  # fmt: skip
    assert queue_sentence(r) == "In vLLM's queue requests waited 620 ms on average, p99 810 ms."
    assert "p99 800-1000 ms" in queue_sentence(r.drop("server_queue_time_p99_s"))  # a table without the value


def test_without_the_series_nothing_is_said():
    assert queue_sentence(row()) == "" and gap_sentence(row()) == ""
    assert _binding_line(row(), BATCH_SLOTS).endswith("the batch-size limit binds.")


def test_the_ttft_gap_is_said_only_when_most_of_the_ttft_is_outside_the_engine():
    outside = row(kv_cache_usage_max=0.3, waiting_max=0, preemptions=0, ttft_gap_mean_s=0.08, server_ttft_mean_s=0.02)
    text = _binding_line(outside, COMPUTE)
    assert "80% of the TTFT is outside vLLM's engine: 100 ms on average at the client against vLLM's own 20 ms" in text
    assert gap_sentence(row(ttft_gap_mean_s=0.004, server_ttft_mean_s=0.001)) == ""  # a local round trip
    assert gap_sentence(row(ttft_gap_mean_s=0.02, server_ttft_mean_s=0.2)) == ""  # the engine's own time dominates
