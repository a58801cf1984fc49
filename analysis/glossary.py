"""The one glossary: every metric the suite reports, every column it writes, their units and their formulas.

`GLOSSARY` defines the metrics (docs/metrics.md's first table). `COLUMNS` declares every column of `steps.csv` and of
`requests.parquet` once: its unit, formula, meaning, console header, format and section. The step table's column
lists (`analysis.steps.STEP_COLUMNS`, `analysis.server_metrics.SERVER_COLUMNS`, `analysis.generator.
GENERATOR_COLUMNS`, `analysis.schedule.OPEN_LOOP_COLUMNS`), the console tables, the web UI's LLM tab, the
report's per-step table and docs/metrics.md are derived from it, so they cannot disagree. The core step columns
also carry the function that computes them. Pure functions (no network, no Locust); times are seconds unless a
name says otherwise.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .histograms import NARROW_BUCKET, from_columns
from .thresholds import (
    CPU_BOUND,
    DRAM_ACTIVE_HIGH,
    GPU_ACTIVE_LOW,
    KNEE_GAIN,
    LAG_BOUND_S,
    LAG_CEILING_S,
    LAG_FLOOR_S,
    LAG_SHARE,
    OUTLIER_MARGIN,
    PROBE_INTERVAL_S,
    SM_ACTIVE_SATURATED,
    STABLE_TOLERANCE,
)


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
        "e2e_s",
        "s",
        "End-to-end latency: from sending the request to the arrival of the last token-carrying chunk "
        "(an embeddings request, which does not stream: to the arrival of the last byte of its body).",
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
        "ttfo_s",
        "s",
        "Time to first output token: from sending the request to the arrival of the first chunk that carries an "
        "answer token (delta.content) or a tool-call token (delta.tool_calls), what the user waits for; ttft_s "
        "counts the first token of any kind, thinking included. The same as ttft_s when the model does not reason; "
        "none when the stream carried reasoning only (the thought never closed: no answer token). A chunk that "
        "ends the thought and starts the answer is the answer's first chunk. Per step, a request without an answer "
        "token counts as never answered (+inf) in the TTFO percentiles, so they cannot read better than the "
        "requests did.",
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
        "prompt_tok_s",
        "tokens/s",
        "Prompt throughput: the server's usage.prompt_tokens of the ok requests that completed inside a window / "
        "window length (an embeddings run's token rate; a chat or completions run's prefill rate).",
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
]  # fmt: skip

GLOSSARY: dict[str, Metric] = {m.name: m for m in _METRICS}


def markdown_table() -> str:
    """The glossary as a Markdown table (`python -m analysis glossary`; the first table of docs/metrics.md)."""
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


def reasoning_time_s(ttft: float | None, ttfo: float | None) -> float | None:
    """Reasoning time = TTFO - TTFT; None without an answer token (or without a first token)."""
    if ttft is None or ttfo is None:
        return None
    return ttfo - ttft


def answer_tokens(output_tokens: int | None, reasoning_tokens: int | None) -> int | None:
    """Answer tokens = output_tokens - reasoning_tokens (tool-call tokens included); None when either is missing."""
    if output_tokens is None or reasoning_tokens is None:
        return None
    return output_tokens - reasoning_tokens


def answer_tpot_s(
    e2e: float | None, ttfo: float | None, output_tokens: int | None, reasoning_tokens: int | None
) -> float | None:
    """Answer TPOT = (E2E - TTFO) / (output_tokens - reasoning_tokens - 1); None when the answer has <= 1 token."""
    answer = answer_tokens(output_tokens, reasoning_tokens)
    if e2e is None or ttfo is None or answer is None or answer <= 1:
        return None
    return (e2e - ttfo) / (answer - 1)


def reasoning_share(
    reasoning_tokens: Sequence[float] | np.ndarray, output_tokens: Sequence[float] | np.ndarray
) -> float:
    """Reasoning share = sum(reasoning_tokens) / sum(output_tokens) over the requests with both; NaN without output."""
    r = np.asarray(reasoning_tokens, dtype=float)
    o = np.asarray(output_tokens, dtype=float)
    both = ~np.isnan(r) & ~np.isnan(o)
    total = float(o[both].sum())
    return float(r[both].sum()) / total if total > 0 else math.nan


def ttfo_values(requests: pd.DataFrame) -> np.ndarray:
    """Per request, ttfo_s for the TTFO statistics: +inf (never answered) where tokens came but no answer token
    (reasoning_tokens known, ttfo_s missing); NaN where unknown (records written before TTFO existed)."""
    ttfo = numeric_column(requests, "ttfo_s")
    never = np.isnan(ttfo) & ~np.isnan(numeric_column(requests, "reasoning_tokens"))
    ttfo[never] = math.inf
    return ttfo


def numeric_column(frame: pd.DataFrame, column: str) -> np.ndarray:
    """A column as floats (None and absent: NaN), a copy."""
    if column not in frame.columns:
        return np.full(len(frame), math.nan)
    return pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=float, copy=True)


# --- statistics shared by every table ------------------------------------------------------------------------


def percentile(values: Sequence[float] | np.ndarray | pd.Series, q: float) -> float:
    """q-th percentile (0-100) of the raw values, linear interpolation = numpy's default; NaN when there are none."""
    arr = np.asarray(values, dtype=float)
    arr = arr[~np.isnan(arr)]
    if arr.size == 0:
        return math.nan
    return float(np.percentile(arr, q))


def percentile_never(values: Sequence[float] | np.ndarray | pd.Series, q: float) -> float:
    """percentile() where +inf (never) ranks above every finite value: with h = (n - 1) q / 100, x_(floor h) +
    frac(h) (x_(floor h + 1) - x_(floor h)) over the sorted values, inf once it reaches an inf; NaN when none."""
    arr = np.asarray(values, dtype=float)
    arr = arr[~np.isnan(arr)]
    never = np.isposinf(arr)
    if not never.any():
        return percentile(arr, q)
    finite = np.sort(arr[~never])
    h = (arr.size - 1) * q / 100
    lo = math.floor(h)
    frac = h - lo
    if lo >= finite.size or (frac > 0 and lo + 1 >= finite.size):
        return math.inf
    return float(finite[lo] + frac * (finite[lo + 1] - finite[lo])) if frac > 0 else float(finite[lo])


def mean(values: Sequence[float] | np.ndarray | pd.Series) -> float:
    """Mean = sum / count of the values that are not missing; NaN when there are none."""
    values = pd.Series(values, dtype=float).dropna()
    return float(values.mean()) if len(values) else math.nan


def flagged(value: object) -> bool:
    """Flagged = the verdict is true; False, None and NaN (not measured) are not flagged."""
    return value is not None and not pd.isna(value) and bool(value)


def _nan(value: float | None) -> float:
    return math.nan if value is None else value


# --- the registry of columns ---------------------------------------------------------------------------------

# Sections: where a column is written and in which console table it is shown.
STEP = "step"  # the core step table (steps.csv, the "Batching curve" console table)
SERVER = "server"  # steps.csv: vLLM's /metrics over each step's window
GENERATOR = "generator"  # steps.csv: the load generator's self-checks
OPEN_LOOP = "open_loop"  # steps.csv: open-loop (--rates) columns
UNCERTAINTY = "uncertainty"  # steps.csv: confidence intervals and suspect steps, after the open-loop columns
SERVER_BOUNDS = "server_bounds"  # steps.csv: the bounds of the server's histogram quantiles, after the intervals
STEP_END = "step_end"  # steps.csv: why each step ended (--step-duration auto), last
REASONING = "reasoning"  # steps.csv: reasoning and tool calls (TTFO, reasoning tokens), after why each step ended
EMBEDDINGS = "embeddings"  # steps.csv: inputs/s, prompt tok/s and E2E percentiles, after the reasoning section
GPU = "gpu"  # steps.csv: the step's window in Unix time and the GPU exporters' telemetry (issue 20), last
REQUESTS = "requests"  # requests.parquet: one row per request
LIVE = "live"  # the web UI's LLM tab only: the server's latest gauges and the row's scope (written nowhere)
TURNS = "turns"  # turns.csv: one row per turn of the conversations (--turns), written only in multi-turn runs

# A format is a kind and a number of decimals: ms1 = seconds shown as ms with 1 decimal, pct0 = a fraction as a
# whole percentage, num2 = 2 decimals, int = a count, g = as short as exact, flag = the column's word when true /
# ok when false, pass = ok when true / the column's word when false (a check that passes), text = as is. Missing
# values always show as "-", never 0.
_FORMAT = re.compile(r"^(ms|pct|num|int|g|flag|pass|text)(\d*)$")
FORMAT_WORDS = {
    "ms": "ms, {d} decimal{s}",
    "pct": "% (whole)",
    "num": "{d} decimal{s}",
    "int": "integer",
    "g": "shortest exact",
    "flag": "{flag} / ok",
    "pass": "ok / {flag}",
    "text": "as is",
}


@dataclass(frozen=True)
class StepData:
    """What a step's core columns are computed from (one step, or the whole run's row)."""

    ok: pd.DataFrame  # its measured ok requests: started after the warm-up, not in flight at the stop
    errors: int  # its measured failed requests
    cut_off: int  # its requests in flight when the load generator began to stop
    output_tokens: int  # output tokens of the ok requests (any step) that completed inside its window
    window_s: float  # length of its measured window
    itl_s: np.ndarray  # every ITL sample of its ok requests


