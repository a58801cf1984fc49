"""The end of a run, computed once: the step table and every verdict on it (diagnosis, integrity check, SLO gate,
efficiency ceiling, error limit), the files of the run directory, and the console text.

The live run (locustfiles/plugin.py), `python -m analysis report RUN_DIR` and the web UI's snapshot all come
here, so a run reads the same however it was finished. Pure: no Locust, no network.

    outcome = finish_run(run_dir)         # writes steps.csv, summary.json, summary.md, report.html
    outcome = compute_so_far(run_dir)     # the same numbers for a run in progress; writes nothing
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from . import __version__ as SUITE_VERSION
from . import capacity, energy, roofline, servers, spec_decode
from .adaptive import step_lengths_text
from .arrivals import Arrivals, arrivals_of_run
from .batch import run_kind
from .compare import Comparison, compare_runs
from .diagnosis import Diagnosis, diagnose, worker_lines
from .diskio import replace_file
from .integrity import integrity
from .kinds import RequestKind
from .live import close_open_steps
from .lora import MODELS_FILE, format_models, has_mix, model_table, run_models
from .outages import Outage, find_outages, outage_lines
from .prometheus_text import scrape_timeout_s
from .records import REQUEST_COLUMNS, REQUESTS_FILE, UNREADABLE_LINES, single_model
from .run import (
    REPORT_FILE,
    STEPS_FILE,
    SUMMARY_FILE,
    SUMMARY_MD_FILE,
    compute_tables,
    dataset_info,
    efficiency_ceiling,
    error_limit,
    images_info,
    merged,
    read_run,
    slo_gate,
    write_summary_md,
)
from .sse import CUT_OFF
from .steps import close_unfinished, format_table, timeline_from_records
from .trials import TRIALS_FILE, plan_verdicts, trials_summary
from .trials import console_lines as trial_lines
from .turns import TURNS_FILE, format_turns, has_turns, turn_table


@dataclass
class Outcome:
    """Everything the end of a run computed; the report, summary.json, summary.md and the console read it."""

    run_dir: Path
    run: dict  # run.json (its timeline's open steps closed, for a run in progress)
    table: pd.DataFrame  # steps.csv
    records: pd.DataFrame  # the records without their per-chunk lists (REQUEST_COLUMNS)
    metrics: pd.DataFrame | None
    generator: pd.DataFrame
    diagnosis: Diagnosis
    diagnosis_lines: list[str]  # the diagnosis, a line per outage, then a line per worker gone missing or unreported
    integrity: dict
    slo: dict | None  # None without --slo
    ceiling: dict | None  # None without a bandwidth and --model-bytes
    errors: dict  # the --max-error-rate verdict (analysis.run.error_limit)
    summary: dict = field(default_factory=dict)  # summary.json
    console: str = ""  # what the end of the run prints
    files: dict[str, Path] = field(default_factory=dict)  # the files written, by name
    outages: list[Outage] = field(default_factory=list)  # spans of refused connections (analysis.outages)
    comparisons: list[Comparison] = field(default_factory=list)  # --compare: this run against each other one
    capacity: dict | None = None  # --find-capacity: the search's result (analysis.capacity.result)
    arrivals: Arrivals | None = None  # an open loop's inter-arrival times (analysis.arrivals); None in a closed loop
    trials: pd.DataFrame | None = None  # trials.csv (analysis.trials): --repeat's per-trial rows, else None
    turns: pd.DataFrame | None = None  # turns.csv (analysis.turns): a conversation run's per-turn table, else None
    models: pd.DataFrame | None = None  # models.csv (analysis.lora): a model mix's per-model rows, else None
    # The GPUs' samples (analysis.gpu.gpu_series: empty without --gpu-metrics-url) and each step's roofline verdict
    # (analysis.roofline.step_verdicts, per GPU too): the report draws and tabulates them, the diagnosis quotes them.
    gpu_samples: pd.DataFrame | None = None
    gpu_verdicts: dict[int, roofline.StepVerdict] = field(default_factory=dict)
    # Speculative decoding's run totals and per-position rates (analysis.spec_decode; summary.json's `spec_decode`).
    spec_decode: dict | None = None

    @property
    def errors_over_limit(self) -> bool:
        return bool(self.errors["over_limit"])

    @property
    def nothing_completed(self) -> bool:
        """No request of the run completed: nothing was measured (errors.completed)."""
        return self.errors.get("completed") == 0

    @property
    def slo_failed(self) -> bool:
        return self.slo is not None and not self.slo["passed"]

    @property
    def capacity_found(self) -> bool:
        """A capacity search found a load meeting every objective (False: even the first probe broke one)."""
        return self.capacity is not None and self.capacity.get(_capacity_key(self.capacity)) is not None


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


def _section(title: str, lines: list[str]) -> str:
    return "\n".join(["", f"{title}:", *(f"- {line}" for line in lines)])


def _summary(outcome: Outcome) -> dict:
    """summary.json: the run's totals, its step table and its verdicts, machine-readable."""
    run, records = outcome.run, outcome.records
    cut = records["error_type"] == CUT_OFF
    errors = records[(records["status"] != "ok") & ~cut]["error_type"].value_counts().to_dict()
    ok = records[records["status"] == "ok"]
    batch = run_kind(records)
    return {
        "run_dir": str(outcome.run_dir),
        "started_at": run.get("started_at"),
        "finished_at": run.get("finished_at"),
        "options": run.get("options", {}),
        "dataset": dataset_info(run),
        "trace": _trace(run, records),
        "images": images_info(run),  # --images: count, width, height, format, reuse (None without)
        "models": sorted(records["model"].dropna().unique().tolist()),
        "requests": len(records),
        "ok": len(ok),
        "errors": {str(k): int(v) for k, v in errors.items()},
        "cut_off": int(cut.sum()),
        # A batch kind's run generates no tokens: its output_tokens is missing (null), not 0; its totals are these.
        "output_tokens": None if batch is not None else (int(ok["output_tokens"].sum()) if len(ok) else 0),
        **({} if batch is None else {batch.name: _batch_totals(batch, run, ok)}),
        "steps": json.loads(outcome.table.to_json(orient="records")),  # NaN -> null: missing stays missing
        **({} if outcome.turns is None else {"turns": json.loads(outcome.turns.to_json(orient="records"))}),
        # --lora-mix: the mix (run.json's) and each model over the whole measured run (analysis.lora); else null.
        "lora_mix": run.get("lora_mix"),
        "per_model": run_models(records, run.get("timeline") or [], run) if outcome.models is not None else None,
        **({} if outcome.trials is None else {"trials": trials_summary(outcome.table, outcome.trials)}),
        "diagnosis": outcome.diagnosis.to_dict(),
        "outages": [o.to_dict() for o in outcome.outages],
        "integrity": outcome.integrity,
        "server_profile": run.get("server_profile"),
        "slo": outcome.slo,
        "capacity": outcome.capacity,
        "arrivals": None if outcome.arrivals is None else outcome.arrivals.to_dict(),
        "spec_decode": outcome.spec_decode,
        "ceiling": outcome.ceiling,
        # The GPUs' energy (issue 35): the run's totals and each GPU's joules per step; null without the counter.
        "energy": energy.energy_summary(outcome.table, records, outcome.metrics, run.get("timeline") or []),
        "workers": run.get("workers") or [],
        "server_version": run.get("server_version"),
        "suite_version": run.get("suite_version") or SUITE_VERSION,
        "suite_revision": _git_revision(),
    }


