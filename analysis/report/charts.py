"""The report's per-step charts: the batching curve, the latencies, reasoning and the TTFT points."""

from __future__ import annotations

import html
import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .. import glossary
from ..generator import flagged
from ..kinds import RequestKind
from ..schedule import is_rate_run
from ..steps import unstable

if TYPE_CHECKING:
    pass

# Charts of a long run at high load stay a few MB (a one-hour run can hold hundreds of thousands of requests):
# a CDF is drawn through at most ~1,200 of its exact points (cdf_points), and the TTFT timeline shows one marker per
# request up to TIMELINE_POINTS requests, beyond that the TIMELINE_POINTS / 10 slowest and an even sample of the others.
CDF_RANKS = 1000
CDF_TAIL_RANKS = 100
TIMELINE_POINTS = 50_000
GPU_POINTS = 5_000  # per GPU and series in the GPU section's chart: an hour of 1 s scrapes drawn 1 in 1
MISMATCH_LI = "<li style='color:#b00;font-weight:bold'>"


AXIS_TITLES = {"users": "users", "rate_rps": "requests/s (intended)"}


def _load_axis(tables: dict[str, pd.DataFrame]) -> str:
    """The x axis of the curves: the rate when every run compared is a rate run (--rates), else users."""
    return "rate_rps" if all(is_rate_run(t) for t in tables.values()) else "users"


def _by_load(t: pd.DataFrame, x: str) -> pd.DataFrame:
    """The steps in load order: a line over steps joins neighbouring loads, however the steps ran (a capacity
    search probes 1, 2, 4, 8, 16, 12, 10, 9 users)."""
    return t.sort_values(x, kind="stable") if x in t.columns else t


def _error_bars(t: pd.DataFrame, name: str) -> dict | None:
    """Plotly error bars from a value's 95 % interval columns (<name>_ci_low/_high); None when the table has none
    (a run written before the intervals existed); a step without an interval gets no bar."""
    low, high = f"{name}_ci_low", f"{name}_ci_high"
    if low not in t.columns or high not in t.columns:
        return None
    value = pd.to_numeric(t[name], errors="coerce")
    up = (pd.to_numeric(t[high], errors="coerce") - value).tolist()
    down = (value - pd.to_numeric(t[low], errors="coerce")).tolist()
    return {"type": "data", "symmetric": False, "array": up, "arrayminus": down, "visible": True}


def scaled_bars(t: pd.DataFrame, name: str, factor: float) -> dict | None:
    """_error_bars of a value shown scaled (seconds as ms, a fraction as %)."""
    return _error_bars(t.assign(**{c: t[c] * factor for c in (name, f"{name}_ci_low", f"{name}_ci_high")}), name)


