"""vLLM's Prometheus metrics: parsing a scrape, storing the samples, and summarizing them per load step.

Pure: the scraper that fetches `/metrics` during a run lives in `locustfiles/scraper.py`.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa

from . import glossary
from .diskio import replace_parquet
from .histograms import quantile_bounds
from .prometheus_text import ALIASES, SCRAPES_FILE, parse_samples, scrape_line  # noqa: F401 (re-exported)
from .servers import CANONICAL

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.parquet"
UP = "up"  # one sample per scrape: 1 when it succeeded, 0 for a gap (labels carry the error)

# The canonical series the analysis reads: every server's samples are renamed to these when a scrape is parsed
# (analysis/servers: a profile per server); those a server lacks are absent, and their columns missing.
KV_CACHE = CANONICAL["kv_cache_usage"]
RUNNING = CANONICAL["running"]
WAITING = CANONICAL["waiting"]
WAITING_BY_REASON = CANONICAL["waiting_by_reason"]  # reason = capacity | deferred (vLLM 0.32)
PREEMPTIONS = CANONICAL["preemptions"]
SUCCESS = CANONICAL["success"]
GENERATION_TOKENS = CANONICAL["generation_tokens"]
PREFIX_QUERIES = CANONICAL["prefix_cache_queries"]
PREFIX_HITS = CANONICAL["prefix_cache_hits"]
TTFT_HISTOGRAM = CANONICAL["ttft_histogram"]
QUEUE_HISTOGRAM = CANONICAL["queue_histogram"]
CACHE_CONFIG = CANONICAL["cache_config"]

SERVER_COLUMNS = glossary.names(glossary.SERVER)  # steps.csv's server columns, in order
SERVER_BOUND_COLUMNS = glossary.names(glossary.SERVER_BOUNDS)  # the quantiles' bounds, written after open loop

SERVER_SOURCE = "server"  # metrics.parquet's source of the server's own /metrics; a GPU exporter's is its URL

SCHEMA = pa.schema(
    [
        ("timestamp", pa.float64()),
        ("metric", pa.string()),
        ("labels", pa.string()),
        ("value", pa.float64()),
        ("source", pa.string()),  # last: added with the GPU exporters (issue 20)
    ]
)


def counter_total(samples: list[tuple[str, dict, float]], metric: str, model: str | None = None) -> float:
    """Sum of a metric's samples over all label sets (optionally of one model_name)."""
    return sum(
        v
        for name, labels, v in samples
        if name == metric and (model is None or labels.get("model_name", model) == model)
    )


def merge_scrapes(run_dir: Path, write: bool = True) -> pd.DataFrame:
    """metrics.jsonl -> metrics.parquet (timestamp, metric, labels as JSON text, value, source: "server" or the GPU
    exporter's URL; each scrape's `up` sample carries its source, so an exporter's gaps are its own)."""
    run_dir = Path(run_dir)
    rows: dict[str, list] = {"timestamp": [], "metric": [], "labels": [], "value": [], "source": []}
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
            source = scrape.get("source") or SERVER_SOURCE
            samples = scrape.get("samples") or ()
            rows["timestamp"].append(t)
            rows["metric"].append(UP)
            rows["labels"].append("{}" if ok else json.dumps({"error": scrape.get("error") or "unknown"}))
            rows["value"].append(1.0 if ok else 0.0)
            rows["source"].extend([source] * (len(samples) + 1))
            for name, labels, value in samples:
                rows["timestamp"].append(t)
                rows["metric"].append(name)
                rows["labels"].append(json.dumps(labels, sort_keys=True))
                rows["value"].append(value)
    table = pa.Table.from_pydict(rows, schema=SCHEMA)
    if write:
        replace_parquet(run_dir / METRICS_FILE, table)
    return table.to_pandas()


def with_source(metrics: pd.DataFrame) -> pd.DataFrame:
    """The frame with its `source` column: a metrics.parquet written before GPU exporters holds the server's only."""
    if "source" in metrics.columns:
        return metrics
    return metrics.assign(source=SERVER_SOURCE)


def server_rows(metrics: pd.DataFrame) -> pd.DataFrame:
    """The rows of the server's own /metrics scrapes (not a GPU exporter's)."""
    if "source" not in metrics.columns:
        return metrics
    return metrics[metrics["source"] == SERVER_SOURCE]


def load_metrics(run_dir: Path) -> pd.DataFrame | None:
    run_dir = Path(run_dir)
    if (run_dir / METRICS_FILE).exists():
        return with_source(pd.read_parquet(run_dir / METRICS_FILE))
    if (run_dir / SCRAPES_FILE).exists():
        return merge_scrapes(run_dir, write=False)
    return None


