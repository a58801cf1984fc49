"""A run directory: its metadata (`run.json`) and the end-of-run outputs rebuilt from the raw records."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd

from . import trials
from .adaptive import end_reasons
from .batch import BATCH_COLUMNS
from .diskio import replace_file
from .energy import step_energy_table
from .generator import merge_generator, step_generator_table
from .gpu import GPU_COLUMNS, step_gpu_table
from .lora import LORA_COLUMNS, lora_step_table
from .reasoning import REASONING_COLUMNS
from .records import merge_records, single_model
from .roofline import roofline_table, samples
from .schedule import OPEN_LOOP_COLUMNS
from .server_metrics import SCRAPES_FILE, SERVER_BOUND_COLUMNS, load_metrics, merge_scrapes, step_server_table
from .spec_decode import SPEC_COLUMNS, SPEC_SUMMARY, spec_table
from .sse import CUT_OFF
from .steps import UNCERTAINTY_COLUMNS, measured_column, step_table, timeline_from_records

RUN_FILE = "run.json"
STEPS_FILE = "steps.csv"
SUMMARY_MD_FILE = "summary.md"
SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.html"


def read_run(run_dir: Path) -> dict:
    path = Path(run_dir) / RUN_FILE
    if not path.exists():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))


def write_run(run_dir: Path, data: dict) -> None:
    """Replace run.json atomically, so a crash or a full disk leaves the previous version rather than half a file;
    raises WriteFailure (analysis/diskio.py)."""
    replace_file(Path(run_dir) / RUN_FILE, json.dumps(data, indent=2, sort_keys=True, default=str))


def compute_table(
    records: pd.DataFrame,
    timeline: list[dict],
    metrics: pd.DataFrame | None,
    generator: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """steps.csv: one row per step (per plan step with --repeat, its trials pooled: compute_tables)."""
    return compute_tables(records, timeline, metrics, generator)[0]


def compute_tables(
    records: pd.DataFrame,
    timeline: list[dict],
    metrics: pd.DataFrame | None,
    generator: pd.DataFrame | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """(steps.csv, trials.csv or None). With --repeat (the timeline's entries carry their trial), steps.csv has one
    row per plan step over its trials pooled and the across-trial section (analysis/trials.py), trials.csv each
    trial's own rows: the same table over each timeline entry alone; without, the table as always and None."""
    if not trials.has_trials(timeline):
        # No across-trial section: a run without --repeat writes steps.csv byte for byte as before.
        return _table(records, timeline, metrics, generator), None
    per_entry = _table(records, trials.separate(timeline), metrics, generator)
    table = trials.pooled_table(step_table(records, timeline), per_entry, timeline)
    table.attrs.update(per_entry.attrs)  # the run's totals riding along (speculative decoding's), over every entry
    return table, trials.trials_table(per_entry, timeline)


def _table(
    records: pd.DataFrame,
    timeline: list[dict],
    metrics: pd.DataFrame | None,
    generator: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The step table joined with the server's series and the load generator's self-checks in each step's window
    (the self-check columns are always there: empty for a step without samples), then the open-loop columns."""
    table = step_table(records, timeline)
    if metrics is not None:
        server = step_server_table(metrics, timeline, model=single_model(records), records=records)
        table = table.merge(server, on="step", how="left")
    if not timeline:
        timeline = timeline_from_records(records)
    table = table.merge(step_generator_table(generator, timeline), on="step", how="left")
    # The open-loop columns come after every column of earlier versions, then the intervals and suspect-step checks,
    # the server quantiles' bounds and why each step ended: steps.csv only gains columns at its end.
    tail = OPEN_LOOP_COLUMNS + UNCERTAINTY_COLUMNS + [c for c in SERVER_BOUND_COLUMNS if c in table.columns]
    table = table[[c for c in table.columns if c not in tail] + tail]
    steps = table["step"].tolist()
    probes = {int(t["step"]): t.get("probe") for t in timeline if "step" in t}
    table = table.assign(
        end_reason=end_reasons(steps, timeline),
        probe=pd.array([probes.get(int(s)) if str(s).lstrip("-").isdigit() else None for s in steps], dtype="Int64"),
    )
    # The step's window in Unix time and the GPU exporters' telemetry (issue 20), for every run, then the GPUs'
    # roofline verdict on the same samples.
    table = table.merge(step_gpu_table(metrics, timeline), on="step", how="left")
    table = table.merge(roofline_table(samples(metrics), timeline), on="step", how="left")
    # vLLM's LoRA adapters running and waiting (issue 35), empty without vllm:lora_requests_info.
    table = table.merge(lora_step_table(metrics, timeline, records), on="step", how="left")
    # Reasoning and tool calls (issue 18) after why each step ended, then the batch kinds (issues 19, 33), then GPU
    # (issue 20; its columns in the glossary's order, whichever module fills them).
    tail = REASONING_COLUMNS + BATCH_COLUMNS + [c for c in GPU_COLUMNS if c in table.columns]
    table = table[[c for c in table.columns if c not in tail] + tail]
    # The GPUs' energy per step, per output token and per request (issue 35), after the GPU section, then LoRA, then
    # speculative decoding. Its run totals ride along for summary.json (analysis/finish.py) rather than flattening
    # every chunk list twice.
    table = table.merge(step_energy_table(metrics, timeline, table, records), on="step", how="left")
    spec, totals = spec_table(metrics, timeline, records, single_model(records))
    table = table.merge(spec, on="step", how="left")
    late = LORA_COLUMNS + SPEC_COLUMNS
    table = table[[c for c in table.columns if c not in late] + late]
    table.attrs[SPEC_SUMMARY] = totals
    return table


def merged(run_dir: Path, write: bool = True) -> tuple[pd.DataFrame, pd.DataFrame | None, pd.DataFrame]:
    """(records, server metrics, self-check samples) of a run, merged from its raw files; with write, also into
    requests.parquet, metrics.parquet and generator.parquet."""
    run_dir = Path(run_dir)
    timeline = read_run(run_dir).get("timeline")
    records = merge_records(run_dir, write=write, measured=lambda df: measured_column(df, timeline))
    metrics = merge_scrapes(run_dir, write=write) if (run_dir / SCRAPES_FILE).exists() else load_metrics(run_dir)
    return records, metrics, merge_generator(run_dir, write=write)


def finalize(run_dir: Path) -> pd.DataFrame:
    """Merge records, scrapes and self-check samples into requests.parquet, metrics.parquet and generator.parquet,
    write steps.csv; return the table."""
    run_dir = Path(run_dir)
    records, metrics, generator = merged(run_dir)
    timeline = read_run(run_dir).get("timeline") or timeline_from_records(records)
    table, per_trial = compute_tables(records, timeline, metrics, generator)
    replace_file(run_dir / STEPS_FILE, table.to_csv(index=False))
    if per_trial is not None:
        replace_file(run_dir / trials.TRIALS_FILE, per_trial.to_csv(index=False))
    return table


def parse_rate(text: str, name: str) -> float:
    """'1%' or '0.01' -> 0.01; raises ValueError naming the option."""
    text = str(text).strip()
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise ValueError(f"{name} {text!r} is not a rate; use e.g. {name} 1% or {name} 0.01") from None
    if not 0 <= value <= 1:
        raise ValueError(f"{name} {text!r} must be between 0 and 100%; use e.g. {name} 1%")
    return value


def error_counts(records: pd.DataFrame) -> tuple[int, int]:
    """(failed requests, requests) of a run, leaving out the requests cut off by the end of the run."""
    measured = records[records["error_type"] != CUT_OFF]
    return int((measured["status"] != "ok").sum()), len(measured)


def error_limit(records: pd.DataFrame, max_error_rate: str | float | None) -> dict:
    """The --max-error-rate verdict: rate = failed / requests (cut-off requests left out; 0 without requests),
    over_limit when rate > the limit; `completed`, the ok requests: a run with none measured nothing."""
    failed, total = error_counts(records)
    limit = parse_rate("0" if max_error_rate in (None, "") else max_error_rate, "--max-error-rate")
    rate = failed / total if total else 0.0
    over = rate > limit
    text = (
        f"Errors: {failed} of {total} requests ({rate:.2%}), {'over' if over else 'within'} --max-error-rate "
        f"{limit:.2%}"
    )
    completed = total - failed
    if not completed:
        cut = int((records["error_type"] == CUT_OFF).sum())
        text += (
            f"\nNo request completed: {failed} failed and {cut} were still running when the run stopped, so nothing "
            "was measured (a headless run exits 1). A server that accepts requests but never finishes them? "
            "--read-timeout bounds the wait for each line of a stream"
        )
    return {
        "failed": failed, "requests": total, "rate": rate, "limit": limit, "over_limit": over,
        "completed": completed, "text": text,
    }  # fmt: skip


def slo_gate(run_dir: Path, records: pd.DataFrame | None = None, run: dict | None = None) -> dict | None:
    """The run's --slo (from run.json, or `run`) judged on its records: the verdict dict, or None without
    objectives."""
    from .records import load_records
    from .slo import judge_steps, parse_slo, verdict, verdict_lines

    run = read_run(run_dir) if run is None else run
    spec = (run.get("options") or {}).get("slo") or ""
    if not spec:
        return None
    objectives = parse_slo(spec)
    if records is None or ("chunk_offsets_s" not in records.columns and any(o.metric == "itl" for o in objectives)):
        records = load_records(run_dir)  # ITL objectives need the per-chunk lists
    timeline = run.get("timeline") or timeline_from_records(records)
    judged = judge_steps(records, timeline, objectives)
    result = verdict(judged, objectives)
    result["text"] = verdict_lines(result, objectives)
    return result


def write_summary_md(
    run_dir: Path,
    table: pd.DataFrame,
    gate: dict | None,
    diagnosis: list[str],
    run: dict | None = None,
    capacity: dict | None = None,
) -> Path:
    """summary.md, for a CI job summary: the step table, the SLO verdict (when --slo was given), the diagnosis; in a
    capacity search (`capacity`: analysis.capacity.result) its result first, and each probe's verdict."""
    from .slo import markdown_summary

    run = read_run(run_dir) if run is None else run
    options = run.get("options") or {}
    title = f"Load test of {options.get('host') or 'the server'}" + (
        f" ({options['model']})" if options.get("model") else ""
    )
    judged = pd.DataFrame(gate["steps"]) if gate else None
    lines = gate["text"] if gate else ["No --slo given: no gate."]
    if capacity is not None:
        # The probes beyond the capacity break objectives on purpose: the gate's FAILED is not the run's verdict.
        lines = [capacity["line"]]
        if capacity.get("limit") is None:
            lines.append("The search did not finish (the run was stopped first): this is the best found so far.")
        lines.append(
            "A capacity search: the probes beyond the capacity break the objectives on purpose, so the SLO gate does "
            "not judge this run; `verdict` is each probe's, on its objectives' 95 % intervals."
        )
    path = Path(run_dir) / SUMMARY_MD_FILE
    replace_file(path, markdown_summary(title, table, judged, lines, diagnosis, capacity))
    return path


def efficiency_ceiling(run_dir: Path, table: pd.DataFrame, run: dict | None = None) -> dict | None:
    """The single-request decode ceiling from the run's --gpu / --memory-bandwidth-gbs and --model-bytes, against
    the measured decode rate at the lowest step; None when either figure was not given."""
    from .ceiling import bandwidth_gbs, ceiling_report, parse_bytes

    options = (read_run(run_dir) if run is None else run).get("options") or {}
    bandwidth = bandwidth_gbs(options.get("gpu"), options.get("memory_bandwidth_gbs"))
    weights = parse_bytes(str(options["model_bytes"])) if options.get("model_bytes") else None
    source = (
        f"--gpu {options['gpu']}"
        if options.get("gpu") and not options.get("memory_bandwidth_gbs")
        else ("--memory-bandwidth-gbs")
    )
    rows = json.loads(table.to_json(orient="records"))
    rows = [{**r, "tpot_p50_s": math.nan if r.get("tpot_p50_s") is None else r["tpot_p50_s"]} for r in rows]
    return ceiling_report(rows, bandwidth, weights, f"{source}, --model-bytes {options.get('model_bytes')}")


def dataset_info(run: dict) -> dict:
    """How the run's prompts were built (run.json's "dataset"); runs from before prompt sources used --prompt."""
    options = run.get("options") or {}
    return run.get("dataset") or {"spec": options.get("dataset") or "fixed"}


_IMAGES = re.compile(r"\s*(\d+):(\d+)[xX](\d+)\s*")


def images_info(run: dict) -> dict | None:
    """--images: the image settings of run.json's options (count, width, height, format, reuse), None without."""
    options = run.get("options") or {}
    m = _IMAGES.fullmatch(str(options.get("images") or ""))
    if m is None:  # no images (or text options.check refused: such a run never started)
        return None
    count, width, height = (int(g) for g in m.groups())
    return {
        "count": count,
        "width": width,
        "height": height,
        "format": str(options.get("image_format") or "png"),
        "reuse": bool(options.get("image_reuse")),
    }


def images_text(info: dict) -> str:
    """One line describing a run's images, for the report and summary.md."""
    same = "the same images in every request (--image-reuse)" if info["reuse"] else "distinct per request"
    return (
        f"Images: {info['count']} per request, {info['width']}x{info['height']} {info['format'].upper()} (generated, "
        f"--images {info['count']}:{info['width']}x{info['height']} --image-format {info['format']}), {same}"
    )
