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
from .diagnosis import utc
from .embeddings import shown as embeddings_shown
from .generator import ADVICE, CPU_BOUND, LAG_BOUND_S, bound_steps, flagged
from .glossary import GLOSSARY, GPU, STEP_TABLE, TURNS, Column, columns, format_value
from .reasoning import shown as reasoning_shown
from .records import single_model
from .roofline import ratio_text
from .roofline import shown as gpu_shown
from .run import REPORT_FILE, STEPS_FILE, SUMMARY_FILE, dataset_info, images_info, images_text
from .schedule import flagged as schedule_flagged
from .schedule import is_rate_run
from .server_metrics import KV_CACHE, RUNNING, WAITING, ServerSeries, server_info
from .sse import CUT_OFF
from .steps import unstable
from .thresholds import DRAM_ACTIVE_HIGH, GPU_ACTIVE_LOW, SM_ACTIVE_SATURATED

if TYPE_CHECKING:
    from .arrivals import Arrivals
    from .compare import Comparison
    from .finish import Outcome

__all__ = ["REPORT_FILE", "SUMMARY_FILE", "build_report", "cdf_points"]
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


def _embeddings_curve(tables: dict[str, pd.DataFrame]) -> go.Figure:
    """An embeddings run's batching curve: inputs/s per step with its 95 % interval (suspect steps as open markers),
    and E2E p50/p95 with theirs on the second axis (an embeddings request has no tokens out, no TTFT, no TPOT)."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    x = _load_axis(tables)
    for name, t in tables.items():
        t = _by_load(t, x)
        if "inputs_per_s" not in t.columns:
            continue
        suspect = [
            flagged(o) or unstable(s)
            for o, s in zip(t.get("outlier", [None] * len(t)), t.get("stable", [None] * len(t)))
        ]
        fig.add_trace(
            go.Scatter(
                x=t[x],
                y=t["inputs_per_s"],
                name=f"{name} inputs/s",
                mode="lines+markers",
                error_y=_error_bars(t, "inputs_per_s"),
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
                    error_y=_scaled_bars(t, column, 1000),
                ),
                secondary_y=True,
            )
    fig.update_xaxes(type="log", title=AXIS_TITLES[x], dtick=np.log10(2))
    fig.update_yaxes(title_text="inputs/s", secondary_y=False, rangemode="tozero")
    fig.update_yaxes(title_text="E2E (ms)", secondary_y=True, rangemode="tozero")
    fig.update_layout(title="Batching curve (embeddings: inputs/s and E2E)", height=420)
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
        if reasoning_shown(t):
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
                           name=f"{label} p{q}", error_y=_scaled_bars(shown, name, 1000)),
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


def _reasoning_html(table: pd.DataFrame) -> str:
    """A reasoning (or tool-calling) run's section: what TTFO is against TTFT, the steps with requests that never
    got an answer token, and the chart; empty when no request reasoned or called a tool."""
    if not reasoning_shown(table):
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


def _timeline(
    records: pd.DataFrame, metrics: pd.DataFrame | None, timeline: list[dict], embeddings: bool = False
) -> go.Figure:
    """Load and throughput, each request's latency, the server's gauges over the run; an embeddings run's are
    inputs/s and E2E (it has no output tokens and no TTFT)."""
    ok = records[records["status"] == "ok"]
    if embeddings:
        ok = ok.assign(ttft_s=ok["e2e_s"], output_tokens=pd.to_numeric(ok["inputs"], errors="coerce"))
    ttft_shown, ttft_title = _ttft_points(ok)
    if embeddings:
        ttft_title = ttft_title.replace("TTFT", "E2E")
    rate_name = "inputs/s" if embeddings else "tok/s"
    # A trace replay (--trace) holds one pool of users throughout: its load over time is the trace's rows.
    trace = bool(timeline) and all("trace_window" in step for step in timeline)
    fig = make_subplots(
        rows=3,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.05,
        subplot_titles=(
            ("the trace's requests/s (1 s bins, by intended send time)" if trace else "users")
            + f" and {'' if embeddings else 'aggregate '}{rate_name} (1 s bins, by completion)",
            ttft_title,
            "server: KV-cache usage, running and waiting requests",
        ),
        specs=[[{"secondary_y": True}], [{}], [{"secondary_y": True}]],
    )
    t0 = records["start_time"].min() if len(records) else 0.0
    if trace and "intended_start_time" in records.columns and records["intended_start_time"].notna().any():
        # Clipped at 0: the first row's intended time lies a lag before the first send stamp (t0).
        intended = (records["intended_start_time"].dropna().astype(float) - t0).clip(lower=0)
        sent = np.floor(intended).astype(int).value_counts()
        sent = sent.reindex(range(int(sent.index.min()), int(sent.index.max()) + 1), fill_value=0)  # idle seconds: 0
        fig.add_trace(go.Scatter(x=sent.index + 0.5, y=sent.values, name="requests/s (trace)"), row=1, col=1)
    elif timeline:
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
            go.Bar(x=per_s.index + 0.5, y=per_s.values, name=rate_name, opacity=0.5), row=1, col=1, secondary_y=True
        )
        fig.add_trace(
            go.Scattergl(
                x=ttft_shown["start_time"] - t0,
                y=ttft_shown["ttft_s"] * 1000,
                mode="markers",
                marker={"size": 3},
                name="E2E (ms)" if embeddings else "TTFT (ms)",
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
    fig.update_yaxes(title_text="E2E (ms)" if embeddings else "TTFT (ms)", row=2, col=1)
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


# (field, subplot title, scale, y axis title): the GPU section's rows, on the Timeline's x axis.
_GPU_ROWS = (
    ("util", "GPU utilisation (a kernel running; DCGM_FI_DEV_GPU_UTIL / 100)", 1.0, "util"),
    ("sm_active", "SM active (DCGM_FI_PROF_SM_ACTIVE)", 1.0, "SM"),
    ("dram_active", "DRAM active (DCGM_FI_PROF_DRAM_ACTIVE)", 1.0, "DRAM"),
    ("mem_used_bytes", "framebuffer used (GiB; DCGM_FI_DEV_FB_USED)", 2.0**-30, "GiB"),
    ("power_w", "power (W; DCGM_FI_DEV_POWER_USAGE)", 1.0, "W"),
)


def _gpu_figure(samples: pd.DataFrame, timeline: list[dict], t0: float) -> go.Figure:
    """Each GPU's series over the run (the Timeline's x: seconds since the run started, step starts dotted), the
    roofline thresholds dashed; a series the exporter did not give is left out, not drawn at 0."""
    rows = [r for r in _GPU_ROWS if r[0] in set(samples["field"])]
    fig = make_subplots(
        rows=len(rows), cols=1, shared_xaxes=True, vertical_spacing=0.04, subplot_titles=[r[1] for r in rows]
    )
    for i, (name, _, scale, axis) in enumerate(rows, start=1):
        for key, g in samples[samples["field"] == name].groupby("gpu_key", sort=True):
            g = g.sort_values("timestamp")
            every = max(1, math.ceil(len(g) / GPU_POINTS))
            g = g.iloc[::every]
            fig.add_trace(
                go.Scatter(x=g["timestamp"] - t0, y=g["value"] * scale, mode="lines", name=f"{key} {axis}",
                           legendgroup=str(key)),
                row=i, col=1,
            )  # fmt: skip
        fig.update_yaxes(title_text=axis, rangemode="tozero", row=i, col=1)
        if name in ("util", "sm_active", "dram_active"):
            fig.update_yaxes(range=[0, 1.05], row=i, col=1)
        lines = {"sm_active": (GPU_ACTIVE_LOW, SM_ACTIVE_SATURATED), "dram_active": (DRAM_ACTIVE_HIGH,)}.get(name, ())
        for y in lines:
            fig.add_hline(y=y, line={"dash": "dash", "color": "#b00"}, row=i, col=1)
    for step in timeline:
        fig.add_vline(x=step["start_time"] - t0, line={"dash": "dot", "color": "grey"})
    fig.update_xaxes(title_text="seconds since the run started", row=len(rows), col=1)
    fig.update_layout(title="GPUs (dcgm-exporter; dashed red: the roofline thresholds)", height=180 * len(rows) + 120)
    return fig


def _gpu_html(outcome: Outcome, t0: float) -> str:
    """The GPU section, only when a step saw a GPU: each GPU's series on the run's time axis and its verdict per step
    (as analysis.roofline computed it in finish)."""
    samples = outcome.gpu_samples
    if samples is None or not len(samples) or not gpu_shown(outcome.table):
        return ""
    users = {int(r["step"]): r["users"] for r in outcome.table.to_dict(orient="records")
             if str(r["step"]).lstrip("-").isdigit()}  # fmt: skip
    head = "".join(
        f"<th>{h}</th>"
        for h in ("step", "users", "GPU", "readings", "util", "SM active [95 % CI]", "DRAM active [95 % CI]",
                  "mem max (GiB)", "power (W)", "regime", "why")
    )  # fmt: skip
    body = []
    for step, v in sorted(outcome.gpu_verdicts.items()):
        for g in v.gpus:
            cells = (
                step, users.get(step, ""), g.gpu_key, g.readings, format_value(g.util, "num2"), ratio_text(g.sm),
                ratio_text(g.dram), format_value(g.mem_used_max_bytes / 2**30, "num1"),
                format_value(g.power_mean_w, "num0"), g.regime or "-", g.why,
            )  # fmt: skip
            body.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    figure = _gpu_figure(samples, outcome.run.get("timeline") or [], t0)
    return (
        "<h2>GPUs</h2><p>dcgm-exporter's series of each GPU over the run, and each GPU's roofline verdict per step: "
        f"memory_bound when DRAM active's 95 % interval lies at or above {DRAM_ACTIVE_HIGH:g} and SM active's below "
        f"{SM_ACTIVE_SATURATED:g}; compute_bound when SM active's lies at or above {SM_ACTIVE_SATURATED:g} and DRAM "
        f"active's below {DRAM_ACTIVE_HIGH:g}; neither when both lie below {GPU_ACTIVE_LOW:g}; otherwise it cannot "
        "be told (-). The step's regime (the per-step table's gpu_regime) is that of its busy GPUs when they "
        "agree.</p>"
        + figure.to_html(full_html=False, include_plotlyjs=False)
        + f"<div class='scroll'><table class='gpus'><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody>"
        "</table></div>"
    )


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
        stopped = ""
        if p.get("interrupted"):
            stopped = " (stopped before it was judged" + ("" if p.get("counted") else ": not counted") + ")"
        tds += f"<td{style}>{html.escape(verdict + stopped)}</td>"
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


def _cdfs(records: pd.DataFrame, embeddings: bool = False) -> go.Figure:
    """Per step, the CDFs of TTFT and TPOT (an embeddings run: of E2E, its only latency)."""
    metrics = ((1, "e2e_s"),) if embeddings else ((1, "ttft_s"), (2, "tpot_s"))
    titles = ("E2E CDF (ms)",) if embeddings else ("TTFT CDF (ms)", "TPOT CDF (ms)")
    fig = make_subplots(rows=1, cols=len(metrics), subplot_titles=titles)
    ok = records[(records["status"] == "ok") & ~records["warmup"].astype(bool)]
    for (_step, users), group in ok.groupby(["step", "users"]):
        for col, metric in metrics:
            v = np.sort(group[metric].dropna().to_numpy(dtype=float)) * 1000
            if len(v):
                x, y = cdf_points(v)
                fig.add_trace(
                    go.Scatter(
                        x=x,
                        y=y,
                        mode="lines",
                        name=f"{users} users ({metric.split('_')[0].upper()})",
                    ),
                    row=1,
                    col=col,
                )
    fig.update_layout(title="Distributions per step", height=420)
    return fig


ARRIVAL_CURVE_POINTS = 200
PROCESS_NAMES = {"poisson": "exponential (Poisson)", "constant": "constant", "trace": "the trace's timestamps"}


def _process_name(arrivals: Arrivals) -> str:
    if arrivals.burstiness is not None:
        return f"gamma, shape {arrivals.burstiness:g}"
    return PROCESS_NAMES.get(arrivals.process, arrivals.process)


def _arrivals_figure(arrivals: Arrivals) -> go.Figure:
    """The CDFs of the pooled scaled gaps, sent and intended (cdf_points: bounded), and the process's own CDF."""
    fig = go.Figure()
    curves = (("sent (actual send times)", arrivals.sent, None), ("intended", arrivals.intended, "dot"))
    for name, values, dash in curves:
        if len(values):
            x, y = cdf_points(values)
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=name, line={"dash": dash} if dash else None))
    both = np.concatenate([arrivals.sent, arrivals.intended])
    positive = both[both > 0]
    if positive.size:
        low, high = max(float(positive.min()), 1e-6), max(float(positive.max()), 1.0)
        grid = np.geomspace(low, high, ARRIVAL_CURVE_POINTS) if high > low else np.array([low])
        if arrivals.process == "constant":
            grid = np.unique(np.concatenate([grid, [1.0, np.nextafter(1.0, 0)]]))
        y = arrivals.expected_cdf(grid)
        if y is not None:
            fig.add_trace(
                go.Scatter(
                    x=grid, y=y, mode="lines", name=f"expected: {_process_name(arrivals)}",
                    line={"color": "#888", "dash": "dash"},
                )
            )  # fmt: skip
    fig.update_layout(
        title="Gaps between consecutive requests, every step pooled (gap × the step's rate: 1 = the mean gap)",
        xaxis={"title": "gap × rate (log)", "type": "log"},
        yaxis={"title": "fraction of gaps ≤ x", "range": [0, 1.02]},
        height=420,
    )
    return fig