def _batch_totals(kind: RequestKind, run: dict, ok: pd.DataFrame) -> dict:
    """summary.json's section of a batch kind, named after it (e.g. `embeddings`): its own options' values and the
    ok requests' items and prompt tokens (per step: `steps`)."""
    options = run.get("options") or {}
    prompt = pd.to_numeric(ok["prompt_tokens"], errors="coerce")
    return {
        **{name: options.get(name) for name, _flag, _default in kind.own_options},
        str(kind.items): int(pd.to_numeric(ok[kind.items], errors="coerce").fillna(0).sum()),
        "prompt_tokens": int(prompt.fillna(0).sum()) if prompt.notna().any() else None,
    }


def _trace(run: dict, records: pd.DataFrame) -> dict | None:
    """--trace: run.json's trace (file, format, slice, speed, rows in the slice) and the rows sent and answered."""
    trace = run.get("trace")
    if not trace:
        return None
    rows = records["trace_row"] if "trace_row" in records.columns else pd.Series(dtype="Int64")
    sent = records[rows.notna() & (records["error_type"] != CUT_OFF)]
    return {**trace, "rows_sent": int(rows.notna().sum()), "rows_ok": int((sent["status"] == "ok").sum())}


def _compute(run_dir: Path, write: bool, echo: Callable[[str], None], now: float | None = None) -> Outcome:
    """The table and the verdicts, each computed once; with write, the merged files and steps.csv are written."""
    run_dir = Path(run_dir)
    run = read_run(run_dir)
    full, metrics, generator = merged(run_dir, write=write)
    unreadable = int(full.attrs.get(UNREADABLE_LINES, 0))  # record lines skipped by the merge (said once there)
    timeline = run.get("timeline") or timeline_from_records(full)
    if now is not None:
        timeline = close_open_steps(timeline, now)
    else:
        timeline = close_unfinished(timeline, full)
    run = {**run, "timeline": timeline}
    table, per_trial = compute_tables(full, timeline, metrics, generator)
    if write:
        replace_file(run_dir / STEPS_FILE, table.to_csv(index=False))
        if per_trial is not None:
            replace_file(run_dir / TRIALS_FILE, per_trial.to_csv(index=False))
    echo("\n" + format_table(table) + "".join("\n" + line for line in trial_lines(table)))
    gpu_lines = roofline.console_lines(table)  # only when a step saw a GPU
    if gpu_lines:
        echo("\n".join(gpu_lines))
    energy_lines = energy.console_lines(table)  # only when a GPU exports its energy counter
    if energy_lines:
        echo("\n".join(energy_lines))
    spec = table.attrs.get(spec_decode.SPEC_SUMMARY)
    spec_lines = spec_decode.console_lines(table, spec)  # only when the server exports the counters
    if spec_lines:
        echo("\n".join(spec_lines))
    turns = None
    if has_turns(full):  # a conversation run (--turns): the per-turn table after the step table
        turns = turn_table(full, timeline, servers.of_run(run).cached_tokens_zero_omitted)
        if write:
            replace_file(run_dir / TURNS_FILE, turns.to_csv(index=False))
        echo("\n" + format_turns(turns))
    models = None
    if has_mix(full, run):  # a model mix (--lora-mix): the per-model rows after the step table
        models = model_table(full[REQUEST_COLUMNS], timeline, run, metrics)
        if write:
            replace_file(run_dir / MODELS_FILE, models.to_csv(index=False))
        text = format_models(models)
        if text:
            echo("\n" + text)
    gpu_samples = roofline.samples(metrics)
    gpu_verdicts = plan_verdicts(roofline.step_verdicts(gpu_samples, timeline), timeline)  # --repeat: per plan step
    diagnosis = diagnose(table, curve=not run.get("trace"), gpu=gpu_verdicts)  # a trace's windows: its load
    outages = find_outages(full, run.get("started_at"))
    ended = now is None  # a run in progress has no end yet
    lines = [
        *diagnosis.text,
        *outage_lines(outages, ended),
        *worker_lines(run.get("workers") or [], run.get("started_at")),
    ]
    echo(_section("Diagnosis", lines))
    gate = slo_gate(run_dir, full, run)  # the per-chunk lists are still here, for ITL objectives
    found = _capacity(run, full, timeline, table, diagnosis)
    records = full[REQUEST_COLUMNS]  # the rest needs no per-chunk lists: most of a long run's data
    del full
    interval = (run.get("options") or {}).get("scrape_interval") or 1.0
    settle = scrape_timeout_s(interval)  # a scrape's counters may miss what finished this long before its stamp
    check = integrity(records, metrics, single_model(records), servers.of_run(run), unreadable, settle)
    echo(_section("Integrity check", check["text"]))
    if found is not None:
        # The search's probes beyond the capacity broke objectives on purpose: its result replaces the gate.
        echo(_section("Capacity", capacity_lines(found)))
    elif gate is not None:
        echo(_section("SLO gate", gate["text"]))
    ceiling = efficiency_ceiling(run_dir, table, run)
    if ceiling is not None:
        ceiling["text"] += roofline.ceiling_lines(table, ceiling)  # its bandwidth against the DRAM activity measured
        echo(_section("Efficiency ceiling", ceiling["text"]))
    errors = error_limit(records, (run.get("options") or {}).get("max_error_rate"))
    echo(errors["text"])
    # Each timeline entry's own row (a repeated run's trials.csv: the pooled rows span several entries).
    echo(_section("Step lengths", step_lengths_text(run, table if per_trial is None else per_trial, records)))
    outcome = Outcome(
        run_dir=run_dir,
        run=run,
        table=table,
        records=records,
        metrics=metrics,
        generator=generator,
        diagnosis=diagnosis,
        diagnosis_lines=lines,
        integrity=check,
        slo=gate,
        ceiling=ceiling,
        errors=errors,
        outages=outages,
        capacity=found,
        arrivals=arrivals_of_run(records, run, table),
        turns=turns,
        models=models,
        trials=per_trial,
        gpu_samples=gpu_samples,
        gpu_verdicts=gpu_verdicts,
        spec_decode=spec,
    )
    outcome.summary = _summary(outcome)
    return outcome


