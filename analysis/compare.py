"""Two runs compared step by step: is the difference larger than the noise each run's own intervals allow?

Pure: works on two step tables (steps.csv). Steps are matched by load (users; the intended rate when both are
--rates runs). For each of aggregate tok/s, TTFT p95 and TPOT p95 (two runs of one batch kind: its items/s, prompt
tok/s and E2E p95) the difference is relative to the other run,
d = a / b - 1, and its 95 % interval combines the two runs' independent intervals on the relative scale (the delta
method for a ratio): half-width = (a / b) * sqrt((h_a / a)^2 + (h_b / b)^2), h = (ci_high - ci_low) / 2. A
difference is significant when |d| exceeds that half-width. The intervals are each run's within-run noise only:
run-to-run and machine-to-machine variation is not in them, and the lines say so.

When both runs repeated their plan (--repeat, analysis/trials.py) and a metric has an across-trial interval at the
load in both, the same rule is applied to the across-trial means and intervals instead (the t-interval over each
run's trials, which holds the drift between trials a whole plan apart): a step's own interval cannot see that drift.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from .batch import table_kind
from .glossary import STEP_TABLE
from .kinds import RequestKind
from .schedule import is_rate_run, rate_label

# (column, label): what is compared, each with its interval columns <column>_ci_low / <column>_ci_high.
METRICS = (("aggregate_tok_s", "aggregate tok/s"), ("ttft_p95_s", "TTFT p95"), ("tpot_p95_s", "TPOT p95"))


def batch_metrics(kind: RequestKind) -> tuple[tuple[str, str], ...]:
    """Two runs of a batch kind (no output tokens, no TTFT, no TPOT): their throughput and latency, with the same
    intervals."""
    rate = str(kind.item_rate)
    return (rate, STEP_TABLE[rate].unit), ("prompt_tok_s", "prompt tok/s"), ("e2e_p95_s", "E2E p95")


CI_LOW, CI_HIGH = "_ci_low", "_ci_high"
TRIALS_MEAN, TRIALS_LOW, TRIALS_HIGH = "_trials_mean", "_trials_ci_low", "_trials_ci_high"
TRIALS_LABEL = " across trials"
TRIALS_NOTE = (
    "A difference marked across trials is judged on both runs' across-trial means and intervals (--repeat: the "
    "t-interval over each run's trials of the step, a whole plan apart), which hold the drift between trials that "
    "a step's own interval cannot see."
)

NOISE_NOTE = (
    "Judged against within-run noise only (each step's own 95 % intervals): run-to-run and machine-to-machine "
    "variation is not in them. On a shared machine two identical runs have differed by about 12 % in aggregate "
    "tok/s at 16 users while each run's own intervals were narrower, so a difference of that order needs repeated "
    "or interleaved runs (A B A B) before it is believed."
)


def relative_difference(
    a: float, a_low: float, a_high: float, b: float, b_low: float, b_high: float
) -> tuple[float, float]:
    """(d, half-width) with d = a / b - 1 and half-width = (a / b) * sqrt((h_a / a)^2 + (h_b / b)^2); NaN
    half-width when an interval is missing."""
    if not (b > 0) or math.isnan(a):
        return math.nan, math.nan
    ratio = a / b
    h_a, h_b = (a_high - a_low) / 2, (b_high - b_low) / 2
    if any(math.isnan(x) for x in (h_a, h_b)) or not (a > 0):
        return ratio - 1, math.nan
    return ratio - 1, ratio * math.hypot(h_a / a, h_b / b)


def _percent(x: float, digits: int) -> str:
    return f"{x * 100:+.{digits}f} %"


@dataclass(frozen=True)
class Difference:
    """One metric at one step: this run's value against the other's, relative, with its half-width."""

    column: str
    label: str
    this: float
    other: float
    relative: float  # this / other - 1
    half_width: float  # of `relative`; NaN when it cannot be judged (then `reason` says why)
    reason: str | None = None
    trials: bool = False  # judged on both runs' across-trial means and intervals (--repeat), not the within-step ones

    @property
    def significant(self) -> bool | None:
        """|relative| > half_width; None when it cannot be judged."""
        if math.isnan(self.relative) or math.isnan(self.half_width):
            return None
        return abs(self.relative) > self.half_width

    def stated(self, why: bool = True) -> str:
        """'+12 % ± 4 %', 'no significant difference (+3 % ± 9 %)' or '+5 %, cannot be judged (why)'."""
        if math.isnan(self.relative):
            return "not measured in both runs"
        if self.significant is None:
            return f"{_percent(self.relative, 0)}" + (f", cannot be judged ({self.reason})" if why else "")
        digits = 0 if self.half_width >= 0.01 else 1
        stated = f"{_percent(self.relative, digits)} ± {self.half_width * 100:.{digits}f} %"
        return stated if self.significant else f"no significant difference ({stated})"

    def text(self) -> str:
        """'aggregate tok/s: +12 % ± 4 %' ('aggregate tok/s across trials: ...' when judged on the trials)."""
        return f"{self.label}{TRIALS_LABEL if self.trials else ''}: {self.stated()}"


@dataclass(frozen=True)
class StepComparison:
    load: float
    load_text: str  # "16 users", "4 req/s"
    differences: tuple[Difference, ...] = ()
    only_in: str | None = None  # the run that has this load when the other has not

    def line(self) -> str:
        if self.only_in is not None:
            return f"At {self.load_text}: only in {self.only_in}, not compared."
        reasons = {d.reason for d in self.differences if d.significant is None and not math.isnan(d.relative)}
        if len(reasons) == 1 and all(d.significant is None for d in self.differences):
            # One reason for all: said once.
            said = ", ".join(f"{d.label} {d.stated(why=False)}" for d in self.differences)
            return f"At {self.load_text}: {said}: cannot be judged ({reasons.pop()})."
        return f"At {self.load_text}: " + "; ".join(d.text() for d in self.differences) + "."


@dataclass
class Comparison:
    """This run against another, step by step."""

    this: str
    other: str
    key: str = "users"
    steps: list[StepComparison] = field(default_factory=list)
    unmatched: str | None = None  # why the steps could not be matched at all
    missing_intervals: list[str] = field(default_factory=list)  # the runs whose steps.csv has no intervals
    metrics: tuple[tuple[str, str], ...] = METRICS  # (column, label) compared: batch_metrics for a batch kind

    def lines(self) -> list[str]:
        """The console's (and the report's) sentences."""
        if self.unmatched is not None:
            return [f"{self.this} against {self.other}: {self.unmatched}"]
        by = "users" if self.key == "users" else "intended request rate"
        out = [
            f"{self.this} against {self.other}, steps matched by {by}: each difference relative to {self.other}, "
            "± its 95 % interval from both runs' intervals; significant when the difference exceeds it."
        ]
        for name in self.missing_intervals:
            line = f"{name}'s steps.csv has no confidence intervals (a version before them wrote it): no difference "
            line += "can be judged"
            if name != self.this:
                line += f"; `python -m analysis report {name}` recomputes its steps.csv, intervals included"
            out.append(line + ".")
        out += [s.line() for s in self.steps]
        judged = [d.trials for s in self.steps for d in s.differences]
        if any(judged):
            out.append(TRIALS_NOTE)
        if not judged or not all(judged):  # some difference was judged on the within-step intervals alone
            out.append(NOISE_NOTE)
        return out


def _num(row: pd.Series | None, column: str) -> float:
    if row is None or column not in row.index or pd.isna(row[column]):
        return math.nan
    return float(row[column])


def _trial_values(row: pd.Series, column: str) -> list[float] | None:
    """(mean, low, high) of the step's across-trial interval of `column`, or None when it has none (no --repeat, or
    fewer than 2 trials with a value)."""
    mean, low, high = (_num(row, column + suffix) for suffix in (TRIALS_MEAN, TRIALS_LOW, TRIALS_HIGH))
    if any(math.isnan(v) for v in (mean, low, high)):
        return None
    # The t-interval is symmetric; its lower bound is clipped at 0 in steps.csv: the half-width is the upper side's.
    return [mean, 2 * mean - high, high]


def _difference(column: str, label: str, a: pd.Series, b: pd.Series, missing: list[str]) -> Difference:
    trials = _trial_values(a, column), _trial_values(b, column)
    if trials[0] is not None and trials[1] is not None:
        values = trials[0] + trials[1]
        relative, half = relative_difference(*values)
        return Difference(column, label, values[0], values[3], relative, half, trials=True)
    lo, hi = column + CI_LOW, column + CI_HIGH
    values = [_num(a, column), _num(a, lo), _num(a, hi), _num(b, column), _num(b, lo), _num(b, hi)]
    relative, half = relative_difference(*values)
    reason = None
    if math.isnan(half):
        if missing:
            reason = f"no intervals in {' and '.join(missing)}"
        else:
            reason = "no interval at this step: too few requests or too short a window"
    return Difference(column, label, values[0], values[3], relative, half, reason)


def _load_text(load: float, key: str) -> str:
    return rate_label(load) if key == "rate_rps" else f"{load:g} users"


def _has_intervals(table: pd.DataFrame, metrics: tuple[tuple[str, str], ...] = METRICS) -> bool:
    return all(c + s in table.columns for c, _ in metrics for s in (CI_LOW, CI_HIGH))


def compare_runs(table: pd.DataFrame, other: pd.DataFrame, this_name: str, other_name: str) -> Comparison:
    """Per load present in either run: each METRICS difference of `table` relative to `other` (module docstring);
    a load in one run only is named, not compared."""
    comparison = Comparison(this_name, other_name)
    rates = is_rate_run(table), is_rate_run(other)
    if rates[0] != rates[1]:
        kinds = ["an open-loop (--rates) run" if r else "a closed-loop (--steps) run" for r in rates]
        comparison.unmatched = (
            f"{this_name} is {kinds[0]} and {other_name} {kinds[1]}: their steps do not match by load; not compared."
        )
        return comparison
    key = "rate_rps" if rates[0] else "users"
    comparison.key = key
    batch = table_kind(table)
    if batch is not None and table_kind(other) == batch:
        comparison.metrics = batch_metrics(batch)
    metrics = comparison.metrics
    missing = [name for name, t in ((this_name, table), (other_name, other)) if not _has_intervals(t, metrics)]
    comparison.missing_intervals = missing

    def by_load(t: pd.DataFrame) -> dict[tuple[float, int], pd.Series]:
        # A load run twice (--steps 1,4,1) is matched in order: the first with the first.
        out, seen = {}, {}
        rows = t[t["step"].astype(str) != "all"].sort_values("step", key=lambda s: pd.to_numeric(s, errors="coerce"))
        for _, row in rows.iterrows():
            load = float(row[key])
            n = seen.get(load, 0)
            seen[load] = n + 1
            out[(load, n)] = row
        return out

    mine, theirs = by_load(table), by_load(other)
    for load, n in sorted(set(mine) | set(theirs)):
        text = _load_text(load, key) + (f" (repeat {n + 1})" if n else "")
        a, b = mine.get((load, n)), theirs.get((load, n))
        if a is None or b is None:
            comparison.steps.append(StepComparison(load, text, only_in=this_name if b is None else other_name))
            continue
        diffs = tuple(_difference(c, label, a, b, missing) for c, label in metrics)
        comparison.steps.append(StepComparison(load, text, diffs))
    return comparison
