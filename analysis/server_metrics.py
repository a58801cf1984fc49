"""vLLM's Prometheus metrics: parsing a scrape, storing the samples, and summarizing them per load step.

Pure: the scraper that fetches `/metrics` during a run lives in `locustfiles/scraper.py`.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from prometheus_client.parser import text_string_to_metric_families

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.parquet"
SCRAPES_FILE = "metrics.jsonl"  # appended during the run, one line per scrape; merged into metrics.parquet
UP = "up"  # one sample per scrape: 1 when it succeeded, 0 for a gap (labels carry the error)

# Old (V0 engine) names -> the names of vLLM 0.32 (V1 engine).
ALIASES = {
    "vllm:gpu_cache_usage_perc": "vllm:kv_cache_usage_perc",
    "vllm:cpu_cache_usage_perc": "vllm:kv_cache_usage_perc",
    "vllm:gpu_prefix_cache_queries_total": "vllm:prefix_cache_queries_total",
    "vllm:gpu_prefix_cache_hits_total": "vllm:prefix_cache_hits_total",
}
KV_CACHE = "vllm:kv_cache_usage_perc"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
PREEMPTIONS = "vllm:num_preemptions_total"
SUCCESS = "vllm:request_success_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"

SERVER_COLUMNS = [
    "kv_cache_usage_mean",
    "kv_cache_usage_max",
    "running_mean",
    "running_max",
    "waiting_mean",
    "waiting_max",
    "preemptions",
]

SCHEMA = pa.schema(
    [("timestamp", pa.float64()), ("metric", pa.string()), ("labels", pa.string()), ("value", pa.float64())]
)


def parse_samples(text: str, prefix: str = "vllm:") -> list[tuple[str, dict, float]]:
    """(metric, labels, value) of every sample whose name starts with `prefix`, under vLLM 0.32's names."""
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith(prefix):
                out.append((ALIASES.get(s.name, s.name), dict(s.labels), float(s.value)))
    return out


def counter_total(samples: list[tuple[str, dict, float]], metric: str, model: str | None = None) -> float:
    """Sum of a metric's samples over all label sets (optionally of one model_name)."""
    return sum(
        v
        for name, labels, v in samples
        if name == metric and (model is None or labels.get("model_name", model) == model)
    )


def scrape_line(timestamp: float, samples: list[tuple[str, dict, float]] | None, error: str | None = None) -> bytes:
    """One line of metrics.jsonl: a scrape's samples, or a gap with its error."""
    return orjson.dumps({"t": timestamp, "samples": samples, "error": error}, option=orjson.OPT_APPEND_NEWLINE)


def merge_scrapes(run_dir: Path, write: bool = True) -> pd.DataFrame:
    """metrics.jsonl -> metrics.parquet (timestamp, metric, labels as JSON text, value)."""
    run_dir = Path(run_dir)
    rows: dict[str, list] = {"timestamp": [], "metric": [], "labels": [], "value": []}
    path = run_dir / SCRAPES_FILE
    if not path.exists():
        return pd.DataFrame(rows)
    with open(path, "rb") as f:
        for line in f:
            try:
                scrape = orjson.loads(line)
            except ValueError:
                continue  # a line cut by a crash
            t = scrape["t"]
            ok = scrape.get("samples") is not None
            rows["timestamp"].append(t)
            rows["metric"].append(UP)
            rows["labels"].append("{}" if ok else json.dumps({"error": scrape.get("error") or "unknown"}))
            rows["value"].append(1.0 if ok else 0.0)
            for name, labels, value in scrape.get("samples") or ():
                rows["timestamp"].append(t)
                rows["metric"].append(name)
                rows["labels"].append(json.dumps(labels, sort_keys=True))
                rows["value"].append(value)
    table = pa.Table.from_pydict(rows, schema=SCHEMA)
    if write:
        tmp = run_dir / (METRICS_FILE + ".tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, run_dir / METRICS_FILE)
    return table.to_pandas()


def load_metrics(run_dir: Path) -> pd.DataFrame | None:
    run_dir = Path(run_dir)
    if (run_dir / METRICS_FILE).exists():
        return pd.read_parquet(run_dir / METRICS_FILE)
    if (run_dir / SCRAPES_FILE).exists():
        return merge_scrapes(run_dir, write=False)
    return None


def _series(metrics: pd.DataFrame, metric: str, model: str | None) -> pd.Series:
    """One value per scrape: the sum over label sets (engines, reasons) of one metric."""
    rows = metrics[metrics["metric"] == metric]
    if model is not None and len(rows):
        keep = [json.loads(lbl).get("model_name", model) == model for lbl in rows["labels"]]
        rows = rows[keep]
    return rows.groupby("timestamp")["value"].sum().sort_index()


def _window(series: pd.Series, start: float, end: float) -> pd.Series:
    return series[(series.index >= start) & (series.index < end)]


def _stat(values: pd.Series, how: str) -> float:
    return float(getattr(values, how)()) if len(values) else math.nan


def _counter_delta(series: pd.Series, start: float, end: float) -> float:
    """Increase of a counter between the last scrape before `start` and the last before `end`."""
    before = series[series.index <= start]
    upto = series[series.index <= end]
    if upto.empty or upto.index[-1] <= start:
        return math.nan  # no scrape inside the window
    if before.empty:
        inside = _window(series, start, end)
        if len(inside) < 2:
            return math.nan
        before, upto = inside.iloc[:1], inside
    return float(max(upto.iloc[-1] - before.iloc[-1], 0.0))


def step_server_table(metrics: pd.DataFrame | None, timeline: list[dict], model: str | None = None) -> pd.DataFrame:
    """Per step, over its measured window: KV-cache usage, running and waiting requests, preemptions."""
    rows = []
    series = {}
    if metrics is not None and len(metrics):
        series = {m: _series(metrics, m, model) for m in (KV_CACHE, RUNNING, WAITING, PREEMPTIONS)}
    for step in timeline:
        start, end = float(step["measure_start"]), float(step["end_time"] or np.inf)
        row = {"step": int(step["step"])}
        if not series:
            row.update({c: math.nan for c in SERVER_COLUMNS})
        else:
            kv, run, wait = (_window(series[m], start, end) for m in (KV_CACHE, RUNNING, WAITING))
            row.update(
                {
                    "kv_cache_usage_mean": _stat(kv, "mean"),
                    "kv_cache_usage_max": _stat(kv, "max"),
                    "running_mean": _stat(run, "mean"),
                    "running_max": _stat(run, "max"),
                    "waiting_mean": _stat(wait, "mean"),
                    "waiting_max": _stat(wait, "max"),
                    "preemptions": _counter_delta(series[PREEMPTIONS], start, end),
                }
            )
        rows.append(row)
    return pd.DataFrame(rows, columns=["step", *SERVER_COLUMNS])