def _capacity_key(result: dict) -> str:
    return "max_users" if result.get("mode") == capacity.USERS else "max_rate_rps"


def _capacity(run: dict, records: pd.DataFrame, timeline: list[dict], table: pd.DataFrame, diagnosis) -> dict | None:
    """--find-capacity: every probe judged again on the complete records, and the search's result; None otherwise."""
    options = run.get("options") or {}
    mode = str(options.get("find_capacity") or "").strip()
    if mode not in capacity.MODES or not options.get("slo") or not len(table):
        return None
    probes = capacity.probes_of_run(records, timeline, table, mode, options["slo"])
    limit = next((t["capacity_limit"] for t in timeline if t.get("capacity_limit")), None)
    try:
        resolution = capacity.parse_resolution(options.get("capacity_resolution") or capacity.DEFAULT_RESOLUTION)
    except ValueError:
        resolution = None  # a run.json edited by hand: the bracket is not judged
    return capacity.result(mode, probes, options["slo"], table, diagnosis.binding, limit, resolution)


def capacity_lines(result: dict) -> list[str]:
    """The console's Capacity section: the result's sentence, then each probe in the order it ran."""
    mode = result["mode"]
    key = "users" if mode == capacity.USERS else "rate_rps"
    lines = [result["line"]]
    if result.get("limit") is None:
        lines.append("The search did not finish (the run was stopped first): this is the best found so far.")
    for p in result["probes"]:
        checks = ", ".join(
            f"{name} {c['verdict']}" + ("" if c.get("note") != capacity.FEW else " (few samples)")
            for name, c in p["objectives"].items()
        )
        stopped = ""
        if p.get("interrupted"):
            stopped = " (stopped before it was judged" + ("" if p.get("counted") else ": not counted") + ")"
        lines.append(f"Probe {p['probe']}: {capacity.load_text(p[key], mode)}: {p['verdict']} ({checks}){stopped}")
    return lines