@dataclass(frozen=True)
class Column:
    """One column of steps.csv or requests.parquet (or of the web UI's tab), declared once."""

    name: str
    section: str
    unit: str
    meaning: str  # one line
    formula: str = ""
    label: str = ""  # the report's and the web UI's title, without the unit (`title` adds it)
    header: str | None = None  # the console header in its section's table; None: not on the console
    fmt: str = "num1"  # see _FORMAT
    web_fmt: str | None = None  # the web UI's format when it differs (finer TPOT, a rate with 2 decimals)
    web_key: str | None = None  # the web UI's row key when it is not derived from the name (kept for its users)
    flag: str | None = None  # a verdict: the word shown when it is true (BOUND, BEHIND)
    metric: str | None = None  # the GLOSSARY metric it is a statistic of
    live: bool = False  # a request column the live view keeps (the core step columns read it)
    # A histogram quantile: the (low, high) columns of the bounds it lies between; shown as what they allow
    bounds: tuple[str, str] | None = None
    compute: Callable[[StepData], object] | None = field(default=None, compare=False, repr=False)
    inf_text: str | None = None  # how +inf reads (a TTFO percentile reached by requests never answered)

    def __post_init__(self) -> None:
        for fmt in (self.fmt, self.web_fmt):
            if fmt is not None and not _FORMAT.match(fmt):
                raise ValueError(f"column {self.name}: unknown format {fmt!r}")

    @property
    def title(self) -> str:
        """The label with the unit it is shown in: "TTFT p50 (ms)", "Window (s)"."""
        label = self.label or self.name
        if self.fmt.startswith("ms"):
            return f"{label} (ms)"
        if self.unit == "s" and self.fmt.startswith(("num", "g")):
            return f"{label} (s)"
        return label

    def show(self, value: object, web: bool = False) -> str:
        """The value as text in this column's format (the web UI's when `web`)."""
        if self.inf_text is not None and isinstance(value, float) and value == math.inf:
            return self.inf_text
        return format_value(value, (self.web_fmt or self.fmt) if web else self.fmt, self.flag)

    def cell(self, row: dict, web: bool = False) -> str:
        """This column's value in a row as text; a histogram quantile without a value shows its bounds instead
        ("< 300", "100-250", "> 10000" in ms)."""
        if self.bounds is not None:
            low, high = (row.get(name) for name in self.bounds)
            if not _missing(low):
                return from_columns(math.nan, low, high, row.get(self.name)).text(unit="")
        return self.show(row.get(self.name), web)

    @property
    def key(self) -> str:
        """The web UI's row key: seconds shown in ms are named *_ms."""
        if self.web_key:
            return self.web_key
        return self.name[:-2] + "_ms" if self.fmt.startswith("ms") and self.name.endswith("_s") else self.name


def _missing(value: object) -> bool:
    if value is None:
        return True
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):  # a list or an array: present
        return False


def format_value(value: object, fmt: str, flag: str | None = None) -> str:
    """A value as text: ms1 = v * 1000 with 1 decimal, pct0 = v * 100 % with none, num2 = 2 decimals, int = a count;
    missing = "-"."""
    if _missing(value):
        return "-"
    kind, digits = _FORMAT.match(fmt).groups()
    d = int(digits or 0)
    if kind == "text":
        return str(value)
    if kind == "flag":
        return (flag or "yes") if bool(value) else "ok"
    if kind == "pass":
        return "ok" if bool(value) else (flag or "no")
    try:
        v = float(value)
    except (TypeError, ValueError):  # the whole run's step is "all"
        return str(value)
    if kind == "int":
        return f"{v:.0f}"
    if kind == "ms":
        return f"{v * 1000:.{d}f}"
    if kind == "pct":
        return f"{v:.{d}%}"
    if kind == "g":
        return f"{round(v, 3):g}"  # a trace window's rate (rows / length) has no short decimal form
    return f"{v:.{d}f}"


def _ok(column: str) -> Callable[[StepData], pd.Series]:
    return lambda d: d.ok[column]


def _per_request_tok_s(d: StepData) -> list[float | None]:
    return [per_request_tok_s(n, e) for n, e in zip(d.ok["output_tokens"], d.ok["e2e_s"])]


def _percentiles(
    metric: str, label: str, qs: Sequence[int], values: Callable[[StepData], object], over: str
) -> list[Column]:
    """A metric's per-step percentile columns <metric>_p<q>_s; the first one's console header names the metric."""
    return [
        Column(
            f"{metric}_p{q}_s", STEP, "s",
            f"{q}th percentile of {metric}_s over {over}.",
            f"percentile({metric}_s, {q})",
            label=f"{label} p{q}", header=f"{label} p{q}" if i == 0 else f"p{q}", fmt="ms1",
            web_fmt="ms2" if metric == "tpot" else None, metric=f"{metric}_s",
            compute=lambda d, q=q: percentile(values(d), q),
        )
        for i, q in enumerate(qs)
    ]  # fmt: skip


_MEASURED = "the step's measured ok requests"

# steps.csv, core: one row per step, computed from requests.parquet by each column's `compute` (analysis/steps.py
# builds the StepData). A new per-step metric is one Column here, appended to the end of the list so the columns
# before it keep their order (steps.csv is read by name); it then reaches steps.csv, the console (with a header),
# the report's table and docs/metrics.md, and the web UI when its name is added to WEB_UI below. A record column it
# reads that the live view does not keep yet needs live=True on that column in _REQUEST_COLUMNS.
_STEP_COLUMNS = [
    Column("step", STEP, "index", "Index of the load step (0 = first); the whole run's row is \"all\".",
           label="Step", header="step", fmt="int"),
    Column("users", STEP, "users", "The step's target users, all processes together (a rate step: its user pool).",
           label="Users", header="users", fmt="int"),
    Column("window_s", STEP, "s", "Length of the step's measured window, from the end of its warm-up to its end.",
           "end_time - measure_start", label="Window", fmt="num2", compute=lambda d: d.window_s),
    Column("requests", STEP, "requests", "Ok requests measured: the count of the step's measured ok requests.", "count",
           label="Requests ok", header="reqs", fmt="int", compute=lambda d: len(d.ok)),
    Column("errors", STEP, "requests", "Failed requests started after the step's warm-up, not cut off.", "count",
           label="Errors", header="errors", fmt="int", compute=lambda d: d.errors),
    Column("cut_off", STEP, "requests",
           "Requests of the step in flight when the load generator began to stop: neither errors nor measured.",
           "count", label="Cut off", header="cut_off", fmt="int", compute=lambda d: d.cut_off),
    Column("output_tokens", STEP, "tokens", "Output tokens of the ok requests that completed inside the window.",
           "sum of output_tokens", label="Output tokens", fmt="int", metric="output_tokens",
           compute=lambda d: d.output_tokens),
    Column("aggregate_tok_s", STEP, "tokens/s", "Aggregate throughput over the step's measured window.",
           "output_tokens / window_s", label="Aggregate tok/s", header="agg tok/s", metric="aggregate_tok_s",
           compute=lambda d: _nan(aggregate_tok_s(d.output_tokens, d.window_s))),
    Column("per_request_tok_s_mean", STEP, "tokens/s", f"Mean per-request throughput of {_MEASURED}.",
           "mean(output_tokens / e2e_s)", label="Per-request tok/s", header="req tok/s",
           web_key="per_request_tok_s", metric="per_request_tok_s",
           compute=lambda d: mean(_per_request_tok_s(d))),
    *_percentiles("ttft", "TTFT", (50, 95, 99), _ok("ttft_s"), _MEASURED),
    Column("ttft_mean_s", STEP, "s", f"Mean TTFT of {_MEASURED}.", "mean(ttft_s)", label="TTFT mean", fmt="ms1",
           metric="ttft_s", compute=lambda d: mean(d.ok["ttft_s"])),
    *_percentiles("tpot", "TPOT", (50, 95, 99), _ok("tpot_s"), _MEASURED + "; one-token answers have none"),
    *_percentiles("itl", "ITL", (50, 99), lambda d: d.itl_s, "every ITL sample of " + _MEASURED),
    Column("e2e_mean_s", STEP, "s", f"Mean end-to-end latency of {_MEASURED}.", "mean(e2e_s)",
           label="E2E mean", header="E2E mean", fmt="ms1", metric="e2e_s", compute=lambda d: mean(d.ok["e2e_s"])),
]  # fmt: skip

_WINDOW = "over the step's measured window"
_HISTOGRAM = "between the scrapes that bound the window"
_QUANTILES = ((50, "median"), (99, "99th percentile"))


def _server_quantiles(prefix: str, series: str, label: str, what: str, headers: tuple) -> list[Column]:
    """A server histogram's p50 and p99 columns: a value only where the buckets and the mean pin it down (their
    bounds, in the SERVER_BOUNDS section, say what is known otherwise)."""
    return [
        Column(f"{prefix}_p{q}_s", SERVER, "s", f"{what}, {words} {_WINDOW}, when its histogram pins it down; "
               "else missing (see its _low_s / _high_s bounds).",
               f"histogram_quantile({q / 100:.2f}) of {series} {_HISTOGRAM}, interpolated inside its bucket's bounds "
               f"[{prefix}_p{q}_low_s, {prefix}_p{q}_high_s] when (high - low) / high <= {NARROW_BUCKET}; else "
               "missing", label=f"{label} p{q}", header=header, fmt="ms1", metric=prefix,
               bounds=(f"{prefix}_p{q}_low_s", f"{prefix}_p{q}_high_s"))
        for (q, words), header in zip(_QUANTILES, headers)
    ]  # fmt: skip


