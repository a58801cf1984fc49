"""Where the batching curve flattens (the knee), whether the server is past its batch limit, which steps not to
trust, and which resource binds where. Pure: works on the step table."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone

import pandas as pd

from . import glossary, kinds, roofline, schedule
from . import knee as knee_rules
from .generator import advice, flagged, reasons
from .histograms import from_columns, ms_text
from .steps import throughput_column, unstable
from .thresholds import KNEE_GAIN

# KV-cache usage at or above this counts as full. Not lower: with 32 requests running against a cap of
# max_num_seqs = 32, a 128-block cache measured 91 % while 32 more waited; a 1-block prompt still fitted, so the
# batch-size cap, not the cache, held them back.
KV_FULL = knee_rules.KV_FULL

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
    knee_users: int | None = None  # the highest load before the flattening (a rate run: its user pool)
    knee_rate_rps: float | None = None  # rate runs (--rates): the knee's intended requests/s
    binding: dict[int, str] = field(default_factory=dict)  # step -> resource, at and past the knee (or saturation)
    text: list[str] = field(default_factory=list)
    knee_range: list[float] | None = None  # [the knee's load, the next step's]: the knee lies in between
    saturated_step: int | None = None  # the first step where the server's own state says its batch is full
    saturated_users: int | None = None
    saturated_rate_rps: float | None = None
    outlier_steps: list[int] = field(default_factory=list)  # left out of the knee: rerun them
    unstable_steps: list[int] = field(default_factory=list)
    # step -> the GPUs' roofline regime (analysis.roofline: memory_bound, compute_bound, neither, "" untold), for the
    # steps the diagnosis speaks of: those it names a binding resource for, else the knee or the highest load
    gpu_regime: dict[int, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["binding"] = {str(k): v for k, v in self.binding.items()}
        d["gpu_regime"] = {str(k): v for k, v in self.gpu_regime.items()}
        return d


def gain_per_doubling(tok_s_before: float, tok_s_after: float, users_before: float, users_after: float) -> float:
    """Gain per doubling = (after / before) ** (1 / log2(users_after / users_before)) - 1 (users, or the rate)."""
    if not (tok_s_before > 0) or not (tok_s_after >= 0) or users_after <= users_before:
        return math.nan
    return (tok_s_after / tok_s_before) ** (1 / math.log2(users_after / users_before)) - 1


def _count(v: float | None) -> str:
    return "an unknown number of" if v is None or pd.isna(v) else f"{v:.0f}"


def binding_resource(row: pd.Series) -> str:
    """KV cache when it is full (>= 95 %) or preempts; batch slots when requests wait with KV cache to spare; the
    load generator when the step is generator-bound and nothing waited or was preempted at the server (its timings
    cannot be trusted, so it comes first then); else compute."""
    server = _server_resource(row)
    if flagged(row.get("generator_bound")) and not _over_its_limit(row):
        return LOAD_GENERATOR
    # Generator-bound while requests queued at the server or were preempted: the client delivered more than the
    # server could take, so its lag distorts the latencies, not what binds. On the 2-core machine a 2-3 ms lag p99
    # had the real vLLM's full, preempting KV cache reported as "the load generator binds". A full cache alone is
    # not that proof (the fake server's gauge reads 100 % at 8 streams with no limit at all).
    return server


def _over_its_limit(row: pd.Series) -> bool:
    """The server held more work than it could run: requests waited (waiting_max > 0) or were preempted."""
    waiting, preempt = row.get("waiting_max"), row.get("preemptions")
    return bool((waiting is not None and not pd.isna(waiting) and waiting > 0)
                or (preempt is not None and not pd.isna(preempt) and preempt > 0))  # fmt: skip


def _server_resource(row: pd.Series) -> str:
    """What the server's own metrics say binds: KV cache, batch slots, compute, or unknown without them."""
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
        if flagged(row.get("generator_bound")):
            line += (
                f" The load generator was flagged too ({reasons(row)}): this step's latencies may read high; "
                f"{advice(row)}."
            )
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


