"""Where a run's files go: --run-dir (a new timestamped directory by default, never one holding another run's
records) and --no-report."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import ClassVar

from ..analysis.records import RECORDS_DIR
from .declare import option

logger = logging.getLogger("vllm_loadtest")


@dataclass(frozen=True)
class OutputOptions:
    """Where the run's files go and whether the report is built."""

    GROUP: ClassVar[str] = "Output"

    run_dir: str = option("--run-dir", "", "Where records and tables go. Default: reports/<UTC timestamp>/")
    no_report: bool = option(
        "--no-report",
        False,
        "Do not write report.html at the end of the run (summary.json and summary.md are still written)",
    )


def default_run_dir() -> Path:
    return Path("reports") / datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def unused_run_dir(path: Path) -> Path:
    """`path`, or `path-2`, `path-3` ... when it already holds records of another run (never mix two runs)."""
    candidate, n = path, 1
    while (candidate / RECORDS_DIR).is_dir() and any((candidate / RECORDS_DIR).iterdir()):
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    if candidate != path:
        logger.warning("%s already holds a run; writing this one to %s", path, candidate)
    return candidate
