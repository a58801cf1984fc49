"""report.html: one self-contained file (plotly's JavaScript inlined) rebuilt from a run directory's files.

Every piece of text that comes from the server or the run (model names, error messages, options) is escaped.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from . import __version__ as SUITE_VERSION
from .capacity import FAIL, FEW, PASS, UNCERTAIN, USERS, load_text
from .compare import METRICS as COMPARED
from .diagnosis import utc
from .generator import ADVICE, CPU_BOUND, LAG_BOUND_S, bound_steps, flagged
from .glossary import GLOSSARY, STEP_TABLE, Column, format_value
from .records import single_model
from .run import REPORT_FILE, STEPS_FILE, SUMMARY_FILE, dataset_info
from .schedule import flagged as schedule_flagged
from .schedule import is_rate_run
from .server_metrics import KV_CACHE, RUNNING, WAITING, ServerSeries, server_info
from .sse import CUT_OFF
from .steps import unstable

if TYPE_CHECKING:
    from .compare import Comparison
    from .finish import Outcome

__all__ = ["REPORT_FILE", "SUMMARY_FILE", "build_report", "cdf_points"]
# Charts of a long run at high load stay a few MB (a one-hour run can hold hundreds of thousands of requests):
# a CDF is drawn through at most ~1,200 of its exact points (cdf_points), and the TTFT timeline shows one marker per
# request up to TIMELINE_POINTS requests, beyond that the TIMELINE_POINTS / 10 slowest and an even sample of the others.
CDF_RANKS = 1000
CDF_TAIL_RANKS = 100
TIMELINE_POINTS = 50_000
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


def _batching_curve(tables: dict[str, pd.DataFrame]) -> go.Figure:
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


def _latencies(tables: dict[str, pd.DataFrame]) -> go.Figure:
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


def _ttft_points(ok: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The requests the timeline's TTFT chart shows, and its title."""
    if len(ok) <= TIMELINE_POINTS:
        return ok, "TTFT of each request"
    ok = ok.reset_index(drop=True)  # the sample is taken by label
    slowest = ok["ttft_s"].nlargest(TIMELINE_POINTS // 10).index
    rest = ok.drop(index=slowest)
    every = math.ceil(len(rest) / (TIMELINE_POINTS - len(slowest)))
    shown = pd.concat([ok.loc[slowest], rest.iloc[::every]])
    return shown, f"TTFT: the {len(slowest):,} slowest requests and 1 in {every} of the others ({len(ok):,} in all)"


def _timeline(records: pd.DataFrame, metrics: pd.DataFrame | None, timeline: list[dict]) -> go.Figure:
    ok = records[records["status"] == "ok"]
    ttft_shown, ttft_title = _ttft_points(ok)
    fig = make_subplots(
        rows=3,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.05,
        subplot_titles=(
            "users and aggregate tok/s (1 s bins, by completion)",
            ttft_title,
            "server: KV-cache usage, running and waiting requests",
        ),
        specs=[[{"secondary_y": True}], [{}], [{"secondary_y": True}]],
    )
    t0 = records["start_time"].min() if len(records) else 0.0
    if timeline:
        xs, ys = [], []
        for step in timeline:
            end = step["end_time"] or step["start_time"]
            xs += [step["start_time"] - t0, end - t0]
            ys += [step["users"], step["users"]]
        fig.add_trace(go.Scatter(x=xs, y=ys, name="users", line={"shape": "hv"}), row=1, col=1)
    if len(ok):
        end = (ok["start_time"] + ok["e2e_s"] - t0).astype(float)
        bins = np.floor(end).astype(int)
        per_s = ok.groupby(bins)["output_tokens"].sum()
        fig.add_trace(
            go.Bar(x=per_s.index + 0.5, y=per_s.values, name="tok/s", opacity=0.5), row=1, col=1, secondary_y=True
        )
        fig.add_trace(
            go.Scattergl(
                x=ttft_shown["start_time"] - t0,
                y=ttft_shown["ttft_s"] * 1000,
                mode="markers",
                marker={"size": 3},
                name="TTFT (ms)",
            ),
            row=2,
            col=1,
        )
    if metrics is not None and len(metrics):
        server = ServerSeries(metrics, single_model(records))
        for metric, label, secondary in (
            (KV_CACHE, "KV-cache usage", False),
            (RUNNING, "running", True),
            (WAITING, "waiting", True),
        ):
            s = server.gauge(metric)
            fig.add_trace(
                go.Scatter(x=s.index - t0, y=s.values, name=label, mode="lines"), row=3, col=1, secondary_y=secondary
            )
    for step in timeline:
        fig.add_vline(x=step["start_time"] - t0, line={"dash": "dot", "color": "grey"})
    fig.update_xaxes(title_text="seconds since the run started", row=3, col=1)
    fig.update_yaxes(title_text="TTFT (ms)", row=2, col=1)
    fig.update_yaxes(rangemode="tozero")
    fig.update_yaxes(title_text="KV-cache usage", range=[0, 1.05], row=3, col=1, secondary_y=False)
    fig.update_layout(title="Timeline", height=800)
    return fig


def _generator(samples: pd.DataFrame, timeline: list[dict], t0: float) -> go.Figure:
    """Each load-generating process's self-checks over time, against the bounds that flag a step."""
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.08,
        subplot_titles=(
            "event-loop lag of each load process: p99 and max of each second's probe samples (ms)",
            "CPU of each load process (fraction of one core)",
        ),
    )
    for worker, g in samples.groupby("worker"):
        x = g["timestamp"] - t0
        lags = [np.asarray(v, dtype=float) for v in g["lag_s"]]
        p99 = [float(np.percentile(v, 99)) * 1000 if v.size else None for v in lags]
        top = [float(v.max()) * 1000 if v.size else None for v in lags]
        fig.add_trace(go.Scatter(x=x, y=p99, mode="lines", name=f"{worker} lag p99"), row=1, col=1)
        max_line = go.Scatter(x=x, y=top, mode="lines", line={"dash": "dot"}, name=f"{worker} lag max")
        fig.add_trace(max_line, row=1, col=1)
        fig.add_trace(go.Scatter(x=x, y=g["cpu_fraction"], mode="lines", name=f"{worker} CPU"), row=2, col=1)
    fig.add_hline(y=LAG_BOUND_S * 1000, line={"dash": "dash", "color": "#b00"}, row=1, col=1)
    fig.add_hline(y=CPU_BOUND, line={"dash": "dash", "color": "#b00"}, row=2, col=1)
    for step in timeline:
        fig.add_vline(x=step["start_time"] - t0, line={"dash": "dot", "color": "grey"})
    fig.update_yaxes(type="log", title_text="lag (ms)", row=1, col=1)
    fig.update_yaxes(title_text="CPU", rangemode="tozero", row=2, col=1)
    fig.update_xaxes(title_text="seconds since the run started", row=2, col=1)
    fig.update_layout(title="Load generator self-checks (dashed red: the generator-bound limits)", height=560)
    return fig


