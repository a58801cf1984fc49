"""Adaptive step length (`--step-duration auto`): a step ends once it has measured enough, or at its maximum.

A step ends when its aggregate tok/s interval (batch means, `aggregate_interval`: the estimator of steps.csv's
aggregate_tok_s_ci_low/high) has a half-width within --ci-target of its value and its TTFT p95 has
min_samples_for_quantile(0.95) measured samples; or when it has run --max-step-duration (warm-up included), and
then its end_reason says so (`max_duration`). The warm-up (--step-warmup) comes first in each step, as always.

Stopping at the first narrow interval of a test looked at every second is sequential testing: among many looks
one is narrow by chance, so the intervals of the steps kept would be optimistic. The interval is looked at only at
fixed check points: first once the measured window holds MIN_CHECK_BATCHES batches of BATCH_E2E_MULTIPLE median
E2Es (and at least MIN_CHECK_WINDOW_S), then each time the window has grown by CHECK_GROWTH (5 more of 20 batches),
so even a 120 s step of 10 ms requests is looked at some 20 times, not 120.

Pure: numpy and the interval functions, no Locust. `StepAccumulator` is the controller's light live view of the
current step (fed a few numbers per finished request); `decide` is the rule; `step_lengths_text` is the console's
end-of-run section.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from . import glossary
from .uncertainty import (
    BATCH_E2E_MULTIPLE,
    Interval,
    batch_count,
    batch_means,
    min_samples_for_quantile,
    rate_interval,
)

AUTO = "auto"  # --step-duration auto
DEFAULT_MAX_STEP_DURATION = "120s"
DEFAULT_CI_TARGET = "5%"

# Why a step ended (run.json's timeline entries and steps.csv's end_reason).
CI_TARGET = "ci_target"  # its interval narrowed to --ci-target with enough TTFT samples
MAX_DURATION = "max_duration"  # it reached --max-step-duration first: flagged
FIXED = "fixed"  # a fixed --step-duration elapsed
RUN_STOPPED = "run_stopped"  # the run was stopped before the step ended (Ctrl-C, the web UI's stop, -t)
END_REASONS = (CI_TARGET, MAX_DURATION, FIXED, RUN_STOPPED)
STEP_END_COLUMNS = glossary.names(glossary.STEP_END)  # steps.csv's last columns, after the open-loop ones

QUANTILE = 0.95  # the TTFT percentile that must have enough samples
MIN_CHECK_BATCHES = 10
MIN_CHECK_WINDOW_S = 2.0  # below this, the 1-second polling of the shape is too coarse to cut a window
CHECK_GROWTH = 1.25


def parse_ci_target(text: str) -> float:
    """'5%' or '0.05' -> 0.05 (a relative half-width, above 0 and below 1); raises ValueError with a one-line fix."""
    text = str(text).strip()
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise ValueError(f"--ci-target {text!r} is not a percentage; use e.g. --ci-target 5% or 0.05") from None
    if not 0 < value < 1:
        raise ValueError(f"--ci-target {text!r} must be above 0 and below 100%; use e.g. --ci-target 5%")
    return value


def aggregate_interval(
    end_times: Sequence[float] | np.ndarray,
    tokens: Sequence[float] | np.ndarray,
    start: float,
    end: float,
    e2e_median_s: float | None,
    start_times: Sequence[float] | np.ndarray | None = None,
) -> Interval:
    """Aggregate tok/s = output tokens of the ok requests completed in [start, end) / (end - start), with its
    batch-means interval over batch_count(end - start, median E2E) batches, widened by the window-edge error when
    the requests' start times are given (uncertainty.rate_interval: steps.csv's aggregate_tok_s interval)."""
    batches = batch_count(end - start, e2e_median_s)
    if start_times is None:
        return batch_means(end_times, tokens, start, end, batches)
    return rate_interval(start_times, end_times, tokens, start, end, batches)


def within_target(interval: Interval, target: float) -> bool:
    """half_width / |value| <= target (false when the interval is missing)."""
    rel = interval.relative_half_width
    return bool(rel <= target) if not math.isnan(rel) else False


def next_check_s(last_check_s: float, e2e_median_s: float) -> float:
    """The window length of the next look: max(MIN_CHECK_WINDOW_S, MIN_CHECK_BATCHES * BATCH_E2E_MULTIPLE * median
    E2E, CHECK_GROWTH * the last look's window)."""
    first = max(MIN_CHECK_WINDOW_S, MIN_CHECK_BATCHES * BATCH_E2E_MULTIPLE * e2e_median_s)
    return max(first, CHECK_GROWTH * last_check_s)


@dataclass(frozen=True)
class Decision:
    """One poll of the rule: stop (with its reason) or continue; the interval when this poll was a look."""

    stop: bool
    reason: str | None  # CI_TARGET or MAX_DURATION when stopping
    checked: bool  # this poll was a check point (the interval was looked at)
    window_s: float  # the measured window so far
    ttft_samples: int
    value: float = math.nan  # aggregate tok/s over the window
    rel_half_width: float = math.nan  # its interval's half-width / value

    def to_dict(self) -> dict:
        """run.json's record of the poll that ended a step (NaN as None: JSON has no NaN)."""
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()}


