"""The report's verdicts: the efficiency ceiling, the SLO gate, the capacity search, the load generator."""

from __future__ import annotations

import html
import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ..capacity import FAIL, FEW, PASS, UNCERTAIN, USERS, load_text
from ..generator import ADVICE, bound_steps

if TYPE_CHECKING:
    pass
from .charts import AXIS_TITLES


def ceiling_html(ceiling: dict | None) -> str:
    """The single-request decode ceiling against the measured rate, and why they differ."""
    if ceiling is None:
        return ""
    items = "".join(f"<li>{html.escape(t)}</li>" for t in ceiling["text"])
    return f"<h2>Efficiency ceiling</h2><ul>{items}</ul>"


def slo_html(gate: dict | None, searched: bool = False) -> str:
    """The --slo gate: its verdict in words and each step's goodput and objectives; in a capacity search (`searched`)
    only the steps' objectives, since its probes beyond the capacity break them on purpose."""
    if gate is None:
        return ""
    color = "#070" if gate["passed"] else "#b00"
    lines = "".join(f"<li>{html.escape(t)}</li>" for t in gate["text"][1:])
    if searched:
        color, title = "#000", "SLO objectives per step"
        verdict = (
            "A capacity search: the probes beyond the capacity break the objectives on purpose, so the gate is not "
            "this run's verdict (the Capacity section is). Each step's values, judged on their own without "
            "intervals:"
        )
        lines = ""
    else:
        title, verdict = "SLO gate", gate["text"][0]
    names = list(gate["objectives"])
    head = "".join(f"<th>{html.escape(c)}</th>" for c in ["step", "users", "requests", "goodput", *names])
    rows = ""
    for r in gate["steps"]:
        goodput = "-" if r["goodput"] is None else f"{r['goodput']:.1%}"
        cells = [str(r["step"]), str(r["users"]), str(r["requests"]), goodput]
        for n in names:
            value = "no data" if r[n] is None else (f"{r[n]:.2%}" if n == "error_rate" else f"{r[n] * 1000:.1f} ms")
            value = "no answer" if r.get(f"{n}_no_answer") else value
            cells.append(f"{'met' if r[f'{n}_met'] else 'BROKEN'} ({value})")
        rows += "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"
    return (
        f"<h2>{title}</h2><p style='color:{color};font-weight:bold'>{html.escape(verdict)}</p>"
        f"<ul>{lines}</ul><table><tr>{head}</tr>{rows}</table>"
    )


VERDICT_COLORS = {PASS: "#070", FAIL: "#b00", UNCERTAIN: "#d80"}


def _capacity_load_key(result: dict) -> str:
    return "users" if result["mode"] == USERS else "rate_rps"


