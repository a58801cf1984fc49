"""The console's line per step as it ends: always the same columns (users, throughput with its interval, TTFT and TPOT
percentiles, errors, stable or not), so a headless run reads as a table that grows. Pure: the step's records and its
timeline entry in, text out (locustfiles/console.py prints it).

It runs in the load generator's own event loop as a step ends, so it is kept small: numpy over the step's few fields,
with the step table's own estimators (glossary.percentile, uncertainty.rate_interval and halves, knee.stable): about
2-3 ms for a step of 3,000 requests, once per step, where the whole step table took 30 ms (75 ms on a busy machine,
a stall that showed in the stamps of the streams in flight). Each record costs about 1 µs as it arrives.

A line counts the records that had arrived when its step ended; steps.csv at the end of the run is the reference,
and also counts the step's requests that finished after it ended.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from . import glossary, kinds, knee
from .sse import CUT_OFF
from .uncertainty import batch_count, halves, rate_interval

LATENCIES = (("ttft_p50_s", "ttft", 50), ("ttft_p95_s", "ttft", 95), ("tpot_p50_s", "tpot", 50),
             ("tpot_p95_s", "tpot", 95))  # fmt: skip
WIDTHS = {"step": 4, "users": 6, "requests": 6, "errors": 6, "stable": 8}  # else 9; the throughput 18


FIELDS = ("ok", "warmup", "cut", "start_time", "duration_s", "e2e_s", "ttft_s", "tpot_s")


@dataclass
class Steps:
    """What the lines need of every record received (each request once): per step its outcomes and latencies as
    columns, and every ok request's span and weight (tokens, or a batch kind's items), counted in the window it ends
    in."""

    kind: kinds.RequestKind | None = None
    seen: dict[int, set[str]] = field(default_factory=dict)  # per step not yet shown, the request ids received
    per_step: dict[int, dict[str, list]] = field(default_factory=dict)
    shown: set[int] = field(default_factory=set)  # steps whose line is out: their records are no longer kept
    spans: tuple[list[float], list[float], list[float]] = field(default_factory=lambda: ([], [], []))

    def add_rows(self, rows: list[dict]) -> None:
        starts, ends, weights = self.spans
        for r in rows:
            seen = self.seen.setdefault(r["step"], set())
            if r["request_id"] in seen or r["step"] in self.shown:  # a worker's copy may arrive twice
                continue
            seen.add(r["request_id"])
            if self.kind is None:
                self.kind = kinds.of(r["endpoint"])
            ok = r["status"] == "ok"
            values = (ok, r["warmup"], r["error_type"] == CUT_OFF, r["start_time"], r["duration_s"], r["e2e_s"],
                      r["ttft_s"], r["tpot_s"])  # fmt: skip
            columns = self.per_step.get(r["step"]) or self.per_step.setdefault(r["step"], {f: [] for f in FIELDS})
            for name, value in zip(FIELDS, values):
                columns[name].append(value)
            if ok and r["e2e_s"] is not None:
                starts.append(r["start_time"])
                ends.append(r["start_time"] + r["e2e_s"])
                weights.append(float((r[self.kind.items] if self.kind.batch else r["output_tokens"]) or 0))

    def shown_step(self, step: dict) -> None:
        """The step's line is out: drop its records, and the spans that ended before it did (no later window counts
        them), so a long run keeps only its current steps."""
        self.shown.add(step["step"])
        self.per_step.pop(step["step"], None)
        self.seen.pop(step["step"], None)
        end = float(step["end_time"])
        keep = [i for i, e in enumerate(self.spans[1]) if e >= end]
        self.spans = tuple([column[i] for i in keep] for column in self.spans)


def throughput(kind: kinds.RequestKind | None) -> str:
    """The line's throughput column: aggregate tok/s, or a batch kind's items/s."""
    return str(kind.item_rate) if kind is not None and kind.batch else "aggregate_tok_s"


def columns(kind: kinds.RequestKind | None) -> list[str]:
    return ["step", "users", "requests", "errors", throughput(kind), *(name for name, _, _ in LATENCIES), "stable"]


def _width(name: str, kind: kinds.RequestKind | None) -> int:
    return 18 if name == throughput(kind) else WIDTHS.get(name, 9)


def header(kind: kinds.RequestKind | None) -> str:
    """The header line, once before the first step's line (latencies in ms)."""
    names = columns(kind)
    latencies = {name for name, _, _ in LATENCIES}
    titles = [glossary.STEP_TABLE[n].label if n in latencies else glossary.STEP_TABLE[n].header for n in names]
    return "  ".join(t.rjust(_width(n, kind)) for n, t in zip(names, titles)) + "   (latencies in ms)"


def line(kind: kinds.RequestKind | None, row: dict) -> str:
    """One step's line: the glossary's formats, '± half-width' after the throughput, '-' for what it lacks."""
    cells = []
    for n in columns(kind):
        cell = glossary.STEP_TABLE[n].show(row.get(n))
        if n == throughput(kind) and cell != "-" and not math.isnan(row.get("half_width", math.nan)):
            cell += f" ±{row['half_width']:.1f}"
        cells.append(cell.rjust(_width(n, kind)))
    if row.get("trial"):  # --repeat: the plan step's trial, after the same columns as every other line
        cells.append(f"trial {row['trial']}")
    return "  ".join(cells)


def step_row(steps: Steps, step: dict) -> dict | None:
    """The line's values of one finished step (the step table's definitions: requests started after the warm-up
    and finished by the step's end; throughput over its measured window); None when none of its requests finished."""
    columns = steps.per_step.get(step["step"])
    if not columns:
        return None
    ok, warm, cut, start, duration, e2e, ttft, tpot = (np.array(columns[f], dtype=float) for f in FIELDS)
    window_start, window_end = float(step["measure_start"]), float(step["end_time"])
    measured = (warm == 0) & (cut == 0) & (start + np.nan_to_num(duration, nan=np.inf) <= window_end)
    good = measured & (ok == 1)
    row: dict = {"step": step.get("plan_step", step["step"]), "users": step["users"], "requests": int(good.sum())}
    if step.get("trial") is not None:
        row["trial"] = f"{step['trial']}/{step.get('trials', '?')}"
    row["errors"] = int((measured & (ok == 0)).sum())
    for name, metric, q in LATENCIES:
        row[name] = glossary.percentile((ttft if metric == "ttft" else tpot)[good], q)
    starts, ends, weights = (np.array(column, dtype=float) for column in steps.spans)
    e2e_ok = e2e[good & ~np.isnan(e2e)]
    k = batch_count(window_end - window_start, float(np.median(e2e_ok)) if e2e_ok.size else math.nan)
    rate = rate_interval(starts, ends, weights, window_start, window_end, k)
    row[throughput(steps.kind)], row["half_width"] = rate.value, rate.half_width
    done = (ends >= window_start) & (ends < window_end)
    first, second = halves(ends[done], weights[done], window_start, window_end, k)
    judged = not any(math.isnan(v) for v in (first.value, second.value, first.half_width, second.half_width,
                                              rate.half_width))  # fmt: skip
    verdict = knee.stable(first.value, first.half_width, second.value, second.half_width) if judged else None
    row["stable"] = None if verdict is None else bool(verdict)
    return row