def _server_bounds(prefix: str, series: str, label: str) -> list[Column]:
    """The bounds a server histogram's p50 and p99 lie between: the bucket's edges, the upper one narrowed by
    Markov's inequality with the exact mean."""
    out = []
    for q, words in _QUANTILES:
        out += [
            Column(f"{prefix}_p{q}_low_s", SERVER_BOUNDS, "s", f"Lower bound of {prefix}'s {words} {_WINDOW}: the "
                   "lower edge of the histogram bucket it lies in (0 in the first bucket).",
                   f"the largest bucket bound of {series} whose cumulative count is below {q / 100:.2f} * count, "
                   f"{_HISTOGRAM}", label=f"{label} p{q} low", fmt="ms1", metric=prefix),
            Column(f"{prefix}_p{q}_high_s", SERVER_BOUNDS, "s", f"Upper bound of {prefix}'s {words} {_WINDOW}: "
                   "the upper edge of its bucket, or the mean's bound when tighter; inf (null in summary.json) in "
                   "the +Inf bucket.", f"min(upper edge of the bucket where the cumulative count of {series} "
                   f"reaches {q / 100:.2f} * count, {prefix}_mean_s / (1 - {q / 100:.2f})) (Markov's inequality; "
                   "the mean's bound is left out when it falls below the bucket: scrape skew)",
                   label=f"{label} p{q} high", fmt="ms1", metric=prefix),
        ]  # fmt: skip
    return out


# steps.csv, server: vLLM's /metrics over each step's window (analysis/server_metrics.py).
_SERVER_COLUMNS = [
    Column("kv_cache_usage_mean", SERVER, "fraction", f"Mean KV-cache usage {_WINDOW}.",
           "mean of vllm:kv_cache_usage_perc over the scrapes inside the window", label="KV cache mean",
           header="KV cache mean", fmt="pct0", metric="kv_cache_usage"),
    Column("kv_cache_usage_max", SERVER, "fraction", f"Max KV-cache usage {_WINDOW}.",
           "max of vllm:kv_cache_usage_perc over the scrapes inside the window", label="KV cache max",
           header="max", fmt="pct0", metric="kv_cache_usage"),
    Column("running_mean", SERVER, "requests", f"Mean of the requests in vLLM's running batch {_WINDOW}.",
           "mean of vllm:num_requests_running", label="Running mean", header="running mean", metric="running"),
    Column("running_max", SERVER, "requests", f"Max of the requests in vLLM's running batch {_WINDOW}.",
           "max of vllm:num_requests_running", label="Running max", header="max", metric="running"),
    Column("waiting_mean", SERVER, "requests", f"Mean of the requests waiting for admission {_WINDOW}.",
           "mean of vllm:num_requests_waiting", label="Waiting mean", header="waiting mean", metric="waiting"),
    Column("waiting_max", SERVER, "requests", f"Max of the requests waiting for admission {_WINDOW}.",
           "max of vllm:num_requests_waiting", label="Waiting max", header="max", metric="waiting"),
    Column("waiting_capacity_max", SERVER, "requests", f"Max of the requests waiting for capacity {_WINDOW}.",
           "max of vllm:num_requests_waiting_by_reason{reason=capacity}", label="Waiting for capacity max",
           metric="waiting_capacity"),
    Column("waiting_deferred_max", SERVER, "requests", f"Max of the requests deferred by transient constraints "
           f"{_WINDOW}.", "max of vllm:num_requests_waiting_by_reason{reason=deferred}",
           label="Waiting deferred max", metric="waiting_capacity"),
    Column("preemptions", SERVER, "requests", f"Running requests evicted to free KV cache {_WINDOW}.",
           "increase of vllm:num_preemptions_total", label="Preemptions", header="preemptions", fmt="int",
           metric="preemptions"),
    Column("prefix_cache_hit_rate", SERVER, "fraction", f"Share of looked-up prompt tokens found in the prefix "
           f"cache {_WINDOW}.", "increase of vllm:prefix_cache_hits_total / increase of "
           "vllm:prefix_cache_queries_total", label="Prefix-cache hit rate", header="prefix hits", fmt="pct0",
           metric="prefix_cache_hit_rate"),
    Column("server_ttft_mean_s", SERVER, "s", f"vLLM's own mean TTFT {_WINDOW}.",
           "increase of vllm:time_to_first_token_seconds_sum / increase of its _count", label="Server TTFT mean",
           header="server TTFT mean", fmt="ms1", metric="server_ttft"),
    *_server_quantiles("server_ttft", "vllm:time_to_first_token_seconds", "Server TTFT", "vLLM's own TTFT",
                       (None, "p99")),
    Column("server_queue_time_mean_s", SERVER, "s", f"Mean time requests waited in vLLM's queue {_WINDOW}.",
           "increase of vllm:request_queue_time_seconds_sum / increase of its _count", label="Queue time mean",
           header="queue mean", fmt="ms1", metric="server_queue_time"),
    *_server_quantiles("server_queue_time", "vllm:request_queue_time_seconds", "Queue time",
                       "Time requests waited in vLLM's queue", (None, "p99")),
    Column("ttft_gap_mean_s", SERVER, "s", "Client-minus-server TTFT over the same requests: the time outside "
           "vLLM's engine clock.", "mean ttft_s of the requests whose first token arrived between the two scrapes "
           "- server_ttft_mean_s", label="TTFT gap", header="TTFT gap", fmt="ms1", metric="ttft_gap_mean"),
]  # fmt: skip

_PROCESSES = "over the load-generating processes, of the samples inside the step's window"

# steps.csv, generator: the load generator's self-checks over each step's window (analysis/generator.py).
_GENERATOR_COLUMNS = [
    Column("generator_processes", GENERATOR, "processes", "Load-generating processes with self-check samples in "
           "the window.", "count of distinct workers", label="Load processes", header="processes", fmt="int",
           metric="generator_processes"),
    Column("generator_lag_p50_s", GENERATOR, "s", "Event-loop lag, the worst process's median.",
           f"max {_PROCESSES}, of each process's percentile(lag_s, 50)", label="Generator lag p50",
           header="lag p50", fmt="ms1", metric="generator_lag"),
    Column("generator_lag_p99_s", GENERATOR, "s", "Event-loop lag, the worst process's 99th percentile.",
           f"max {_PROCESSES}, of each process's percentile(lag_s, 99)", label="Generator lag p99",
           header="p99", fmt="ms1", metric="generator_lag"),
    Column("generator_lag_max_s", GENERATOR, "s", "Event-loop lag, the largest sample of any process.",
           f"max {_PROCESSES}, of each process's max(lag_s)", label="Generator lag max", header="max", fmt="ms1",
           metric="generator_lag"),
    Column("generator_cpu_max", GENERATOR, "fraction", "CPU use of the busiest load process (1 = one core).",
           f"max {_PROCESSES}, of sum(cpu_s) / sum(interval_s)", label="Generator CPU max", header="CPU max",
           fmt="pct0", metric="generator_cpu_max"),
    Column("users_achieved_mean", GENERATOR, "users", "Users actually running, all processes together.",
           f"sum {_PROCESSES}, of the interval_s-weighted mean of users_achieved", label="Users achieved",
           header="achieved", metric="users_achieved_mean"),
    Column("generator_bound", GENERATOR, "bool", "The load generator could not keep up: the step's latencies read "
           "high.", f"generator_lag_p99_s > {LAG_BOUND_S} or generator_cpu_max > {CPU_BOUND}; empty without samples",
           label="Generator-bound", header="generator", fmt="flag", flag="BOUND", metric="generator_bound"),
]  # fmt: skip

_SENT = "the step's requests sent after its warm-up, any outcome"
_OK_INTENDED = "the step's measured ok requests, counted from the intended send time"

# steps.csv, open loop (--rates; empty in a closed loop but achieved_rps), last (analysis/schedule.py).
_OPEN_LOOP_COLUMNS = [
    Column("rate_rps", OPEN_LOOP, "requests/s", "Intended request rate of a rate step (--rates), all processes; "
           "a trace replay's window: the rate its rows were scheduled at.",
           "the step's --rates value; a trace window: its rows / its length", label="Rate (req/s)",
           header="rate req/s", fmt="g", web_fmt="num2",
           metric="rate_rps"),
    Column("achieved_rps", OPEN_LOOP, "requests/s", "Requests sent in the step's measured window per second "
           "(a rate step of conversations: new conversations).",
           "requests whose start_time lies in the window (a rate step of conversations: turn 1 only) / window_s",
           label="Achieved (req/s)", header="achieved", fmt="num2", metric="achieved_rps"),
    Column("schedule_lag_p50_s", OPEN_LOOP, "s", f"Median schedule lag of {_SENT}.", "percentile(schedule_lag_s, 50)",
           label="Schedule lag p50", header="lag p50", fmt="ms1", metric="schedule_lag_s"),
    Column("schedule_lag_p99_s", OPEN_LOOP, "s", f"99th percentile of the schedule lag of {_SENT}.",
           "percentile(schedule_lag_s, 99)", label="Schedule lag p99", header="p99", fmt="ms1",
           metric="schedule_lag_s"),
    Column("schedule_lag_max_s", OPEN_LOOP, "s", f"Largest schedule lag of {_SENT}.", "max(schedule_lag_s)",
           label="Schedule lag max", header="max", fmt="ms1", metric="schedule_lag_s"),
    Column("ttft_intended_p50_s", OPEN_LOOP, "s", f"Median TTFT of {_OK_INTENDED}.",
           "percentile(ttft_s + schedule_lag_s, 50)", label="TTFT@intended p50", header="TTFT@intended p50",
           fmt="ms1", metric="ttft_intended"),
    Column("ttft_intended_p95_s", OPEN_LOOP, "s", f"95th percentile of the TTFT of {_OK_INTENDED}.",
           "percentile(ttft_s + schedule_lag_s, 95)", label="TTFT@intended p95", fmt="ms1", metric="ttft_intended"),
    Column("ttft_intended_p99_s", OPEN_LOOP, "s", f"99th percentile of the TTFT of {_OK_INTENDED}.",
           "percentile(ttft_s + schedule_lag_s, 99)", label="TTFT@intended p99", header="p99", fmt="ms1",
           metric="ttft_intended"),
    Column("ttft_intended_mean_s", OPEN_LOOP, "s", f"Mean TTFT of {_OK_INTENDED}.", "mean(ttft_s + schedule_lag_s)",
           label="TTFT@intended mean", fmt="ms1", metric="ttft_intended"),
    Column("e2e_intended_mean_s", OPEN_LOOP, "s", f"Mean E2E of {_OK_INTENDED}.", "mean(e2e_s + schedule_lag_s)",
           label="E2E@intended mean", header="E2E@intended mean", fmt="ms1", metric="e2e_intended"),
    Column("schedule_behind", OPEN_LOOP, "bool", "The client did not keep the schedule: the server was offered "
           "less than the intended load, later.", f"schedule_lag_p99_s > min({LAG_CEILING_S}, max({LAG_FLOOR_S}, "
           f"{LAG_SHARE} / rate_rps)); empty in a closed loop", label="Behind schedule", header="schedule",
           fmt="flag", flag="BEHIND", metric="schedule_behind"),
]  # fmt: skip

