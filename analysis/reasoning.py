"""Reasoning models and tool calls per step: TTFO percentiles with their intervals, reasoning tokens and share, the
answer-only TPOT, the requests without an answer token and those that called a tool (steps.csv's last section), and
the console's "Reasoning" table, shown only when a request reasoned or called a tool.

A request whose stream ended inside the thought has no TTFO. It is not left out of the TTFO percentiles: it counts as
never answered (+inf), since leaving it out would make them read better than the requests did (a step where 3 % of
the requests never answered has an infinite p99 wait for the answer, not the p99 of the others). Pure: no Locust.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from . import glossary
from .glossary import numeric_column as _numbers
from .glossary import percentile, percentile_never, ttfo_values
from .uncertainty import min_samples_for_quantile, quantile_interval

REASONING_COLUMNS = glossary.names(glossary.REASONING)
# (column, q): the TTFO percentiles, each with an order-statistic interval (<column>_ci_low/_high).
TTFO_QUANTILES = (("ttfo_p50_s", 0.50), ("ttfo_p95_s", 0.95), ("ttfo_p99_s", 0.99))
TTFT_OF = {"ttfo_p50_s": "ttft_p50_s", "ttfo_p95_s": "ttft_p95_s", "ttfo_p99_s": "ttft_p99_s"}
FEW_MARK = "~"  # as the batching curve's: a percentile with too few samples for an interval


def reasoning_row(ok: pd.DataFrame) -> dict:
    """One row's reasoning columns from its measured ok requests (REASONING_COLUMNS, in their order)."""
    ttfo = ttfo_values(ok)
    known = ~np.isnan(ttfo)
    reasoning = _numbers(ok, "reasoning_tokens")
    tools = _numbers(ok, "tool_call_chunks")
    row: dict = {name: percentile_never(ttfo, q * 100) for name, q in TTFO_QUANTILES}
    row["reasoning_tokens_mean"] = glossary.mean(reasoning)
    row["reasoning_share"] = glossary.reasoning_share(reasoning, _numbers(ok, "output_tokens"))
    row["answer_tpot_p50_s"] = percentile(_numbers(ok, "answer_tpot_s"), 50)
    # Records without the fields (written before them) leave the counts empty, not 0.
    row["no_answer_requests"] = int(np.isposinf(ttfo).sum()) if known.any() else None
    row["tool_call_requests"] = int((tools > 0).sum()) if (~np.isnan(tools)).any() else None
    for name, q in TTFO_QUANTILES:
        with np.errstate(invalid="ignore"):  # its own value (numpy's interpolation) is NaN at an inf: not used
            ci = quantile_interval(ttfo, q)  # sorts +inf last: a bound whose rank reaches them is inf
        row[f"{name}_ci_low"], row[f"{name}_ci_high"] = ci.low, ci.high
    return {name: row[name] for name in REASONING_COLUMNS}


def _ttfo_few(row: dict, q: float) -> bool:
    """Too few requests for the TTFO percentile's interval (never-answered ones count: they are samples)."""
    n = row.get("requests")
    return n is not None and not pd.isna(n) and int(n) < min_samples_for_quantile(q)


def console_lines(table: pd.DataFrame) -> list[str]:
    """The console's "Reasoning" table (TTFT and TTFO side by side, the reasoning share, the requests without an
    answer token) and a line per step without an answer token in some requests; nothing when nothing reasoned."""
    if not len(table) or not glossary.applies(table, glossary.REASONING):
        return []
    section = glossary.SECTIONS[glossary.REASONING]
    names = [c.name for c, _ in section.shown()]
    rows = glossary.console_rows(table, glossary.REASONING)
    records = table.to_dict(orient="records")
    for cells, r in zip(rows[1:], records):
        few = r.get("few_samples")
        few = few.split() if isinstance(few, str) else []
        for name, q in TTFO_QUANTILES:
            for column, marked in ((name, _ttfo_few(r, q)), (TTFT_OF[name], TTFT_OF[name] in few)):
                i = names.index(column)
                if marked and cells[i] not in ("-", glossary.STEP_TABLE[name].inf_text):
                    cells[i] += FEW_MARK
    out = ["", section.title, *glossary.aligned(rows)]
    for r in records:
        missing = r.get("no_answer_requests")
        if missing is None or pd.isna(missing) or not missing:
            continue
        out.append(
            f"No answer token in {int(missing)} of {int(r['requests'])} ok requests of step {r['step']} "
            f"({r['users']} users): their streams ended inside the thought (max_tokens reached while reasoning, or "
            "a thought never closed); they count as never answered in the TTFO percentiles."
        )
    return out
