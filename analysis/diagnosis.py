"""Where the batching curve flattens (the knee) and which resource binds there. Pure: works on the step table."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone

import pandas as pd

from . import schedule
from .generator import advice, flagged, reasons
from .histograms import from_columns, ms_text

KNEE_GAIN = 0.10  # a doubling of users that adds less aggregate tok/s than this is past the knee
# KV-cache usage at or above this counts as full. Not lower: with 32 requests running against a cap of
# max_num_seqs = 32, a 128-block cache measured 91 % while 32 more waited; a 1-block prompt still fitted, so the
# batch-size cap, not the cache, held them back.
KV_FULL = 0.95

# The TTFT gap is worth a sentence when at least this share of the client's TTFT is outside vLLM's engine clock,
# and at least GAP_MIN_S: below that it is the HTTP round trip of a fast local server.
GAP_SHARE = 0.5
GAP_MIN_S = 0.010

KV_CACHE = "KV cache"
COMPUTE = "compute"
BATCH_SLOTS = "batch slots (max_num_seqs)"
UNKNOWN = "unknown (no server metrics)"
LOAD_GENERATOR = "the load generator"


@dataclass
class Diagnosis:
    knee_step: int | None = None
    knee_users: int | None = None
    knee_rate_rps: float | None = None  # rate runs (--rates): the knee's intended requests/s
    binding: dict[int, str] = field(default_factory=dict)  # step -> resource, for the steps at and after the knee
    text: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["binding"] = {str(k): v for k, v in self.binding.items()}
        return d


def gain_per_doubling(tok_s_before: float, tok_s_after: float, users_before: float, users_after: float) -> float:
    """Gain per doubling = (after / before) ** (1 / log2(users_after / users_before)) - 1 (users, or the rate)."""
    if not (tok_s_before > 0) or not (tok_s_after >= 0) or users_after <= users_before:
        return math.nan
    return (tok_s_after / tok_s_before) ** (1 / math.log2(users_after / users_before)) - 1


def _count(v: float | None) -> str:
    return "an unknown number of" if v is None or pd.isna(v) else f"{v:.0f}"


def binding_resource(row: pd.Series) -> str:
    """The load generator when the step is generator-bound (its timings cannot be trusted, so it comes first);
    KV cache when it is full (>= 95 %) or preempts; batch slots when requests wait with KV cache to spare;
    else compute."""
    if flagged(row.get("generator_bound")):
        return LOAD_GENERATOR
    kv, waiting, preempt = row.get("kv_cache_usage_max"), row.get("waiting_max"), row.get("preemptions")
    if kv is None or pd.isna(kv):
        return UNKNOWN
    if kv >= KV_FULL or (not pd.isna(preempt) and preempt > 0):
        return KV_CACHE
    if not pd.isna(waiting) and waiting > 0:
        return BATCH_SLOTS
    return COMPUTE


def _load(row: pd.Series) -> str:
    """A step's load in words: '16 users', or '4 req/s' for a rate step."""
    rate = row.get("rate_rps")
    if rate is not None and not pd.isna(rate):
        return schedule.rate_label(float(rate))
    return f"{int(row['users'])} users"


def _present(value: object) -> bool:
    return value is not None and not pd.isna(value)


def queue_sentence(row: pd.Series) -> str:
    """vLLM's queue time at a step in numbers that hold: the exact mean (_sum / _count) and the p99 as its bucket
    bounds (or its value when they pin it down); '' without the series."""
    mean = row.get("server_queue_time_mean_s")
    if not _present(mean):
        return ""
    p99 = from_columns(
        0.99, row.get("server_queue_time_p99_low_s"), row.get("server_queue_time_p99_high_s"),
        row.get("server_queue_time_p99_s"),
    )  # fmt: skip
    tail = f", p99 {p99.text()}" if p99.text() != "-" else ""
    return f"In vLLM's queue requests waited {ms_text(float(mean))} on average{tail}."


def gap_sentence(row: pd.Series) -> str:
    """The TTFT gap, when most of the client's TTFT is outside vLLM's engine clock: means only (both exact, over the
    same requests); '' otherwise."""
    gap, server = row.get("ttft_gap_mean_s"), row.get("server_ttft_mean_s")
    if not (_present(gap) and _present(server)):
        return ""
    client = float(gap) + float(server)
    if not client > 0 or gap < GAP_MIN_S or gap < GAP_SHARE * client:
        return ""
    return (
        f"{gap / client:.0%} of the TTFT is outside vLLM's engine: {ms_text(client)} on average at the client "
        f"against vLLM's own {ms_text(float(server))} for the same requests (HTTP, tokenization, detokenization, "
        "streaming, network)."
    )