def _ceiling_html(ceiling: dict | None) -> str:
    """The single-request decode ceiling against the measured rate, and why they differ."""
    if ceiling is None:
        return ""
    items = "".join(f"<li>{html.escape(t)}</li>" for t in ceiling["text"])
    return f"<h2>Efficiency ceiling</h2><ul>{items}</ul>"


def _slo_html(gate: dict | None, searched: bool = False) -> str:
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


def _capacity_figure(result: dict) -> go.Figure:
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


def _capacity_html(result: dict | None) -> str:
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
        tds += f"<td{style}>{html.escape(verdict)}</td>"
        tds += "".join(f"<td>{html.escape(_check_text(n, (p.get('objectives') or {}).get(n)))}</td>" for n in names)
        tds += f"<td>{html.escape(_tok_s_text(p))}</td><td>{html.escape(str(p.get('requests')))}</td>"
        rows.append(f"<tr class='probe-{html.escape(verdict)}'>{tds}</tr>")
    header = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    figure = _capacity_figure(result).to_html(full_html=False, include_plotlyjs=False) if result["probes"] else ""
    return (
        f"<h2>Capacity</h2><p id='capacity-line' style='color:{color};font-weight:bold'>"
        f"{html.escape(result['line'])}</p>"
        + "".join(f"<p>{html.escape(n)}</p>" for n in notes)
        + "<p>Each probe is a step of the run, judged on its 95 % intervals: pass when the interval lies at or under "
        "the limit, fail when above, uncertain when it straddles the limit.</p>"
        f"<table class='capacity'><thead><tr>{header}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
        f"{figure}"
    )


