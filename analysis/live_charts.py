"""The data of the web UI's live charts (`/llm/charts.json`): per-step tok/s with its interval (a batch kind's run,
e.g. embeddings: its items/s, named by `items`), TTFT/TPOT p95 over time (and E2E p95, what such a run's page
draws), the server's KV-cache usage
and waiting requests, the step timeline and the suspect steps.

Pure but for `ScrapeTail`, which reads the new bytes of metrics.jsonl (no Locust, no network). Everything is plain
JSON: numbers, booleans and null for a missing value (never 0); times are seconds since the run's first step began.
Server-provided text (the model name, a scrape's error) is data for the page to show as text, never markup.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import orjson
import pandas as pd

from .batch import table_kind
from .glossary import STEP_TABLE
from .kinds import RequestKind
from .server_metrics import KV_CACHE, RUNNING, WAITING
from .uncertainty import min_samples_for_quantile

VERSION = 1
P95 = 0.95
# A time bin's p95 is drawn from this many requests on (fewer: null, the bin's count still shown); the step's own
# p95 is drawn beside it, with "few samples" when it has fewer than min_samples_for_quantile(0.95).
MIN_BIN_SAMPLES = 20
MAX_BINS = 120  # the latency-over-time charts' bins: the narrowest width of BIN_WIDTHS_S giving at most this many
BIN_WIDTHS_S = (2, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600)
MAX_POINTS = 1500  # scrapes shown per series; a longer run is reduced to per-interval maxima (peaks stay visible)
READ_BYTES = 1 << 20  # at most this much of metrics.jsonl per read (a vLLM scrape is ~32 KB: ~30 scrapes)
READ_BUDGET_S = 0.004  # parsing stops after this long; the rest waits for the next read (the event loop is shared)
GAUGES = {KV_CACHE: "kv_cache_usage", WAITING: "waiting", RUNNING: "running"}


def _num(value: object) -> float | None:
    """A finite float, or None (missing: NaN, None, text)."""
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _flag(value: object) -> bool | None:
    """True/False of a flag column (bool, 0/1, "True"), None when missing."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, str):
        return {"true": True, "false": False, "1": True, "0": False}.get(value.strip().lower())
    try:
        return bool(value)
    except (TypeError, ValueError):
        return None