_CI = "95 % confidence interval"
_BATCH_MEANS = (
    "batch means: the window cut into k = min(20, window_s / median e2e_s) equal batches, the "
    "t-interval (k - 1 degrees of freedom) over the k batch rates (merged pairwise while their lag-1 "
    "autocorrelation exceeds 0.5), its half-width widened to sqrt(hw^2 + (1.96 * edge_sd)^2) for the window's "
    "edges (tokens are counted when their request completes: edge_sd = sqrt(2 var P(t)) / window_s, P(t) the "
    "tokens in flight at t, linear progress); empty below 5 batches"
)
_ORDER_STATS = (
    "order statistics [x_(l), x_(u)] of the raw values, ranks from Binomial(n, q); empty when n < "
    "10 / (1 - q) (then listed in few_samples)"
)
_T_REQUESTS = "t-interval (n - 1 degrees of freedom) over the requests' values; empty below 2 requests"


def _ci_pair(
    name: str, label: str, unit: str, fmt: str, how: str, metric: str, web_fmt: str | None = None
) -> list[Column]:
    """The <name>_ci_low and <name>_ci_high columns of a step value."""
    return [Column(f"{name}_ci_{end}", UNCERTAINTY, unit, f"{word} bound of the {_CI} of {name}.", how,
                   label=f"{label} CI {end}", fmt=fmt, web_fmt=web_fmt, metric=metric)
            for end, word in (("low", "Lower"), ("high", "Upper"))]  # fmt: skip


# steps.csv, uncertainty: how sure each step's numbers are, and whether the step itself can be trusted (computed in
# analysis/steps.py with analysis/uncertainty.py and analysis/knee.py); last in steps.csv.
_UNCERTAINTY_COLUMNS = [
    *_ci_pair("aggregate_tok_s", "Aggregate tok/s", "tokens/s", "num1", _BATCH_MEANS, "aggregate_tok_s"),
    *_ci_pair("per_request_tok_s_mean", "Per-request tok/s", "tokens/s", "num1", _T_REQUESTS, "per_request_tok_s"),
    *_ci_pair("e2e_mean_s", "E2E mean", "s", "ms1", _T_REQUESTS, "e2e_s"),
    *_ci_pair("ttft_p50_s", "TTFT p50", "s", "ms1", _ORDER_STATS, "ttft_s"),
    *_ci_pair("ttft_p95_s", "TTFT p95", "s", "ms1", _ORDER_STATS, "ttft_s"),
    *_ci_pair("ttft_p99_s", "TTFT p99", "s", "ms1", _ORDER_STATS, "ttft_s"),
    *_ci_pair("tpot_p50_s", "TPOT p50", "s", "ms1", _ORDER_STATS, "tpot_s", web_fmt="ms2"),
    *_ci_pair("tpot_p95_s", "TPOT p95", "s", "ms1", _ORDER_STATS, "tpot_s", web_fmt="ms2"),
    Column("few_samples", UNCERTAINTY, "text", "The step's percentile columns with too few samples for an interval: "
           "their value is a rough guess, marked ~ on the console.", "names, space-separated, of the percentiles "
           "with intervals (and TPOT p99) whose n < 10 / (1 - q) (20 for p50, 200 for p95, 1000 for p99); empty "
           "when none",
           label="Too few samples", fmt="text"),
    Column("aggregate_tok_s_first_half", UNCERTAINTY, "tokens/s", "Aggregate throughput over the first half of the "
           "step's measured window.", "output tokens of the ok requests completed in [measure_start, mid) / "
           "(window_s / 2)", label="Aggregate tok/s, 1st half", metric="aggregate_tok_s"),
    Column("aggregate_tok_s_second_half", UNCERTAINTY, "tokens/s", "Aggregate throughput over the second half of "
           "the step's measured window.", "output tokens of the ok requests completed in [mid, end) / "
           "(window_s / 2)", label="Aggregate tok/s, 2nd half", metric="aggregate_tok_s"),
    Column("stable", UNCERTAINTY, "bool", "Throughput was steady inside the window: no trend beyond its noise "
           "between its two halves.", f"not (|second - first| > sqrt(hw1^2 + hw2^2) and > {STABLE_TOLERANCE:.0%} of "
           "their mean), hw = each half's batch-means half-width; empty when a half has under 2 batches",
           label="Stable", header="stable", fmt="pass", flag="UNSTABLE", metric="stable"),
    Column("outlier", UNCERTAINTY, "bool", "The step ran slower than the steps around it imply: something else may "
           "have used the server or this machine.", f"the next step is clearly above it and its CI high < (1 - "
           f"{OUTLIER_MARGIN}) x the line between its neighbours; empty for the first and last step",
           label="Outlier", header="outlier", fmt="flag", flag="OUTLIER", metric="outlier"),
]  # fmt: skip

# steps.csv, server bounds: what vLLM's histograms say of their p50 and p99 (analysis/server_metrics.py and
# analysis/histograms.py), after the open-loop columns, since steps.csv only gains columns at its end.
_SERVER_BOUND_COLUMNS = [
    *_server_bounds("server_ttft", "vllm:time_to_first_token_seconds", "Server TTFT"),
    *_server_bounds("server_queue_time", "vllm:request_queue_time_seconds", "Queue time"),
]
# steps.csv, how each step ended (analysis/adaptive.py), after the open-loop columns.
_STEP_END_COLUMNS = [
    Column("end_reason", STEP_END, "text", "Why the step ended: ci_target (--step-duration auto: its aggregate tok/s "
           "interval within --ci-target with enough TTFT samples), max_duration (it reached --max-step-duration "
           "first: flagged), fixed (--step-duration elapsed), run_stopped (the run was stopped first).",
           "run.json's timeline entry of the step", label="End reason", fmt="text"),
    Column("probe", STEP_END, "count", "The order in which the probes of a capacity search (--find-capacity) ran, from "
           "1; empty in a run of fixed steps.", "run.json's timeline entry of the step", label="Probe", header="probe",
           fmt="int"),
]  # fmt: skip

_NO_ANSWER = "no answer"  # a TTFO percentile that requests never answered reach (+inf)
_NEVER = (
    '; a request without an answer token counts as never answered (+inf: shown "no answer"), so the '
    "percentile is inf once its rank reaches them"
)


def _ttfo_percentiles() -> list[Column]:
    return [
        Column(f"ttfo_p{q}_s", REASONING, "s", f"{q}th percentile of the TTFO of {_MEASURED}: the wait for the "
               f"first answer or tool-call token{_NEVER}.", f"percentile(ttfo_s, {q}), no answer = +inf",
               label=f"TTFO p{q}", header=f"TTFO p{q}", fmt="ms1", metric="ttfo_s", inf_text=_NO_ANSWER)
        for q in (50, 95, 99)
    ]  # fmt: skip


# steps.csv, reasoning and tool calls (analysis/reasoning.py), after why each step ended: steps.csv only gains
# columns at its end. Written for every run (a run that does not reason has TTFO = TTFT, 0 reasoning tokens); the
# console and the report show them only when a request reasoned or called a tool.
_REASONING_COLUMNS = [
    *_ttfo_percentiles(),
    Column("reasoning_tokens_mean", REASONING, "tokens", f"Mean reasoning tokens per request of {_MEASURED}.",
           "mean(reasoning_tokens)", label="Reasoning tokens mean", header="reasoning tok", fmt="num0",
           metric="reasoning_tokens"),
    Column("reasoning_share", REASONING, "fraction", f"Share of the output tokens of {_MEASURED} that were "
           "reasoning.", "sum(reasoning_tokens) / sum(output_tokens)", label="Reasoning share",
           header="reasoning share", fmt="pct0", metric="reasoning_share"),
    Column("answer_tpot_p50_s", REASONING, "s", f"Median answer-only TPOT of {_MEASURED}; answers of one token "
           "have none.", "percentile(answer_tpot_s, 50)", label="Answer TPOT p50", header="answer TPOT p50",
           fmt="ms1", web_fmt="ms2", metric="answer_tpot_s"),
    Column("no_answer_requests", REASONING, "requests", f"How many of {_MEASURED} had no answer token: the "
           "stream ended inside the thought (max_tokens reached while reasoning, or a model that never closes it).",
           "count of ttfo_s missing with reasoning_tokens known; empty for records without them", label="No answer",
           header="no answer", fmt="int", metric="ttfo_s"),
    Column("tool_call_requests", REASONING, "requests", f"How many of {_MEASURED} streamed a tool call.",
           "count of tool_call_chunks > 0", label="Tool-call requests", header="tool calls", fmt="int"),
    *[c for name in ("ttfo_p50_s", "ttfo_p95_s", "ttfo_p99_s")
      for c in (Column(f"{name}_ci_{end}", REASONING, "s", f"{word} bound of the {_CI} of {name}.",
                       "order statistics [x_(l), x_(u)] of the raw values, a request never answered +inf (so a bound "
                       "whose rank reaches them is inf), ranks from Binomial(n, q); empty when n < 10 / (1 - q) "
                       "(the console marks the value ~)", label=f"{name[:4].upper()} {name[5:8]} CI {end}",
                       fmt="ms1", metric="ttfo_s", inf_text=_NO_ANSWER)
                for end, word in (("low", "Lower"), ("high", "Upper")))],
]  # fmt: skip