def _step_name(row: pd.Series) -> str:
    """A step named by its load: 'the 2-user step', 'the 4 req/s step'."""
    rate = row.get("rate_rps")
    if rate is not None and not pd.isna(rate):
        return f"the {schedule.rate_label(float(rate))} step"
    return f"the {int(row['users'])}-user step"


def _unit(y_col: str) -> str:
    """The curve's throughput column's unit in words: tok/s, or a batch kind's items/s (its glossary unit)."""
    return "tok/s" if y_col == knee_rules.THROUGHPUT else glossary.STEP_TABLE[y_col].unit


def _name(y_col: str) -> str:
    """Its name in the knee's sentence: 'Aggregate throughput', 'Embeddings throughput (inputs/s)'."""
    kind = kinds.by_item_rate(y_col)
    return "Aggregate throughput" if kind is None else f"{kind.title} throughput ({_unit(y_col)})"


def _tok_s(row: pd.Series, y_col: str = knee_rules.THROUGHPUT) -> str:
    """Its throughput with the interval's half-width when there is one: '5512 ± 41 tok/s', '412 ± 9 inputs/s'."""
    y, low, high = (knee_rules.num(row, c) for c in (y_col, f"{y_col}_ci_low", f"{y_col}_ci_high"))
    unit = _unit(y_col)
    if math.isnan(low) or math.isnan(high):
        return f"{y:.0f} {unit}"
    return f"{y:.0f} ± {(high - low) / 2:.0f} {unit}"


def _sentence(text: str) -> str:
    return text[0].upper() + text[1:]


def _between(low: pd.Series, high: pd.Series) -> str:
    """Two steps' loads as a range: '16 and 32 users', '4 and 8 req/s'."""
    rate = low.get("rate_rps")
    if rate is not None and not pd.isna(rate):
        return f"{float(rate):g} and {schedule.rate_label(float(high['rate_rps']))}"
    return f"{int(low['users'])} and {int(high['users'])} users"


def _knee_line(rows: pd.DataFrame, k: knee_rules.Knee, key: str, unit: str, y_col: str = knee_rules.THROUGHPUT) -> str:
    """Where the curve flattens, between which loads, and what the step after it did."""
    at = rows.loc[rows["step"] == k.step].iloc[0]
    nxt = rows.loc[rows[key] == k.range[1]].iloc[0]
    if nxt[key] >= 1.5 * at[key]:
        gain = gain_per_doubling(at[y_col], nxt[y_col], at[key], nxt[key])
        per = "" if pd.isna(gain) else f" ({gain * 100:+.0f} % per doubling of {unit})"
    else:
        # Loads this close (a capacity search's bisection: 16 and 17 users) make a rate per doubling of a small
        # change: -4 % read as -61 % per doubling. The change itself is what was measured.
        change = nxt[y_col] / at[y_col] - 1 if at[y_col] > 0 else math.nan
        per = "" if pd.isna(change) else f" ({change * 100:+.0f} %)"
    return (
        f"{_name(y_col)} flattens at {_load(at)}: the knee lies between {_between(at, nxt)}. Going "
        f"to {_load(nxt)} changed it from {_tok_s(at, y_col)} to {_tok_s(nxt, y_col)}{per}, and no later step rose "
        "more than "
        f"{KNEE_GAIN * 100:.0f} % above it beyond the noise."
    )


def _unmeasured_line(steps: list[int], total: int) -> str:
    """Steps that sent no request: no throughput was measured there, so no knee is judged on them."""
    names = ", ".join(map(str, steps))
    if total - len(steps) < 2:
        return (
            f"No knee can be judged: step{'s' if len(steps) > 1 else ''} {names} sent no request, which leaves "
            f"{total - len(steps)} of {total} steps measured (the run's warnings say why)."
        )
    return (
        f"Step{'s' if len(steps) > 1 else ''} {names} sent no request (no throughput measured there, the run's "
        "warnings say why): left out of the knee."
    )


