"""Per-turn results of a conversation run (--turns): one row per turn index, from the raw per-request records.

A turn's requests are the k-th request of every conversation, over every step, measured by the step table's rules
(analysis/steps.py: started after their step's warm-up, not in flight when the load generator began to stop).
The prefix-cache hit rate is the server's own count per request (usage.prompt_tokens_details.cached_tokens), so it
is missing, never 0, when the server sent none. Pure: no I/O but the caller's.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import special

from . import glossary
from .glossary import mean
from .steps import FEW_MARK, TOO_FEW, measured_masks, timeline_from_records
from .uncertainty import CONFIDENCE, Interval, quantile_interval

TURNS_FILE = "turns.csv"
TURN_COLUMNS = glossary.names(glossary.TURNS)
# (column, the request column it is a percentile of, q): each with an order-statistic interval.
QUANTILES = (("ttft_p50_s", "ttft_s", 0.50), ("ttft_p95_s", "ttft_s", 0.95), ("tpot_p50_s", "tpot_s", 0.50))


def has_turns(records: pd.DataFrame) -> bool:
    """A conversation run: some record carries its turn."""
    return "turn" in records.columns and bool(records["turn"].notna().any())


def ratio_interval(
    numerators: np.ndarray | pd.Series,
    denominators: np.ndarray | pd.Series,
    confidence: float = CONFIDENCE,
    clip: bool = True,
) -> Interval:
    """R = sum(c) / sum(p), ± t(n-1, (1+c)/2) * sqrt(sum((c - R p)^2) / (n-1)) / (sqrt(n) * mean(p)) (the ratio
    estimator's interval over n independent pairs), clipped to [0, 1] (a share; `clip` False: a ratio that may
    exceed 1, e.g. tokens per chunk); NaN bounds below 2 pairs."""
    c = np.asarray(numerators, dtype=float)
    p = np.asarray(denominators, dtype=float)
    keep = ~(np.isnan(c) | np.isnan(p))
    c, p = c[keep], p[keep]
    n = int(c.size)
    if n == 0 or not p.sum() > 0:
        return Interval(math.nan, n=n, note="no samples")
    r = float(c.sum() / p.sum())
    if n < 2:
        return Interval(r, n=n, note="too few samples")
    spread = math.sqrt(float(((c - r * p) ** 2).sum()) / (n - 1))
    half = float(special.stdtrit(n - 1, (1 + confidence) / 2)) * spread / (math.sqrt(n) * float(p.mean()))
    if not clip:
        return Interval(r, r - half, r + half, n)
    return Interval(r, max(0.0, r - half), min(1.0, r + half), n)


def _numeric(frame: pd.DataFrame, name: str) -> pd.Series:
    """A column as floats (missing: NaN); all NaN when the frame lacks it (records of an older version)."""
    if name not in frame.columns:
        return pd.Series(np.nan, index=frame.index, dtype=float)
    return pd.to_numeric(frame[name], errors="coerce").astype(float)


def _cached(ok: pd.DataFrame, zero_omitted: bool) -> pd.Series:
    """cached_prompt_tokens of the ok requests; with a server that leaves out a zero (SGLang), an answer with usage
    but without it had none cached, once some answer of the run carries it."""
    cached = _numeric(ok, "cached_prompt_tokens")
    if zero_omitted and cached.notna().any():
        cached = cached.where(cached.notna() | _numeric(ok, "prompt_tokens").isna(), 0.0)
    return cached


def turn_table(records: pd.DataFrame, timeline: list[dict] | None = None, zero_omitted: bool = False) -> pd.DataFrame:
    """One row per turn index (turns.csv): requests, prompt and history length, TTFT p50/p95 and TPOT p50 with
    their intervals, prefix-cache hit rate = sum(cached_prompt_tokens) / sum(prompt_tokens) over the requests that
    carry it; `zero_omitted`: the server leaves out cached_tokens when 0 (servers.ServerProfile)."""
    if not has_turns(records):
        return pd.DataFrame(columns=TURN_COLUMNS)
    timeline = timeline or timeline_from_records(records)
    measured, cut, _ = measured_masks(records, timeline)
    steps = [int(t["step"]) for t in timeline if "step" in t]
    in_run = records["step"].isin(steps) & measured & ~cut & records["turn"].notna()
    is_ok = records["status"] == "ok"
    ok_all = records[in_run & is_ok]
    cached_all = _cached(ok_all, zero_omitted)
    failed = records.loc[in_run & ~is_ok, "turn"].astype(int).value_counts()
    rows = []
    for turn in sorted({*ok_all["turn"].astype(int), *failed.index}):
        ok = ok_all[ok_all["turn"].astype(int) == turn]
        row: dict = {
            "turn": turn,
            "requests": len(ok),
            "errors": int(failed.get(turn, 0)),
            "prompt_tokens_mean": mean(_numeric(ok, "prompt_tokens")),
            "history_tokens_mean": mean(_numeric(ok, "history_tokens")),
        }
        few = []
        intervals = {}
        for column, metric, q in QUANTILES:
            ci = quantile_interval(_numeric(ok, metric).to_numpy(), q)
            intervals[column] = ci
            row[column] = ci.value
            if ci.note == TOO_FEW:
                few.append(column)
        cached, prompt = cached_all[ok.index], _numeric(ok, "prompt_tokens")
        carry = cached.notna() & prompt.notna()
        hit = ratio_interval(cached[carry], prompt[carry])
        intervals["prefix_cache_hit_rate"] = hit
        row["prefix_cache_hit_rate"] = hit.value
        row["prefix_cache_requests"] = int(carry.sum())
        for name, ci in intervals.items():
            row[f"{name}_ci_low"], row[f"{name}_ci_high"] = ci.low, ci.high
        row["few_samples"] = " ".join(few) or None
        rows.append(row)
    return pd.DataFrame(rows, columns=TURN_COLUMNS)


def format_turns(table: pd.DataFrame) -> str:
    """The per-turn table for the console: latencies in ms, missing values as '-', a percentile with too few
    samples for an interval marked '~'."""
    rows = glossary.console_rows(table, glossary.TURNS)
    shown = [c.name for c, _ in glossary.SECTIONS[glossary.TURNS].shown()]
    for cells, few in zip(rows[1:], table["few_samples"].tolist()):
        for name in few.split() if isinstance(few, str) else ():
            if name in shown and cells[shown.index(name)] != "-":
                cells[shown.index(name)] += FEW_MARK
    return "\n".join([glossary.SECTIONS[glossary.TURNS].title, *glossary.aligned(rows)])
