"""Service-level objectives: parse `--slo`, judge every step against them, goodput, and the CI summary.

`--slo ttft_p95=500ms,tpot_p95=50ms,e2e_p99=20s,error_rate=1%`: each objective is `<metric>_<statistic>` with
metric ttft, ttfo, tpot, itl or e2e (the glossary's) and statistic p50, p90, p95, p99 or mean, or `error_rate`; a
step meets it when its value is at or under the threshold. Values come from the same requests as the step table
(started after the step's warm-up, not cut off by the stop). TTFO (the first answer or tool-call token): a request
without an answer token (its thought never closed) counts as never answered (+inf), in the step's statistic as in
steps.csv and for the request itself in goodput, so a step whose requests never answered fails a ttfo objective
(it is not "no data": the users waited and got no answer). Pure: no Locust, no I/O.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import kinds
from .batch import table_kind
from .glossary import GLOSSARY, STEP_TABLE, Metric, numeric_column, percentile, percentile_never
from .steps import itl_samples, measured_masks

# The metrics objectives can be set on, by their --slo name, as the glossary declares them (Metric.objective).
OBJECTIVES: dict[str, Metric] = {m.objective: m for m in GLOSSARY.values() if m.objective}
METRICS = tuple(OBJECTIVES)
STATISTICS = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "mean": None}
_VALUE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|%)?\s*$")
EXAMPLE = "ttft_p95=500ms,tpot_p95=50ms,e2e_p99=20s,error_rate=1%"


@dataclass(frozen=True)
class Objective:
    name: str  # as written: ttft_p95, error_rate
    metric: str  # ttft | tpot | itl | e2e | error_rate
    statistic: str | None  # p95 | mean | None (error_rate)
    threshold: float  # seconds, or a fraction for error_rate

    def describe(self, value: float | None = None) -> str:
        return f"{self.name} <= {_fmt(self, self.threshold)}" + ("" if value is None else f" ({_fmt(self, value)})")


def _fmt(obj: Objective, v: float) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "no data"
    if v == math.inf:
        return "no answer"  # a TTFO percentile reached by requests that never got an answer token
    if obj.metric == "error_rate":
        return f"{v:.2%}"
    return f"{v * 1000:.1f} ms" if v < 10 else f"{v:.2f} s"


def parse_slo(spec: str) -> list[Objective]:
    """Objectives from `name=value,...`; ValueError with the fix on anything else."""
    out: list[Objective] = []
    for part in (p for p in spec.split(",") if p.strip()):
        name, sep, raw = part.partition("=")
        name = name.strip().lower()
        if not sep:
            raise ValueError(f"--slo entry {part.strip()!r} has no '=value'; write it like {EXAMPLE}")
        m = _VALUE.match(raw)
        if not m:
            raise ValueError(f"--slo {name} value {raw.strip()!r} is not a number with ms, s or %; e.g. {EXAMPLE}")
        number, unit = float(m.group(1)), m.group(2)
        if name == "error_rate":
            threshold = number / 100 if unit == "%" else number
            if unit not in (None, "%") or not 0 <= threshold <= 1:
                raise ValueError(f"--slo error_rate {raw.strip()!r} must be a share: e.g. error_rate=1%")
            out.append(Objective(name, "error_rate", None, threshold))
            continue
        metric, _, statistic = name.partition("_")
        if metric not in METRICS or statistic not in STATISTICS:
            raise ValueError(
                f"--slo has no objective {name!r}; use <{'|'.join(METRICS)}>_<{'|'.join(STATISTICS)}> or error_rate"
            )
        if unit == "%":
            raise ValueError(f"--slo {name} is a time: write ms or s, e.g. {name}=500ms")
        out.append(Objective(name, metric, statistic, number / 1000 if unit == "ms" else number))
    if not out:
        raise ValueError(f"--slo is empty; e.g. --slo {EXAMPLE}")
    names = [o.name for o in out]
    if len(set(names)) != len(names):
        raise ValueError(f"--slo names an objective twice: {','.join(names)}")
    return out


# What a request that does not stream has no value of: no first token, no token gaps.
STREAMING_ONLY = tuple(name for name, m in OBJECTIVES.items() if m.streaming)


def check_endpoint(objectives: list[Objective], endpoint: str) -> None:
    """ValueError (one line with the fix) for an objective the endpoint's requests have no value of: ttft, ttfo,
    tpot and itl with a kind that does not stream (every step would fail them for "no data")."""
    kind = kinds.of(endpoint)
    if kind.streams:
        return
    streaming = [o.name for o in objectives if o.metric in STREAMING_ONLY]
    if streaming:
        raise ValueError(
            f"--slo {','.join(streaming)} cannot be judged with --endpoint {kind.name} (its requests do not "
            "stream: no first token, no token gaps); use e2e objectives, e.g. --slo e2e_p95=200ms,error_rate=1%"
        )


def _num1(v: float) -> str:
    return "-" if v is None or math.isnan(v) else f"{v:.1f}"


def _statistic(values: np.ndarray, statistic: str) -> float:
    q = STATISTICS[statistic]
    if q is None:
        values = values[~np.isnan(values)]
        return float(values.mean()) if values.size else math.nan
    return percentile_never(values, q) if np.isposinf(values).any() else percentile(values, q)


def request_values(ok: pd.DataFrame, metric: str) -> np.ndarray:
    """Per ok request, its value of a per-request metric (ttft, ttfo, tpot, e2e) in seconds, as the glossary
    declares it (ttfo: +inf without an answer token); NaN where missing."""
    m = OBJECTIVES[metric]
    return m.values(ok) if m.values is not None else numeric_column(ok, m.name)


def _request_meets(ok: pd.DataFrame, objectives: list[Objective]) -> np.ndarray:
    """Per ok request: every per-request latency objective (ttft, tpot, e2e) is met by the request's own value.

    ITL objectives are judged on the step only: a request has many ITL samples, and a single slow token in a long
    answer would otherwise fail it; error_rate is not a property of one request.
    """
    meets = np.ones(len(ok), dtype=bool)
    for o in objectives:
        m = OBJECTIVES.get(o.metric)
        if m is None or not m.per_request:
            continue
        v = request_values(ok, o.metric)
        within = v <= o.threshold  # NaN compares False; a TTFO never answered (+inf) too
        if m.none_meets:
            within |= np.isnan(v)  # a one-token answer has no TPOT: judged on its other objectives
        meets &= within
    return meets


def judge_steps(records: pd.DataFrame, timeline: list[dict], objectives: list[Objective]) -> pd.DataFrame:
    """One row per step: each objective's value and verdict, goodput, and whether the step meets them all.

    goodput = ok requests meeting every per-request objective / measured requests (ok + failed); a one-token
    answer has no TPOT and is judged on the rest.
    """
    measured, cut, _stop = measured_masks(records, timeline)
    rows = []
    for step in timeline:
        s = int(step["step"])
        in_step = (records["step"] == s) & measured & ~cut
        ok = records[in_step & (records["status"] == "ok")]
        failed = int((in_step & (records["status"] != "ok")).sum())
        total = len(ok) + failed
        row: dict = {"step": s, "users": int(step["users"]), "requests": total}
        row["goodput"] = float(_request_meets(ok, objectives).sum()) / total if total else math.nan
        passed = total > 0
        for o in objectives:
            if o.metric == "error_rate":
                value = failed / total if total else math.nan
            elif o.metric == "itl":
                value = _statistic(itl_samples(ok), o.statistic)
            else:
                value = _statistic(request_values(ok, o.metric), o.statistic)
            ok_value = not math.isnan(value) and value <= o.threshold
            row[o.name] = value
            if o.metric == "ttfo":  # summary.json writes inf as null: say it was no answer, not no data
                row[f"{o.name}_no_answer"] = value == math.inf
            row[f"{o.name}_met"] = ok_value
            passed = passed and ok_value  # no data for an objective is not a pass
        row["meets_all"] = passed
        rows.append(row)
    return pd.DataFrame(rows)


def verdict(judged: pd.DataFrame, objectives: list[Objective]) -> dict:
    """The gate: passed when every step meets every objective; the highest step that does; what broke where."""
    passing = judged[judged["meets_all"]] if len(judged) else judged
    broken = []
    for row in judged.itertuples(index=False):
        r = row._asdict()
        for o in objectives:
            if not r[f"{o.name}_met"]:
                value = r[o.name]
                entry = {"step": r["step"], "users": r["users"], "objective": o.name, "value": _json_number(value)}
                if value == math.inf:  # a TTFO statistic reached by requests never answered (null in summary.json)
                    entry["no_answer"] = True
                broken.append(entry)
    highest = passing.iloc[-1] if len(passing) else None
    return {
        "objectives": {o.name: o.threshold for o in objectives},
        "passed": bool(len(judged)) and bool(judged["meets_all"].all()),
        "highest_step_meeting_all": None if highest is None else int(highest["step"]),
        "highest_users_meeting_all": None if highest is None else int(highest["users"]),
        "broken": broken,
        "steps": [{k: _json_number(v) for k, v in r.items()} for r in judged.to_dict(orient="records")],
    }


def _json_number(v: object) -> object:
    """NaN and inf as None (summary.json is strict JSON); anything else as it is."""
    return None if isinstance(v, float) and not math.isfinite(v) else v


def verdict_lines(result: dict, objectives: list[Objective]) -> list[str]:
    """The gate in plain words."""
    by_name = {o.name: o for o in objectives}
    head = "PASSED" if result["passed"] else "FAILED"
    spec = ", ".join(o.describe() for o in objectives)
    lines = [f"SLO gate {head} ({spec})."]
    if result["highest_users_meeting_all"] is not None:
        lines.append(f"Highest step meeting every objective: {result['highest_users_meeting_all']} users.")
    else:
        lines.append("No step met every objective.")
    for b in result["broken"]:
        o = by_name[b["objective"]]
        value = math.inf if b.get("no_answer") else b["value"]
        lines.append(f"Step {b['step']} ({b['users']} users): {o.describe(value)} not met.")
    return lines


def markdown_summary(
    title: str,
    table: pd.DataFrame,
    judged: pd.DataFrame | None,
    lines: list[str],
    diagnosis: list[str],
    capacity: dict | None = None,
) -> str:
    """summary.md: a short Markdown page for a CI job summary (e.g. appended to $GITHUB_STEP_SUMMARY); a capacity
    search's table leads with each step's probe number and ends with the probe's verdict."""
    out = [f"## {title}", ""]
    out += [f"- {line}" for line in lines]
    probes = "probe" in table.columns and bool(table["probe"].notna().any())
    rates = "rate_rps" in table.columns and len(table) > 0 and bool(table["rate_rps"].notna().all())
    verdicts = {int(p["step"]): p.get("verdict") for p in (capacity or {}).get("probes") or []}
    head = (["probe"] if probes else []) + ["users"] + (["req/s"] if rates else [])
    # A batch kind's run: its throughput is its items/s and its latency E2E (no tokens out, no TTFT, no TPOT).
    batch = table_kind(table)
    batched = batch is not None
    if batch is not None:
        head += ["requests", "errors", STEP_TABLE[str(batch.item_rate)].unit, "prompt tok/s", "E2E p50", "E2E p95"]
    else:
        head += ["requests", "errors", "tok/s", "TTFT p95", "TPOT p95", "E2E mean"]
    has_goodput = judged is not None and len(judged) == len(table)
    if has_goodput:
        head += ["goodput", "SLOs"]
    if capacity is not None:
        head += ["verdict"]
    out += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def ms(v: float) -> str:
        return "-" if v is None or math.isnan(v) else f"{v * 1000:.1f} ms"

    for i, r in enumerate(table.itertuples(index=False)):
        lead = [("-" if pd.isna(r.probe) else str(int(r.probe)))] if probes else []
        load = [str(r.users)] + ([f"{float(r.rate_rps):g}"] if rates else [])
        cells = [
            *lead, *load, str(r.requests), str(r.errors),
            "-" if math.isnan(r.aggregate_tok_s) else f"{r.aggregate_tok_s:.1f}",
            ms(r.ttft_p95_s), ms(r.tpot_p95_s), ms(r.e2e_mean_s),
        ] if not batched else [
            *lead, *load, str(r.requests), str(r.errors),
            _num1(getattr(r, str(batch.item_rate))),
            _num1(r.prompt_tok_s), ms(r.e2e_p50_s), ms(r.e2e_p95_s),
        ]  # fmt: skip
        if has_goodput:
            g = judged.iloc[i]
            goodput = "-" if pd.isna(g["goodput"]) else f"{g['goodput']:.1%}"  # None in a step with no data
            cells += [goodput, "met" if g["meets_all"] else "**broken**"]
        if capacity is not None:
            verdict = verdicts.get(int(r.step)) if str(r.step).lstrip("-").isdigit() else None
            cells.append("-" if verdict is None else (verdict if verdict == "pass" else f"**{verdict}**"))
        out.append("| " + " | ".join(cells) + " |")
    if diagnosis:
        out += ["", "**Diagnosis**", "", *[f"- {d}" for d in diagnosis]]
    out += ["", "_Metrics as defined in the glossary of the suite's README, over each step's measured window._"]
    return "\n".join(out) + "\n"