_E2E_ORDER_STATS = (
    "order statistics [x_(l), x_(u)] of the raw e2e_s values, ranks from Binomial(n, q); empty when n < 10 / (1 - q)"
)
_COMPLETED = "the ok requests (any step) that completed inside the step's measured window"


def _emb_ci(name: str, label: str, unit: str, fmt: str, how: str, metric: str) -> list[Column]:
    """The <name>_ci_low and <name>_ci_high columns of an embeddings step value."""
    return [Column(f"{name}_ci_{end}", EMBEDDINGS, unit, f"{word} bound of the {_CI} of {name}.", how,
                   label=f"{label} CI {end}", fmt=fmt, metric=metric)
            for end, word in (("low", "Lower"), ("high", "Upper"))]  # fmt: skip


# steps.csv, embeddings (issue 19): last in steps.csv (analysis/embeddings.py). Written for every run; inputs_per_s
# is empty outside an embeddings run, prompt_tok_s is a chat or completions run's prefill rate.
_EMBEDDINGS_COLUMNS = [
    Column("inputs_per_s", EMBEDDINGS, "inputs/s", f"Inputs embedded per second: inputs of {_COMPLETED} / window_s; "
           "empty when no record carries inputs (not an embeddings run).", "sum(inputs) / window_s",
           label="Inputs/s", header="inputs/s", fmt="num1", metric="inputs_per_s"),
    Column("prompt_tok_s", EMBEDDINGS, "tokens/s", f"Prompt tokens per second: the server's prompt_tokens of "
           f"{_COMPLETED} / window_s; empty when no record carries prompt_tokens.", "sum(prompt_tokens) / window_s",
           label="Prompt tok/s", header="prompt tok/s", fmt="num1", metric="prompt_tok_s"),
    *[Column(f"e2e_p{q}_s", EMBEDDINGS, "s", f"{q}th percentile of e2e_s over {_MEASURED}.", f"percentile(e2e_s, {q})",
             label=f"E2E p{q}", header=f"E2E p{q}" if q == 50 else f"p{q}", fmt="ms1", metric="e2e_s")
      for q in (50, 95, 99)],
    *_emb_ci("inputs_per_s", "Inputs/s", "inputs/s", "num1", _BATCH_MEANS.replace("tokens", "inputs"), "inputs_per_s"),
    *_emb_ci("prompt_tok_s", "Prompt tok/s", "tokens/s", "num1", _BATCH_MEANS, "prompt_tok_s"),
    *[c for q in (50, 95, 99) for c in _emb_ci(f"e2e_p{q}_s", f"E2E p{q}", "s", "ms1", _E2E_ORDER_STATS, "e2e_s")],
    # The halves `stable` compares in an embeddings run (its tok/s halves are empty: no output tokens).
    Column("inputs_per_s_first_half", EMBEDDINGS, "inputs/s", "Inputs/s over the first half of the step's measured "
           "window.", "inputs of the ok requests completed in [measure_start, mid) / (window_s / 2)",
           label="Inputs/s, 1st half", metric="inputs_per_s"),
    Column("inputs_per_s_second_half", EMBEDDINGS, "inputs/s", "Inputs/s over the second half of the step's measured "
           "window.", "inputs of the ok requests completed in [mid, end) / (window_s / 2)",
           label="Inputs/s, 2nd half", metric="inputs_per_s"),
]  # fmt: skip

# requests.parquet: one row per request, in analysis/records.py SCHEMA's order.
_GPU_MEAN = "mean over the GPUs with samples in the window of each GPU's mean over its samples inside it"

# steps.csv, GPU (issue 20): last in steps.csv (analysis/gpu.py). Written for every run: the window's Unix times
# always, the GPU columns empty without --gpu-metrics-url or when a GPU does not export the field (never 0).
_GPU_COLUMNS = [
    Column("window_start_time", GPU, "Unix s", "Start of the step's measured window (after its warm-up), in Unix "
           "seconds: joins any time series (Prometheus, DCGM, logs) to the step.", "measure_start",
           label="Window start (Unix s)", fmt="num3"),
    Column("window_end_time", GPU, "Unix s", "End of the step's measured window, in Unix seconds; empty while the "
           "step runs.", "end_time", label="Window end (Unix s)", fmt="num3"),
    Column("gpus", GPU, "GPUs", "GPUs with DCGM samples inside the window, over every --gpu-metrics-url; empty without "
           "GPU telemetry.", "count of distinct gpu_key (<Hostname>/<gpu>)", label="GPUs", header="gpus", fmt="int"),
    Column("gpu_util_mean", GPU, "fraction", "Mean GPU utilization (time a kernel ran) in the window.",
           f"{_GPU_MEAN}, of DCGM_FI_DEV_GPU_UTIL / 100", label="GPU util", header="util", fmt="pct0",
           metric="gpu_util"),
    Column("gpu_sm_active_mean", GPU, "fraction", "Mean SM activity in the window; empty for a GPU without profiling "
           "fields.", f"{_GPU_MEAN}, of DCGM_FI_PROF_SM_ACTIVE", label="SM active", header="SM", fmt="num2",
           metric="gpu_sm_active"),
    Column("gpu_dram_active_mean", GPU, "fraction", "Mean DRAM (memory-interface) activity in the window: the share "
           "of peak memory bandwidth used; empty for a GPU without profiling fields.",
           f"{_GPU_MEAN}, of DCGM_FI_PROF_DRAM_ACTIVE", label="DRAM active", header="DRAM", fmt="num2",
           metric="gpu_dram_active"),
    Column("gpu_mem_used_max_bytes", GPU, "bytes", "Most framebuffer memory any GPU used in the window.",
           "max over the GPUs and their samples inside the window, of DCGM_FI_DEV_FB_USED * 2**20",
           label="GPU memory max (bytes)", header="mem max", fmt="int", metric="gpu_mem_used"),
    Column("gpu_power_mean_w", GPU, "W", "Mean power draw per GPU in the window.",
           f"{_GPU_MEAN}, of DCGM_FI_DEV_POWER_USAGE", label="GPU power (W)", header="power W", fmt="num0",
           metric="gpu_power"),
]  # fmt: skip

