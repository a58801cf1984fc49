"""One scrape of a Prometheus endpoint: parsed to vLLM 0.32's metric names, as one line of metrics.jsonl.

Kept apart from analysis/server_metrics.py (pandas, pyarrow) so the scraping process starts in a fraction of
the time.
"""

from __future__ import annotations

import orjson
from prometheus_client.parser import text_string_to_metric_families

SCRAPES_FILE = "metrics.jsonl"  # appended during the run, one line per scrape; merged into metrics.parquet

# Old (V0 engine) names -> the names of vLLM 0.32 (V1 engine).
ALIASES = {
    "vllm:gpu_cache_usage_perc": "vllm:kv_cache_usage_perc",
    "vllm:cpu_cache_usage_perc": "vllm:kv_cache_usage_perc",
    "vllm:gpu_prefix_cache_queries_total": "vllm:prefix_cache_queries_total",
    "vllm:gpu_prefix_cache_hits_total": "vllm:prefix_cache_hits_total",
}


def parse_samples(text: str, prefix: str = "vllm:", model: str | None = None) -> list[tuple[str, dict, float]]:
    """(metric, labels, value) of every sample whose name starts with `prefix`, under vLLM 0.32's names.

    `*_created` samples (a counter's creation time) are dropped; with `model`, so are samples of other models
    (samples without a model_name label are kept: they describe the whole server).
    """
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if not s.name.startswith(prefix) or s.name.endswith("_created"):
                continue
            if model is not None and s.labels.get("model_name", model) != model:
                continue
            out.append((ALIASES.get(s.name, s.name), dict(s.labels), float(s.value)))
    return out


def scrape_line(timestamp: float, samples: list[tuple[str, dict, float]] | None, error: str | None = None) -> bytes:
    """One line of metrics.jsonl: a scrape's samples, or a gap with its error."""
    return orjson.dumps({"t": timestamp, "samples": samples, "error": error}, option=orjson.OPT_APPEND_NEWLINE)
