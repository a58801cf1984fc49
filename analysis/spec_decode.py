"""Speculative decoding (issue 35): the server's draft and acceptance counters over each step's measured window and the
client's tokens per chunk (steps.csv's last section), the run's totals (summary.json's `spec_decode`) and the
console's "Speculative decoding" table, shown only when the server exports the counters.

The server's side is vLLM's own arithmetic (vllm/v1/spec_decode/metrics.py): acceptance rate = accepted / draft
tokens, mean acceptance length = 1 + accepted / drafts, per draft position k: accepted at k / drafts, each on the
counters' increase over the window (ServerSeries.increase: a drop is a restart). The per-position rates have as many
values as the server's speculative tokens, so they go to summary.json and the report, not to steps.csv's fixed
columns. The client's side needs no server: a speculating engine step streams its tokens in one chunk, and with
continuous usage each chunk's increase of usage.completion_tokens is exact. Pure: no Locust, no network.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from . import glossary
from .server_metrics import UP, ServerSeries
from .servers import CANONICAL
from .steps import measured_masks
from .turns import ratio_interval

SPEC_COLUMNS = glossary.names(glossary.SPEC)
SPEC_SUMMARY = "spec_decode"  # the step table's attrs key of the run's totals (summary.json's `spec_decode`)
DRAFTS = CANONICAL["spec_drafts"]
DRAFT_TOKENS = CANONICAL["spec_draft_tokens"]
ACCEPTED = CANONICAL["spec_accepted_tokens"]
PER_POSITION = CANONICAL["spec_accepted_per_position"]
_SERVER_COUNTS = (("spec_drafts", DRAFTS), ("spec_draft_tokens", DRAFT_TOKENS), ("spec_accepted_tokens", ACCEPTED))


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.nan


def acceptance(drafts: float, draft_tokens: float, accepted: float) -> tuple[float, float]:
    """(acceptance rate = accepted / draft tokens, mean acceptance length = 1 + accepted / drafts); NaN without
    draft tokens or drafts (and when a counter is missing)."""
    return _ratio(accepted, draft_tokens), 1 + _ratio(accepted, drafts)


def interval_increases(server: ServerSeries, metric: str, start: float, end: float) -> pd.Series:
    """A counter's increase over each scrape interval ending inside (start, end], summed over its label sets, indexed
    by the interval's last scrape: the pieces whose sum is ServerSeries.increase (a drop is a restart from 0)."""
    parts = []
    for _, s in server.labelled(metric):
        times, values = s.index.to_numpy(dtype=float), s.to_numpy(dtype=float)
        upto = times <= end
        times, values = times[upto], values[upto]
        before, inside = times <= start, times > start
        if not inside.any():
            continue
        if before.any():
            points, at = np.concatenate([values[before][-1:], values[inside]]), times[inside]
        elif server.first_scrape <= start:
            points, at = np.concatenate([[0.0], values[inside]]), times[inside]  # the series appeared: new
        else:
            points, at = values[inside], times[inside][1:]
        diffs = np.diff(points)
        parts.append(pd.Series(np.where(diffs >= 0, diffs, points[1:]), index=at))
    if not parts:
        return pd.Series(dtype=float)
    return pd.concat(parts).groupby(level=0).sum().sort_index()


def positions(server: ServerSeries) -> list[int]:
    """The draft positions the per-position counter has (0 .. k-1), in order."""
    found = {lab.get("position") for lab, _ in server.labelled(PER_POSITION)}
    return sorted(int(p) for p in found if p is not None and str(p).isdigit())


def server_window(server: ServerSeries | None, start: float, end: float) -> dict:
    """The server's counters over one window: drafts, draft tokens, accepted tokens (NaN without the counter), the
    accepted tokens per position, and the acceptance rate's interval over the scrape intervals."""
    out: dict = {"per_position_accepted": []}
    for name, metric in _SERVER_COUNTS:
        out[name] = server.increase(metric, start, end) if server is not None and server.has(metric) else math.nan
    if server is None or not server.has(DRAFTS):
        out["ci"] = ratio_interval([], [])
        return out
    out["per_position_accepted"] = [
        server.increase(PER_POSITION, start, end, position=str(p)) for p in positions(server)
    ]
    accepted = interval_increases(server, ACCEPTED, start, end)
    pairs = pd.concat({"a": accepted, "d": interval_increases(server, DRAFT_TOKENS, start, end)}, axis=1).fillna(0.0)
    pairs = pairs[pairs["d"] > 0]  # an interval without drafts tells nothing of the rate
    out["ci"] = ratio_interval(pairs["a"], pairs["d"])
    return out