def _cv_cell(iv) -> str:
    if iv is None or not math.isfinite(iv.value):
        return "-"
    if math.isfinite(iv.low) and math.isfinite(iv.high):
        return f"{iv.value:.2f} [{iv.low:.2f}, {iv.high:.2f}]"
    return f"{iv.value:.2f} ({iv.note or 'no interval'})"


def _arrivals_html(arrivals: Arrivals | None) -> str:
    """An open loop's section: what was sent against what was intended and asked for (analysis/arrivals.py)."""
    if arrivals is None or not len(arrivals.sent):
        return ""
    expected = arrivals.expected_cv
    expected_text = "-" if expected is None else f"{expected:.2f}"

    def num(v: float) -> str:
        return "-" if v is None or not math.isfinite(v) else f"{v:.2f}"

    head = (
        "<tr><th>step</th><th>intended rate (req/s)</th><th>gaps</th><th>CV sent [95 %]</th><th>CV intended</th>"
        "<th>CV expected</th></tr>"
    )
    rows = [
        f"<tr><td>{s.step}</td><td>{'-' if math.isnan(s.rate_rps) else f'{s.rate_rps:g}'}</td><td>{s.cv_sent.n}</td>"
        f"<td>{html.escape(_cv_cell(s.cv_sent))}</td><td>{num(s.cv_intended)}</td><td>{expected_text}</td></tr>"
        for s in arrivals.steps
    ]
    rows.append(
        f"<tr><th>all, scaled</th><td></td><td>{arrivals.pooled.n}</td><td>{html.escape(_cv_cell(arrivals.pooled))}"
        f"</td><td>{num(arrivals.pooled_intended_cv)}</td><td>{expected_text}</td></tr>"
    )
    intro = (
        f"<p>Arrival process: {html.escape(_process_name(arrivals))}. The gaps between consecutive requests of each "
        "step (every load process's, merged), from the actual send times and from the intended ones; CV = sd / "
        "mean of the gaps (exponential 1, gamma of shape B 1 / &radic;B, constant 0), its 95 % interval from a "
        "block bootstrap. A sent CV above the intended one means sends bunched up: requests sent late (no free "
        "user, a busy load process) leave together.</p>"
    )
    return (
        "<h2>Inter-arrival times</h2>"
        + intro
        + f"<table>{head}{''.join(rows)}</table>"
        + _arrivals_figure(arrivals).to_html(full_html=False, include_plotlyjs=False)
    )