def _binding_line(row: pd.Series, resource: str) -> str:
    """The binding resource's sentence, then what the server's own clocks add (queue time, TTFT gap)."""
    line = _resource_line(row, resource)
    if resource in (KV_CACHE, BATCH_SLOTS):
        line = " ".join(s for s in (line, queue_sentence(row)) if s)
    if resource in (KV_CACHE, BATCH_SLOTS, COMPUTE):
        line = " ".join(s for s in (line, gap_sentence(row)) if s)
    return line


def _resource_line(row: pd.Series, resource: str) -> str:
    users = _load(row)
    if resource == LOAD_GENERATOR:
        return (
            f"At {users} the load generator binds ({reasons(row)}): the client could not keep up, so this "
            f"step's latencies read high and its throughput low; {advice(row)}."
        )
    if resource == KV_CACHE:
        return (
            f"At {users} the KV cache binds: usage peaked at {row['kv_cache_usage_max']:.0%}, "
            f"up to {_count(row.get('waiting_max'))} requests waited and {_count(row.get('preemptions'))} were "
            "preempted."
        )
    if resource == BATCH_SLOTS:
        return (
            f"At {users} requests wait (up to {_count(row['waiting_max'])}) while the KV cache "
            f"has room (peak {row['kv_cache_usage_max']:.0%}): the batch-size limit binds."
        )
    if resource == COMPUTE:
        return (
            f"At {users} compute binds: throughput is flat while the KV cache has room "
            f"(peak {row['kv_cache_usage_max']:.0%}) and nothing waits."
        )
    return f"At {users} the binding resource is unknown: no server metrics."


def diagnose(table: pd.DataFrame) -> Diagnosis:
    """The knee: the first step after which doubling users (the rate, in a --rates run) adds under 10 % aggregate
    tok/s; the binding resource of every step from the knee on, and of every generator-bound step (before the knee,
    or without one); then every step of a rate run that fell behind its schedule."""
    d = Diagnosis()
    rates = schedule.is_rate_run(table)
    # A rate run holds the same pool of users at every step: its load is the rate, so the knee is keyed on it.
    key, unit = ("rate_rps", "the rate") if rates else ("users", "users")
    rows = table.sort_values(key).reset_index(drop=True)
    for i in range(len(rows) - 1):
        a, b = rows.iloc[i], rows.iloc[i + 1]
        gain = gain_per_doubling(a["aggregate_tok_s"], b["aggregate_tok_s"], a[key], b[key])
        if not pd.isna(gain) and gain < KNEE_GAIN:
            d.knee_step, d.knee_users = int(a["step"]), int(a["users"])
            if rates:
                d.knee_rate_rps = float(a["rate_rps"])
            d.text.append(
                f"Aggregate throughput flattens at {_load(a)}: going to {_load(b)} changed it "
                f"from {a['aggregate_tok_s']:.0f} to {b['aggregate_tok_s']:.0f} tok/s ({gain * 100:+.0f} % per "
                f"doubling of {unit})."
            )
            break
    if d.knee_step is None and len(rows) >= 2:
        if flagged(rows.iloc[-1].get("generator_bound")):
            room = "whether the server still had room at the highest step is unknown: the load generator bound there"
        else:
            room = "the server still had room at the highest step"
        d.text.append(f"No knee: every doubling of {unit} added at least 10 % aggregate tok/s; {room}.")
    knee = None if d.knee_step is None else rows.loc[rows["step"] == d.knee_step, key].iloc[0]
    for _, row in rows.iterrows():
        past_knee = knee is not None and row[key] >= knee
        if past_knee or flagged(row.get("generator_bound")):
            resource = binding_resource(row)
            d.binding[int(row["step"])] = resource
            d.text.append(_binding_line(row, resource))
    for _, row in rows.iterrows():
        if schedule.flagged(row.get("schedule_behind")):
            d.text.append(schedule.behind_line(row))
    return d


def utc(t: float | None) -> str | None:
    """A Unix time as 'YYYY-MM-DD HH:MM:SS UTC'."""
    if t is None:
        return None
    return datetime.fromtimestamp(float(t), tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def worker_lines(workers: list[dict], started_at: float | None) -> list[str]:
    """One plain sentence per worker that went missing or never sent its final report."""
    out = []
    t0 = started_at or 0.0
    for w in workers:
        name = w.get("worker") or w.get("client_id")
        if w.get("missing_at") is not None:
            out.append(
                f"Worker {name} went missing {w['missing_at'] - t0:.1f} s into the run ({utc(w['missing_at'])}); "
                f"{w.get('records_received', 0)} of its records reached the master (any later ones are in its own "
                "records file on its host, merged when that file is in this run directory)."
            )
        elif w.get("final_at") is None:
            out.append(f"Worker {name} sent no final report; {w.get('records_received', 0)} records arrived.")
    return out