_REQUEST_COLUMNS = [
    Column("request_id", REQUESTS, "text", "Unique id of the request, given by the client.", live=True),
    Column("worker", REQUESTS, "text", "The load-generating process that sent it (<host>-<pid>)."),
    Column("step", REQUESTS, "index", "The load step it was sent in (0 = first).", live=True),
    Column("users", REQUESTS, "users", "Its step's target users, all processes together.", live=True),
    Column("warmup", REQUESTS, "bool", "Sent during its step's warm-up (--step-warmup): not measured.", live=True),
    Column("start_time", REQUESTS, "s", "Unix time of the send stamp (the request's bytes written).", live=True),
    Column("endpoint", REQUESTS, "text", "The API it called: completions, chat or embeddings."),
    Column("model", REQUESTS, "text", "The model it asked for."),
    Column("status", REQUESTS, "text", "ok or error.", live=True),
    Column("error_type", REQUESTS, "text", "The failure's category (e.g. timeout, connection_error, stream_error; "
           "cut_off: in flight when the load generator stopped); none when ok.", live=True),
    Column("error", REQUESTS, "text", "The failure's message; none when ok."),
    Column("http_status", REQUESTS, "code", "The response's HTTP status; none when no response came."),
    Column("ttft_s", REQUESTS, "s", "Time to first token.", "arrival offset of the first token-carrying chunk",
           metric="ttft_s", live=True),
    Column("e2e_s", REQUESTS, "s", "End-to-end latency.", "arrival offset of the last token-carrying chunk (an "
           "embeddings request: of the body's last byte)",
           metric="e2e_s", live=True),
    Column("tpot_s", REQUESTS, "s", "Time per output token.", "(e2e_s - ttft_s) / (output_tokens - 1); none when "
           "output_tokens <= 1", metric="tpot_s", live=True),
    Column("duration_s", REQUESTS, "s", "Time from the send stamp to the response's end (or the failure).",
           "end - start_time", live=True),
    Column("output_tokens", REQUESTS, "tokens", "Output tokens of the answer.", "usage.completion_tokens, else the "
           "token-carrying chunks", metric="output_tokens", live=True),
    Column("output_tokens_estimated", REQUESTS, "bool", "output_tokens counted from chunks: the server sent no "
           "usage."),
    Column("prompt_tokens", REQUESTS, "tokens", "The server's usage.prompt_tokens; none without usage.", live=True),
    Column("chunks", REQUESTS, "chunks", "Token-carrying chunks received.", "len(chunk_offsets_s)"),
    Column("finish_reason", REQUESTS, "text", "The server's finish_reason (stop, length, ...)."),
    Column("chunk_offsets_s", REQUESTS, "s", "Arrival offset of each token-carrying chunk, from the send stamp.",
           "list, one per chunk"),
    Column("chunk_tokens", REQUESTS, "tokens", "Output tokens each chunk carried.", "list, one per chunk; ITL "
           "samples: chunk i >= 1 with k tokens after gap g gives k samples of g / k", metric="itl_s"),
    Column("dataset", REQUESTS, "text", "The --dataset spec the prompt came from, e.g. synthetic:128."),
    Column("max_tokens", REQUESTS, "tokens", "The max_tokens the request asked for (--max-tokens or "
           "--max-tokens-dist)."),
    Column("reference_output_tokens", REQUESTS, "tokens", "The dataset's own answer length (sharegpt); else none."),
    Column("intended_start_time", REQUESTS, "s", "Open loop: when the arrival schedule meant it to be sent; none in "
           "a closed loop.", "Unix time", metric="intended_start_time", live=True),
    Column("schedule_lag_s", REQUESTS, "s", "Open loop: how late it was sent; none in a closed loop.",
           "start_time - intended_start_time", metric="schedule_lag_s", live=True),
    Column("session_id", REQUESTS, "text", "Conversations (--turns): the conversation this request is a turn of; "
           "none in single-turn runs."),
    Column("turn", REQUESTS, "index", "Conversations (--turns): its turn in the conversation, 1-based; none in "
           "single-turn runs."),
    Column("history_tokens", REQUESTS, "tokens", "Conversations (--turns): prompt tokens that repeat the "
           "conversation so far (earlier turns and answers); 0 on the first turn, none in single-turn runs.",
           "prompt_tokens of the previous turn + its output_tokens (the server's counts)"),
    Column("cached_prompt_tokens", REQUESTS, "tokens", "Prompt tokens the server found in its prefix cache, from "
           "its usage.prompt_tokens_details.cached_tokens (vLLM with --enable-prompt-tokens-details); none when the "
           "server does not send it."),
    Column("trace_row", REQUESTS, "index", "Trace replay (--trace): the 0-based row of the trace file this request "
           "replays; none otherwise."),
    Column("reasoning_tokens", REQUESTS, "tokens", "Output tokens that came in reasoning deltas (delta.reasoning or "
           "delta.reasoning_content): the model thinking before it answers; 0 when none did, none when no token "
           "came.", "sum of the tokens of reasoning chunks (exact with continuous usage; without: the server's "
           "usage.completion_tokens_details.reasoning_tokens, else one per reasoning chunk)",
           metric="reasoning_tokens", live=True),
    Column("ttfo_s", REQUESTS, "s", "Time to first output token: the first answer (delta.content) or tool-call token, "
           "what the user waits for; none when the stream had none (a thought never closed).",
           "arrival offset of the first answer or tool-call chunk", metric="ttfo_s", live=True),
    Column("tool_call_chunks", REQUESTS, "chunks", "Token-carrying chunks that streamed a tool call "
           "(delta.tool_calls); none when no token came.", "count", live=True),
    Column("answer_tpot_s", REQUESTS, "s", "Time per output token of the answer alone (after the thinking).",
           "(e2e_s - ttfo_s) / (output_tokens - reasoning_tokens - 1); none when the answer has <= 1 token",
           metric="answer_tpot_s", live=True),
    Column("inputs", REQUESTS, "inputs", "Embeddings (--endpoint embeddings): the inputs the request carried "
           "(--batch-size); none for the streaming endpoints.", live=True),
    Column("images", REQUESTS, "images", "Chat with --images: the images the request carried; none without "
           "images."),
    Column("measured", REQUESTS, "bool", "Counted by the step table (steps.csv): sent after its step's warm-up and "
           "finished before the load generator began to stop. False for the warm-up's requests and for those in "
           "flight at the stop (their timings are real but not part of any step's statistics); decided when the run "
           "is merged, so none in records/*.jsonl and in a requests.parquet written before this column existed.",
           "not warmup and start_time + duration_s <= the timeline's last end_time and error_type != cut_off"),
]  # fmt: skip

# The web UI's LLM tab only: the row's scope and the server's gauges from the latest scrape.
_LIVE_COLUMNS = [
    Column("scope", LIVE, "text", "Which row: the current (or last) step, or the whole run so far.", label="Scope",
           fmt="text"),
    Column("kv_cache_usage", LIVE, "fraction", "KV-cache usage in the latest scrape.", "vllm:kv_cache_usage_perc",
           label="KV cache (latest)", fmt="pct0", metric="kv_cache_usage"),
    Column("running", LIVE, "requests", "Requests in vLLM's running batch in the latest scrape.",
           "vllm:num_requests_running", label="Running (latest)", fmt="int", metric="running"),
    Column("waiting", LIVE, "requests", "Requests waiting for admission in the latest scrape.",
           "vllm:num_requests_waiting", label="Waiting (latest)", fmt="int", metric="waiting"),
]  # fmt: skip

_TURN = "the turn's measured ok requests (every step's: started after its warm-up, not cut off)"
_CACHED = "the turn's measured ok requests that carry cached_prompt_tokens"

# turns.csv: one row per turn index of the conversations (analysis/turns.py), from requests.parquet.
_TURN_COLUMNS = [
    Column("turn", TURNS, "index", "The turn of the conversations, 1-based: every conversation's k-th request.",
           label="Turn", header="turn", fmt="int"),
    Column("requests", TURNS, "requests", f"Ok requests measured: the count of {_TURN}.", "count",
           label="Requests ok", header="reqs", fmt="int"),
    Column("errors", TURNS, "requests", "Failed requests of the turn started after their step's warm-up, not cut "
           "off.", "count", label="Errors", header="errors", fmt="int"),
    Column("prompt_tokens_mean", TURNS, "tokens", f"Mean prompt length of {_TURN}: the whole history resent, plus "
           "the new user message.", "mean(prompt_tokens)", label="Prompt tokens mean", header="prompt tok",
           fmt="num0"),
    Column("history_tokens_mean", TURNS, "tokens", f"Mean of the prompt tokens that repeat the conversation so far, "
           f"over {_TURN}; 0 on turn 1.", "mean(history_tokens)", label="History tokens mean", header="history tok",
           fmt="num0"),
    Column("ttft_p50_s", TURNS, "s", f"Median TTFT of {_TURN}.", "percentile(ttft_s, 50)", label="TTFT p50",
           header="TTFT p50", fmt="ms1", metric="ttft_s"),
    Column("ttft_p95_s", TURNS, "s", f"95th percentile of the TTFT of {_TURN}.", "percentile(ttft_s, 95)",
           label="TTFT p95", header="p95", fmt="ms1", metric="ttft_s"),
    Column("tpot_p50_s", TURNS, "s", f"Median TPOT of {_TURN}; one-token answers have none.",
           "percentile(tpot_s, 50)", label="TPOT p50", header="TPOT p50", fmt="ms1", web_fmt="ms2",
           metric="tpot_s"),
    Column("prefix_cache_hit_rate", TURNS, "fraction", "Share of the turn's prompt tokens the server found in its "
           f"prefix cache, per request from its usage (not its /metrics counters), over {_CACHED}; empty when none "
           "does (the server sent no cached_tokens: vLLM without --enable-prompt-tokens-details), never 0. With "
           "SGLang, which leaves out a zero, an ok request with usage but without it counts as 0 cached when other "
           "requests of the run carry it.", "sum(cached_prompt_tokens) / sum(prompt_tokens)",
           label="Prefix-cache hit rate", header="prefix hits", fmt="pct0"),
    Column("prefix_cache_requests", TURNS, "requests", f"How many requests the hit rate is over: {_CACHED}.",
           "count", label="Requests with cached tokens", fmt="int"),
    *[Column(f"{name}_ci_{end}", TURNS, "s", f"{word} bound of the {_CI} of {name}.", _ORDER_STATS,
             label=f"{label} CI {end}", fmt="ms1", metric=metric)
      for name, label, metric in (("ttft_p50_s", "TTFT p50", "ttft_s"), ("ttft_p95_s", "TTFT p95", "ttft_s"),
                                  ("tpot_p50_s", "TPOT p50", "tpot_s"))
      for end, word in (("low", "Lower"), ("high", "Upper"))],
    *[Column(f"prefix_cache_hit_rate_ci_{end}", TURNS, "fraction", f"{word} bound of the {_CI} of "
             "prefix_cache_hit_rate.", "ratio estimator R = sum(c) / sum(p) over the n requests: R ± t(n - 1, "
             "0.975) * sqrt(sum((c - R p)^2) / (n - 1)) / (sqrt(n) * mean(p)), clipped to [0, 1]; the requests of a "
             "turn are of different conversations, so independent; empty below 2 requests",
             label=f"Prefix-cache hit rate CI {end}", fmt="pct0")
      for end, word in (("low", "Lower"), ("high", "Upper"))],
    Column("few_samples", TURNS, "text", "The turn's percentile columns with too few samples for an interval: "
           "their value is a rough guess, marked ~ on the console.", "names, space-separated, of the percentiles "
           "whose n < 10 / (1 - q) (20 for p50, 200 for p95); empty when none", label="Too few samples", fmt="text"),
]  # fmt: skip