def batching_curve(tables: dict[str, pd.DataFrame]) -> go.Figure:
    """Aggregate and per-request tok/s per step, with their 95 % intervals as error bars; suspect steps (outliers,
    unstable) drawn as open markers."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    x = _load_axis(tables)
    for name, t in tables.items():
        t = _by_load(t, x)
        suspect = [
            flagged(o) or unstable(s)
            for o, s in zip(t.get("outlier", [None] * len(t)), t.get("stable", [None] * len(t)))
        ]
        fig.add_trace(
            go.Scatter(
                x=t[x],
                y=t["aggregate_tok_s"],
                name=f"{name} aggregate tok/s",
                mode="lines+markers",
                error_y=_error_bars(t, "aggregate_tok_s"),
                marker={"symbol": ["circle-open" if s else "circle" for s in suspect], "size": 9},
            ),
            secondary_y=False,
        )
        fig.add_trace(
            go.Scatter(
                x=t[x],
                y=t["per_request_tok_s_mean"],
                name=f"{name} per-request tok/s",
                mode="lines+markers",
                line={"dash": "dot"},
                error_y=_error_bars(t, "per_request_tok_s_mean"),
            ),
            secondary_y=True,
        )
    fig.update_xaxes(type="log", title=AXIS_TITLES[x], dtick=np.log10(2))
    fig.update_yaxes(title_text="aggregate tok/s", secondary_y=False, rangemode="tozero")
    fig.update_yaxes(title_text="per-request tok/s", secondary_y=True, rangemode="tozero")
    fig.update_layout(title="Batching curve", height=420)
    return fig


def batch_curve(tables: dict[str, pd.DataFrame], kind: RequestKind) -> go.Figure:
    """A batch kind's batching curve (analysis/kinds.py): its items/s per step with its 95 % interval (suspect steps
    as open markers), and E2E p50/p95 with theirs on the second axis (no tokens out, no TTFT, no TPOT)."""
    rate = str(kind.item_rate)
    unit = glossary.STEP_TABLE[rate].unit
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    x = _load_axis(tables)
    for name, t in tables.items():
        t = _by_load(t, x)
        if rate not in t.columns:
            continue
        suspect = [
            flagged(o) or unstable(s)
            for o, s in zip(t.get("outlier", [None] * len(t)), t.get("stable", [None] * len(t)))
        ]
        fig.add_trace(
            go.Scatter(
                x=t[x],
                y=t[rate],
                name=f"{name} {unit}",
                mode="lines+markers",
                error_y=_error_bars(t, rate),
                marker={"symbol": ["circle-open" if s else "circle" for s in suspect], "size": 9},
            ),
            secondary_y=False,
        )
        for q, dash in ((50, "dot"), (95, "dash")):
            column = f"e2e_p{q}_s"
            fig.add_trace(
                go.Scatter(
                    x=t[x],
                    y=pd.to_numeric(t[column], errors="coerce") * 1000,
                    name=f"{name} E2E p{q} (ms)",
                    mode="lines+markers",
                    line={"dash": dash},
                    error_y=scaled_bars(t, column, 1000),
                ),
                secondary_y=True,
            )
    fig.update_xaxes(type="log", title=AXIS_TITLES[x], dtick=np.log10(2))
    fig.update_yaxes(title_text=unit, secondary_y=False, rangemode="tozero")
    fig.update_yaxes(title_text="E2E (ms)", secondary_y=True, rangemode="tozero")
    fig.update_layout(title=f"Batching curve ({kind.name}: {unit} and E2E)", height=420)
    return fig


def latency_figure(tables: dict[str, pd.DataFrame]) -> go.Figure:
    fig = make_subplots(rows=1, cols=3, subplot_titles=("TTFT (ms)", "TPOT (ms)", "ITL (ms)"))
    x = _load_axis(tables)
    for name, t in tables.items():
        t = _by_load(t, x)
        for col, metric, qs in ((1, "ttft", (50, 95, 99)), (2, "tpot", (50, 95, 99)), (3, "itl", (50, 99))):
            for q in qs:
                fig.add_trace(
                    go.Scatter(
                        x=t[x],
                        y=t[f"{metric}_p{q}_s"] * 1000,
                        mode="lines+markers",
                        name=f"{name} {metric.upper()} p{q}",
                    ),
                    row=1,
                    col=col,
                )
        if "server_ttft_mean_s" in t.columns and t["server_ttft_mean_s"].notna().any():
            fig.add_trace(
                go.Scatter(
                    x=t[x],
                    y=t["server_ttft_mean_s"] * 1000,
                    mode="lines+markers",
                    line={"dash": "dash"},
                    name=f"{name} vLLM's own TTFT mean",
                ),
                row=1,
                col=1,
            )
        if glossary.applies(t, glossary.REASONING):
            # A reasoning model: TTFO (the first answer token) beside TTFT (the first token, thinking included).
            for q in (50, 95, 99):
                fig.add_trace(
                    go.Scatter(
                        x=t[x],
                        y=_finite_ms(t[f"ttfo_p{q}_s"]),
                        mode="lines+markers",
                        line={"dash": "dot"},
                        name=f"{name} TTFO p{q} (first answer token)",
                    ),
                    row=1,
                    col=1,
                )
        if is_rate_run(t):
            # Open loop: TTFT from the intended send time next to TTFT from the actual one; the gap is the
            # schedule lag, the queueing a closed loop would hide.
            for q in (50, 99):
                fig.add_trace(
                    go.Scatter(
                        x=t[x],
                        y=t[f"ttft_intended_p{q}_s"] * 1000,
                        mode="lines+markers",
                        line={"dash": "dashdot"},
                        name=f"{name} TTFT p{q} from the intended send time",
                    ),
                    row=1,
                    col=1,
                )
    fig.update_xaxes(type="log", title=AXIS_TITLES[x], dtick=np.log10(2))
    fig.update_yaxes(rangemode="tozero")
    fig.update_layout(title=f"Latency percentiles against {AXIS_TITLES[x]}", height=420)
    return fig


def _finite_ms(values: pd.Series) -> pd.Series:
    """Seconds as ms for a chart; +inf (a TTFO percentile of requests never answered) is not drawn."""
    v = pd.to_numeric(values, errors="coerce")
    return v.where(np.isfinite(v)) * 1000


TTFT_TTFO = (
    "TTFT counts the first token of any kind, thinking included; TTFO is the first token of the answer (or of a tool "
    "call), what the user waits for: the gap between them is the time spent reasoning."
)


def _reasoning_figure(t: pd.DataFrame, x: str) -> go.Figure:
    """TTFT and TTFO p50/p95 against the load, with their 95 % intervals; beside it the reasoning share."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("TTFT and TTFO (ms)", "Reasoning share of the output (%)"))
    t = _by_load(t, x)
    for metric, label, dash in (("ttft", "TTFT", None), ("ttfo", "TTFO", "dot")):
        for q in (50, 95):
            name = f"{metric}_p{q}_s"
            shown = t.assign(**{c: _finite_ms(t[c]) / 1000 for c in (name, f"{name}_ci_low", f"{name}_ci_high")
                                if c in t.columns})  # fmt: skip
            fig.add_trace(
                go.Scatter(x=t[x], y=shown[name] * 1000, mode="lines+markers", line={"dash": dash},
                           name=f"{label} p{q}", error_y=scaled_bars(shown, name, 1000)),
                row=1, col=1,
            )  # fmt: skip
    fig.add_trace(
        go.Scatter(x=t[x], y=pd.to_numeric(t["reasoning_share"], errors="coerce") * 100, mode="lines+markers",
                   name="reasoning share (%)"),
        row=1, col=2,
    )  # fmt: skip
    fig.update_xaxes(type="log", title=AXIS_TITLES[x], dtick=np.log10(2))
    fig.update_yaxes(rangemode="tozero", row=1, col=1)
    fig.update_yaxes(range=[0, 100], row=1, col=2)
    fig.update_layout(title="Reasoning: the first token against the first answer token", height=420)
    return fig


