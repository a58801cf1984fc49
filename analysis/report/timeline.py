"""The report's timelines: TTFT and vLLM's gauges over the run, the load generator's and the GPUs'."""

from __future__ import annotations

import html
import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .. import glossary
from ..generator import CPU_BOUND, LAG_BOUND_S
from ..glossary import format_value
from ..kinds import RequestKind
from ..records import single_model
from ..roofline import ratio_text
from ..server_metrics import KV_CACHE, RUNNING, WAITING, ServerSeries
from ..thresholds import DRAM_ACTIVE_HIGH, GPU_ACTIVE_LOW, SM_ACTIVE_SATURATED

if TYPE_CHECKING:
    from ..finish import Outcome
from .charts import GPU_POINTS, ttft_points


def timeline_figure(
    records: pd.DataFrame, metrics: pd.DataFrame | None, timeline: list[dict], batch: RequestKind | None = None
) -> go.Figure:
    """Load and throughput, each request's latency, the server's gauges over the run; a batch kind's run's are its
    items/s and E2E (it has no output tokens and no TTFT)."""
    ok = records[records["status"] == "ok"]
    batched = batch is not None
    if batch is not None:
        ok = ok.assign(ttft_s=ok["e2e_s"], output_tokens=pd.to_numeric(ok[batch.items], errors="coerce"))
    ttft_shown, ttft_title = ttft_points(ok)
    if batched:
        ttft_title = ttft_title.replace("TTFT", "E2E")
    rate_name = "tok/s" if batch is None else glossary.STEP_TABLE[str(batch.item_rate)].unit
    # A trace replay (--trace) holds one pool of users throughout: its load over time is the trace's rows.
    trace = bool(timeline) and all("trace_window" in step for step in timeline)
    fig = make_subplots(
        rows=3,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.05,
        subplot_titles=(
            ("the trace's requests/s (1 s bins, by intended send time)" if trace else "users")
            + f" and {'' if batched else 'aggregate '}{rate_name} (1 s bins, by completion)",
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
                name="E2E (ms)" if batched else "TTFT (ms)",
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
    fig.update_yaxes(title_text="E2E (ms)" if batched else "TTFT (ms)", row=2, col=1)
    fig.update_yaxes(rangemode="tozero")
    fig.update_yaxes(title_text="KV-cache usage", range=[0, 1.05], row=3, col=1, secondary_y=False)
    fig.update_layout(title="Timeline", height=800)
    return fig


def generator_figure(samples: pd.DataFrame, timeline: list[dict], t0: float) -> go.Figure:
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


def gpu_html(outcome: Outcome) -> str:
    """The GPU section, only when a step saw a GPU: each GPU's series on the run's time axis and its verdict per step
    (as analysis.roofline computed it in finish)."""
    records = outcome.records
    t0 = float(records["start_time"].min()) if len(records) else 0.0  # the Timeline's origin
    samples = outcome.gpu_samples
    if samples is None or not len(samples) or not glossary.applies(outcome.table, glossary.GPU):
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
