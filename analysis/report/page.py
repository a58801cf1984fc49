"""The report's page: the step table, comparisons, workers, and build_report putting it together."""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
from plotly.offline import get_plotlyjs

from .. import __version__ as SUITE_VERSION
from ..batch import table_kind
from ..diagnosis import utc
from ..generator import flagged
from ..glossary import (
    ENERGY,
    GLOSSARY,
    GPU,
    LORA,
    REASONING,
    SPEC,
    STEP_TABLE,
    TRIALS,
    Column,
    applies,
    columns,
    format_value,
)
from ..run import STEPS_FILE
from ..schedule import flagged as schedule_flagged
from ..server_metrics import server_info
from ..sse import CUT_OFF
from ..steps import unstable

if TYPE_CHECKING:
    from ..compare import Comparison
    from ..finish import Outcome
from .adapters import adapters_html
from .charts import MISMATCH_LI, batch_curve, batching_curve, latency_figure, reasoning_html
from .distributions import arrivals_html, cdf_figure, turns_html, workload_html
from .energy import energy_html
from .spec_decode import spec_html
from .timeline import generator_figure, gpu_html, timeline_figure
from .trials import trials_html
from .verdicts import capacity_html, ceiling_html, generator_html, slo_html

# The report's parts of the sections only some runs have, after the charts in this order: each shown when its section
# applies to the run (glossary.applies, from the columns declared to show it).
OPTIONAL_PARTS: tuple[tuple[str, Callable[[Outcome], str]], ...] = (
    (REASONING, lambda outcome: reasoning_html(outcome.table)),
    (GPU, gpu_html),
    (ENERGY, energy_html),
    (LORA, adapters_html),  # a model mix's (--lora-mix): "" for a run of one model
    (TRIALS, trials_html),
    (SPEC, spec_html),
)


def _step_cell(column: Column | None, value: object) -> str:
    if column is not None:
        return column.show(value)
    return format_value(value, "g" if isinstance(value, float) else "text")


def table_html(table: pd.DataFrame) -> str:
    """The per-step table under the glossary's titles and in its formats (latencies in ms, fractions in %); a step
    flagged generator-bound, behind schedule, outlier or unstable is highlighted. A column the glossary does not
    know keeps its name. A batch kind's run leaves out the columns no step has a value of (TTFT,
    TPOT, ITL, tok/s: they do not apply), so its items/s, prompt tok/s and E2E columns are read, not hunted for."""
    names = list(table.columns)
    if table_kind(table) is not None:
        names = [n for n in names if n in ("step", "users") or table[n].notna().any()]
    # A section that does not apply to this run (glossary.applies: no GPU seen, ...): its columns without a value left
    # out (the GPU section's window times stay: any run has them).
    absent = {c.section for c in STEP_TABLE.values() if c.shows is not None and not applies(table, c.section)}
    hidden = {c.name for s in absent for c in columns(s) if c.name in table.columns and table[c.name].isna().all()}
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
    batch = table_kind(table)
    figures = [
        # A batch kind's run: its items/s and E2E take the tok/s curve's and the TTFT/TPOT/ITL charts' place (empty).
        batching_curve(tables) if batch is None else batch_curve(tables, batch),
        *([latency_figure(tables)] if batch is None else []),
        timeline_figure(records, metrics, run.get("timeline") or [], batch),
        cdf_figure(records, batch is not None),
    ]
    if len(generator):
        t0 = records["start_time"].min() if len(records) else generator["timestamp"].min()
        figures.insert(len(figures) - 1, generator_figure(generator, run.get("timeline") or [], t0))
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
        capacity_html(outcome.capacity),
        "<h2>Diagnosis</h2><ul>" + "".join(f"<li>{html.escape(t)}</li>" for t in outcome.diagnosis_lines) + "</ul>",
        generator_html(table),
        slo_html(outcome.slo, searched=outcome.capacity is not None),
        ceiling_html(outcome.ceiling),
        workload_html(run, table),
        turns_html(outcome.turns),
        _compare_html(outcome.comparisons),
    ]
    parts += [f.to_html(full_html=False, include_plotlyjs=False) for f in figures]
    parts += [part(outcome) for section, part in OPTIONAL_PARTS if applies(table, section)]
    parts.append(arrivals_html(outcome.arrivals))
    parts += ["<h2>Per-step table</h2>", table_html(table)]
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