def chunk_stats(ok: pd.DataFrame) -> dict:
    """The client's side over ok requests: tokens per chunk (mean over the requests with usage, and its interval),
    the share of chunks with more than one token and the 99th percentile of a chunk's tokens (over the requests whose
    chunks' counts add up to their usage, so each chunk's count is exact)."""
    out = {"tokens_per_chunk_mean": math.nan, "tokens_per_chunk_mean_ci_low": math.nan,
           "tokens_per_chunk_mean_ci_high": math.nan, "multi_token_chunk_share": math.nan,
           "tokens_per_chunk_p99": math.nan}  # fmt: skip
    if not len(ok) or "output_tokens_estimated" not in ok.columns:
        return out
    tokens = pd.to_numeric(ok["output_tokens"], errors="coerce")
    chunks = pd.to_numeric(ok["chunks"], errors="coerce")
    usage = (ok["output_tokens_estimated"] == False) & (chunks > 0) & tokens.notna()  # noqa: E712 (None: unknown)
    if usage.any():
        ci = ratio_interval(tokens[usage], chunks[usage], clip=False)
        out["tokens_per_chunk_mean"] = ci.value
        out["tokens_per_chunk_mean_ci_low"], out["tokens_per_chunk_mean_ci_high"] = ci.low, ci.high
    if "chunk_tokens" not in ok.columns or not usage.any():
        return out
    lists = [np.asarray(a, dtype=np.int64) for a in ok.loc[usage, "chunk_tokens"].tolist()]
    exact = [a for a, t in zip(lists, tokens[usage].tolist()) if a.size and int(a.sum()) == int(t)]
    if exact:
        per_chunk = np.concatenate(exact)
        out["multi_token_chunk_share"] = float((per_chunk > 1).mean())
        out["tokens_per_chunk_p99"] = float(np.percentile(per_chunk, 99))
    return out


def _step_row(step: int, window: dict, ok: pd.DataFrame) -> dict:
    rate, length = acceptance(window["spec_drafts"], window["spec_draft_tokens"], window["spec_accepted_tokens"])
    row = {"step": step, **{name: window[name] for name, _ in _SERVER_COUNTS}}
    row.update(spec_acceptance_rate=rate, spec_acceptance_length_mean=length)
    row["spec_acceptance_rate_ci_low"], row["spec_acceptance_rate_ci_high"] = window["ci"].low, window["ci"].high
    row.update(chunk_stats(ok))
    return row


def _steps(records: pd.DataFrame, timeline: list[dict]):
    """(step, window start, window end, its measured ok requests) of each step, as the step table counts them."""
    if not len(records):
        for t in timeline:
            yield int(t["step"]), float(t["measure_start"]), float(t["end_time"] or np.inf), records
        return
    measured, cut, stop_time = measured_masks(records, timeline)
    ok = measured & ~cut & (records["status"] == "ok")
    for t in timeline:
        end = float(t["end_time"] or stop_time)
        yield int(t["step"]), float(t["measure_start"]), end, records[ok & (records["step"] == int(t["step"]))]


def spec_table(
    metrics: pd.DataFrame | None, timeline: list[dict], records: pd.DataFrame, model: str | None = None
) -> tuple[pd.DataFrame, dict]:
    """steps.csv's speculative-decoding section (one row per step) and summary.json's `spec_decode`: the run's
    totals over every step's window, the acceptance rate per draft position over the run and per step."""
    server = None
    if metrics is not None and len(metrics):
        # Only the counters read here (and the scrapes' up samples), not every series a second time (step_server_table
        # indexes them all).
        read = metrics["metric"].isin((UP, DRAFTS, DRAFT_TOKENS, ACCEPTED, PER_POSITION))
        server = ServerSeries(metrics[read], model)
    rows, per_step, totals = [], [], {name: [] for name, _ in _SERVER_COUNTS}
    per_position: list[list[float]] = []
    oks = []
    for step, start, end, ok in _steps(records, timeline):
        window = server_window(server, start, end)
        rows.append(_step_row(step, window, ok))
        oks.append(ok)
        for name in totals:
            totals[name].append(window[name])
        per_position.append(window["per_position_accepted"])
        rates = [_ratio(a, window["spec_drafts"]) for a in window["per_position_accepted"]]
        per_step.append({"step": step, "acceptance_rate_per_position": [_json(r) for r in rates]})
    table = pd.DataFrame(rows, columns=["step", *SPEC_COLUMNS])
    summary = _totals(totals, per_position, pd.concat(oks) if oks else records.iloc[0:0])
    summary["steps"] = per_step if summary["drafts"] is not None else []
    return table, summary


