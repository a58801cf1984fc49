"""The report's Energy part (issue 35): the GPUs' joules per step, per output token and per request, and each GPU's
joules per step (summary.json's `energy`); only when a GPU exports its energy counter."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from .. import glossary
from ..glossary import STEP_TABLE, format_value
from ..glossary.columns import is_missing

if TYPE_CHECKING:
    from ..finish import Outcome

# The per-step table's columns: (column, its title here).
_STEP = (
    ("step", "step"),
    ("users", "users"),
    ("energy_gpus", "GPUs"),
    ("energy_j", "energy (J)"),
    ("energy_per_output_token_j", "J per output token [95 % CI]"),
    ("energy_per_request_j", "J per request"),
    ("energy_power_w", "W per GPU, from energy"),
    ("gpu_power_mean_w", "W per GPU, readings"),
)


def _cell(row: dict, name: str) -> str:
    text = STEP_TABLE[name].show(row.get(name))
    if name == "energy_per_output_token_j" and text != "-":
        low, high = (row.get(f"{name}_ci_{end}") for end in ("low", "high"))
        if not (is_missing(low) or is_missing(high)):
            text += f" [{format_value(low, 'num3')}, {format_value(high, 'num3')}]"
    return text


def _row(cells) -> str:
    return "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>"


def energy_html(outcome: Outcome) -> str:
    """The Energy part: the method in one paragraph, the per-step table, the run's totals and the per-GPU table."""
    table, totals = outcome.table, outcome.summary.get("energy")
    if not glossary.applies(table, glossary.ENERGY) or not totals:
        return ""
    rows = [r for r in table.to_dict(orient="records") if not is_missing(r.get("energy_j"))]
    head = "".join(f"<th>{html.escape(title)}</th>" for _, title in _STEP)
    body = "".join(_row(_cell(r, name) for name, _ in _STEP) for r in rows)
    steps = [str(s) for s in totals["steps"]]
    gpu_head = "".join(f"<th>{html.escape(h)}</th>" for h in ("GPU", "model", "run (J)", *(f"step {s}" for s in steps)))
    gpu_body = "".join(
        _row((g["gpu_key"], g.get("model_name") or "-", format_value(g["energy_j"], "num0"),
              *(format_value(g["steps"].get(s), "num0") for s in steps)))
        for g in totals["per_gpu"]
    )  # fmt: skip
    line = (
        f"Over the {len(steps)} steps' measured windows ({format_value(totals['window_s'], 'num1')} s): "
        f"{format_value(totals['energy_j'], 'num0')} J on {totals['gpus']} GPUs, "
        f"{format_value(totals['energy_per_output_token_j'], 'num3')} J per output token, "
        f"{format_value(totals['energy_per_request_j'], 'num1')} J per request, "
        f"{format_value(totals['energy_power_w'], 'num0')} W per GPU."
    )
    return (
        "<h2>Energy</h2><p>Each GPU's energy counter (dcgm-exporter's DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION) over each "
        "step's measured window, its value at the window's edges interpolated between the scrapes around them, "
        "summed over the GPUs; per output token and per request completed in the window. The interval is the "
        "aggregate tok/s interval's: the counter is exact, the tokens counted in the window vary. W per GPU from "
        "energy should match the power readings' mean; a gap between them is readings that missed the peaks.</p>"
        f"<p>{html.escape(line)}</p>"
        f"<div class='scroll'><table class='energy'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"
        f"<div class='scroll'><table class='energy'><thead><tr>{gpu_head}</tr></thead><tbody>{gpu_body}</tbody>"
        "</table></div>"
    )