def _saturated_line(row: pd.Series) -> str:
    """The server's own word that its batch is full, from that step on."""
    waiting = max((v for v in (knee_rules.num(row, "waiting_mean"), knee_rules.num(row, "waiting_capacity_max"))
                   if not math.isnan(v)), default=math.nan)  # fmt: skip
    kv, preempted = knee_rules.num(row, "kv_cache_usage_max"), knee_rules.num(row, "preemptions")
    why = [f"KV-cache usage peaked at {kv:.0%}"] if not math.isnan(kv) else []
    if not math.isnan(preempted) and preempted > 0:
        why.append(f"{preempted:.0f} requests were preempted")
    return (
        f"From {_load(row)} the server is past its batch limit: requests waited for KV-cache space (about "
        f"{waiting:.0f} at a time) while {' and '.join(why)}; more load there only queues."
    )


def _outlier_line(row: pd.Series, outlier: knee_rules.Outlier, y_col: str = knee_rules.THROUGHPUT) -> str:
    line = (
        f"{_sentence(_step_name(row))} ran slower than the steps around it imply ({_tok_s(row, y_col)} where they "
        f"imply about {outlier.implied_tok_s:.0f}): something else may have used the server or this machine; rerun "
        "it. "
        "It is left out of the knee."
    )
    if outlier.explained_by:
        line += f" The server's own numbers agree: {outlier.explained_by}."
    return line


def _unstable_line(row: pd.Series, y_col: str = knee_rules.THROUGHPUT) -> str:
    first, second = row.get(f"{y_col}_first_half"), row.get(f"{y_col}_second_half")
    halves = f"from {first:.0f} to {second:.0f} {_unit(y_col)}"
    if pd.isna(first) or pd.isna(second):
        halves = "by more than its noise"  # a table written without the halves
    return (
        f"{_sentence(_step_name(row))} was not steady: its throughput moved {halves} "
        "between the first and second half of its window, beyond its noise: the server's state changed during the "
        "step (a cache filling, a queue growing) or something else used the server or this machine; its numbers "
        "average both halves (rerun it, or lengthen its steps)."
    )


