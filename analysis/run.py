"""A run directory: its metadata (`run.json`) and the end-of-run outputs rebuilt from the raw records."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

from analysis.generator import merge_generator, step_generator_table
from analysis.records import REQUESTS_FILE, merge_records
from analysis.schedule import OPEN_LOOP_COLUMNS
from analysis.server_metrics import SCRAPES_FILE, load_metrics, merge_scrapes, step_server_table
from analysis.sse import CUT_OFF
from analysis.steps import step_table, timeline_from_records

RUN_FILE = "run.json"
STEPS_FILE = "steps.csv"


def read_run(run_dir: Path) -> dict:
    path = Path(run_dir) / RUN_FILE
    if not path.exists():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))


def write_run(run_dir: Path, data: dict) -> None:
    """Replace run.json atomically, so a crash leaves the previous version rather than half a file."""
    path = Path(run_dir) / RUN_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str), encoding="utf-8")
    os.replace(tmp, path)


def compute_table(
    records: pd.DataFrame,
    timeline: list[dict],
    metrics: pd.DataFrame | None,
    generator: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The step table joined with the server's series and the load generator's self-checks in each step's window
    (the self-check columns are always there: empty for a step without samples), then the open-loop columns."""
    table = step_table(records, timeline)
    if metrics is not None:
        models = records["model"].dropna().unique() if "model" in records.columns else []
        model = str(models[0]) if len(models) == 1 else None
        server = step_server_table(metrics, timeline, model=model, records=records)
        table = table.merge(server, on="step", how="left")
    if not timeline:
        timeline = timeline_from_records(records)
    table = table.merge(step_generator_table(generator, timeline), on="step", how="left")
    # The open-loop columns come last, after every column of earlier versions: steps.csv only gains columns.
    return table[[c for c in table.columns if c not in OPEN_LOOP_COLUMNS] + OPEN_LOOP_COLUMNS]


def finalize(run_dir: Path) -> pd.DataFrame:
    """Merge records, scrapes and self-check samples into requests.parquet, metrics.parquet and generator.parquet,
    write steps.csv; return the table."""
    run_dir = Path(run_dir)
    records = merge_records(run_dir)
    timeline = read_run(run_dir).get("timeline") or timeline_from_records(records)
    metrics = merge_scrapes(run_dir) if (run_dir / SCRAPES_FILE).exists() else load_metrics(run_dir)
    table = compute_table(records, timeline, metrics, merge_generator(run_dir))
    table.to_csv(run_dir / STEPS_FILE, index=False)
    return table


def error_counts(run_dir: Path) -> tuple[int, int]:
    """(failed requests, requests) of a run, leaving out the requests cut off by the end of the run."""
    records = pd.read_parquet(Path(run_dir) / REQUESTS_FILE, columns=["status", "error_type"])
    measured = records[records["error_type"] != CUT_OFF]
    return int((measured["status"] != "ok").sum()), len(measured)