def _workload_html(run: dict, table: pd.DataFrame) -> str:
    """The prompt source, how max_tokens was chosen and, when the server counts them, its prefix-cache hits per
    step: the figure a shared-prefix workload is run for."""
    options = run.get("options") or {}
    info = dataset_info(run)
    spec = str(info.get("spec") or "fixed")
    trace = run.get("trace")
    if trace:  # --trace: the rows give the prompts' lengths and max_tokens
        prompts = trace.get("prompts") or {}
        shown = f"--trace-start {trace.get('start_s') or 0:g}s" + (
            f" --trace-duration {trace['duration_s']:g}s" if trace.get("duration_s") else ""
        )
        items = [
            f"Trace replay: --trace {trace.get('path')} ({trace.get('format')}, {trace.get('rows')} rows of "
            f"{trace.get('total_rows') or '?'}, {shown}, --trace-speed {trace.get('speed'):g}, over "
            f"{float(trace.get('span_s') or 0):.1f} s)",
            f"Prompts synthesized to each row's input length (--trace-block-tokens {trace.get('block_tokens')}), "
            f"token lengths from: {prompts.get('tokenizer') or 'unknown'}",
            "max_tokens per request: each row's output length"
            + (f", --seed {options.get('seed')}" if options.get("seed") is not None else ""),
        ]
    else:
        items = [f"Prompt source: --dataset {spec}" + (f" ({info['items']} prompts)" if info.get("items") else "")]
        if info.get("tokenizer"):
            items.append(f"Token lengths from: {info['tokenizer']}")
        seed = f", --seed {options.get('seed')}" if options.get("seed") is not None else ""
        if options.get("endpoint") == "embeddings":  # no max_tokens: the batch and the vectors' encoding instead
            items.append(
                f"Embeddings: --batch-size {options.get('batch_size') or 1} inputs per request (consecutive prompts), "
                f"--encoding-format {options.get('encoding_format') or 'float'}{seed}"
            )
        else:
            dist = options.get("max_tokens_dist") or ("reference" if spec.startswith("sharegpt") else "fixed")
            items.append(
                f"max_tokens per request: {dist}"
                + (f" (--max-tokens {options.get('max_tokens')})" if dist in ("fixed", "reference") else "")
                + seed
            )
    if (image_settings := images_info(run)) is not None:
        items.append(images_text(image_settings))
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