# steps.csv, the roofline verdict (analysis/roofline.py, issue 20), last in the GPU section: after analysis/gpu.py's
# means over the GPUs. Written for every run (empty without GPU samples).
_GPU_READINGS = (
    "the GPUs' readings inside the step's measured window, each GPU's repeats (every field equal to its previous "
    "scrape's: the exporter had not refreshed) left out"
)
_GPU_CI = (
    "per GPU an AR(1) interval of the mean of its readings (r = their lag-1 autocorrelation + (1 + 4 r) / n, within "
    "[0, 0.95]; n_eff = n (1 - r) / (1 + r); mean ± t(n_eff - 1) * sd / sqrt(n) * sqrt((1 + r) / (1 - r))), then the "
    "mean over the GPUs of their means, half-width the mean of their half-widths (GPUs move together: never narrower "
    "than the data allow), clipped to [0, 1]; empty below 5 readings of a GPU"
)
_GPU_VERDICT_COLUMNS = [
    Column("gpu_regime", GPU, "text", "The roofline regime: memory_bound (decode waits on memory bandwidth: DRAM "
           "activity high, SM activity below saturation), compute_bound (SM activity saturated, DRAM not), neither "
           "(both low: the GPU waits on the engine's CPU side or the load); empty when it cannot be told (no "
           "profiling counters, too few readings, an interval straddling a threshold, the GPUs disagree). Judged "
           "per GPU on the intervals of its DRAM and SM activity; the step's regime is that of its busy GPUs (the "
           "idle ones, neither, left aside) when they agree.", f"per GPU: memory_bound when DRAM CI low >= "
           f"{DRAM_ACTIVE_HIGH} and SM CI high < {SM_ACTIVE_SATURATED}; compute_bound when SM CI low >= "
           f"{SM_ACTIVE_SATURATED} and DRAM CI high < {DRAM_ACTIVE_HIGH}; neither when DRAM CI high < "
           f"{DRAM_ACTIVE_HIGH} and SM CI high < {GPU_ACTIVE_LOW}; else empty", label="GPU regime",
           header="regime", fmt="text"),
    *[Column(f"gpu_{name}_active_ci_{end}", GPU, "fraction", f"{word} bound of the {_CI} of the mean {what} "
             f"activity over {_GPU_READINGS}.", _GPU_CI, label=f"{label} active CI {end}", fmt="num2")
      for name, what, label in (("dram", "DRAM", "DRAM"), ("sm", "SM", "SM"))
      for end, word in (("low", "Lower"), ("high", "Upper"))],
]  # fmt: skip

COLUMNS: dict[tuple[str, str], Column] = {
    (c.section, c.name): c
    for c in _STEP_COLUMNS
    + _SERVER_COLUMNS
    + _GENERATOR_COLUMNS
    + _OPEN_LOOP_COLUMNS
    + _UNCERTAINTY_COLUMNS
    + _SERVER_BOUND_COLUMNS
    + _STEP_END_COLUMNS
    + _REASONING_COLUMNS
    + _EMBEDDINGS_COLUMNS
    + _GPU_COLUMNS
    + _GPU_VERDICT_COLUMNS
    + _REQUEST_COLUMNS
    + _LIVE_COLUMNS
    + _TURN_COLUMNS
}
# One column per name in the step table (steps.csv and the web UI's row): the requests' columns may share a name.
STEP_TABLE: dict[str, Column] = {
    c.name: c
    for c in COLUMNS.values()
    if c.section
    in (STEP, SERVER, GENERATOR, OPEN_LOOP, UNCERTAINTY, SERVER_BOUNDS, STEP_END, REASONING, EMBEDDINGS, GPU, LIVE)
}

# The web UI's LLM tab, in the order shown.
WEB_UI = [
    "scope", "step", "probe", "users", "rate_rps", "requests", "errors", "aggregate_tok_s", "per_request_tok_s_mean",
    "ttft_p50_s", "ttft_p95_s", "ttft_p99_s", "ttfo_p50_s", "ttfo_p95_s", "reasoning_share", "tpot_p50_s",
    "tpot_p95_s", "schedule_lag_p99_s",
    "kv_cache_usage", "running", "waiting", "stable", "outlier",
    "inputs_per_s", "prompt_tok_s", "e2e_p95_s",  # issue 19: an embeddings run's (inputs/s empty in any other run)
]  # fmt: skip


def columns(section: str) -> list[Column]:
    """The columns of one section, in the order they are written."""
    return [c for c in COLUMNS.values() if c.section == section]


def names(section: str) -> list[str]:
    """The column names of one section, in the order they are written."""
    return [c.name for c in columns(section)]


def web_columns() -> list[Column]:
    """The web UI's columns, in the order shown."""
    return [STEP_TABLE[name] for name in WEB_UI]


def step_values(data: StepData) -> dict:
    """The computed core columns of one row (all but step and users): each column's own function."""
    return {c.name: c.compute(data) for c in columns(STEP) if c.compute is not None}


# --- the console's tables ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Section:
    """A console table: its title line, the columns repeated at its left, and its columns when their order there
    is not the written order (a column of another section is headed by its label there)."""

    key: str
    title: str
    lead: tuple[str, ...] = ()
    console: tuple[str, ...] | None = None

    def shown(self) -> list[tuple[Column, str]]:
        """(column, header) of its console table."""
        if self.console is None:
            cols = [STEP_TABLE[n] for n in self.lead] + [c for c in columns(self.key) if c.header]
        else:
            cols = [STEP_TABLE[n] for n in self.lead + self.console]
        return [(c, c.header if c.section == self.key or c.name in self.lead else c.label) for c in cols]


SECTIONS = {
    STEP: Section(
        STEP,
        "Batching curve (latencies in ms; TTFT/TPOT/ITL exact percentiles of raw records; ± the half-width of the 95 % "
        "interval; ~ too few samples for a percentile's interval)",
    ),
    SERVER: Section(
        SERVER,
        "Server (vLLM /metrics over each step's measured window; times in ms; a p99 its histogram buckets cannot pin "
        "down shows the bounds they allow, e.g. < 300)",
        ("step", "users"),
    ),
    GENERATOR: Section(
        GENERATOR,
        "Load generator (self-checks over each step's measured window; lag in ms; BOUND: lag p99 over "
        f"{LAG_BOUND_S * 1000:.0f} ms or a process over {CPU_BOUND:.0%} CPU)",
        ("step", "users"),
        (
            "users_achieved_mean",
            "generator_processes",
            "generator_lag_p50_s",
            "generator_lag_p99_s",
            "generator_lag_max_s",
            "generator_cpu_max",
            "generator_bound",
        ),
    ),
    TURNS: Section(
        TURNS,
        "Per turn (every conversation's k-th request; latencies in ms, exact percentiles; ~ too few samples for a "
        "percentile's interval; prefix hits: cached prompt tokens / prompt tokens, from the server's usage)",
    ),
    REASONING: Section(
        REASONING,
        "Reasoning (latencies in ms; TTFT: the first token of any kind, thinking included; TTFO: the first answer or "
        "tool-call token, what the user waits for; the gap is the time spent reasoning; no answer: requests that "
        "never got an answer token reach that percentile; ~ too few samples for a percentile's interval)",
        ("step", "users"),
        (
            "requests",
            "ttft_p50_s",
            "ttfo_p50_s",
            "ttft_p95_s",
            "ttfo_p95_s",
            "ttft_p99_s",
            "ttfo_p99_s",
            "reasoning_share",
            "reasoning_tokens_mean",
            "answer_tpot_p50_s",
            "no_answer_requests",
            "tool_call_requests",
        ),
    ),
    EMBEDDINGS: Section(
        EMBEDDINGS,
        "Embeddings (inputs/s and prompt tok/s over each step's measured window, ± the half-width of the 95 % "
        "interval; E2E: send to the body's last byte, exact percentiles in ms; ~ too few samples for a percentile's "
        "interval)",
        ("step", "users", "requests", "errors"),
        ("inputs_per_s", "prompt_tok_s", "e2e_p50_s", "e2e_p95_s", "e2e_p99_s"),
    ),
    OPEN_LOOP: Section(
        OPEN_LOOP,
        "Open loop (times in ms; lag = actual - intended send time; @intended: latency + lag; BEHIND: lag p99 over "
        f"min({LAG_CEILING_S * 1000:.0f} ms, max({LAG_FLOOR_S * 1000:.0f} ms, {LAG_SHARE:.0%} of 1/rate)))",
        ("step",),
        (
            "rate_rps",
            "achieved_rps",
            "schedule_lag_p50_s",
            "schedule_lag_p99_s",
            "schedule_lag_max_s",
            "ttft_p99_s",
            "ttft_intended_p50_s",
            "ttft_intended_p99_s",
            "e2e_mean_s",
            "e2e_intended_mean_s",
            "schedule_behind",
        ),
    ),
}


def aligned(rows: list[list[str]]) -> list[str]:
    """Rows of cells right-aligned in columns two spaces apart (the first row is the header)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]


def console_rows(table: pd.DataFrame, section: str) -> list[list[str]]:
    """A section's console table as cells: the header row, then one row per step (a column the table lacks: -)."""
    shown = SECTIONS[section].shown()
    rows = [[header for _, header in shown]]
    for r in table.to_dict(orient="records"):
        rows.append([c.cell(r) for c, _ in shown])
    return rows


def console_table(table: pd.DataFrame, section: str) -> list[str]:
    """A section's console table: its title line, its header and one line per step."""
    return [SECTIONS[section].title, *aligned(console_rows(table, section))]


# --- docs/metrics.md -----------------------------------------------------------------------------------------

