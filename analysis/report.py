"""report.html: one self-contained file (plotly's JavaScript inlined) rebuilt from a run directory's files.

Every piece of text that comes from the server or the run (model names, error messages, options) is escaped.
"""

from __future__ import annotations

import html
import json
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from analysis import __version__ as SUITE_VERSION
from analysis.diagnosis import diagnose, utc, worker_lines
from analysis.glossary import GLOSSARY
from analysis.integrity import integrity
from analysis.records import load_records
from analysis.run import STEPS_FILE, read_run
from analysis.server_metrics import KV_CACHE, RUNNING, WAITING, ServerSeries, load_metrics, server_info
from analysis.sse import CUT_OFF

REPORT_FILE = "report.html"
MISMATCH_LI = "<li style='color:#b00;font-weight:bold'>"
SUMMARY_FILE = "summary.json"


def _git_revision() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def summary(run_dir: Path, table: pd.DataFrame, records: pd.DataFrame) -> dict:
    """summary.json: the run's totals, its step table and its diagnosis, machine-readable."""
    run = read_run(run_dir)
    cut = records["error_type"] == CUT_OFF
    errors = records[(records["status"] != "ok") & ~cut]["error_type"].value_counts().to_dict()
    ok = records[records["status"] == "ok"]
    steps = json.loads(table.to_json(orient="records"))  # NaN -> null: missing stays missing
    return {
        "run_dir": str(run_dir),
        "started_at": run.get("started_at"),
        "finished_at": run.get("finished_at"),
        "options": run.get("options", {}),
        "models": sorted(records["model"].dropna().unique().tolist()),
        "requests": len(records),
        "ok": len(ok),
        "errors": {str(k): int(v) for k, v in errors.items()},
        "cut_off": int(cut.sum()),
        "output_tokens": int(ok["output_tokens"].sum()) if len(ok) else 0,
        "steps": steps,
        "diagnosis": diagnose(table).to_dict(),
        "integrity": integrity(records, load_metrics(run_dir), _single_model(records)),
        "workers": run.get("workers") or [],
        "server_version": run.get("server_version"),
        "suite_version": run.get("suite_version") or SUITE_VERSION,
        "suite_revision": _git_revision(),
    }


def _batching_curve(tables: dict[str, pd.DataFrame]) -> go.Figure:
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    for name, t in tables.items():
        fig.add_trace(
            go.Scatter(x=t["users"], y=t["aggregate_tok_s"], name=f"{name} aggregate tok/s", mode="lines+markers"),
            secondary_y=False,
        )
        fig.add_trace(
            go.Scatter(
                x=t["users"],
                y=t["per_request_tok_s_mean"],
                name=f"{name} per-request tok/s",
                mode="lines+markers",
                line={"dash": "dot"},
            ),
            secondary_y=True,
        )
    fig.update_xaxes(type="log", title="users", dtick=np.log10(2))
    fig.update_yaxes(title_text="aggregate tok/s", secondary_y=False, rangemode="tozero")
    fig.update_yaxes(title_text="per-request tok/s", secondary_y=True, rangemode="tozero")
    fig.update_layout(title="Batching curve", height=420)
    return fig


def _latencies(tables: dict[str, pd.DataFrame]) -> go.Figure:
    fig = make_subplots(rows=1, cols=3, subplot_titles=("TTFT (ms)", "TPOT (ms)", "ITL (ms)"))
    for name, t in tables.items():
        for col, metric, qs in ((1, "ttft", (50, 95, 99)), (2, "tpot", (50, 95, 99)), (3, "itl", (50, 99))):
            for q in qs:
                fig.add_trace(
                    go.Scatter(
                        x=t["users"],
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
                    x=t["users"],
                    y=t["server_ttft_mean_s"] * 1000,
                    mode="lines+markers",
                    line={"dash": "dash"},
                    name=f"{name} vLLM's own TTFT mean",
                ),
                row=1,
                col=1,
            )
    fig.update_xaxes(type="log", title="users", dtick=np.log10(2))
    fig.update_yaxes(rangemode="tozero")
    fig.update_layout(title="Latency percentiles against users", height=420)
    return fig


def _single_model(records: pd.DataFrame) -> str | None:
    models = records["model"].dropna().unique()
    return str(models[0]) if len(models) == 1 else None