class ScrapeTail:
    """The gauges of metrics.jsonl's scrapes, read incrementally: each read() parses only the bytes appended since
    the last one, up to its last complete line (a line being written is left for the next read)."""

    def __init__(self, path: Path | None, model: str | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self.model = model
        self.reset()

    def reset(self) -> None:
        self.offset = 0  # bytes of the file consumed: always just after a newline
        self.t: list[float] = []
        self.values: dict[str, list[float | None]] = {key: [] for key in GAUGES.values()}
        self.scrapes = 0
        self.gaps = 0
        self.last_error: str | None = None
        self.behind = False  # the last read stopped before the file's last complete line (budget or max_bytes)

    def read(self, budget_s: float = READ_BUDGET_S, max_bytes: int = READ_BYTES) -> int:
        """Parse the complete lines appended since the last read, for at most budget_s; returns how many."""
        if self.path is None:
            return 0
        try:
            with open(self.path, "rb") as f:
                size = f.seek(0, 2)
                if size < self.offset:  # replaced or truncated: start over
                    self.reset()
                if size == self.offset:
                    self.behind = False
                    return 0
                start = f.seek(self.offset)
                data = f.read(max_bytes)
                if b"\n" not in data and len(data) == max_bytes:
                    data += f.readline()  # one line longer than max_bytes: read it whole, or never move on
        except OSError:  # not written yet (no scraper, or before its first scrape)
            return 0
        end = data.rfind(b"\n") + 1  # the complete lines only: a torn last line waits for the next read
        deadline = time.perf_counter() + budget_s
        parsed, pos = 0, 0
        while pos < end:
            nl = data.index(b"\n", pos, end)
            self._add(data[pos:nl])
            pos = nl + 1
            parsed += 1
            if time.perf_counter() > deadline:
                break
        self.offset = start + pos
        self.behind = pos < end or start + len(data) < size
        return parsed

    def _add(self, line: bytes) -> None:
        try:
            scrape = orjson.loads(line)
            t = float(scrape["t"])
        except (ValueError, KeyError, TypeError):
            return  # a line cut by a crash: merge_scrapes skips it too
        if scrape.get("source") is not None:
            return  # a GPU exporter's scrape (--gpu-metrics-url): these charts draw the server's gauges
        self.scrapes += 1
        samples = scrape.get("samples")
        if samples is None:
            self.gaps += 1
            self.last_error = str(scrape.get("error") or "unknown")
            sums: dict[str, float | None] = dict.fromkeys(GAUGES.values())
        else:
            totals: dict[str, float] = {}
            model = self.model
            for name, labels, value in samples:
                key = GAUGES.get(name)
                if key is not None and (model is None or labels.get("model_name", model) == model):
                    totals[key] = totals.get(key, 0.0) + value  # summed over engines, as latest_gauges does
            sums = {key: totals.get(key) for key in GAUGES.values()}  # a series the server lacks: None
        self.t.append(t)
        for key, value in sums.items():
            self.values[key].append(value)


def downsample(t: np.ndarray, columns: dict[str, np.ndarray], max_points: int = MAX_POINTS) -> tuple:
    """At most max_points points (t sorted): equal time intervals, each the max of its scrapes (NaN where all are
    missing) at the interval's last scrape time; unchanged when short enough."""
    if t.size <= max_points:
        return t, columns
    edges = np.linspace(t[0], t[-1], max_points + 1)
    index = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, max_points - 1)
    starts = np.flatnonzero(np.diff(index, prepend=-1))  # the first scrape of each non-empty interval
    last = np.append(starts[1:], t.size) - 1
    with np.errstate(invalid="ignore"):
        out = {key: np.fmax.reduceat(values, starts) for key, values in columns.items()}  # fmax: NaN only if all
    return t[last], out


def server_series(tail: ScrapeTail, t0: float) -> dict:
    """The scraped gauges since t0 (seconds since it), KV-cache usage as a fraction; null where not scraped."""
    t = np.asarray(tail.t, dtype=float)
    columns = {k: np.array([np.nan if x is None else x for x in v], dtype=float) for k, v in tail.values.items()}
    keep = t >= t0 - 1.0  # the baseline scrape just before the first step
    t, columns = downsample(t[keep], {k: v[keep] for k, v in columns.items()})
    return {
        "t": [round(float(x - t0), 3) for x in t],
        **{k: [_num(x) for x in v] for k, v in columns.items()},
        "scrapes": tail.scrapes,
        "gaps": tail.gaps,
        "last_error": tail.last_error,
        "catching_up": tail.behind,
    }


def bin_width(span_s: float, max_bins: int = MAX_BINS) -> float:
    """The narrowest of BIN_WIDTHS_S giving at most max_bins bins over span_s."""
    for width in BIN_WIDTHS_S:
        if span_s / width <= max_bins:
            return float(width)
    return float(BIN_WIDTHS_S[-1])


def _binned_p95(bins: np.ndarray, values: np.ndarray, n_bins: int) -> tuple[list, list]:
    """(p95 per bin, count per bin): linear interpolation between closest ranks, as numpy; None below
    MIN_BIN_SAMPLES."""
    ok = np.isfinite(values)
    bins, values = bins[ok], values[ok]
    counts = np.bincount(bins, minlength=n_bins)
    order = np.lexsort((values, bins))
    ordered = values[order]
    starts = np.cumsum(counts) - counts
    pos = (counts - 1) * P95
    low = np.floor(pos).astype(np.int64)
    high = np.minimum(low + 1, np.maximum(counts - 1, 0))
    p95: list[float | None] = []
    for i in range(n_bins):
        if counts[i] < MIN_BIN_SAMPLES:
            p95.append(None)
            continue
        a, b = ordered[starts[i] + low[i]], ordered[starts[i] + high[i]]
        p95.append(float(a + (b - a) * (pos[i] - low[i])))
    return p95, [int(c) for c in counts]


