"""Repeated runs (--repeat N, issue 35): the whole load plan run N times, one trial after another.

The timeline keeps a unique running `step` per step run (the records are tagged with it) and, with --repeat, each
entry's `plan_step` and `trial`. steps.csv keeps one row per plan step: its core columns computed over the requests
of all its trials pooled (analysis/steps.step_table groups the entries with `plan_groups`), the columns measured over
a window of the server or the machine averaged over the trials (`pooled_table`), and the across-trial section
(glossary/trials.py: the trials' own values' mean with a t-interval). trials.csv has each trial's own rows: the same
step table over each timeline entry alone. Pure: no Locust, no network.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from .glossary import TRIAL_METRICS, TRIALS, aligned, format_value, names
from .uncertainty import Interval, t_interval

TRIALS_FILE = "trials.csv"
TRIAL_KEYS = ("plan_step", "trial", "trials")
TRIAL_COLUMNS = names(TRIALS)


def has_trials(timeline: list[dict]) -> bool:
    """The run repeated its plan (--repeat N > 1): its timeline entries carry their trial."""
    return any(t.get("trial") is not None for t in timeline or [])


def plan_groups(timeline: list[dict]) -> list[list[dict]]:
    """The timeline's entries grouped by plan step, in the order the plan steps first ran; an entry without a plan
    step (a run without --repeat) is a group of its own, so the step table has one row per entry as before."""
    groups: dict[object, list[dict]] = {}
    for k, entry in enumerate(timeline):
        key = ("plan", entry["plan_step"]) if entry.get("plan_step") is not None else ("entry", k)
        groups.setdefault(key, []).append(entry)
    return list(groups.values())


def separate(timeline: list[dict]) -> list[dict]:
    """The timeline with each entry on its own (no plan step, no trial): the step table of each trial's steps."""
    return [{k: v for k, v in entry.items() if k not in TRIAL_KEYS} for entry in timeline]


def _trial_of(timeline: list[dict]) -> dict[int, tuple[int, int]]:
    """running step -> (plan step, trial)."""
    return {int(t["step"]): (int(t["plan_step"]), int(t["trial"])) for t in timeline if t.get("trial") is not None}


def trials_table(per_entry: pd.DataFrame, timeline: list[dict]) -> pd.DataFrame:
    """trials.csv: each (trial, step) row of the step table computed over that entry alone, led by its trial and
    plan step (`step` stays the running step the records carry)."""
    of = _trial_of(timeline)
    steps = per_entry["step"].astype(int)
    out = per_entry.copy()
    out.insert(0, "plan_step", [of.get(s, (s, 1))[0] for s in steps])
    out.insert(0, "trial", [of.get(s, (s, 1))[1] for s in steps])
    return out.reset_index(drop=True)


