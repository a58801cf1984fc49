"""The run so far, for live views (the web UI's LLM tab): the same step table as the end of the run, computed on
the records received until now.

Pure: no Locust, no network. The controller (master or local runner) feeds it every finished request.
"""

from __future__ import annotations

import math

import pandas as pd

from . import glossary
from .steps import run_row, step_table
from .trials import separate

# What the live table needs of a record (the glossary's request columns marked live); the per-chunk lists stay on
# disk (ITL is in the final report only).
FIELDS = tuple(c.name for c in glossary.columns(glossary.REQUESTS) if c.live)


class LiveRecords:
    """Finished requests of the current run, one row per request_id (a worker's copy may arrive twice)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._columns: dict[str, list] = {f: [] for f in FIELDS}
        self._seen: set[str] = set()

    def __len__(self) -> int:
        return len(self._seen)

    def add(self, record: dict) -> None:
        request_id = record.get("request_id")
        if request_id in self._seen:
            return
        self._seen.add(request_id)
        for f in FIELDS:
            self._columns[f].append(record.get(f))

    def add_rows(self, rows: list[dict]) -> None:
        """Records as dicts (locustfiles/recordbus.py: a local runner's, or a worker's shipped batch parsed once)."""
        for r in rows:
            self.add(r)

    def snapshot(self) -> dict[str, list]:
        """A copy of the columns so far (pointers only), for a frame built in another thread while records arrive."""
        return {f: v[:] for f, v in self._columns.items()}

    def frame(self, columns: dict[str, list] | None = None) -> pd.DataFrame:
        """The records so far (or those of a snapshot) as a DataFrame."""
        df = pd.DataFrame(self._columns if columns is None else columns, columns=list(FIELDS))
        for col in ("ttft_s", "e2e_s", "tpot_s", "duration_s", "start_time", "intended_start_time", "schedule_lag_s"):
            df[col] = pd.to_numeric(df[col], errors="coerce")
        return df


def close_open_steps(timeline: list[dict], now: float) -> list[dict]:
    """A copy of the timeline whose step still running ends at `now` (the run so far)."""
    timeline = [dict(step) for step in timeline]
    for step in timeline:
        if step.get("end_time") is None:
            step["end_time"] = now
    return timeline


def live_table(records: pd.DataFrame, timeline: list[dict], now: float) -> tuple[pd.DataFrame, dict]:
    """(the step table so far, the whole run's row): an open step is measured up to `now`. A --repeat run's trials
    are shown each on its own row as they run (its timeline's running steps; steps.csv pools them at the end), so the
    live charts' steps and the table's rows stay one per timeline entry."""
    running = {int(t["step"]) for t in timeline if t.get("end_time") is None and "step" in t}
    timeline = separate(close_open_steps(timeline, now))
    if not timeline or records.empty:
        return pd.DataFrame(), {}
    table = not_yet_measured(step_table(records, timeline), running)
    probes = {int(t["step"]): t["probe"] for t in timeline if t.get("probe") is not None and "step" in t}
    if probes and len(table):  # a capacity search: each step's probe number (steps.csv's probe)
        table = table.assign(
            probe=[probes.get(int(s)) if str(s).lstrip("-").isdigit() else None for s in table["step"]]
        )
    return table, run_row(records, timeline)


# A row's own identity and counts: everything else in it is measured from finished requests.
IDENTITY = frozenset({"step", "users", "rate_rps", "window_s", "requests", "errors", "cut_off", "probe", "trial"})


def not_yet_measured(table: pd.DataFrame, running: set[int]) -> pd.DataFrame:
    """A running step none of whose requests has finished yet has measured nothing so far: its values are missing,
    not a throughput of 0 judged stable."""
    if table.empty or not running:
        return table
    counts = table[[c for c in ("requests", "errors") if c in table.columns]].fillna(0).sum(axis=1)
    empty = table["step"].map(lambda s: str(s).lstrip("-").isdigit() and int(s) in running) & (counts == 0)
    if not empty.any():
        return table
    table = table.copy()
    for column in (c for c in table.columns if c not in IDENTITY):
        if pd.api.types.is_float_dtype(table[column]):
            table.loc[empty, column] = math.nan
        else:
            table[column] = table[column].astype(object)
            table.loc[empty, column] = None
    return table


def latest_gauges(samples: list[tuple[str, dict, float]] | None, model: str | None = None) -> dict[str, float]:
    """The server's KV-cache usage, running and waiting requests from one scrape (NaN when not scraped)."""
    from .server_metrics import KV_CACHE, RUNNING, WAITING, counter_total

    if samples is None:
        return {"kv_cache_usage": math.nan, "running": math.nan, "waiting": math.nan}
    names = {name for name, _, _ in samples}
    return {
        key: counter_total(samples, metric, model) if metric in names else math.nan
        for key, metric in (("kv_cache_usage", KV_CACHE), ("running", RUNNING), ("waiting", WAITING))
    }
