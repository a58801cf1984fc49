"""The report's speculative-decoding section (issue 35): per step the acceptance rate with its interval, the mean
acceptance length, the acceptance rate per draft position and the client's tokens per chunk, then the run's totals;
only when the server exported the counters (glossary.applies)."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from .. import glossary
from ..glossary import format_value
from ..spec_decode import totals_line

if TYPE_CHECKING:
    from ..finish import Outcome

_ABOUT = (
    "The server's draft counters over each step's measured window, as vLLM computes them: acceptance rate = accepted "
    "/ draft tokens, mean acceptance length = 1 + accepted / drafts (the target model's own token included), per draft "
    "position k: accepted at k / drafts. Tokens per chunk: what the client received in each token-carrying chunk (a "
    "speculating step streams its accepted tokens and its own in one chunk)."
)


def spec_html(outcome: Outcome) -> str:
    """The section's HTML; empty when the server exported no speculative-decoding counters."""
    table, summary = outcome.table, outcome.spec_decode or {}
    if not len(table) or not glossary.applies(table, glossary.SPEC):
        return ""
    per_step = {int(s["step"]): s.get("acceptance_rate_per_position") or [] for s in summary.get("steps") or []}
    width = max((len(v) for v in per_step.values()), default=0)
    head = ["step", "users", "drafts", "acceptance rate [95 % CI]", "mean acceptance length"]
    head += [f"pos {k}" for k in range(width)] + ["tokens per chunk", "multi-token chunks"]
    rows = []
    for r in table.to_dict(orient="records"):
        rate = format_value(r.get("spec_acceptance_rate"), "pct1")
        low, high = r.get("spec_acceptance_rate_ci_low"), r.get("spec_acceptance_rate_ci_high")
        if format_value(low, "pct1") != "-":
            rate += f" [{format_value(low, 'pct1')}, {format_value(high, 'pct1')}]"
        positions = per_step.get(int(r["step"]), []) if str(r["step"]).lstrip("-").isdigit() else []
        cells = [
            r["step"], r.get("users", ""), format_value(r.get("spec_drafts"), "int"), rate,
            format_value(r.get("spec_acceptance_length_mean"), "num2"),
            *[format_value(positions[k] if k < len(positions) else None, "num3") for k in range(width)],
            format_value(r.get("tokens_per_chunk_mean"), "num2"),
            format_value(r.get("multi_token_chunk_share"), "pct0"),
        ]  # fmt: skip
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    line = totals_line(summary)
    return (
        f"<h2>Speculative decoding</h2><p>{html.escape(_ABOUT)}</p>"
        + (f"<p>{html.escape(line)}.</p>" if line else "")
        + "<table><tr>"
        + "".join(f"<th>{html.escape(h)}</th>" for h in head)
        + "</tr>"
        + "".join(rows)
        + "</table>"
    )
