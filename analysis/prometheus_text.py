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


def scrape_line(timestamp: float, samples: list[tuple[str, dict, float]] | None, error: str | None = None) -> bytes:
    """One line of metrics.jsonl: a scrape's samples, or a gap with its error."""
    return orjson.dumps({"t": timestamp, "samples": samples, "error": error}, option=orjson.OPT_APPEND_NEWLINE)