def finish_run(
    run_dir: Path,
    *,
    compare: list[Path] | None = None,
    report: bool = True,
    echo: Callable[[str], None] | None = None,
) -> Outcome:
    """Merge the run directory's raw files and write steps.csv, summary.json, summary.md and (with report)
    report.html; `echo` gets each part of the console text as soon as it is known (the report takes a while)."""
    run_dir = Path(run_dir)
    console: list[str] = []

    def say(text: str) -> None:
        console.append(text)
        if echo is not None:
            echo(text)

    outcome = _compute(run_dir, write=True, echo=say)
    outcome.comparisons = _comparisons(outcome, compare or [])
    for comparison in outcome.comparisons:
        say(_section("Comparison", comparison.lines()))
    files = {STEPS_FILE: run_dir / STEPS_FILE}
    if outcome.turns is not None:
        files[TURNS_FILE] = run_dir / TURNS_FILE
    if outcome.models is not None:
        files[MODELS_FILE] = run_dir / MODELS_FILE
    if outcome.trials is not None:
        files[TRIALS_FILE] = run_dir / TRIALS_FILE
    files[SUMMARY_MD_FILE] = write_summary_md(
        run_dir, outcome.table, outcome.slo, outcome.diagnosis_lines, outcome.run, outcome.capacity
    )
    files[SUMMARY_FILE] = run_dir / SUMMARY_FILE
    replace_file(files[SUMMARY_FILE], json.dumps(outcome.summary, indent=2, default=str))
    say(
        f"\nResults: {run_dir / REQUESTS_FILE}, {run_dir / STEPS_FILE}"
        + ("" if outcome.turns is None else f", {run_dir / TURNS_FILE}")
        + ("" if outcome.models is None else f", {run_dir / MODELS_FILE}")
        + ("" if outcome.trials is None else f", {run_dir / TRIALS_FILE}")
    )
    if report:
        from .report import build_report  # plotly is only imported when a report is written

        files[REPORT_FILE] = run_dir / REPORT_FILE
        replace_file(files[REPORT_FILE], build_report(outcome, compare))
        say(f"Report: {files[REPORT_FILE]}")
    outcome.files = files
    outcome.console = "\n".join(console)
    return outcome