def _is_flag(cells: pd.Series) -> bool:
    values = [v for v in cells if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return bool(values) and all(isinstance(v, (bool, np.bool_)) for v in values)


def _combine(name: str, cells: pd.Series) -> object:
    """A window-measured column over a step's trials: a flag set when any trial's is, a number the trials' mean (the
    window times: the first start, the last end), text the trials' values when they agree, else each one once."""
    known = cells.dropna()
    if not len(known):
        return None if cells.dtype == object else math.nan
    if name == "window_start_time":
        return float(known.min())
    if name == "window_end_time":
        return float(known.max())
    if _is_flag(known):
        return bool(known.astype(bool).any())
    if pd.api.types.is_numeric_dtype(cells.dtype) and not pd.api.types.is_bool_dtype(cells.dtype):
        return float(pd.to_numeric(known).mean())
    texts = list(dict.fromkeys(str(v) for v in known))
    return texts[0] if len(texts) == 1 else "; ".join(texts)


def pooled_table(core: pd.DataFrame, per_entry: pd.DataFrame, timeline: list[dict]) -> pd.DataFrame:
    """steps.csv of a repeated run: per plan step the pooled core columns (`core`: the step table over its trials'
    requests together), the other columns (the server's series, the self-checks, the GPUs, why each step ended: each
    measured over one window) combined over its trials (`_combine`), in per_entry's column order; then the
    across-trial section."""
    of = _trial_of(timeline)
    plan = per_entry["step"].astype(int).map(lambda s: of.get(s, (s, 1))[0])
    rows = []
    for _, r in core.iterrows():
        group = per_entry[plan == int(r["step"])]
        row = {}
        for name in per_entry.columns:
            row[name] = r[name] if name in core.columns else _combine(name, group[name])
        rows.append(row)
    table = pd.DataFrame(rows, columns=list(per_entry.columns))
    if "probe" in table.columns:
        table["probe"] = table["probe"].astype("Int64")
    across = across_trials(trials_table(per_entry, timeline))
    return table.merge(across, left_on="step", right_on="plan_step", how="left").drop(columns="plan_step")


def plan_verdicts(verdicts: dict, timeline: list[dict]) -> dict:
    """Per-entry verdicts (by running step, e.g. the GPUs' roofline regime) as per-plan-step ones for the pooled
    table: a step's verdict when every trial that has one gives the same regime (the last trial's), else none."""
    of = _trial_of(timeline)
    if not of:
        return verdicts
    by_plan: dict[int, list] = {}
    for step, verdict in verdicts.items():
        by_plan.setdefault(of.get(int(step), (int(step), 1))[0], []).append(verdict)
    return {plan: found[-1] for plan, found in by_plan.items() if len({v.regime for v in found}) == 1}


def trial_interval(values: list[float] | np.ndarray) -> Interval:
    """The across-trial interval: mean ± t(0.975, N - 1) * s / sqrt(N) over the trials' own values (NaN left out),
    its lower bound clipped at 0 (every metric it is taken of, a rate or a time, is >= 0: a bound below would only
    say the trials are few and far apart, which the upper bound already says)."""
    ci = t_interval(values)
    return Interval(ci.value, max(ci.low, 0.0) if not math.isnan(ci.low) else ci.low, ci.high, ci.n, ci.note)


def disagree(lows: np.ndarray, highs: np.ndarray) -> bool | None:
    """Two trials' within-step intervals do not overlap (the lowest upper bound below the highest lower bound); None
    when fewer than 2 trials have an interval."""
    known = ~(np.isnan(lows) | np.isnan(highs))
    if known.sum() < 2:
        return None
    return bool(highs[known].min() < lows[known].max())


def across_trials(trials: pd.DataFrame) -> pd.DataFrame:
    """The across-trial section per plan step (glossary/trials.py), from trials.csv's rows."""
    rows = []
    for plan_step, group in trials.groupby("plan_step", sort=True):
        row: dict = {"plan_step": int(plan_step), "trials": int(group["trial"].nunique())}
        for name, _label in TRIAL_METRICS:
            values = pd.to_numeric(group[name], errors="coerce").to_numpy(float) if name in group else np.array([])
            ci = trial_interval(values)
            row[f"{name}_trials_mean"], row[f"{name}_trials_ci_low"], row[f"{name}_trials_ci_high"] = (
                ci.value,
                ci.low,
                ci.high,
            )
        tok = pd.to_numeric(group["aggregate_tok_s"], errors="coerce")
        row["aggregate_tok_s_trials_min"] = float(tok.min()) if tok.notna().any() else math.nan
        row["aggregate_tok_s_trials_max"] = float(tok.max()) if tok.notna().any() else math.nan
        lows = pd.to_numeric(group["aggregate_tok_s_ci_low"], errors="coerce").to_numpy(float)
        highs = pd.to_numeric(group["aggregate_tok_s_ci_high"], errors="coerce").to_numpy(float)
        row["trials_disagree"] = disagree(lows, highs)
        rows.append(row)
    out = pd.DataFrame(rows, columns=["plan_step", *TRIAL_COLUMNS])
    out["trials_disagree"] = out["trials_disagree"].astype(object)
    return out


def trials_summary(table: pd.DataFrame, trials: pd.DataFrame | None) -> dict | None:
    """summary.json's `trials`: per plan step each trial's tok/s and percentiles with its within-step interval, the
    across-trial mean and interval, and whether the trials disagree; None without --repeat."""
    if trials is None or "trials" not in table.columns:
        return None
    steps = []
    for r in table.to_dict(orient="records"):
        group = trials[trials["plan_step"] == int(r["step"])]
        entry: dict = {"step": int(r["step"]), "users": r.get("users"), "trials": r.get("trials"),
                       "disagree": r.get("trials_disagree")}  # fmt: skip
        for name, _label in TRIAL_METRICS:
            entry[name] = {
                "pooled": _num(r.get(name)),
                "pooled_ci": [_num(r.get(f"{name}_ci_low")), _num(r.get(f"{name}_ci_high"))],
                "trials_mean": _num(r.get(f"{name}_trials_mean")),
                "trials_ci": [_num(r.get(f"{name}_trials_ci_low")), _num(r.get(f"{name}_trials_ci_high"))],
                "per_trial": [_trial_entry(t, name) for t in group.to_dict(orient="records")],
            }
        steps.append(entry)
    return {
        "trials": int(trials["trial"].max()) if len(trials) else 0,
        "interval": "t-interval over the trials' own values: mean ± t(0.975, N-1) * s / sqrt(N)",
        "steps": steps,
        "disagreeing_steps": [s["step"] for s in steps if s["disagree"]],
    }


def _trial_entry(row: dict, name: str) -> dict:
    """One trial's value of `name` with its within-step interval."""
    ci = [_num(row.get(f"{name}_ci_low")), _num(row.get(f"{name}_ci_high"))]
    return {"trial": int(row["trial"]), "value": _num(row.get(name)), "ci": ci}


def _num(value: object) -> float | None:
    """A JSON number: NaN and missing as None (missing stays missing)."""
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def console_lines(table: pd.DataFrame) -> list[str]:
    """The console's "Trials" table: per step the pooled tok/s with its within-step interval beside the across-trial
    mean and interval, the trials' lowest and highest, TTFT p99 and TPOT p50 across trials; [] without --repeat."""
    if "trials" not in table.columns or not table["trials"].notna().any():
        return []
    rows = [["step", "users", "trials", "tok/s pooled", "across trials", "lowest", "highest", "TTFT p99 across",
             "TPOT p50 across", "agree"]]  # fmt: skip
    for r in table.to_dict(orient="records"):
        rows.append([
            str(r["step"]), str(r["users"]), format_value(r.get("trials"), "int"),
            _with_interval(r, "aggregate_tok_s", "_ci_low", "_ci_high", "num1", value="aggregate_tok_s"),
            _with_interval(r, "aggregate_tok_s", "_trials_ci_low", "_trials_ci_high", "num1"),
            format_value(r.get("aggregate_tok_s_trials_min"), "num1"),
            format_value(r.get("aggregate_tok_s_trials_max"), "num1"),
            _with_interval(r, "ttft_p99_s", "_trials_ci_low", "_trials_ci_high", "ms1"),
            _with_interval(r, "tpot_p50_s", "_trials_ci_low", "_trials_ci_high", "ms1"),
            "DISAGREE" if r.get("trials_disagree") is True else "ok" if r.get("trials_disagree") is False else "-",
        ])  # fmt: skip
    title = (
        "Trials (--repeat: tok/s pooled over the step's trials ± its within-step interval, then the across-trial mean "
        "[95 % t-interval over the trials' own values]; latencies in ms; DISAGREE: two trials' within-step "
        "intervals do not overlap)"
    )
    return ["", title, *aligned(rows)]


def _with_interval(row: dict, name: str, low: str, high: str, fmt: str, value: str | None = None) -> str:
    """'mean [low, high]' (or 'value ±half-width' for the pooled one); '-' without a value."""
    centre = row.get(value or f"{name}_trials_mean")
    text = format_value(centre, fmt)
    lo, hi = row.get(f"{name}{low}"), row.get(f"{name}{high}")
    if text == "-" or _num(lo) is None or _num(hi) is None:
        return text
    if value is not None:
        return f"{text} ±{format_value((hi - lo) / 2, fmt)}"
    return f"{text} [{format_value(lo, fmt)}, {format_value(hi, fmt)}]"