def _objective_value(name: str, v: float | None) -> str:
    """An objective's value as the console states it: a share for error_rate, else a time."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "no data"
    if name == "error_rate":
        return f"{v:.2%}"
    return f"{v * 1000:.1f} ms" if v < 10 else f"{v:.2f} s"


def _check_text(name: str, c: dict | None) -> str:
    """'171.6 ms (CI 169.6-172.2 ms): fail', or '21.2 ms (too few samples for an interval): pass'."""
    if c is None:
        return "-"
    value = _objective_value(name, c.get("value"))
    if c.get("low") is not None and c.get("high") is not None:
        ci = f" (CI {_objective_value(name, c['low'])} to {_objective_value(name, c['high'])})"
    elif c.get("note") == FEW:
        ci = " (too few samples for an interval)"
    else:
        ci = ""
    return f"{value}{ci}: {c.get('verdict')}"


def _tok_s_text(p: dict) -> str:
    v, low, high = p.get("aggregate_tok_s"), p.get("aggregate_tok_s_low"), p.get("aggregate_tok_s_high")
    if v is None:
        return "-"
    return f"{v:.1f}" + (f" (CI {low:.1f} to {high:.1f})" if low is not None and high is not None else "")


def capacity_figure(result: dict) -> go.Figure:
    """The probe path on the batching curve: each probe at (load, aggregate tok/s), coloured by its verdict and
    labelled with its number, joined in the order the probes ran; the capacity and the first failing load marked."""
    key, mode = _capacity_load_key(result), result["mode"]
    probes = [p for p in result["probes"] if p.get(key) is not None]
    fig = go.Figure()
    by_load = sorted(probes, key=lambda p: p[key])
    fig.add_trace(
        go.Scatter(
            x=[p[key] for p in by_load],
            y=[p.get("aggregate_tok_s") for p in by_load],
            mode="lines",
            line={"color": "#ccc", "width": 6},
            name="batching curve (probes in load order)",
            hoverinfo="skip",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=[p[key] for p in probes],
            y=[p.get("aggregate_tok_s") for p in probes],
            mode="lines",
            line={"color": "#555", "dash": "dot"},
            name="probe path (run order)",
            hoverinfo="skip",
        )
    )
    for verdict, color in VERDICT_COLORS.items():
        shown = [p for p in probes if p.get("verdict") == verdict]
        if not shown:
            continue
        ys = [p.get("aggregate_tok_s") for p in shown]
        up = [None if p.get("aggregate_tok_s_high") is None or y is None else p["aggregate_tok_s_high"] - y
              for p, y in zip(shown, ys)]  # fmt: skip
        down = [None if p.get("aggregate_tok_s_low") is None or y is None else y - p["aggregate_tok_s_low"]
                for p, y in zip(shown, ys)]  # fmt: skip
        fig.add_trace(
            go.Scatter(
                x=[p[key] for p in shown],
                y=ys,
                mode="markers+text",
                marker={"color": color, "size": 12},
                text=[str(p["probe"]) for p in shown],
                textposition="top right",
                error_y={
                    "type": "data",
                    "symmetric": False,
                    "array": up,
                    "arrayminus": down,
                    "visible": True,
                    "thickness": 1,
                },
                name=f"{verdict}",
                customdata=[[p["probe"], load_text(p[key], mode)] for p in shown],
                hovertemplate="probe %{customdata[0]}: %{customdata[1]}, %{y:.1f} tok/s<extra>" + verdict + "</extra>",
            )
        )
    best = result.get("max_users" if mode == USERS else "max_rate_rps")
    failing = (result.get("first_failing") or {}).get(key)
    for load, color, label, side in (
        (best, VERDICT_COLORS[PASS], "capacity", "right"),
        (failing, VERDICT_COLORS[FAIL], "first failing", "left"),
    ):
        if load is None:
            continue
        fig.add_vline(x=load, line={"dash": "dash", "color": color})
        # An annotation on a log axis is placed in log10 units (add_vline's own annotation is not, and stretches the
        # axis to the load itself).
        fig.add_annotation(
            x=math.log10(load), y=1.0, yref="paper", yanchor="bottom", xanchor=side, showarrow=False,
            text=html.escape(f"{label}: {load_text(load, mode)}"), font={"color": color},
        )  # fmt: skip
    fig.update_xaxes(type="log", title=AXIS_TITLES[key], dtick=np.log10(2))
    fig.update_yaxes(title_text="aggregate tok/s", rangemode="tozero")
    fig.update_layout(title="Capacity search: the probe path on the batching curve", height=420)
    return fig


def capacity_html(result: dict | None) -> str:
    """--find-capacity: the result's sentence, every probe in the order it ran with each objective's value, interval
    and verdict, and the probe path on the batching curve (analysis.capacity.result, as finish computed it)."""
    if result is None:
        return ""
    key, mode = _capacity_load_key(result), result["mode"]
    found = result.get("max_users" if mode == USERS else "max_rate_rps") is not None
    color = VERDICT_COLORS[UNCERTAIN] if result.get("uncertain") else VERDICT_COLORS[PASS if found else FAIL]
    notes = []
    if result.get("limit") is None:
        notes.append("The search did not finish (the run was stopped first): this is the best found so far.")
    names = list(result.get("objectives") or {})
    head = ["probe", "step", "load", "verdict"]
    head += [f"{n} (limit {_objective_value(n, result['objectives'][n])})" for n in names]
    head += ["aggregate tok/s", "requests"]
    rows = []
    for p in result["probes"]:
        verdict = str(p.get("verdict"))
        cells = [
            str(p["probe"]),
            str(p.get("step")),
            "-" if p.get(key) is None else load_text(p[key], mode),
        ]
        tds = "".join(f"<td>{html.escape(c)}</td>" for c in cells)
        style = f" style='color:{VERDICT_COLORS.get(verdict, '#000')};font-weight:bold'"
        stopped = ""
        if p.get("interrupted"):
            stopped = " (stopped before it was judged" + ("" if p.get("counted") else ": not counted") + ")"
        tds += f"<td{style}>{html.escape(verdict + stopped)}</td>"
        tds += "".join(f"<td>{html.escape(_check_text(n, (p.get('objectives') or {}).get(n)))}</td>" for n in names)
        tds += f"<td>{html.escape(_tok_s_text(p))}</td><td>{html.escape(str(p.get('requests')))}</td>"
        rows.append(f"<tr class='probe-{html.escape(verdict)}'>{tds}</tr>")
    header = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    figure = capacity_figure(result).to_html(full_html=False, include_plotlyjs=False) if result["probes"] else ""
    return (
        f"<h2>Capacity</h2><p id='capacity-line' style='color:{color};font-weight:bold'>"
        f"{html.escape(result['line'])}</p>"
        + "".join(f"<p>{html.escape(n)}</p>" for n in notes)
        + "<p>Each probe is a step of the run, judged on its 95 % intervals: pass when the interval lies at or under "
        "the limit, fail when above, uncertain when it straddles the limit.</p>"
        f"<table class='capacity'><thead><tr>{header}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
        f"{figure}"
    )


def generator_html(table: pd.DataFrame) -> str:
    """The generator-bound steps, shown before anything else: their client-side numbers are not the server's."""
    bound = bound_steps(table)
    if not len(bound):
        return ""
    which = ", ".join(f"{int(r['step'])} ({int(r['users'])} users)" for _, r in bound.iterrows())
    return (
        f"<p style='color:#b00;font-weight:bold'>GENERATOR-BOUND steps {html.escape(which)}: the load generator could "
        "not keep up, so their latencies read high and their throughput low (marked in the per-step table). To "
        f"measure the server, {html.escape(ADVICE)}.</p>"
    )
