"""The console's line per step as it ends: always the same columns (users, throughput with its interval, TTFT and TPOT
percentiles, errors, stable or not), so a headless run reads as a table that grows. Pure: the records of the step and
its timeline entry in, text out (locustfiles/console.py prints it).

The line is the step as far as the records that had arrived when it ended; steps.csv at the end of the run is the
reference: it also counts the requests of the step that finished after it ended.
"""

from __future__ import annotations

import math

import pandas as pd

from . import glossary
from .batch import half_width, throughput_column
from .steps import step_table

# The line's columns after its throughput (the kind's: aggregate tok/s, or a batch kind's items/s).
LATENCIES = ("ttft_p50_s", "ttft_p95_s", "tpot_p50_s", "tpot_p95_s")
WIDTHS = {"step": 4, "users": 6, "requests": 6, "errors": 6, "stable": 8}  # else 9; the throughput 18


def columns(table: pd.DataFrame) -> list[str]:
    """The line's columns for this run's kind."""
    return ["step", "users", "requests", "errors", throughput_column(table), *LATENCIES, "stable"]


def _width(name: str, throughput: str) -> int:
    return 18 if name == throughput else WIDTHS.get(name, 9)


def header(table: pd.DataFrame) -> str:
    """The header line, once before the first step's line (latencies in ms)."""
    names = columns(table)
    titles = [glossary.STEP_TABLE[n].label if n in LATENCIES else glossary.STEP_TABLE[n].header for n in names]
    return "  ".join(t.rjust(_width(n, names[4])) for n, t in zip(names, titles)) + "   (latencies in ms)"


def line(table: pd.DataFrame, row: dict) -> str:
    """One step's line: the glossary's formats, '± half-width' after the throughput, '-' for what it lacks."""
    names = columns(table)
    cells = []
    for n in names:
        cell = glossary.STEP_TABLE[n].show(row.get(n))
        if n == names[4]:
            hw = half_width(row, n)
            if cell != "-" and not math.isnan(hw):
                cell += f" ±{hw:.1f}"
        cells.append(cell.rjust(_width(n, names[4])))
    return "  ".join(cells)


def step_row(records: pd.DataFrame, step: dict) -> tuple[pd.DataFrame, dict] | None:
    """(the one-row step table, its row) of one finished step from the records received so far; None when no
    request of it finished."""
    mine = records[records["step"] == step["step"]] if len(records) else records
    if not len(mine):
        return None
    table = step_table(mine, [step])
    rows = table.to_dict(orient="records")
    return (table, rows[0]) if rows else None
