"""The one glossary: every metric the suite reports, its unit and its formula.

Column names in `requests.parquet`, `steps.csv`, the console table and the README come from `GLOSSARY`.
The formulas are pure functions (no network, no Locust) so the live view, the end-of-run table and the
report cannot disagree. Times are seconds unless a name says otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from analysis.generator import CPU_BOUND, LAG_BOUND_S, PROBE_INTERVAL_S
from analysis.schedule import LAG_CEILING_S, LAG_FLOOR_S, LAG_SHARE


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    definition: str


_METRICS = [
    Metric(
        "ttft_s",
        "s",
        "Time to first token: from sending the request to the arrival of the first chunk that carries at least one "
        "output token (with continuous usage: the first chunk whose cumulative completion_tokens >= 1, even if its "
        "text is empty; without: the first chunk with a choice that is not a role-only chat delta).",
    ),
    Metric(
        "e2e_s", "s", "End-to-end latency: from sending the request to the arrival of the last token-carrying chunk."
    ),
    Metric(
        "output_tokens",
        "tokens",
        "The server's usage.completion_tokens; when the server sends no usage, the number of token-carrying chunks "
        "(then output_tokens_estimated is true).",
    ),
    Metric(
        "tpot_s",
        "s",
        "Time per output token, per request: (e2e_s - ttft_s) / (output_tokens - 1); none when output_tokens <= 1.",
    ),
    Metric(
        "itl_s",
        "s",
        "Inter-token latency, one sample per token after the first chunk: a chunk carrying k tokens that arrives g "
        "seconds after the previous token-carrying chunk contributes k samples of g / k.",
    ),
    Metric("per_request_tok_s", "tokens/s", "Per-request throughput: output_tokens / e2e_s."),
    Metric(
        "aggregate_tok_s",
        "tokens/s",
        "Aggregate throughput: output tokens of the ok requests that completed inside a window / window length.",
    ),
]

# Server-side series, scraped from vLLM's /metrics during the run and summarized per step.
_METRICS += [
    Metric(
        "kv_cache_usage",
        "fraction",
        "Share of the KV cache in use (vllm:kv_cache_usage_perc, vllm:gpu_cache_usage_perc before the V1 engine), "
        "0 to 1; per step, its mean and max over the measured window.",
    ),
    Metric(
        "running",
        "requests",
        "Requests in vLLM's running batch (vllm:num_requests_running); per step, mean and max.",
    ),
    Metric(
        "waiting",
        "requests",
        "Requests queued for admission to the batch (vllm:num_requests_waiting); per step, mean and max.",
    ),
    Metric(
        "preemptions",
        "requests",
        "Increase of vllm:num_preemptions_total over a step's measured window: running requests evicted to free "
        "KV cache, whose work is redone later.",
    ),
    Metric(
        "waiting_capacity",
        "requests",
        "Requests waiting for scheduling capacity (vllm:num_requests_waiting_by_reason{reason=capacity}); "
        "waiting_deferred: deferred by transient constraints (reason=deferred); per step, the max.",
    ),
    Metric(
        "prefix_cache_hit_rate",
        "fraction",
        "Increase of vllm:prefix_cache_hits_total / increase of vllm:prefix_cache_queries_total over a step's "
        "window (prompt tokens found in the prefix cache / prompt tokens looked up); none when nothing was queried.",
    ),
    Metric(
        "server_ttft",
        "s",
        "vLLM's own TTFT (vllm:time_to_first_token_seconds) for the requests it observed in a step's window: mean = "
        "increase of _sum / increase of _count; p50 and p99 interpolated inside the histogram's buckets (as "
        "Prometheus' histogram_quantile), so only as fine as its bucket bounds.",
    ),
    Metric(
        "server_queue_time",
        "s",
        "Time requests spent waiting in vLLM's queue before their first scheduling (vllm:request_queue_time_seconds); "
        "mean, p50 and p99 per step as for server_ttft.",
    ),
    Metric(
        "ttft_gap_mean",
        "s",
        "Client-minus-server TTFT over the same requests: the mean ttft_s of the requests whose first token "
        "arrived between the two scrapes that bound a step's server_ttft, minus server_ttft's mean; the time "
        "outside vLLM's engine clock (HTTP, request processing, detokenization, streaming, network, client).",
    ),
]

# The load generator's self-checks (generator.parquet), summarized per step over the same measured window.
_METRICS += [
    Metric(
        "generator_lag",
        "s",
        f"Event-loop lag of a load-generating process: a probe greenlet sleeps {PROBE_INTERVAL_S * 1000:.0f} ms, over "
        "and over, and records how late it woke (actual - intended wake time), the wait every stream's timestamp "
        "suffers too. Per step, generator_lag_p50_s, generator_lag_p99_s and generator_lag_max_s: the highest over "
        "the processes of each process's p50, p99 and max of its samples in the window (those of its rows of "
        "generator.parquet whose timestamp lies in the window).",
    ),
    Metric(
        "generator_cpu_max",
        "fraction",
        "Max over the load-generating processes of the process's CPU use in the window: sum of cpu_s / sum of "
        "interval_s of its samples there (1 = one full core).",
    ),
    Metric(
        "users_achieved_mean",
        "users",
        "Users actually running: sum over the load-generating processes of the mean of users_achieved over each "
        "one's samples in the window, weighted by interval_s; to compare with users, the step's target.",
    ),
    Metric(
        "generator_processes",
        "processes",
        "Load-generating processes with self-check samples in the window.",
    ),
    Metric(
        "generator_bound",
        "bool",
        f"generator_lag_p99_s > {LAG_BOUND_S} or generator_cpu_max > {CPU_BOUND}: the load generator could not "
        "keep up, so the step's latencies read high and its throughput low (add worker processes); empty when the "
        "step has no samples.",
    ),
]

# Judgements against objectives and limits the user gives (--slo; --gpu / --memory-bandwidth-gbs, --model-bytes).
_METRICS += [
    Metric(
        "goodput",
        "fraction",
        "Per step: ok requests whose own ttft_s, tpot_s and e2e_s meet every --slo objective on those metrics / "
        "measured requests (ok + failed; warm-up and cut-off left out). A request without a TPOT (one token) is "
        "judged on the rest; ITL and error_rate objectives are judged on the step, not per request.",
    ),
    Metric(
        "decode_ceiling_tok_s",
        "tokens/s",
        "Single-request decode ceiling: memory bandwidth (bytes/s) / model weight bytes, since each token of one "
        "request reads every weight once.",
    ),
    Metric(
        "decode_efficiency",
        "fraction",
        "Measured single-request decode rate (1 / tpot_p50_s at the step with the fewest users, one in a sweep that "
        "starts at 1) / decode_ceiling_tok_s.",
    ),
]

# Open-loop runs (--rates): each request's intended send time, and the latencies counted from it.
_METRICS += [
    Metric(
        "rate_rps",
        "requests/s",
        "Intended request rate of a rate step (--rates), all load processes together; none for a user step.",
    ),
    Metric(
        "achieved_rps",
        "requests/s",
        "Requests sent in a step's measured window (send stamp inside it, any outcome) / window length.",
    ),
    Metric(
        "intended_start_time",
        "s",
        "Open loop: the Unix time at which the step's arrival schedule meant the request to be sent; none in a "
        "closed loop.",
    ),
    Metric(
        "schedule_lag_s",
        "s",
        "start_time - intended_start_time: how late the request was sent (no free user, a late event loop, the "
        "connect); none in a closed loop. Per step, schedule_lag_p50_s, schedule_lag_p99_s and schedule_lag_max_s "
        "over the step's requests sent after its warm-up, whatever their outcome.",
    ),
    Metric(
        "ttft_intended",
        "s",
        "ttft_s + schedule_lag_s: TTFT counted from the intended send time, what a user arriving on schedule "
        "waits; per step ttft_intended_p50_s, ttft_intended_p95_s, ttft_intended_p99_s and ttft_intended_mean_s "
        "over the ok requests.",
    ),
    Metric(
        "e2e_intended",
        "s",
        "e2e_s + schedule_lag_s: E2E counted from the intended send time; per step e2e_intended_mean_s.",
    ),
    Metric(
        "schedule_behind",
        "bool",
        f"schedule_lag_p99_s > min({LAG_CEILING_S}, max({LAG_FLOOR_S}, {LAG_SHARE} / rate_rps)): the client did not "
        "keep the schedule, so the server was offered less than the intended load, later; empty in a closed loop.",
    ),
]

GLOSSARY: dict[str, Metric] = {m.name: m for m in _METRICS}


def markdown_table() -> str:
    """The glossary as the README's Markdown table (`python -m analysis glossary`)."""
    rows = ["| name | unit | definition |", "|---|---|---|"]
    rows += [f"| `{m.name}` | {m.unit} | {m.definition} |" for m in GLOSSARY.values()]
    return "\n".join(rows)


