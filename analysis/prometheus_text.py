"""One scrape of a Prometheus endpoint: parsed to the suite's canonical series names (vLLM 0.32's, see
analysis/servers), as one line of metrics.jsonl.

Kept apart from analysis/server_metrics.py (pandas, pyarrow) so the scraping process starts in a fraction of
the time.
"""

from __future__ import annotations

import orjson
from prometheus_client.parser import text_string_to_metric_families

from . import servers

SCRAPES_FILE = "metrics.jsonl"  # appended during the run, one line per scrape; merged into metrics.parquet

ALIASES = servers.PROFILES["vllm"].aliases  # vLLM's old (V0 engine) names -> those of vLLM 0.32 (V1 engine)

GPU_PREFIX = "DCGM_"  # NVIDIA dcgm-exporter's series: DCGM_FI_DEV_* (device), DCGM_FI_PROF_* (profiling), DCGM_EXP_*


def scrape_timeout_s(interval_s: float) -> float:
    """How long a scrape may take at --scrape-interval: twice the interval, within 1 to 5 s. A scrape is stamped when
    its answer arrived, so its counters may miss what finished up to this long before its timestamp."""
    return max(1.0, min(5.0, float(interval_s) * 2))


def parse_samples(
    text: str,
    prefix: str | None = None,
    model: str | None = None,
    profile: servers.ServerProfile | str | None = None,
) -> list[tuple[str, dict, float]]:
    """(metric, labels, value) of every sample of the server's own series (names starting with `prefix`, by
    default the profile's prefixes), renamed to the canonical names where the profile maps them (default: vLLM).

    `*_created` samples (a counter's creation time) are dropped; with `model`, so are samples of other models
    (samples without a model_name label are kept: they describe the whole server).
    """
    profile = servers.get(profile)
    prefixes = (prefix,) if prefix is not None else profile.prefixes
    if not prefixes:
        return []
    renames = profile.renames
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if not s.name.startswith(prefixes) or s.name.endswith("_created"):
                continue
            if model is not None and s.labels.get("model_name", model) != model:
                continue
            out.append((renames.get(s.name, s.name), dict(s.labels), float(s.value)))
    return out


def parse_gpu_samples(text: str) -> list[tuple[str, dict, float]]:
    """(metric, labels, value) of every DCGM_ sample of a GPU exporter's answer, under DCGM's own names and with all
    their labels (gpu, UUID, modelName, Hostname, pod ...): no server profile renames them."""
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith(GPU_PREFIX) and not s.name.endswith("_created"):
                out.append((s.name, dict(s.labels), float(s.value)))
    return out


def scrape_line(
    timestamp: float,
    samples: list[tuple[str, dict, float]] | None,
    error: str | None = None,
    source: str | None = None,
) -> bytes:
    """One line of metrics.jsonl: a scrape's samples, or a gap with its error; a GPU exporter's line starts with its
    `source` (its URL), the server's has none."""
    line: dict = {} if source is None else {"source": source}
    line.update(t=timestamp, samples=samples, error=error)
    return orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE)