def reasoning_html(table: pd.DataFrame) -> str:
    """A reasoning (or tool-calling) run's section: what TTFO is against TTFT, the steps with requests that never
    got an answer token, and the chart; empty when no request reasoned or called a tool."""
    if not glossary.applies(table, glossary.REASONING):
        return ""
    notes = []
    for r in table.to_dict(orient="records"):
        missing = r.get("no_answer_requests")
        if missing is not None and not pd.isna(missing) and missing:
            notes.append(
                f"Step {r['step']} ({r['users']} users): no answer token in {int(missing)} of {int(r['requests'])} ok "
                "requests (the stream ended inside the thought); they count as never answered, so a TTFO percentile "
                'they reach reads "no answer".'
            )
    notes_html = "<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>" if notes else ""
    x = _load_axis({"run": table})
    return (
        f"<h2>Reasoning</h2><p>{html.escape(TTFT_TTFO)}</p>"
        + notes_html
        + _reasoning_figure(table, x).to_html(full_html=False, include_plotlyjs=False)
    )


def ttft_points(ok: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The requests the timeline's TTFT chart shows, and its title."""
    if len(ok) <= TIMELINE_POINTS:
        return ok, "TTFT of each request"
    ok = ok.reset_index(drop=True)  # the sample is taken by label
    slowest = ok["ttft_s"].nlargest(TIMELINE_POINTS // 10).index
    rest = ok.drop(index=slowest)
    every = math.ceil(len(rest) / (TIMELINE_POINTS - len(slowest)))
    shown = pd.concat([ok.loc[slowest], rest.iloc[::every]])
    return shown, f"TTFT: the {len(slowest):,} slowest requests and 1 in {every} of the others ({len(ok):,} in all)"