def _scaled_bars(t: pd.DataFrame, name: str, factor: float) -> dict | None:
    """_error_bars of a value shown scaled (seconds as ms, a fraction as %)."""
    return _error_bars(t.assign(**{c: t[c] * factor for c in (name, f"{name}_ci_low", f"{name}_ci_high")}), name)


def _turns_figure(turns: pd.DataFrame) -> go.Figure:
    """TTFT p50 and p95 (with their 95 % intervals) and the mean prompt length against the turn; beside it the
    server's prefix-cache hit rate per turn (with its interval) when the server sent cached tokens."""
    hits = "prefix_cache_hit_rate" in turns.columns and turns["prefix_cache_hit_rate"].notna().any()
    specs = [[{"secondary_y": True}, {}]] if hits else [[{"secondary_y": True}]]
    titles = ("TTFT and prompt length per turn", "Prefix-cache hit rate per turn") if hits else None
    fig = make_subplots(rows=1, cols=2 if hits else 1, specs=specs, subplot_titles=titles)
    t = turns.sort_values("turn")
    for name, label in (("ttft_p50_s", "TTFT p50"), ("ttft_p95_s", "TTFT p95")):
        bars = _scaled_bars(t, name, 1000)
        fig.add_trace(
            go.Scatter(x=t["turn"], y=t[name] * 1000, mode="lines+markers", name=f"{label} (ms)", error_y=bars),
            row=1,
            col=1,
            secondary_y=False,
        )
    fig.add_trace(
        go.Scatter(
            x=t["turn"], y=t["prompt_tokens_mean"], mode="lines+markers", line={"dash": "dot"},
            name="prompt tokens (mean)",
        ),
        row=1, col=1, secondary_y=True,
    )  # fmt: skip
    if hits:
        fig.add_trace(
            go.Scatter(
                x=t["turn"], y=t["prefix_cache_hit_rate"] * 100, mode="lines+markers", name="prefix-cache hit rate (%)",
                error_y=_scaled_bars(t, "prefix_cache_hit_rate", 100),
            ),
            row=1, col=2,
        )  # fmt: skip
        fig.update_yaxes(title_text="% of prompt tokens", range=[0, 100], row=1, col=2)
    fig.update_xaxes(title_text="turn", dtick=1)
    fig.update_yaxes(title_text="TTFT (ms)", rangemode="tozero", row=1, col=1, secondary_y=False)
    fig.update_yaxes(title_text="prompt tokens", rangemode="tozero", row=1, col=1, secondary_y=True)
    fig.update_layout(title="Per turn", height=420)
    return fig


