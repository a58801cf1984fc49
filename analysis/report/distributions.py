"""The report's distributions: latency CDFs, inter-arrival times, the workload and the turns."""

from __future__ import annotations

import html
import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .. import kinds
from ..glossary import TURNS, columns
from ..run import dataset_info, images_info, images_text

if TYPE_CHECKING:
    from ..arrivals import Arrivals
from .charts import CDF_RANKS, CDF_TAIL_RANKS, scaled_bars


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


def cdf_figure(records: pd.DataFrame, batch: bool = False) -> go.Figure:
    """Per step, the CDFs of TTFT and TPOT (a batch kind's run: of E2E, its only latency)."""
    metrics = ((1, "e2e_s"),) if batch else ((1, "ttft_s"), (2, "tpot_s"))
    titles = ("E2E CDF (ms)",) if batch else ("TTFT CDF (ms)", "TPOT CDF (ms)")
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


def arrivals_figure(arrivals: Arrivals) -> go.Figure:
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


def arrivals_html(arrivals: Arrivals | None) -> str:
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
        + arrivals_figure(arrivals).to_html(full_html=False, include_plotlyjs=False)
    )


def workload_html(run: dict, table: pd.DataFrame) -> str:
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
        kind = kinds.of(options.get("endpoint"))
        if not kind.streams:  # no max_tokens: the kind's own options instead (the batch, the vectors' encoding ...)
            what = {name: counted for name, _flag, _minimum, counted in kind.minimums}
            own = ", ".join(
                f"{flag} {default if options.get(name) in (None, '') else options.get(name)}"
                + (f" {what[name]}" if name in what else "")
                for name, flag, default in kind.own_options
                if options.get(name) not in (None, "") or default != ""
            )
            items.append(f"{kind.title}: {own}{seed}")
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


def _turns_figure(turns: pd.DataFrame) -> go.Figure:
    """TTFT p50 and p95 (with their 95 % intervals) and the mean prompt length against the turn; beside it the
    server's prefix-cache hit rate per turn (with its interval) when the server sent cached tokens."""
    hits = "prefix_cache_hit_rate" in turns.columns and turns["prefix_cache_hit_rate"].notna().any()
    specs = [[{"secondary_y": True}, {}]] if hits else [[{"secondary_y": True}]]
    titles = ("TTFT and prompt length per turn", "Prefix-cache hit rate per turn") if hits else None
    fig = make_subplots(rows=1, cols=2 if hits else 1, specs=specs, subplot_titles=titles)
    t = turns.sort_values("turn")
    for name, label in (("ttft_p50_s", "TTFT p50"), ("ttft_p95_s", "TTFT p95")):
        bars = scaled_bars(t, name, 1000)
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
                error_y=scaled_bars(t, "prefix_cache_hit_rate", 100),
            ),
            row=1, col=2,
        )  # fmt: skip
        fig.update_yaxes(title_text="% of prompt tokens", range=[0, 100], row=1, col=2)
    fig.update_xaxes(title_text="turn", dtick=1)
    fig.update_yaxes(title_text="TTFT (ms)", rangemode="tozero", row=1, col=1, secondary_y=False)
    fig.update_yaxes(title_text="prompt tokens", rangemode="tozero", row=1, col=1, secondary_y=True)
    fig.update_layout(title="Per turn", height=420)
    return fig


def turns_html(turns: pd.DataFrame | None) -> str:
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
