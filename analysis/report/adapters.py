"""The report's Adapters section (--lora-mix, issue 35): each model's share against its weight and its speed, over
the whole run and per step (models.csv, analysis/lora.py)."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

import pandas as pd

from ..glossary import COLUMNS, MODELS

if TYPE_CHECKING:
    from ..finish import Outcome

# The columns shown, in order; the rest are in models.csv.
_SHOWN = (
    "model", "share", "share_low", "share_high", "expected_share", "requests", "errors", "aggregate_tok_s",
    "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "lora_running_share", "lora_waiting_share",
)  # fmt: skip
_ABOUT = (
    "Each request asked for a model drawn by weight (--lora-mix). Share: of the requests sent after each step's "
    "warm-up, whatever their outcome, with its 95 % Wilson interval: a weight outside it says the draws (or the "
    "records) are not what the mix asked. Tok/s is each model's part of the step's aggregate throughput; the "
    "latencies are its own requests' exact percentiles. Running and waiting: the share of the step's scrapes in "
    "which vLLM listed the adapter (vllm:lora_requests_info); empty for the base model and without the series."
)


def _table(rows: list[dict], lead: tuple[str, ...]) -> str:
    names = [*lead, *_SHOWN]
    head = "".join(
        f"<th title='{html.escape(COLUMNS[(MODELS, n)].meaning)}'>{html.escape(COLUMNS[(MODELS, n)].title)}</th>"
        for n in names
    )
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(COLUMNS[(MODELS, n)].show(r.get(n)))}</td>" for n in names) + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def adapters_html(outcome: Outcome) -> str:
    """The section, or "" for a run of one model."""
    table = outcome.models
    if table is None or table["model"].nunique() < 2:
        return ""
    whole = [{**r, "expected_share": r.get("weight")} for r in outcome.summary.get("per_model") or []]
    steps = [{k: (None if not isinstance(v, str) and pd.isna(v) else v) for k, v in r.items()}
             for r in table.to_dict(orient="records")]  # fmt: skip
    return (
        f"<h2>Adapters</h2><p>{html.escape(_ABOUT)}</p><h3>The whole run</h3>{_table(whole, ())}"
        f"<h3>Per step</h3>{_table(steps, ('step', 'users'))}"
    )
