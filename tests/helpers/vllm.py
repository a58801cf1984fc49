"""The real vLLM's own counters, read from its /metrics, and its gauges in a run's metrics.parquet."""

from __future__ import annotations

import time
import urllib.request

import pandas as pd
from vllm_loadtest.analysis.server_metrics import GENERATION_TOKENS, RUNNING, SUCCESS, counter_total, parse_samples


def scrape(url: str) -> list:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        return parse_samples(r.read().decode())


def finished_counts(url: str) -> tuple[float, float]:
    """Requests finished normally (stop/length) and generated tokens, once nothing is running."""
    deadline = time.monotonic() + 60
    while True:
        samples = scrape(url)
        if counter_total(samples, RUNNING) == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    done = sum(
        v for name, labels, v in samples if name == SUCCESS and labels.get("finished_reason") in ("stop", "length")
    )
    return done, counter_total(samples, GENERATION_TOKENS)


def window_stats(metrics: pd.DataFrame, metric: str, start: float, end: float) -> tuple[float, float]:
    """Mean and max of a gauge's raw samples inside [start, end), straight from metrics.parquet."""
    rows = metrics[(metrics["metric"] == metric) & (metrics["timestamp"] >= start) & (metrics["timestamp"] < end)]
    per_scrape = rows.groupby("timestamp")["value"].sum()
    return float(per_scrape.mean()), float(per_scrape.max())