DOCS_FILE = "docs/metrics.md"
DOCS_COMMAND = f"python -m analysis glossary --write {DOCS_FILE}"
_DOCS_SECTIONS = [
    (STEP, "steps.csv: the step table", "One row per load step, from requests.parquet (`analysis/steps.py`); on "
     "the console as the \"Batching curve\". A step's measured requests are those started after its warm-up and not "
     "in flight when the load generator began to stop (cut_off). Percentiles are exact order statistics of the raw "
     "values (linear interpolation between closest ranks, numpy's default), never Locust's response-time buckets."),
    (SERVER, "steps.csv: the server", "vLLM's Prometheus series over each step's measured window "
     "(`analysis/server_metrics.py`); empty without `--metrics-url` scrapes."),
    (GENERATOR, "steps.csv: the load generator", "The load generator's self-checks (`generator.parquet`) over each "
     "step's measured window (`analysis/generator.py`)."),
    (OPEN_LOOP, "steps.csv: open loop", "Open-loop runs (`--rates`), last in steps.csv; empty in a closed loop but "
     "achieved_rps (`analysis/schedule.py`)."),
    (UNCERTAINTY, "steps.csv: confidence intervals and suspect steps", "How sure each step's numbers are (95 % "
     "confidence intervals, computed in `analysis/steps.py` with `analysis/uncertainty.py`), and whether the step "
     "itself can be trusted (`analysis/knee.py`); last in steps.csv. Rates over the window (aggregate tok/s): batch "
     "means. Completions inside one step are not independent (the same users, the same batch), so a t-interval over "
     "single requests or 1-second bins is too narrow; the window is cut into k equal batches, each at least one "
     "median E2E long, and the t-interval is taken over the k batch rates, which assumes the step is stationary (no "
     "trend: `stable` checks it) and the batch rates nearly independent (adjacent batches still alike, lag-1 "
     "autocorrelation over 0.5, are merged pairwise). Tokens are counted when their request completes, so the "
     "window's edges add an error batch means miss when completions are periodic (a few users in step): the tokens "
     "in flight at its start minus those at its end; its spread is measured from the requests' own spans and added "
     "to the half-width. The point estimate is the window's rate, unchanged. Means over "
     "requests (per-request tok/s, E2E): t-intervals, assuming independent requests (in a closed loop they are "
     "mildly correlated, so these are a little narrow). Percentiles (TTFT, TPOT): distribution-free order-statistic "
     "intervals, the ranks from the binomial distribution of the count of samples below the true quantile, assuming "
     "independent requests; with fewer than 10 / (1 - q) samples there is no such interval (the sample extreme would "
     "be a bound): the bounds are empty, the column is listed in `few_samples` and the console marks its value ~. A "
     "bound is empty whenever the data cannot give one. `stable` and `outlier` are the suspect-step checks; the "
     "diagnosis explains each flagged step and leaves outliers out of the knee."),
    (SERVER_BOUNDS, "steps.csv: server histogram bounds", "What vLLM's histograms say of the server's p50 and "
     "p99 (`analysis/histograms.py`), after the open-loop columns: the bounds each quantile lies between. A "
     "histogram only counts observations between bucket bounds, so a quantile is known to lie in one bucket; "
     "linear interpolation inside it is a guess (in the first bucket, half its width whatever the data were). For a "
     "non-negative time the q-quantile is also at most mean / (1 - q) (Markov's inequality), with the exact mean "
     "from _sum / _count: a median is at most twice the mean. The server columns p50/p99 keep a value only when "
     "these bounds are narrow; the console's server table shows the bounds otherwise (\"< 300\", \"100-250\", "
     "\"> 10000\" in ms). Empty without scrapes or observations."),
    (STEP_END, "steps.csv: how each step ended", "Why each step ended, last in steps.csv (`analysis/adaptive.py`): "
     "with `--step-duration auto` a step runs until its aggregate tok/s interval is within `--ci-target` and its "
     "TTFT p95 has enough samples, looked at only at fixed check points, or until `--max-step-duration`."),
    (REASONING, "steps.csv: reasoning and tool calls", "Reasoning models and tool calls "
     "([reasoning.md](reasoning.md#what-is-measured)), last in steps.csv (`analysis/reasoning.py`), over the step "
     "table's measured ok requests. The parser tells each token-carrying chunk apart: answer (delta.content), tool "
     "call (delta.tool_calls) or reasoning (delta.reasoning, delta.reasoning_content). TTFT counts the first token "
     "of any kind, thinking included; TTFO is the first token of the answer, what the user waits for: the gap is "
     "the time spent reasoning. Written for every run: without reasoning TTFO equals TTFT and the reasoning share "
     "is 0; the console's \"Reasoning\" table, the web UI's TTFO cells and the report's Reasoning section appear "
     "when a request reasoned or called a tool. A request whose stream ended inside the thought has no TTFO: it "
     "counts as never answered (+inf) in the TTFO percentiles and their intervals (shown \"no answer\"), and in "
     "no_answer_requests; leaving it out would make the percentiles read better than the requests did."),
    (EMBEDDINGS, "steps.csv: embeddings", "Embeddings runs (`--endpoint embeddings`, "
     "[embeddings-images.md](embeddings-images.md#embeddings-the-results)), last in steps.csv "
     "(`analysis/embeddings.py`). An embeddings request does not stream: its throughput is inputs and prompt tokens "
     "per second, counted when the request completes inside the step's window, with batch-means intervals as "
     "aggregate tok/s's; its latency is E2E, from the send stamp to the body's last byte, with order-statistic "
     "intervals as TTFT's. Written for every run: inputs_per_s is empty outside an embeddings run, prompt_tok_s is "
     "any run's prompt (prefill) rate; the console's \"Embeddings\" table replaces the batching curve in an "
     "embeddings run, whose streaming columns do not apply."),
    (GPU, "steps.csv: GPU telemetry", "The step's measured window in Unix seconds (always written: it joins any "
     "time series to the step), then NVIDIA dcgm-exporter's samples (`--gpu-metrics-url`, one per GPU host) over "
     "that window ([gpu-telemetry.md](gpu-telemetry.md)), last in steps.csv (`analysis/gpu.py`). The samples are "
     "kept raw in metrics.parquet with all their labels and `source` = the exporter's URL; a GPU is "
     "`<Hostname>/<gpu>` (its UUID without a Hostname label). Each GPU's samples inside the window are averaged "
     "first, then the GPUs, so a GPU scraped less often (gaps) weighs the same. A field a GPU does not export "
     "(DCGM_FI_PROF_* on a consumer GPU; DCGM_FI_PROF_SM_ACTIVE is not in dcgm-exporter's default counters) and "
     "DCGM's blank values are missing, never 0. Then the roofline verdict on them (`analysis/roofline.py`, "
     "[gpu-telemetry.md](gpu-telemetry.md#reading-the-gpu-verdict))."),
    (TURNS, "turns.csv: per turn", "Conversation runs (`--turns`) only: one row per turn index, from "
     "requests.parquet (`analysis/turns.py`); on the console as \"Per turn\", after the step table. A turn's "
     "requests are the k-th request of every conversation, over every step, measured by the step table's rules "
     "(started after their step's warm-up, not in flight when the load generator began to stop). Percentiles are "
     "exact, with order-statistic intervals as in steps.csv; the prefix-cache hit rate is the server's own count "
     "per request (usage.prompt_tokens_details.cached_tokens), so it needs a server that sends it (vLLM: "
     "`--enable-prompt-tokens-details`, on in the embedded server; SGLang: `--enable-cache-report`)."),
    (REQUESTS, "requests.parquet", "One row per request, written as each finishes (`analysis/records.py`)."),
    (LIVE, "The web UI's LLM tab only", "Written nowhere: the row's scope and the server's latest gauges."),
]  # fmt: skip


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _format_words(fmt: str, flag: str | None) -> str:
    kind, digits = _FORMAT.match(fmt).groups()
    d = int(digits or 0)
    return FORMAT_WORDS[kind].format(d=d, s="" if d == 1 else "s", flag=flag)


def _shown_as(c: Column) -> str:
    words = _format_words(c.fmt, c.flag)
    if c.web_fmt and c.web_fmt != c.fmt:
        words += f"; web UI: {_format_words(c.web_fmt, c.flag)}"
    return words


def docs_markdown() -> str:
    """docs/metrics.md: the metric definitions, then every column of every table, from this module."""
    out = [
        "# Metrics and columns",
        "",
        f"Generated from `analysis/glossary.py`; do not edit by hand: regenerate with `{DOCS_COMMAND}`.",
        "Times are seconds unless a column says otherwise. Missing values are empty in the files (NaN / null) and "
        "`-` on the console, in the report and in the web UI, never 0.",
        "",
        "## Metrics",
        "",
        markdown_table(),
    ]
    for section, heading, intro in _DOCS_SECTIONS:
        out += ["", f"## {heading}", "", intro, ""]
        if section == REQUESTS:
            out += ["| column | unit | meaning | formula | metric |", "|---|---|---|---|---|"]
            out += [
                f"| `{c.name}` | {c.unit} | {_cell(c.meaning)} | {_cell(c.formula)} | "
                f"{f'`{c.metric}`' if c.metric else ''} |"
                for c in columns(section)
            ]
            continue
        out += [
            "| column | unit | title | shown as | console header | meaning | formula | metric |",
            "|---|---|---|---|---|---|---|---|",
        ]
        out += [
            f"| `{c.name}` | {c.unit} | {_cell(c.title)} | {_shown_as(c)} | {_cell(c.header or '')} | "
            f"{_cell(c.meaning)} | {_cell(c.formula)} | {f'`{c.metric}`' if c.metric else ''} |"
            for c in columns(section)
        ]
    out += ["", "The web UI's LLM tab shows, in this order: " + ", ".join(f"`{n}`" for n in WEB_UI) + "."]
    return "\n".join(out) + "\n"