class LatencyBins:
    """TTFT and TPOT p95 of the ok requests by the time they finished (start_time + e2e_s), in equal bins from t0;
    warm-up requests included (this is the run as it went; the steps' own p95 leave them out).

    Bins that ended more than LATE_S ago are kept and not recomputed (a record reaches the controller well within
    that: workers ship every 0.5 s), so a refresh sorts only the last bins' requests, not the whole run's."""

    LATE_S = 10.0

    def __init__(self) -> None:
        self._key: tuple[float, float] | None = None
        self._frozen: dict[str, list] = {"ttft_p95_s": [], "tpot_p95_s": [], "e2e_p95_s": [], "n": []}

    def update(self, records: pd.DataFrame | None, t0: float, now: float) -> dict:
        width = bin_width(max(now - t0, 0.0))
        if self._key != (t0, width):  # a new run, or wider bins: everything again
            self._key = (t0, width)
            self._frozen = {"ttft_p95_s": [], "tpot_p95_s": [], "e2e_p95_s": [], "n": []}
        frozen = len(self._frozen["n"])
        ttft, tpot, e2e, n = self._compute(records, t0, width, frozen)
        n_bins = frozen + len(n)
        closed = max(0, min(n_bins, int((now - self.LATE_S - t0) // width)))
        for key, values in (("ttft_p95_s", ttft), ("tpot_p95_s", tpot), ("e2e_p95_s", e2e), ("n", n)):
            self._frozen[key].extend(values[: max(0, closed - frozen)])
        centers = [min((i + 0.5) * width, max(now - t0, i * width)) for i in range(n_bins)]  # the last: so far
        return {
            "bin_s": width,
            "t": [round(c, 3) for c in centers],
            "ttft_p95_s": self._frozen["ttft_p95_s"][:frozen] + ttft,
            "tpot_p95_s": self._frozen["tpot_p95_s"][:frozen] + tpot,
            "e2e_p95_s": self._frozen["e2e_p95_s"][:frozen] + e2e,
            "n": self._frozen["n"][:frozen] + n,
        }

    @staticmethod
    def _compute(records: pd.DataFrame | None, t0: float, width: float, first: int) -> tuple[list, list, list, list]:
        """(ttft p95, tpot p95, e2e p95, count) of the bins from `first` on."""
        if records is None or records.empty:
            return [], [], [], []
        finish = records["start_time"].to_numpy(dtype=float) + records["e2e_s"].to_numpy(dtype=float)
        with np.errstate(invalid="ignore"):
            inside = np.flatnonzero(finish >= t0 + first * width)  # numpy first: the status test on a few rows
        inside = inside[records["status"].iloc[inside].to_numpy() == "ok"]  # not the whole column: a copy
        if not inside.size:
            return [], [], [], []
        bins = ((finish[inside] - t0) // width).astype(np.int64) - first
        n_bins = int(bins.max()) + 1
        ttft, n = _binned_p95(bins, records["ttft_s"].to_numpy(dtype=float)[inside], n_bins)
        tpot, _ = _binned_p95(bins, records["tpot_s"].to_numpy(dtype=float)[inside], n_bins)
        e2e, _ = _binned_p95(bins, records["e2e_s"].to_numpy(dtype=float)[inside], n_bins)
        return ttft, tpot, e2e, n


def latency_bins(records: pd.DataFrame | None, t0: float, now: float) -> dict:
    """LatencyBins of the records all at once (no bins kept from an earlier call)."""
    return LatencyBins().update(records, t0, now)


def step_points(table: pd.DataFrame | None, timeline: list[dict], t0: float, now: float) -> list[dict]:
    """One entry per step of the timeline: its boundaries (seconds since t0; end null while it runs), its tok/s with
    the interval when the table has one, its p95s and its suspect flags when the table has them."""
    rows = {}
    rate = str(batch.item_rate) if (batch := _batch(table)) is not None else ""
    if table is not None and len(table) and "step" in table.columns:
        rows = {int(r["step"]): r for r in table.to_dict("records") if _num(r.get("step")) is not None}
    few = min_samples_for_quantile(P95)
    out = []
    for step in timeline:
        s = int(step["step"])
        row = rows.get(s, {})
        end = _num(step.get("end_time"))
        stable, outlier = _flag(row.get("stable")), _flag(row.get("outlier"))
        why = [w for w, bad in (("outlier", outlier is True), ("unstable", stable is False)) if bad]
        requests = _num(row.get("requests"))
        out.append(
            {
                "step": s,
                "users": int(step["users"]),
                "rate_rps": _num(step.get("rate_rps")),
                "start": round(float(step["start_time"]) - t0, 3),
                "measure_start": round(float(step["measure_start"]) - t0, 3),
                "end": None if end is None else round(end - t0, 3),
                "running": end is None,
                "aggregate_tok_s": _num(row.get("aggregate_tok_s")),
                "ci_low": _num(row.get("aggregate_tok_s_ci_low")),
                "ci_high": _num(row.get("aggregate_tok_s_ci_high")),
                "requests": None if requests is None else int(requests),
                "ttft_p95_s": _num(row.get("ttft_p95_s")),
                "tpot_p95_s": _num(row.get("tpot_p95_s")),
                # A batch kind's curve (its tok/s, TTFT and TPOT are missing): the page draws these instead.
                "items_per_s": _num(row.get(rate)) if rate else None,
                "items_ci_low": _num(row.get(f"{rate}_ci_low")) if rate else None,
                "items_ci_high": _num(row.get(f"{rate}_ci_high")) if rate else None,
                "e2e_p95_s": _num(row.get("e2e_p95_s")),
                "few_samples": requests is not None and requests < few,
                "stable": stable,
                "outlier": outlier,
                "suspect": bool(why),
                "suspect_why": why,
            }
        )
    return out


def chart_data(
    table: pd.DataFrame | None,
    timeline: list[dict],
    records: pd.DataFrame | None,
    tail: ScrapeTail | None,
    now: float,
    state: str,
    model: str | None = None,
    latency: LatencyBins | None = None,
) -> dict:
    """The whole payload of /llm/charts.json (see the module docstring); an empty timeline gives no steps. Pass the
    same `latency` (LatencyBins) at every refresh of a run to recompute only its last bins."""
    t0 = float(timeline[0]["start_time"]) if timeline else now
    table_columns = set(table.columns) if table is not None else set()
    return {
        "version": VERSION,
        "state": state,
        "model": model,
        "started_at": t0 if timeline else None,
        "elapsed_s": round(now - t0, 3) if timeline else None,
        "has_ci": {"aggregate_tok_s_ci_low", "aggregate_tok_s_ci_high"} <= table_columns,
        "has_flags": bool({"stable", "outlier"} & table_columns),
        "items": _items(table),
        "steps": step_points(table, timeline, t0, now),
        "latency": (latency or LatencyBins()).update(records if timeline else None, t0, now),
        "server": server_series(tail, t0) if tail is not None and timeline else None,
    }


def _batch(table: pd.DataFrame | None) -> RequestKind | None:
    return table_kind(table) if table is not None and len(table) else None


def _items(table: pd.DataFrame | None) -> dict | None:
    """A batch kind's run: what its curve counts (the page's labels); None for a streamed kind's."""
    kind = _batch(table)
    if kind is None:
        return None
    column = STEP_TABLE[str(kind.item_rate)]
    return {"kind": kind.name, "unit": column.unit, "label": column.label}


def to_json(data: dict) -> bytes:
    """The payload as JSON bytes; non-finite numbers become null (JSON has no NaN)."""

    def clean(x):
        if isinstance(x, float):
            return x if math.isfinite(x) else None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        if isinstance(x, np.generic):
            return clean(x.item())
        return x

    return orjson.dumps(clean(data))