def ttft_s(token_offsets_s: Sequence[float]) -> float | None:
    """TTFT = arrival offset of the first token-carrying chunk."""
    return token_offsets_s[0] if token_offsets_s else None


def e2e_s(token_offsets_s: Sequence[float]) -> float | None:
    """E2E = arrival offset of the last token-carrying chunk."""
    return token_offsets_s[-1] if token_offsets_s else None


def tpot_s(e2e: float | None, ttft: float | None, output_tokens: int | None) -> float | None:
    """TPOT = (E2E - TTFT) / (output_tokens - 1); None when output_tokens <= 1."""
    if e2e is None or ttft is None or output_tokens is None or output_tokens <= 1:
        return None
    return (e2e - ttft) / (output_tokens - 1)


def itl_samples_s(token_offsets_s: Sequence[float], chunk_tokens: Sequence[int]) -> list[float]:
    """ITL samples: chunk i (i >= 1) with k tokens after gap g = t[i] - t[i-1] gives k samples of g / k."""
    out: list[float] = []
    for i in range(1, len(token_offsets_s)):
        k = chunk_tokens[i]
        if k <= 0:
            continue
        gap = token_offsets_s[i] - token_offsets_s[i - 1]
        out.extend([gap / k] * k)
    return out


def per_request_tok_s(output_tokens: int | None, e2e: float | None) -> float | None:
    """Per-request tok/s = output_tokens / E2E."""
    if output_tokens is None or e2e is None or e2e <= 0:
        return None
    return output_tokens / e2e


def aggregate_tok_s(output_tokens_in_window: int, window_s: float) -> float | None:
    """Aggregate tok/s = output tokens of requests completed in the window / window length."""
    if window_s is None or not math.isfinite(window_s) or window_s <= 0:
        return None
    return output_tokens_in_window / window_s


def schedule_lag_s(start_time: float, intended_start_time: float | None) -> float | None:
    """Schedule lag = start_time - intended_start_time; None in a closed loop (no intended time)."""
    if intended_start_time is None:
        return None
    return start_time - intended_start_time


def intended_s(latency_s: float | None, lag_s: float | None) -> float | None:
    """Latency from the intended send time = latency_s + schedule_lag_s; None when either is missing."""
    if latency_s is None or lag_s is None:
        return None
    return latency_s + lag_s