def decide(
    end_times: Sequence[float] | np.ndarray,
    tokens: Sequence[float] | np.ndarray,
    e2e_median_s: float | None,
    ttft_samples: int,
    window_start: float,
    now: float,
    elapsed_s: float,
    max_duration_s: float,
    target: float,
    last_check_s: float = 0.0,
    start_times: Sequence[float] | np.ndarray | None = None,
) -> Decision:
    """At a check point (window >= next_check_s, or elapsed_s >= max_duration_s): stop with CI_TARGET when the
    aggregate tok/s interval is within target and ttft_samples >= n for the 0.95 quantile, else with MAX_DURATION
    once elapsed_s >= max_duration_s; else continue."""
    window = now - window_start
    if elapsed_s < max_duration_s:
        if window <= 0 or e2e_median_s is None or math.isnan(e2e_median_s):
            return Decision(False, None, False, max(window, 0.0), ttft_samples)
        if window < next_check_s(last_check_s, e2e_median_s):
            return Decision(False, None, False, window, ttft_samples)
    ci = (
        aggregate_interval(end_times, tokens, window_start, now, e2e_median_s, start_times)
        if window > 0
        else Interval(math.nan)
    )
    # The maximum is a check point fixed in advance too: a step that qualifies there ended by its interval.
    if within_target(ci, target) and ttft_samples >= min_samples_for_quantile(QUANTILE):
        reason = CI_TARGET
    elif elapsed_s >= max_duration_s:
        reason = MAX_DURATION
    else:
        reason = None
    return Decision(reason is not None, reason, True, max(window, 0.0), ttft_samples, ci.value, ci.relative_half_width)