class ServerSeries:
    """The scraped samples of one run, indexed for per-window questions (one model's samples, labels parsed once)."""

    def __init__(self, metrics: pd.DataFrame, model: str | None = None) -> None:
        metrics = server_rows(metrics)  # a GPU exporter's scrapes and gaps are not the server's
        up = metrics[metrics["metric"] == UP]
        ok_times = up.loc[up["value"] > 0, "timestamp"]
        # Scrapes before the first successful one tell nothing about which series existed then.
        self.first_scrape = float(ok_times.min()) if len(ok_times) else math.inf
        self.last_scrape = float(ok_times.max()) if len(ok_times) else -math.inf
        self._by_metric: dict[str, list[tuple[dict, pd.Series]]] = {}
        rows = metrics[metrics["metric"] != UP]
        for (metric, labels_text), group in rows.groupby(["metric", "labels"], sort=False):
            labels = json.loads(labels_text)
            if model is not None and labels.get("model_name", model) != model:
                continue
            series = pd.Series(group["value"].to_numpy(), index=group["timestamp"].to_numpy()).sort_index()
            self._by_metric.setdefault(metric, []).append((labels, series))

    def has(self, metric: str) -> bool:
        return metric in self._by_metric

    def labelled(self, metric: str, **match: str) -> list[tuple[dict, pd.Series]]:
        series = self._by_metric.get(metric, [])
        return [(lab, s) for lab, s in series if all(lab.get(k) == v for k, v in match.items())]

    def gauge(self, metric: str, **match: str) -> pd.Series:
        """One value per scrape: the sum over label sets (engines, reasons) of a gauge."""
        parts = [s for _, s in self.labelled(metric, **match)]
        if not parts:
            return pd.Series(dtype=float)
        return pd.concat(parts).groupby(level=0).sum().sort_index()

    def increase(self, metric: str, start: float, end: float, **match: str) -> float:
        """Increase of a counter over (start, end], summed over its label sets; NaN when no scrape covers it."""
        values = [counter_increase(s, start, end, self.first_scrape) for _, s in self.labelled(metric, **match)]
        values = [v for v in values if not math.isnan(v)]
        return float(sum(values)) if values else math.nan

    def scrape_span(self, metric: str, start: float, end: float) -> tuple[float, float] | None:
        """The scrapes that bound a counter's increase over (start, end]: the baseline and the last one inside."""
        times = np.unique(np.concatenate([s.index.to_numpy(dtype=float) for _, s in self.labelled(metric)] or [[]]))
        times = times[times <= end]
        inside = times[times > start]
        if inside.size == 0:
            return None
        before = times[times <= start]
        return (float(before[-1]) if before.size else float(inside[0])), float(inside[-1])

    def histogram_increase(self, metric: str, start: float, end: float) -> tuple[dict[float, float], float, float]:
        """Bucket counts (upper bound -> cumulative count), count and sum of its observations in (start, end]."""
        buckets: dict[float, float] = {}
        for labels, s in self.labelled(metric + "_bucket"):
            v = counter_increase(s, start, end, self.first_scrape)
            if not math.isnan(v):
                le = float(labels["le"])
                buckets[le] = buckets.get(le, 0.0) + v
        return buckets, self.increase(metric + "_count", start, end), self.increase(metric + "_sum", start, end)


def counter_increase(series: pd.Series, start: float, end: float, first_scrape: float = -math.inf) -> float:
    """Increase of one counter over (start, end]: sum of rises between consecutive scrapes, a drop being a restart
    from 0 (increase = the new value), as Prometheus' increase(); baseline = the last scrape at or before `start`."""
    times = series.index.to_numpy(dtype=float)
    values = series.to_numpy(dtype=float)
    upto = times <= end
    times, values = times[upto], values[upto]
    before = times <= start
    inside = values[~before]
    if inside.size == 0:
        return math.nan
    if before.any():
        points = np.concatenate([values[before][-1:], inside])
    elif first_scrape <= start:
        points = np.concatenate([[0.0], inside])  # the series appeared after a scrape that did not have it: new
    else:
        points = inside  # scraping began inside the window: count from the first scrape
        if points.size < 2:
            return math.nan
    diffs = np.diff(points)
    return float(np.where(diffs >= 0, diffs, points[1:]).sum())


