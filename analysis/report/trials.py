"""The report's Trials part (--repeat N): per step each trial's own tok/s with its within-step interval, beside the
across-trial mean and interval of steps.csv, and the steps whose trials disagree."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from ..glossary import format_value

if TYPE_CHECKING:
    from ..finish import Outcome


def _interval(value: object, low: object, high: object, fmt: str) -> str:
    """'value [low, high]'; the value alone when a bound is missing; '-' without a value."""
    text = format_value(value, fmt)
    bounds = format_value(low, fmt), format_value(high, fmt)
    return text if text == "-" or "-" in bounds else f"{text} [{bounds[0]}, {bounds[1]}]"


def trials_html(outcome: Outcome) -> str:
    """Per step: users, trials, each trial's aggregate tok/s [its within-step interval], the pooled value [its
    interval], the across-trial mean [its t-interval], TTFT p99 and TPOT p50 across trials; a disagreement flagged."""
    table, trials = outcome.table, outcome.trials
    if trials is None or "trials" not in table.columns:
        return ""
    count = int(trials["trial"].max())
    head = ["Step", "Users", "Trials", *(f"Trial {k} tok/s" for k in range(1, count + 1)), "Pooled tok/s",
            "Across trials tok/s", "TTFT p99 across trials (ms)", "TPOT p50 across trials (ms)",
            "Trials agree"]  # fmt: skip
    rows = []
    for r in table.to_dict(orient="records"):
        own = {int(t["trial"]): t for t in trials[trials["plan_step"] == int(r["step"])].to_dict(orient="records")}
        cells = [str(r["step"]), str(r["users"]), format_value(r.get("trials"), "int")]
        for k in range(1, count + 1):
            t = own.get(k, {})
            cells.append(_interval(t.get("aggregate_tok_s"), t.get("aggregate_tok_s_ci_low"),
                                   t.get("aggregate_tok_s_ci_high"), "num1"))  # fmt: skip
        cells.append(_interval(r.get("aggregate_tok_s"), r.get("aggregate_tok_s_ci_low"),
                               r.get("aggregate_tok_s_ci_high"), "num1"))  # fmt: skip
        for name, fmt in (("aggregate_tok_s", "num1"), ("ttft_p99_s", "ms1"), ("tpot_p50_s", "ms1")):
            cells.append(_interval(r.get(f"{name}_trials_mean"), r.get(f"{name}_trials_ci_low"),
                                   r.get(f"{name}_trials_ci_high"), fmt))  # fmt: skip
        disagree = r.get("trials_disagree")
        cells.append("DISAGREE" if disagree is True else "ok" if disagree is False else "-")
        flag = " class='flagged' title='trials disagree'" if disagree is True else ""
        rows.append(f"<tr{flag}>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    intro = (
        f"The whole plan ran {count} times (--repeat {count}), one trial after another, so a step's trials lie a "
        "whole plan apart and sample the slow drift (other tenants, thermal state, caches, the server's warm-up) "
        "that a step's own interval cannot see. Each trial's tok/s is shown with its within-step 95 % interval; "
        "the pooled value is over all the trials' requests together; the across-trial interval is a t-interval "
        "over the trials' own values (mean ± t(0.975, N-1) · s / √N; for 2 or 3 trials it always contains every "
        "trial's value). DISAGREE: two trials' within-step intervals do not overlap, so each trial alone would "
        "look more certain than the run is: read the across-trial interval."
    )
    return (
        f"<h2>Trials</h2><p>{html.escape(intro)}</p><div class='scroll'><table class='steps'><thead><tr>"
        + "".join(f"<th>{html.escape(h)}</th>" for h in head)
        + f"</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
    )