class StepAccumulator:
    """The current step's finished requests on the controller: each ok request's completion time and tokens (any
    step: the window's rate counts every completion in it), and the E2E and TTFT count of this step's measured
    ones. `lag_s` leaves out the end of the window whose records may not have arrived yet (a master: shipped every
    0.5 s)."""

    def __init__(self, lag_s: float = 0.0) -> None:
        self.active = False  # --step-duration auto: off, nothing is kept
        self.lag_s = lag_s
        self.reset(-1)

    def reset(self, step: int) -> None:
        self.step = step
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.tokens: list[int] = []
        self.e2e: list[float] = []
        self.ttft_samples = 0
        self.last_check_s = 0.0

    def add(
        self, step: int, warmup: bool, start_time: float, status: str, e2e_s, output_tokens, ttft_s
    ) -> None:  # fmt: skip
        if status != "ok" or e2e_s is None:
            return
        self.starts.append(start_time)
        self.ends.append(start_time + e2e_s)
        self.tokens.append(output_tokens or 0)
        if step == self.step and not warmup:
            self.e2e.append(e2e_s)
            if ttft_s is not None:
                self.ttft_samples += 1

    def add_rows(self, rows: list[dict]) -> None:
        """Records as dicts (locustfiles/recordbus.py: a local runner's, or a worker's shipped batch parsed once)."""
        if not self.active:
            return
        for r in rows:
            try:
                self.add(r["step"], r["warmup"], r["start_time"], r["status"], r["e2e_s"], r["output_tokens"],
                         r["ttft_s"])  # fmt: skip
            except (KeyError, TypeError):
                continue  # not a record of this suite's: the merge at the end reports unreadable lines

    def decide(
        self, window_start: float, now: float, elapsed_s: float, max_duration_s: float, target: float
    ) -> Decision:
        """The rule (`decide`) on what has arrived, over the window up to now - lag_s; remembers its looks."""
        median = float(np.median(self.e2e)) if self.e2e else None
        decision = decide(
            np.fromiter(self.ends, float, len(self.ends)), np.fromiter(self.tokens, float, len(self.tokens)),
            median, self.ttft_samples, window_start, now - self.lag_s, elapsed_s, max_duration_s, target,
            self.last_check_s, np.fromiter(self.starts, float, len(self.starts)),
        )  # fmt: skip
        if decision.checked:
            self.last_check_s = decision.window_s
        return decision


def max_duration_line(
    step: int, users: int, max_duration_s: float, target: float, rel_half_width: float, ttft_samples: int | None = None
) -> str:
    """'Step 3 (16 users) reached --max-step-duration 120 s before its interval narrowed to 5 %: ±7.9 %' (or, when
    the interval did narrow, the TTFT samples its p95 still lacked)."""
    need = min_samples_for_quantile(QUANTILE)
    start = f"Step {step} ({users} users) reached --max-step-duration {max_duration_s:g} s"
    if not math.isnan(rel_half_width) and rel_half_width <= target and ttft_samples is not None and ttft_samples < need:
        return f"{start} with {ttft_samples} of the {need} TTFT samples its p95 needs (±{rel_half_width * 100:.1f} %)"
    got = "no interval" if math.isnan(rel_half_width) else f"±{rel_half_width * 100:.1f} %"
    return f"{start} before its interval narrowed to {target * 100:g} %: {got}"


def end_reasons(steps: Sequence, timeline: list[dict]) -> list[str | None]:
    """steps.csv's end_reason: each step's timeline entry's (None for a run recorded before it was kept)."""
    by_step = {int(t["step"]): t.get("end_reason") for t in timeline if "step" in t}
    return [by_step.get(int(s)) if str(s).lstrip("-").isdigit() else None for s in steps]


def _final_interval(row: dict, records, entry: dict, stop_time: float) -> Interval:
    """The step's aggregate tok/s interval: steps.csv's when it has one, else computed here the same way."""
    low, high = row.get("aggregate_tok_s_ci_low"), row.get("aggregate_tok_s_ci_high")
    value = row.get("aggregate_tok_s")
    if low is not None and high is not None and not (math.isnan(low) or math.isnan(high)):
        return Interval(float(value), float(low), float(high))
    start, end = float(entry["measure_start"]), float(entry.get("end_time") or stop_time)
    ok = records[records["status"] == "ok"]
    measured = ok[(ok["step"] == int(entry["step"])) & ~ok["warmup"].astype(bool)]
    median = float(measured["e2e_s"].median()) if len(measured) else None
    ends = (ok["start_time"] + ok["e2e_s"]).to_numpy(float)
    tokens = ok["output_tokens"].fillna(0).to_numpy(float)
    return aggregate_interval(ends, tokens, start, end, median, ok["start_time"].to_numpy(float))


