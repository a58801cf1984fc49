"""A run directory: its metadata (`run.json`) and the end-of-run outputs rebuilt from the raw records."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

from analysis.records import merge_records
from analysis.steps import step_table

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


def finalize(run_dir: Path) -> pd.DataFrame:
    """Merge the records into requests.parquet and write steps.csv; returns the step table."""
    run_dir = Path(run_dir)
    records = merge_records(run_dir)
    table = step_table(records, read_run(run_dir).get("timeline") or [])
    table.to_csv(run_dir / STEPS_FILE, index=False)
    return table