def _sum(values: list[float]) -> float | None:
    known = [v for v in values if not math.isnan(v)]
    return float(sum(known)) if known else None


def _json(value: float) -> float | None:
    return None if value is None or math.isnan(value) else float(value)


def _totals(totals: dict[str, list[float]], per_position: list[list[float]], ok: pd.DataFrame) -> dict:
    """The whole measured run: the sums of the steps' increases, their ratios, and the client's chunks."""
    drafts, draft_tokens, accepted = (_sum(totals[name]) for name, _ in _SERVER_COUNTS)
    nan = math.nan
    rate, length = acceptance(
        nan if drafts is None else drafts, nan if draft_tokens is None else draft_tokens,
        nan if accepted is None else accepted,
    )  # fmt: skip
    width = max((len(p) for p in per_position), default=0)
    by_position = [_sum([p[k] for p in per_position if len(p) > k]) for k in range(width)]
    chunks = chunk_stats(ok)
    return {
        "drafts": drafts,
        "draft_tokens": draft_tokens,
        "accepted_tokens": accepted,
        "acceptance_rate": _json(rate),
        "acceptance_length_mean": _json(length),
        "acceptance_rate_per_position": [None if a is None else _json(_ratio(a, drafts or 0.0)) for a in by_position],
        "tokens_per_chunk_mean": _json(chunks["tokens_per_chunk_mean"]),
        "multi_token_chunk_share": _json(chunks["multi_token_chunk_share"]),
        "tokens_per_chunk_p99": _json(chunks["tokens_per_chunk_p99"]),
    }


def totals_line(summary: dict | None) -> str | None:
    """One sentence of the run's totals; None when the server exported no speculative-decoding counters."""
    if not summary or summary.get("drafts") is None:
        return None
    rate, length = summary.get("acceptance_rate"), summary.get("acceptance_length_mean")
    text = (
        f"Over the measured run: acceptance rate {glossary.format_value(rate, 'pct1')} "
        f"({glossary.format_value(summary['accepted_tokens'], 'int')} of "
        f"{glossary.format_value(summary['draft_tokens'], 'int')} draft tokens), mean acceptance length "
        f"{glossary.format_value(length, 'num2')} over {glossary.format_value(summary['drafts'], 'int')} drafts"
    )
    per_position = summary.get("acceptance_rate_per_position") or []
    if per_position:
        text += "; per position: " + ", ".join(glossary.format_value(r, "num3") for r in per_position)
    return text


def console_lines(table: pd.DataFrame, summary: dict | None) -> list[str]:
    """The console's "Speculative decoding" table and the run's totals; nothing when the server exported no
    speculative-decoding counters."""
    if not len(table) or not glossary.applies(table, glossary.SPEC):
        return []
    section = glossary.SECTIONS[glossary.SPEC]
    names = [c.name for c, _ in section.shown()]
    rows = glossary.console_rows(table, glossary.SPEC)
    for cells, r in zip(rows[1:], table.to_dict(orient="records")):
        for name, fmt in (("spec_acceptance_rate", "pct1"), ("tokens_per_chunk_mean", "num2")):
            low, high = r.get(f"{name}_ci_low"), r.get(f"{name}_ci_high")
            if name in names and low is not None and high is not None and not (pd.isna(low) or pd.isna(high)):
                cells[names.index(name)] += " ±" + glossary.format_value((high - low) / 2, fmt)  # as the batching curve
    line = totals_line(summary)
    return ["", section.title, *glossary.aligned(rows), *([line] if line else [])]