def _generator_html(table: pd.DataFrame) -> str:
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


def cdf_points(sorted_values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(x, y): points of the empirical CDF of the sorted values (the i-th smallest at y = i / n); every point up to
    CDF_RANKS + 2 * CDF_TAIL_RANKS values, beyond that only some of them, each one still exact: evenly spaced ranks
    (the line drawn through them stays within 1 / CDF_RANKS of the CDF everywhere), log-spaced ranks in both tails
    (p99.9, p99.99 … stay where they are) and the smallest and largest values."""
    n = len(sorted_values)
    if n <= CDF_RANKS + 2 * CDF_TAIL_RANKS:
        ranks = np.arange(n)
    else:
        tail = np.unique(np.ceil(np.geomspace(1, n / 100, CDF_TAIL_RANKS)).astype(np.int64))  # 1 … n / 100
        even = np.round(np.linspace(0, n - 1, CDF_RANKS + 1)).astype(np.int64)
        ranks = np.unique(np.concatenate([even, tail - 1, n - tail]))
    return sorted_values[ranks], (ranks + 1) / n


def _cdfs(records: pd.DataFrame) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=("TTFT CDF (ms)", "TPOT CDF (ms)"))
    ok = records[(records["status"] == "ok") & ~records["warmup"].astype(bool)]
    for (_step, users), group in ok.groupby(["step", "users"]):
        for col, metric in ((1, "ttft_s"), (2, "tpot_s")):
            v = np.sort(group[metric].dropna().to_numpy(dtype=float)) * 1000
            if len(v):
                x, y = cdf_points(v)
                fig.add_trace(
                    go.Scatter(
                        x=x,
                        y=y,
                        mode="lines",
                        name=f"{users} users ({metric[:4].upper()})",
                    ),
                    row=1,
                    col=col,
                )
    fig.update_layout(title="Distributions per step", height=420)
    return fig


def _workload_html(run: dict, table: pd.DataFrame) -> str:
    """The prompt source, how max_tokens was chosen and, when the server counts them, its prefix-cache hits per
    step: the figure a shared-prefix workload is run for."""
    options = run.get("options") or {}
    info = dataset_info(run)
    spec = str(info.get("spec") or "fixed")
    items = [f"Prompt source: --dataset {spec}" + (f" ({info['items']} prompts)" if info.get("items") else "")]
    if info.get("tokenizer"):
        items.append(f"Token lengths from: {info['tokenizer']}")
    dist = options.get("max_tokens_dist") or ("reference" if spec.startswith("sharegpt") else "fixed")
    items.append(
        f"max_tokens per request: {dist}"
        + (f" (--max-tokens {options.get('max_tokens')})" if dist in ("fixed", "reference") else "")
        + (f", --seed {options.get('seed')}" if options.get("seed") is not None else "")
    )
    items += [str(note) for note in info.get("notes") or []]
    rates = table[["step", "users", "prefix_cache_hit_rate"]] if "prefix_cache_hit_rate" in table.columns else None
    if rates is not None and rates["prefix_cache_hit_rate"].notna().any():
        items.append(
            "Prefix-cache hit rate (server counters: prompt tokens found in the cache / looked up): "
            + ", ".join(
                f"step {int(r.step)} ({int(r.users)} users) "
                + ("-" if pd.isna(r.prefix_cache_hit_rate) else f"{r.prefix_cache_hit_rate:.0%}")
                for r in rates.itertuples(index=False)
            )
        )
    elif spec.startswith("shared-prefix"):
        items.append(
            "Prefix-cache hit rate: not available (the server exposed no vllm:prefix_cache_queries_total, or "
            "--metrics-url was off)"
        )
    return "<h2>Workload</h2><ul>" + "".join(f"<li>{html.escape(t)}</li>" for t in items) + "</ul>"


def _step_cell(column: Column | None, value: object) -> str:
    if column is not None:
        return column.show(value)
    return format_value(value, "g" if isinstance(value, float) else "text")


def _table_html(table: pd.DataFrame) -> str:
    """The per-step table under the glossary's titles and in its formats (latencies in ms, fractions in %); a step
    flagged generator-bound, behind schedule, outlier or unstable is highlighted. A column the glossary does not
    know keeps its name."""
    shown = [(name, STEP_TABLE.get(name)) for name in table.columns]
    head = "".join(
        f"<th title='{html.escape(c.meaning if c else str(name))}'>{html.escape(c.title if c else str(name))}</th>"
        for name, c in shown
    )
    rows = []
    for r in table.to_dict(orient="records"):
        cells = "".join(f"<td>{html.escape(_step_cell(c, r[name]))}</td>" for name, c in shown)
        why = [w for w, on in (("generator-bound", flagged(r.get("generator_bound"))),
                               ("behind schedule", schedule_flagged(r.get("schedule_behind"))),
                               ("outlier", flagged(r.get("outlier"))),
                               ("unstable", unstable(r.get("stable")))) if on]  # fmt: skip
        flag = f" class='flagged' title='{', '.join(why)}'" if why else ""
        rows.append(f"<tr{flag}>{cells}</tr>")
    # ~60 columns: the table scrolls sideways inside its own box (the step column stays in view) instead of running
    # past the page's edge.
    return (
        f"<div class='scroll'><table class='steps'><thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def _compare_html(comparisons: list[Comparison]) -> str:
    """--compare: per step, each difference and whether it exceeds the noise, as analysis.compare states it."""
    out = []
    for c in comparisons:
        lines = c.lines()
        out.append(f"<h2>Comparison: {html.escape(c.this)} against {html.escape(c.other)}</h2>")
        if c.unmatched is not None:
            out.append(f"<p>{html.escape(lines[0])}</p>")
            continue
        notes = lines[: 1 + len(c.missing_intervals)]
        out.append("".join(f"<p>{html.escape(t)}</p>" for t in notes))
        labels = [label for _, label in COMPARED]
        head = "<tr><th>load</th>" + "".join(f"<th>{html.escape(x)}</th>" for x in labels) + "</tr>"
        rows = []
        for s in c.steps:
            if s.only_in is not None:
                cells = f"<td colspan='{len(labels)}'>only in {html.escape(s.only_in)}, not compared</td>"
            else:
                # A significant difference in bold: the cells a reader acts on.
                cells = "".join(
                    ("<td style='font-weight:bold'>" if d.significant else "<td>") + f"{html.escape(d.stated())}</td>"
                    for d in s.differences
                )
            rows.append(f"<tr><th>{html.escape(s.load_text)}</th>{cells}</tr>")
        out.append(f"<table class='compare'>{head}{''.join(rows)}</table><p>{html.escape(lines[-1])}</p>")
    return "".join(out)


def _workers_html(workers: list[dict], lines: list[str]) -> str:
    head = "<tr><th>worker</th><th>Locust id</th><th>connected</th><th>missing since</th><th>records received</th>"
    head += "<th>records reported</th></tr>"
    rows = "".join(
        "<tr>"
        + "".join(
            f"<td>{html.escape('' if v is None else str(v))}</td>"
            for v in (
                w.get("worker"),
                w.get("client_id"),
                utc(w.get("connected_at")),
                utc(w.get("missing_at")),
                w.get("records_received"),
                w.get("records_reported"),
            )
        )
        + "</tr>"
        for w in workers
    )
    notes = "".join(f"<li>{html.escape(line)}</li>" for line in lines)
    return f"<h2>Workers</h2><ul>{notes}</ul><table>{head}{rows}</table>"


def build_report(outcome: Outcome, compare: list[Path] | None = None) -> str:
    """report.html of an outcome (analysis.finish): its verdicts as computed there, never again here."""
    run_dir, run, records, table = outcome.run_dir, outcome.run, outcome.records, outcome.table
    metrics, generator = outcome.metrics, outcome.generator
    tables = {run_dir.name: table}
    for other in compare or []:
        tables[Path(other).name] = pd.read_csv(Path(other) / STEPS_FILE)
    figures = [
        _batching_curve(tables),
        _latencies(tables),
        _timeline(records, metrics, run.get("timeline") or []),
        _cdfs(records),
    ]
    if len(generator):
        t0 = records["start_time"].min() if len(records) else generator["timestamp"].min()
        figures.insert(3, _generator(generator, run.get("timeline") or [], t0))
    server = {}
    if (run_dir / "server.json").exists():
        server = json.loads((run_dir / "server.json").read_text())
    cache_config = server_info(metrics)
    meta = {
        "run directory": str(run_dir),
        "started": utc(run.get("started_at")),
        "finished": utc(run.get("finished_at")),
        "server": (run.get("options") or {}).get("host"),
        "models": ", ".join(sorted(records["model"].dropna().unique())),
        "vLLM version": run.get("server_version") or "not exposed by the server",
        "server KV cache": ", ".join(f"{k}={v}" for k, v in sorted(cache_config.items())) or None,
        "embedded server settings": json.dumps(server.get("settings", {}), sort_keys=True) if server else None,
        "arguments": json.dumps(run.get("options", {}), sort_keys=True),
        "Locust": run.get("locust_version"),
        "suite version": run.get("suite_version") or SUITE_VERSION,
        "suite revision": outcome.summary.get("suite_revision"),
    }
    cut_off = int((records["error_type"] == CUT_OFF).sum())
    failed = records[(records["status"] != "ok") & (records["error_type"] != CUT_OFF)]
    errors = failed.groupby(["error_type", "error"], dropna=False).size()
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>vllm-loadtest report</title>",
        f"<script type='text/javascript'>{get_plotlyjs()}</script>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:12px}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
        ".scroll{overflow-x:auto;max-width:100%}.steps td,.steps th{white-space:nowrap;background:#fff}"
        ".steps td:first-child,.steps th:first-child{position:sticky;left:0}"
        ".steps tr.flagged td{background:#fdd}</style></head><body>",
        f"<h1>vllm-loadtest report: {html.escape(run_dir.name)}</h1>",
        _capacity_html(outcome.capacity),
        "<h2>Diagnosis</h2><ul>" + "".join(f"<li>{html.escape(t)}</li>" for t in outcome.diagnosis_lines) + "</ul>",
        _generator_html(table),
        _slo_html(outcome.slo, searched=outcome.capacity is not None),
        _ceiling_html(outcome.ceiling),
        _workload_html(run, table),
        _compare_html(outcome.comparisons),
    ]
    parts += [f.to_html(full_html=False, include_plotlyjs=False) for f in figures]
    parts += ["<h2>Per-step table</h2>", _table_html(table)]
    if len(errors):
        parts.append(
            "<h2>Errors</h2><ul>"
            + "".join(
                f"<li>{int(n)} × {html.escape(str(k[0]))}: {html.escape(str(k[1]))}</li>" for k, n in errors.items()
            )
            + "</ul>"
        )
    if cut_off:
        parts.append(
            f"<p>{cut_off} request(s) were still running when the load generator stopped: recorded as cut_off, "
            "neither counted as errors nor measured.</p>"
        )
    check = outcome.integrity
    parts.append(
        "<h2>Integrity check</h2><p>The client's records against the server's own counters over the run.</p><ul>"
        + "".join(
            (MISMATCH_LI if t.startswith("MISMATCH") else "<li>") + f"{html.escape(t)}</li>" for t in check["text"]
        )
        + "</ul>"
    )
    workers = run.get("workers") or []
    if workers:
        # The diagnosis's worker lines (analysis.diagnosis.worker_lines), as finish computed them.
        skip = len(outcome.diagnosis.text) + len(outcome.outages)  # the lines before the worker lines
        parts.append(_workers_html(workers, outcome.diagnosis_lines[skip:]))
    parts.append(
        "<h2>Run</h2><table>"
        + "".join(
            f"<tr><th>{html.escape(k)}</th><td style='text-align:left'>{html.escape(str(v))}</td></tr>"
            for k, v in meta.items()
            if v is not None
        )
        + "</table>"
    )
    parts.append(
        "<h2>Glossary</h2><table>"
        + "".join(
            f"<tr><th>{html.escape(m.name)}</th><td>{html.escape(m.unit)}</td>"
            f"<td style='text-align:left'>{html.escape(m.definition)}</td></tr>"
            for m in GLOSSARY.values()
        )
        + "</table></body></html>"
    )
    return "\n".join(parts)