def _timeline(records: pd.DataFrame, metrics: pd.DataFrame | None, timeline: list[dict]) -> go.Figure:
    fig = make_subplots(
        rows=3,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.05,
        subplot_titles=(
            "users and aggregate tok/s (1 s bins, by completion)",
            "TTFT of each request",
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
    ok = records[records["status"] == "ok"]
    if len(ok):
        end = (ok["start_time"] + ok["e2e_s"] - t0).astype(float)
        bins = np.floor(end).astype(int)
        per_s = ok.groupby(bins)["output_tokens"].sum()
        fig.add_trace(
            go.Bar(x=per_s.index + 0.5, y=per_s.values, name="tok/s", opacity=0.5), row=1, col=1, secondary_y=True
        )
        fig.add_trace(
            go.Scattergl(
                x=ok["start_time"] - t0, y=ok["ttft_s"] * 1000, mode="markers", marker={"size": 3}, name="TTFT (ms)"
            ),
            row=2,
            col=1,
        )
    if metrics is not None and len(metrics):
        server = ServerSeries(metrics, _single_model(records))
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


def _cdfs(records: pd.DataFrame) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=("TTFT CDF (ms)", "TPOT CDF (ms)"))
    ok = records[(records["status"] == "ok") & ~records["warmup"].astype(bool)]
    for (_step, users), group in ok.groupby(["step", "users"]):
        for col, metric in ((1, "ttft_s"), (2, "tpot_s")):
            v = np.sort(group[metric].dropna().to_numpy(dtype=float)) * 1000
            if len(v):
                fig.add_trace(
                    go.Scatter(
                        x=v,
                        y=np.arange(1, len(v) + 1) / len(v),
                        mode="lines",
                        name=f"{users} users ({metric[:4].upper()})",
                    ),
                    row=1,
                    col=col,
                )
    fig.update_layout(title="Distributions per step", height=420)
    return fig


def _table_html(table: pd.DataFrame) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in table.columns)
    rows = []
    for r in table.itertuples(index=False):
        cells = "".join(
            f"<td>{'' if pd.isna(v) else html.escape(f'{v:.4g}' if isinstance(v, float) else str(v))}</td>" for v in r
        )
        rows.append(f"<tr>{cells}</tr>")
    # ~40 columns: the table scrolls inside its own box instead of widening the page past the charts.
    return (
        f"<div style='overflow-x:auto'><table><thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def _workers_html(workers: list[dict], started_at: float | None) -> str:
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
    notes = "".join(f"<li>{html.escape(line)}</li>" for line in worker_lines(workers, started_at))
    return f"<h2>Workers</h2><ul>{notes}</ul><table>{head}{rows}</table>"


def build_report_so_far(run_dir: Path, timeline: list[dict] | None = None) -> str:
    """report.html of a run still in progress, from its raw files, without writing anything into its directory."""
    import time

    from analysis.records import merge_records
    from analysis.run import compute_table
    from analysis.server_metrics import SCRAPES_FILE, merge_scrapes
    from analysis.steps import timeline_from_records

    run_dir = Path(run_dir)
    records = merge_records(run_dir, write=False)
    run = read_run(run_dir)
    now = time.time()
    timeline = [dict(t) for t in (timeline or run.get("timeline") or timeline_from_records(records))]
    for step in timeline:
        if step.get("end_time") is None:
            step["end_time"] = now
    run["timeline"] = timeline
    metrics = merge_scrapes(run_dir, write=False) if (run_dir / SCRAPES_FILE).exists() else load_metrics(run_dir)
    table = compute_table(records, timeline, metrics)
    return build_report(run_dir, records=records, table=table, metrics=metrics, run=run)


def build_report(
    run_dir: Path,
    compare: list[Path] | None = None,
    *,
    records: pd.DataFrame | None = None,
    table: pd.DataFrame | None = None,
    metrics: pd.DataFrame | None = None,
    run: dict | None = None,
) -> str:
    """report.html from the run directory's files (or from data already in memory)."""
    run_dir = Path(run_dir)
    records = load_records(run_dir) if records is None else records
    table = pd.read_csv(run_dir / STEPS_FILE) if table is None else table
    run = read_run(run_dir) if run is None else run
    metrics = load_metrics(run_dir) if metrics is None else metrics
    diag = diagnose(table)
    tables = {run_dir.name: table}
    for other in compare or []:
        tables[Path(other).name] = pd.read_csv(Path(other) / STEPS_FILE)
    figures = [
        _batching_curve(tables),
        _latencies(tables),
        _timeline(records, metrics, run.get("timeline") or []),
        _cdfs(records),
    ]
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
        "suite revision": _git_revision(),
    }
    cut_off = int((records["error_type"] == CUT_OFF).sum())
    failed = records[(records["status"] != "ok") & (records["error_type"] != CUT_OFF)]
    errors = failed.groupby(["error_type", "error"], dropna=False).size()
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>vllm-loadtest report</title>",
        f"<script type='text/javascript'>{get_plotlyjs()}</script>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:12px}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}</style></head><body>",
        f"<h1>vllm-loadtest report: {html.escape(run_dir.name)}</h1>",
        "<h2>Diagnosis</h2><ul>"
        + "".join(
            f"<li>{html.escape(t)}</li>"
            for t in [*diag.text, *worker_lines(run.get("workers") or [], run.get("started_at"))]
        )
        + "</ul>",
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
    check = integrity(records, metrics, _single_model(records))
    parts.append(
        "<h2>Integrity check</h2><p>The client's records against the server's own counters over the run.</p><ul>"
        + "".join(
            (MISMATCH_LI if t.startswith("MISMATCH") else "<li>") + f"{html.escape(t)}</li>" for t in check["text"]
        )
        + "</ul>"
    )
    workers = run.get("workers") or []
    if workers:
        parts.append(_workers_html(workers, run.get("started_at")))
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


def write_report(run_dir: Path, compare: list[Path] | None = None) -> Path:
    """Write summary.json and report.html into the run directory from its files."""
    run_dir = Path(run_dir)
    records = load_records(run_dir)
    table = pd.read_csv(run_dir / STEPS_FILE)
    (run_dir / SUMMARY_FILE).write_text(json.dumps(summary(run_dir, table, records), indent=2, default=str))
    path = run_dir / REPORT_FILE
    path.write_text(build_report(run_dir, compare), encoding="utf-8")
    return path