def step_lengths_text(run: dict, table, records) -> list[str]:
    """The console's end-of-run lines: the run's total time, and each step's length and reason to end (one line for
    a run of fixed steps); a step that hit --max-step-duration flagged with the interval it reached."""
    timeline = [t for t in run.get("timeline") or [] if t.get("start_time") is not None]
    if not timeline:
        return []
    options = run.get("options") or {}
    ends = [float(t["end_time"]) for t in timeline if t.get("end_time") is not None]
    stop_time = max(ends) if ends else math.nan
    total = (run.get("finished_at") or stop_time) - (run.get("started_at") or timeline[0]["start_time"])
    lengths = [(t.get("end_time") or stop_time) - t["start_time"] for t in timeline]
    stepped = sum(lengths)
    head = f"The run took {total:.1f} s, its {len(timeline)} step(s) {stepped:.1f} s"
    stopped = [t for t in timeline if t.get("end_reason") == RUN_STOPPED]
    if str(options.get("step_duration", "")).strip().lower() != AUTO:
        tail = f"; step {stopped[0]['step']} was cut short by the run's stop" if stopped else ""
        given = options.get("step_duration")
        return [f"{head} ({f'fixed --step-duration {given}' if given else 'fixed steps'}){tail}"]
    try:
        target = parse_ci_target(options.get("ci_target") or DEFAULT_CI_TARGET)
    except ValueError:
        target = math.nan
    maximum = options.get("max_step_duration") or DEFAULT_MAX_STEP_DURATION
    rows = {int(r["step"]): r for r in table.to_dict(orient="records") if str(r.get("step")).isdigit()}
    lines = [f"{head}, of at most {maximum} each (--step-duration auto, --ci-target {target * 100:g} %)"]
    for t, length in zip(timeline, lengths):
        ci = _final_interval(rows.get(int(t["step"]), {}), records, t, stop_time)
        rel = ci.relative_half_width
        width = "no interval" if math.isnan(rel) else f"±{rel * 100:.1f} %"
        reason = t.get("end_reason")
        label = f"Step {t['step']} ({t['users']} users): {length:.1f} s, "
        if reason == MAX_DURATION and (t.get("end_check") or {}).get("objective_straddled"):
            # A capacity probe kept on for its verdict (locustfiles/shape.py _probe_end), its tok/s within target.
            lines.append(f"MAX: Step {t['step']} ({t['users']} users) reached --max-step-duration with an objective's "
                         f"interval still straddling its limit (aggregate tok/s {width}) ({length:.1f} s)")  # fmt: skip
        elif reason == MAX_DURATION:
            samples = _ttft_samples(records, int(t["step"]))
            flag = max_duration_line(t["step"], t["users"], _seconds(maximum, length), target, rel, samples)
            lines.append(f"MAX: {flag} ({length:.1f} s)")
        elif reason == CI_TARGET:
            lines.append(f"{label}interval within target (aggregate tok/s {width})")
        elif reason == RUN_STOPPED:
            lines.append(f"{label}cut short by the run's stop (aggregate tok/s {width})")
        else:
            running = reason is None and run.get("finished_at") is None and t is timeline[-1]
            lines.append(f"{label}{'still running' if running else reason or 'reason not recorded'} "
                         f"(aggregate tok/s {width})")  # fmt: skip
    return lines


def _ttft_samples(records, step: int) -> int:
    """The step's measured ok requests with a TTFT."""
    measured = (records["step"] == step) & ~records["warmup"].astype(bool) & (records["status"] == "ok")
    return int((measured & records["ttft_s"].notna()).sum()) if "ttft_s" in records.columns else 0


def _seconds(text: str, fallback: float) -> float:
    """'120s' / '2m' / '90' -> seconds, for the console line (the fallback when it cannot be read)."""
    text = str(text).strip()
    units = {"s": 1, "m": 60, "h": 3600}
    try:
        return float(text[:-1]) * units[text[-1]] if text[-1] in units else float(text)
    except (ValueError, IndexError):
        return fallback
