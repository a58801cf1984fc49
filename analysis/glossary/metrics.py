"""The metric glossary: each metric's name, unit and definition (docs/reference/metrics.md's first table)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..histograms import NARROW_BUCKET
from ..thresholds import (
    CPU_BOUND,
    KNEE_GAIN,
    LAG_BOUND_S,
    LAG_CEILING_S,
    LAG_FLOOR_S,
    LAG_SHARE,
    OUTLIER_MARGIN,
    PROBE_INTERVAL_S,
    STABLE_TOLERANCE,
)
from .formulas import ttfo_values


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    definition: str
    # Its --slo name (ttft in ttft_p95) when objectives can be set on it, and where they apply:
    objective: str | None = None
    streaming: bool = False  # only a kind that streams has a value of it (no first token, no token gaps otherwise)
    per_request: bool = True  # one value per request (ITL's many samples are judged on the step only)
    none_meets: bool = False  # a request without a value meets its objective (a one-token answer has no TPOT)
    # Per ok request its value for objectives (NaN unknown); None: the requests' column of its name, as floats.
    values: Callable[[pd.DataFrame], np.ndarray] | None = None


_METRICS = [
    Metric(
        "ttft_s",
        "s",
        "Time to first token: from sending the request to the arrival of the first chunk that carries at least one "
        "output token (with continuous usage: the first chunk whose cumulative completion_tokens >= 1, even if its "
        "text is empty; without: the first chunk with a choice that is not a role-only chat delta).",
        objective="ttft",
        streaming=True,
    ),
    Metric(
        "e2e_s",
        "s",
        "End-to-end latency: from sending the request to the arrival of the last token-carrying chunk "
        "(an embeddings request, which does not stream: to the arrival of the last byte of its body).",
        objective="e2e",
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
        objective="tpot",
        streaming=True,
        none_meets=True,
    ),
    Metric(
        "itl_s",
        "s",
        "Inter-token latency, one sample per token after the first chunk: a chunk carrying k tokens that arrives g "
        "seconds after the previous token-carrying chunk contributes k samples of g / k.",
        objective="itl",
        streaming=True,
        per_request=False,
    ),
    Metric("per_request_tok_s", "tokens/s", "Per-request throughput: output_tokens / e2e_s."),
    Metric(
        "ttfo_s",
        "s",
        "Time to first output token: from sending the request to the arrival of the first chunk that carries an "
        "answer token (delta.content) or a tool-call token (delta.tool_calls), what the user waits for; ttft_s "
        "counts the first token of any kind, thinking included. The same as ttft_s when the model does not reason; "
        "none when the stream carried reasoning only (the thought never closed: no answer token). A chunk that "
        "ends the thought and starts the answer is the answer's first chunk. Per step, a request without an answer "
        "token counts as never answered (+inf) in the TTFO percentiles, so they cannot read better than the "
        "requests did.",
        objective="ttfo",
        streaming=True,
        values=ttfo_values,
    ),
    Metric(
        "reasoning_tokens",
        "tokens",
        "Output tokens that came in reasoning chunks (delta.reasoning in vLLM 0.32, delta.reasoning_content in "
        "older versions and other servers): with continuous usage the tokens each reasoning chunk carried (its "
        "increase of completion_tokens); without, the server's usage.completion_tokens_details.reasoning_tokens "
        "when it sends one, else one per reasoning chunk. 0 when nothing reasoned; none when no token came.",
    ),
    Metric(
        "reasoning_time",
        "s",
        "ttfo_s - ttft_s: from the first token to the first answer token, the time spent reasoning (0 without "
        "reasoning); none without an answer token.",
    ),
    Metric(
        "answer_tpot_s",
        "s",
        "Time per output token of the answer alone: (e2e_s - ttfo_s) / (output_tokens - reasoning_tokens - 1); none "
        "when the answer has at most one token. tpot_s stays over all output tokens, thinking included.",
    ),
    Metric(
        "reasoning_share",
        "fraction",
        "Per step: sum of reasoning_tokens / sum of output_tokens over the measured ok requests that carry both.",
    ),
    Metric(
        "aggregate_tok_s",
        "tokens/s",
        "Aggregate throughput: output tokens of the ok requests that completed inside a window / window length.",
    ),
    Metric(
        "inputs_per_s",
        "inputs/s",
        "Embeddings throughput: inputs (texts embedded, --batch-size per request) of the ok requests that completed "
        "inside a window / window length.",
    ),
    Metric(
        "documents_per_s",
        "documents/s",
        "Rerank throughput: documents (ranked against the query, --documents per request) of the ok requests that "
        "completed inside a window / window length.",
    ),
    Metric(
        "prompt_tok_s",
        "tokens/s",
        "Prompt throughput: the server's usage.prompt_tokens of the ok requests that completed inside a window / "
        "window length (an embeddings or rerank run's token rate; a chat or completions run's prefill rate).",
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
        "increase of _sum / increase of _count (exact); a quantile q (p50, p99) is only known to lie in the bucket "
        "where the cumulative count crosses q * count, [low, high], high lowered to mean / (1 - q) when that is "
        "tighter (Markov's inequality: a non-negative time's q-quantile is at most mean / (1 - q)). The p50/p99 "
        "value is the interpolation inside [low, high] only when that range is narrow ((high - low) / high <= "
        f"{NARROW_BUCKET}), else missing: interpolating inside a wide bucket (the first one above all) describes "
        'the bucket, not the requests; the bounds columns say what is known ("< 300 ms", "100-250 ms").',
    ),
    Metric(
        "server_queue_time",
        "s",
        "Time requests spent waiting in vLLM's queue before their first scheduling (vllm:request_queue_time_seconds); "
        "mean (exact), p50 and p99 (their bucket bounds, a value only when they are narrow) per step as for "
        "server_ttft.",
    ),
    Metric(
        "ttft_gap_mean",
        "s",
        "Client-minus-server TTFT over the same requests: the mean ttft_s of the requests whose first token "
        "arrived between the two scrapes that bound a step's server_ttft, minus server_ttft's mean; the time "
        "outside vLLM's engine clock (HTTP, request processing, detokenization, streaming, network, client). "
        "Means only: both are exact, unlike the server's histogram quantiles.",
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
        "Requests sent in a step's measured window (send stamp inside it, any outcome) / window length; in an "
        "open loop of conversations (--turns), first turns only: the rate of new conversations.",
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

# Suspect steps: whether a step's own numbers can be trusted (analysis/knee.py).
_METRICS += [
    Metric(
        "stable",
        "bool",
        "A step's throughput was steady inside its measured window: the aggregate tok/s of its first and second "
        "half differ by no more than their noise (the root sum of squares of their batch-means half-widths) or by "
        f"no more than {STABLE_TOLERANCE:.0%} of their mean; empty when a half has too few batches to tell.",
    ),
    Metric(
        "outlier",
        "bool",
        "A step out of line with the curve its neighbours draw: the next step's tok/s is clearly above it (more "
        f"than {KNEE_GAIN:.0%} and beyond both intervals) and its interval's upper bound lies more than "
        f"{OUTLIER_MARGIN:.0%} below the straight line between the steps before and after it. A saturating "
        "server's curve is concave, so a point far below such a line is a disturbance (another job on the server "
        "or this machine), not the server's curve; the knee leaves such steps out. Empty for the first and last "
        "step (no neighbour on one side).",
    ),
]

# GPU telemetry from NVIDIA's dcgm-exporter (--gpu-metrics-url; analysis/gpu.py).
_DCGM = "one sample per GPU per scrape of --gpu-metrics-url (dcgm-exporter)"
_METRICS += [
    Metric("gpu_util", "fraction", f"DCGM_FI_DEV_GPU_UTIL / 100: the share of time one or more kernels ran on the GPU, "
           f"{_DCGM}. A GPU running one small kernel all the time reads 1: it says busy, not how much of it works."),
    Metric("gpu_sm_active", "fraction", "DCGM_FI_PROF_SM_ACTIVE: the share of cycles an SM has at least one warp "
           "assigned, averaged over the SMs (a profiling field: datacenter GPUs only, and not in dcgm-exporter's "
           f"default counters), {_DCGM}."),
    Metric("gpu_dram_active", "fraction", "DCGM_FI_PROF_DRAM_ACTIVE: the share of cycles the device memory interface "
           "is sending or receiving data, i.e. the share of peak memory bandwidth used (a profiling field: datacenter "
           f"GPUs only), {_DCGM}."),
    Metric("gpu_mem_used", "bytes", f"DCGM_FI_DEV_FB_USED (MiB) * 2**20: framebuffer memory in use, {_DCGM}. vLLM "
           "reserves its KV cache at start, so this stays near --gpu-memory-utilization whatever the load."),
    Metric("gpu_power", "W", f"DCGM_FI_DEV_POWER_USAGE: the board's power draw, {_DCGM}."),
    Metric("gpu_energy", "J", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION / 1000: the GPU's energy since boot (a counter, "
           f"in mJ), {_DCGM}; its increase over a window is the energy drawn in it, readings between scrapes "
           "included (issue 35)."),
]  # fmt: skip

# Speculative decoding (issue 35; analysis/spec_decode.py): the server's counters and the client's chunks.
_METRICS += [
    Metric("spec_acceptance_rate", "fraction", "The share of the draft tokens a speculative-decoding server proposed "
           "that its target model accepted: the increase of vllm:spec_decode_num_accepted_tokens_total over that of "
           "vllm:spec_decode_num_draft_tokens_total in a window (vLLM's own formula, vllm/v1/spec_decode/metrics.py). "
           "Per draft position k: the accepted tokens at position k over the drafts (summary.json, the report).",
           per_request=False),
    Metric("spec_acceptance_length", "tokens", "Mean acceptance length: the tokens a speculating engine step yields "
           "per request, 1 (the target model's own token) + accepted tokens / drafts over a window.",
           per_request=False),
    Metric("tokens_per_chunk", "tokens", "Output tokens a token-carrying chunk of the stream brought: each chunk's "
           "increase of usage.completion_tokens with continuous usage; a request's mean is output_tokens / chunks. "
           "Above 1 when the server streams several tokens at once, as speculative decoding does when it accepts "
           "drafts.", per_request=False),
]  # fmt: skip

GLOSSARY: dict[str, Metric] = {m.name: m for m in _METRICS}


def markdown_table() -> str:
    """The glossary as a Markdown table (`python -m analysis glossary`; docs/reference/metrics.md's first table)."""
    rows = ["| name | unit | definition | --slo |", "|---|---|---|---|"]
    rows += [f"| `{m.name}` | {m.unit} | {m.definition} | {_objective(m)} |" for m in GLOSSARY.values()]
    return "\n".join(rows)


def _objective(m: Metric) -> str:
    """Where --slo objectives on the metric apply (analysis/slo.py reads the same declarations)."""
    if m.objective is None:
        return ""
    where = "streaming kinds only" if m.streaming else "every kind"
    judged = "each request and the step" if m.per_request else "the step's samples"
    return f"`{m.objective}_p95`, ... ({where}; judged on {judged})"