def diagnose(table: pd.DataFrame, curve: bool = True, gpu: dict[int, roofline.StepVerdict] | None = None) -> Diagnosis:
    """The knee (analysis.knee.find_knee: outliers left out, a later step more than the noise above moves it, reported
    with its range), the first step where the server's own state says its batch is full, the suspect steps, the
    binding resource of every step at or past the knee or the saturated step and of every generator-bound step, then
    every step of a rate run that fell behind its schedule. `curve` False (a trace replay, whose steps are windows of
    the trace's own load, not a sweep): no knee, no outliers, no unstable steps, only the per-step verdicts. `gpu`
    (analysis.roofline.step_verdicts): the GPUs' roofline regime follows the binding resource's line of each step it is
    named for (else one line, at the knee or the highest load)."""
    d = Diagnosis()
    gpu = gpu or {}
    rates = schedule.is_rate_run(table)
    # A rate run holds the same pool of users at every step: its load is the rate, so the knee is keyed on it.
    key, unit = ("rate_rps", "the rate") if rates else ("users", "users")
    rows = table.sort_values(key).reset_index(drop=True)
    # An embeddings run has no output tokens: its curve is inputs/s (missing tok/s must not read as a flat curve).
    y_col = throughput_column(rows) if len(rows) else knee_rules.THROUGHPUT
    k = knee_rules.find_knee(rows, key, y_col) if len(rows) else knee_rules.Knee()
    if not curve:
        k = knee_rules.Knee(saturated_step=k.saturated_step, saturated_load=k.saturated_load)
        # Said, so that an empty diagnosis does not read as a verdict of "nothing found".
        d.text.append(
            "A trace replay: its steps are consecutive windows of the trace's own load, not a sweep of loads, so no "
            "knee is looked for; only each window's own verdicts (server limit, load generator, schedule) follow."
        )
    by_step = {int(r["step"]): r for _, r in rows.iterrows()}
    if k.step is not None:
        at = by_step[k.step]
        d.knee_step, d.knee_users = k.step, int(at["users"])
        d.knee_range = list(k.range) if rates else [int(v) for v in k.range]
        if rates:
            d.knee_rate_rps = float(at["rate_rps"])
        d.text.append(_knee_line(rows, k, key, unit, y_col))
    if k.saturated_step is not None:
        sat = by_step[k.saturated_step]
        d.saturated_step, d.saturated_users = k.saturated_step, int(sat["users"])
        if rates:
            d.saturated_rate_rps = float(sat["rate_rps"])
    if k.unmeasured and curve:
        d.text.append(_unmeasured_line(k.unmeasured, len(rows)))
    if k.step is None and len(rows) - len(k.unmeasured) >= 2 and curve:
        highest = "the highest measured step" if k.unmeasured else "the highest step"
        if k.saturated_step is not None:
            room = "but the server's own state says it is past its batch limit (next line)"
        elif flagged(rows.iloc[-1].get("generator_bound")):
            room = f"whether the server still had room at {highest} is unknown: the load generator bound there"
        else:
            room = f"the server still had room at {highest}"
        d.text.append(
            f"No knee: throughput still grew beyond the noise up to {highest} (a later step topped each one "
            f"by more than {KNEE_GAIN * 100:.0f} %, outliers left out); {room}."
        )
    if k.saturated_step is not None:
        d.text.append(_saturated_line(by_step[k.saturated_step]))
    d.outlier_steps = [o.step for o in k.outliers]
    for o in k.outliers:
        d.text.append(_outlier_line(by_step[o.step], o, y_col))
    for _, row in rows.iterrows():
        if curve and unstable(row.get("stable")) and int(row["step"]) not in d.outlier_steps:
            d.unstable_steps.append(int(row["step"]))
            d.text.append(_unstable_line(row, y_col))
    # The binding resource is named where throughput has stopped growing (at or past the knee), where the server is
    # full (at or past saturation), and where the load generator bound; never for an outlier (it says nothing of the
    # server) nor for a step after which throughput still rose beyond the noise.
    limits = [load for load in (k.load, k.saturated_load) if load is not None]
    start = min(limits) if limits else None
    kept = rows[~rows["step"].astype(int).isin(d.outlier_steps)]
    for _, row in rows.iterrows():
        step = int(row["step"])
        if flagged(row.get("generator_bound")):
            resource = binding_resource(row)
        elif start is None or row[key] < start or step in d.outlier_steps:
            continue
        else:
            later = kept[kept[key] > row[key]]
            rose = any(knee_rules.clearly_above(r, row, y_col=y_col) for _, r in later.iterrows())
            resource = binding_resource(row)
            if rose and resource in (COMPUTE, UNKNOWN):
                continue
        d.binding[step] = resource
        d.text.append(_binding_line(row, resource))
        if step in gpu:  # next to the KV-cache verdict: what the GPU itself was doing
            d.gpu_regime[step] = gpu[step].regime
            d.text.append(roofline.regime_line(gpu[step], _load(row), row))
    if gpu and not d.gpu_regime:
        # No step binds (the curve still grows): one line at the knee, else at the highest load the GPUs were seen.
        seen = rows[rows["step"].astype(int).isin(list(gpu))]
        at = seen[seen["step"] == d.knee_step] if d.knee_step is not None else seen.iloc[0:0]
        row = at.iloc[0] if len(at) else (seen.iloc[-1] if len(seen) else None)
        if row is not None:
            step = int(row["step"])
            d.gpu_regime[step] = gpu[step].regime
            d.text.append(roofline.regime_line(gpu[step], _load(row), row))
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