def _turns_html(turns: pd.DataFrame | None) -> str:
    """A conversation run's per-turn section: the chart and turns.csv under the glossary's titles; empty otherwise."""
    if turns is None or not len(turns):
        return ""
    shown = [c for c in columns(TURNS) if c.name in turns.columns]
    head = "".join(f"<th title='{html.escape(c.meaning)}'>{html.escape(c.title)}</th>" for c in shown)
    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c.show(r[c.name]))}</td>" for c in shown) + "</tr>"
        for r in turns.to_dict(orient="records")
    )
    note = ""
    if not turns["prefix_cache_hit_rate"].notna().any():
        note = (
            "<p>Prefix-cache hit rate: not available (the server sent no usage.prompt_tokens_details.cached_tokens; "
            "vLLM sends it when started with --enable-prompt-tokens-details).</p>"
        )
    return (
        "<h2>Per turn</h2><p>Each conversation's k-th request is turn k: its prompt resends the conversation so far. "
        "TTFT percentiles with their 95 % intervals; the prefix-cache hit rate is the server's own count per request "
        "(cached prompt tokens / prompt tokens).</p>"
        + note
        + _turns_figure(turns).to_html(full_html=False, include_plotlyjs=False)
        + f"<div class='scroll'><table class='turns'><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></div>"
    )