def _comparisons(outcome: Outcome, others: list[Path]) -> list[Comparison]:
    """This run's steps against each other run's steps.csv (analysis.compare)."""
    out = []
    for other in map(Path, others):
        # Two runs of the same name (reports/a/run, reports/b/run) are told apart by their paths.
        this_name, other_name = outcome.run_dir.name, other.name
        if this_name == other_name:
            this_name, other_name = str(outcome.run_dir), str(other)
        out.append(compare_runs(outcome.table, pd.read_csv(other / STEPS_FILE), this_name, other_name))
    return out


def compute_run(run_dir: Path, echo: Callable[[str], None] | None = None) -> Outcome:
    """The outcome of a finished run, computed without writing anything: what the end of a run prints when its
    files cannot be written (a full disk); `echo` gets the console text as finish_run's."""
    console: list[str] = []

    def say(text: str) -> None:
        console.append(text)
        if echo is not None:
            echo(text)

    outcome = _compute(Path(run_dir), write=False, echo=say)
    outcome.console = "\n".join(console)
    return outcome


def compute_so_far(run_dir: Path, now: float | None = None) -> Outcome:
    """The outcome of a run still in progress, its running step measured up to `now`; nothing is written into its
    directory (the run is still writing there)."""
    console: list[str] = []
    outcome = _compute(Path(run_dir), write=False, echo=console.append, now=time.time() if now is None else now)
    outcome.console = "\n".join(console)
    return outcome


def report_so_far(run_dir: Path) -> str:
    """report.html of a run in progress (the web UI's download), through the same pipeline as the end of a run."""
    from .report import build_report

    return build_report(compute_so_far(run_dir))