def histogram_quantile(q: float, buckets: dict[float, float]) -> float:
    """q-quantile (0-1) from cumulative bucket counts {upper bound: count}: linear interpolation inside the bucket
    holding rank q * total, as Prometheus' histogram_quantile; NaN without observations or in the +Inf bucket.
    Not reported: inside a wide bucket it describes the bucket, not the requests (histograms.quantile_bounds is)."""
    bounds = sorted(buckets)
    if not bounds or not math.isinf(bounds[-1]):
        return math.nan
    total = buckets[bounds[-1]]
    if not total > 0:
        return math.nan
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for b in bounds:
        count = buckets[b]
        if count >= rank:
            if math.isinf(b):
                return math.nan  # above the largest finite bound: unknown, not the bound
            if count == lower_count:
                return b
            return lower_bound + (b - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = b, count
    return math.nan


def _window(series: pd.Series, start: float, end: float) -> pd.Series:
    return series[(series.index >= start) & (series.index < end)]


def _stat(values: pd.Series, how: str) -> float:
    return float(getattr(values, how)()) if len(values) else math.nan


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.nan


def step_server_table(
    metrics: pd.DataFrame | None,
    timeline: list[dict],
    model: str | None = None,
    records: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Per step, over its measured window: gauges' mean and max over the scrapes inside it, counters' increase and
    histogram quantiles from the bucket increases between the last scrape before it and the last inside it: the
    bounds they lie between (histograms.quantile_bounds, with the exact mean), a value only when those are narrow.

    The TTFT gap compares like with like: the server's histogram counts a request when its first token is out, so
    the client's side is the requests (ok or not) whose first token arrived between the same two scrapes."""
    rows = []
    server = ServerSeries(metrics, model) if metrics is not None and len(metrics) else None
    gauges = {}
    if server is not None:
        gauges = {
            "kv_cache_usage": server.gauge(KV_CACHE),
            "running": server.gauge(RUNNING),
            "waiting": server.gauge(WAITING),
            "waiting_capacity": server.gauge(WAITING_BY_REASON, reason="capacity"),
            "waiting_deferred": server.gauge(WAITING_BY_REASON, reason="deferred"),
        }
    for step in timeline:
        start, end = float(step["measure_start"]), float(step["end_time"] or np.inf)
        row: dict = {"step": int(step["step"]), **{c: math.nan for c in SERVER_COLUMNS + SERVER_BOUND_COLUMNS}}
        if server is not None:
            for name, series in gauges.items():
                inside = _window(series, start, end)
                row[f"{name}_max"] = _stat(inside, "max")
                if f"{name}_mean" in SERVER_COLUMNS:
                    row[f"{name}_mean"] = _stat(inside, "mean")
            row["preemptions"] = server.increase(PREEMPTIONS, start, end)
            row["prefix_cache_hit_rate"] = _ratio(
                server.increase(PREFIX_HITS, start, end), server.increase(PREFIX_QUERIES, start, end)
            )
            for prefix, metric in (("server_ttft", TTFT_HISTOGRAM), ("server_queue_time", QUEUE_HISTOGRAM)):
                buckets, count, total = server.histogram_increase(metric, start, end)
                row[f"{prefix}_mean_s"] = mean = _ratio(total, count)
                for q in (50, 99):
                    known = quantile_bounds(q / 100, buckets, mean)
                    row[f"{prefix}_p{q}_s"] = known.value
                    row[f"{prefix}_p{q}_low_s"], row[f"{prefix}_p{q}_high_s"] = known.low, known.high
            span = server.scrape_span(TTFT_HISTOGRAM + "_count", start, end)
            if span is not None and records is not None and len(records):
                # Every request whose first token arrived, ok or not: a stream cut off later still had its TTFT, and
                # the server counted it (leaving them out made the gap negative at 64 users in the demo).
                started = records[records["ttft_s"].notna()]
                first_token = started["start_time"] + started["ttft_s"]
                client = started.loc[(first_token > span[0]) & (first_token <= span[1]), "ttft_s"]
                if len(client) and not math.isnan(row["server_ttft_mean_s"]):
                    row["ttft_gap_mean_s"] = float(client.mean()) - row["server_ttft_mean_s"]
        rows.append(row)
    return pd.DataFrame(rows, columns=["step", *SERVER_COLUMNS, *SERVER_BOUND_COLUMNS])


def server_info(metrics: pd.DataFrame | None) -> dict:
    """The server's self-description from its first scrape: vllm:cache_config_info's labels (block size, blocks)."""
    if metrics is None or not len(metrics):
        return {}
    rows = metrics[metrics["metric"] == CACHE_CONFIG]
    return json.loads(rows["labels"].iloc[0]) if len(rows) else {}