def _step_cell(column: Column | None, value: object) -> str:
    if column is not None:
        return column.show(value)
    return format_value(value, "g" if isinstance(value, float) else "text")


def _table_html(table: pd.DataFrame) -> str:
    """The per-step table under the glossary's titles and in its formats (latencies in ms, fractions in %); a step
    flagged generator-bound, behind schedule, outlier or unstable is highlighted. A column the glossary does not
    know keeps its name. An embeddings run leaves out the columns no step has a value of (TTFT, TPOT, ITL, tok/s:
    they do not apply), so its inputs/s, prompt tok/s and E2E columns are read, not hunted for."""
    names = list(table.columns)
    if embeddings_shown(table):
        names = [n for n in names if n in ("step", "users") or table[n].notna().any()]
    if not gpu_shown(table):  # no GPU seen: its empty columns left out (the window times stay: any run has them)
        hidden = {c.name for c in columns(GPU)} - {"window_start_time", "window_end_time"}
        names = [n for n in names if n not in hidden]
    shown = [(name, STEP_TABLE.get(name)) for name in names]
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
        labels = [label for _, label in c.metrics]
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
    embeddings = embeddings_shown(table)
    figures = [
        # An embeddings run: inputs/s and E2E take the tok/s curve's and the TTFT/TPOT/ITL charts' place (all empty).
        _embeddings_curve(tables) if embeddings else _batching_curve(tables),
        *([] if embeddings else [_latencies(tables)]),
        _timeline(records, metrics, run.get("timeline") or [], embeddings),
        _cdfs(records, embeddings),
    ]
    if len(generator):
        t0 = records["start_time"].min() if len(records) else generator["timestamp"].min()
        figures.insert(len(figures) - 1, _generator(generator, run.get("timeline") or [], t0))
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
        _turns_html(outcome.turns),
        _reasoning_html(table),
        _compare_html(outcome.comparisons),
    ]
    parts += [f.to_html(full_html=False, include_plotlyjs=False) for f in figures]
    gpu_t0 = records["start_time"].min() if len(records) else 0.0  # the Timeline's origin
    parts.append(_gpu_html(outcome, float(gpu_t0)))
    parts.append(_arrivals_html(outcome.arrivals))
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
