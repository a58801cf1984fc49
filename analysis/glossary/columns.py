"""The registry's pieces: sections, the Column declaration, value formats, and the step table's columns."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..histograms import NARROW_BUCKET, from_columns
from ..thresholds import (
    CPU_BOUND,
    LAG_BOUND_S,
    LAG_CEILING_S,
    LAG_FLOOR_S,
    LAG_SHARE,
    OUTLIER_MARGIN,
    STABLE_TOLERANCE,
)
from .formulas import aggregate_tok_s, as_nan, mean, per_request_tok_s, percentile

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
RERANK = "rerank"  # steps.csv: documents/s (with the embeddings section's prompt tok/s and E2E), after it
GPU = "gpu"  # steps.csv: the step's window in Unix time and the GPU exporters' telemetry (issue 20), last
REQUESTS = "requests"  # requests.parquet: one row per request
LIVE = "live"  # the web UI's LLM tab only: the server's latest gauges and the row's scope (written nowhere)
TURNS = "turns"  # turns.csv: one row per turn of the conversations (--turns), written only in multi-turn runs

# A format is a kind and a number of decimals: ms1 = seconds shown as ms with 1 decimal, pct0 = a fraction as a
# whole percentage, num2 = 2 decimals, int = a count, g = as short as exact, flag = the column's word when true /
# ok when false, pass = ok when true / the column's word when false (a check that passes), text = as is. Missing
# values always show as "-", never 0.
SHOWS = {"value": "has a value in some step", "positive": "is above 0 in some step"}
FORMAT = re.compile(r"^(ms|pct|num|int|g|flag|pass|text)(\d*)$")
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
    fmt: str = "num1"  # see FORMAT
    web_fmt: str | None = None  # the web UI's format when it differs (finer TPOT, a rate with 2 decimals)
    web_key: str | None = None  # the web UI's row key when it is not derived from the name (kept for its users)
    flag: str | None = None  # a verdict: the word shown when it is true (BOUND, BEHIND)
    metric: str | None = None  # the GLOSSARY metric it is a statistic of
    live: bool = False  # a request column the live view keeps (the core step columns read it)
    # A histogram quantile: the (low, high) columns of the bounds it lies between; shown as what they allow
    bounds: tuple[str, str] | None = None
    compute: Callable[[StepData], object] | None = field(default=None, compare=False, repr=False)
    inf_text: str | None = None  # how +inf reads (a TTFO percentile reached by requests never answered)
    # Where its section applies (glossary.applies): "value", any step with a value here; "positive", above 0.
    shows: str | None = None

    def __post_init__(self) -> None:
        for fmt in (self.fmt, self.web_fmt):
            if fmt is not None and not FORMAT.match(fmt):
                raise ValueError(f"column {self.name}: unknown format {fmt!r}")
        if self.shows not in (None, *SHOWS):
            raise ValueError(f"column {self.name}: shows must be one of {', '.join(SHOWS)}, not {self.shows!r}")

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
            if not is_missing(low):
                return from_columns(math.nan, low, high, row.get(self.name)).text(unit="")
        return self.show(row.get(self.name), web)

    @property
    def key(self) -> str:
        """The web UI's row key: seconds shown in ms are named *_ms."""
        if self.web_key:
            return self.web_key
        return self.name[:-2] + "_ms" if self.fmt.startswith("ms") and self.name.endswith("_s") else self.name


def is_missing(value: object) -> bool:
    if value is None:
        return True
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):  # a list or an array: present
        return False


def format_value(value: object, fmt: str, flag: str | None = None) -> str:
    """A value as text: ms1 = v * 1000 with 1 decimal, pct0 = v * 100 % with none, num2 = 2 decimals, int = a count;
    missing = "-"."""
    if is_missing(value):
        return "-"
    kind, digits = FORMAT.match(fmt).groups()
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
# the report's table and docs/reference/metrics.md, and the web UI when its name is added to WEB_UI below. A record
# column it reads that the live view does not keep yet needs live=True on that column in _REQUEST_COLUMNS.
STEP_COLUMNS = [
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
           compute=lambda d: as_nan(aggregate_tok_s(d.output_tokens, d.window_s))),
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
SERVER_COLUMNS = [
    Column("kv_cache_usage_mean", SERVER, "fraction", f"Mean KV-cache usage {_WINDOW}.",
           "mean of vllm:kv_cache_usage_perc over the scrapes inside the window", label="KV cache mean",
           header="KV cache mean", fmt="pct0", metric="kv_cache_usage"),
    Column("kv_cache_usage_max", SERVER, "fraction", f"Max KV-cache usage {_WINDOW}.",
           "max of vllm:kv_cache_usage_perc over the scrapes inside the window", label="KV cache max",
           header="max", fmt="pct0", metric="kv_cache_usage", shows="value"),
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
GENERATOR_COLUMNS = [
    Column("generator_processes", GENERATOR, "processes", "Load-generating processes with self-check samples in "
           "the window.", "count of distinct workers", label="Load processes", header="processes", fmt="int",
           metric="generator_processes", shows="value"),
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
OPEN_LOOP_COLUMNS = [
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

CI = "95 % confidence interval"
_BATCH_MEANS = (
    "batch means: the window cut into k = min(20, window_s / median e2e_s) equal batches, the "
    "t-interval (k - 1 degrees of freedom) over the k batch rates (merged pairwise while their lag-1 "
    "autocorrelation exceeds 0.5), its half-width widened to sqrt(hw^2 + (1.96 * edge_sd)^2) for the window's "
    "edges (tokens are counted when their request completes: edge_sd = sqrt(2 var P(t)) / window_s, P(t) the "
    "tokens in flight at t, linear progress); empty below 5 batches"
)
ORDER_STATS = (
    "order statistics [x_(l), x_(u)] of the raw values, ranks from Binomial(n, q); empty when n < "
    "10 / (1 - q) (then listed in few_samples)"
)
_T_REQUESTS = "t-interval (n - 1 degrees of freedom) over the requests' values; empty below 2 requests"


def _ci_pair(
    name: str, label: str, unit: str, fmt: str, how: str, metric: str, web_fmt: str | None = None
) -> list[Column]:
    """The <name>_ci_low and <name>_ci_high columns of a step value."""
    return [Column(f"{name}_ci_{end}", UNCERTAINTY, unit, f"{word} bound of the {CI} of {name}.", how,
                   label=f"{label} CI {end}", fmt=fmt, web_fmt=web_fmt, metric=metric)
            for end, word in (("low", "Lower"), ("high", "Upper"))]  # fmt: skip


# steps.csv, uncertainty: how sure each step's numbers are, and whether the step itself can be trusted (computed in
# analysis/steps.py with analysis/uncertainty.py and analysis/knee.py); last in steps.csv.
UNCERTAINTY_COLUMNS = [
    *_ci_pair("aggregate_tok_s", "Aggregate tok/s", "tokens/s", "num1", _BATCH_MEANS, "aggregate_tok_s"),
    *_ci_pair("per_request_tok_s_mean", "Per-request tok/s", "tokens/s", "num1", _T_REQUESTS, "per_request_tok_s"),
    *_ci_pair("e2e_mean_s", "E2E mean", "s", "ms1", _T_REQUESTS, "e2e_s"),
    *_ci_pair("ttft_p50_s", "TTFT p50", "s", "ms1", ORDER_STATS, "ttft_s"),
    *_ci_pair("ttft_p95_s", "TTFT p95", "s", "ms1", ORDER_STATS, "ttft_s"),
    *_ci_pair("ttft_p99_s", "TTFT p99", "s", "ms1", ORDER_STATS, "ttft_s"),
    *_ci_pair("tpot_p50_s", "TPOT p50", "s", "ms1", ORDER_STATS, "tpot_s", web_fmt="ms2"),
    *_ci_pair("tpot_p95_s", "TPOT p95", "s", "ms1", ORDER_STATS, "tpot_s", web_fmt="ms2"),
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
SERVER_BOUND_COLUMNS = [
    *_server_bounds("server_ttft", "vllm:time_to_first_token_seconds", "Server TTFT"),
    *_server_bounds("server_queue_time", "vllm:request_queue_time_seconds", "Queue time"),
]
# steps.csv, how each step ended (analysis/adaptive.py), after the open-loop columns.
STEP_END_COLUMNS = [
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
REASONING_COLUMNS = [
    *_ttfo_percentiles(),
    Column("reasoning_tokens_mean", REASONING, "tokens", f"Mean reasoning tokens per request of {_MEASURED}.",
           "mean(reasoning_tokens)", label="Reasoning tokens mean", header="reasoning tok", fmt="num0",
           metric="reasoning_tokens", shows="positive"),
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
           "count of tool_call_chunks > 0", label="Tool-call requests", header="tool calls", fmt="int",
           shows="positive"),
    *[c for name in ("ttfo_p50_s", "ttfo_p95_s", "ttfo_p99_s")
      for c in (Column(f"{name}_ci_{end}", REASONING, "s", f"{word} bound of the {CI} of {name}.",
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


def _emb_ci(
    name: str, label: str, unit: str, fmt: str, how: str, metric: str, section: str = EMBEDDINGS
) -> list[Column]:
    """The <name>_ci_low and <name>_ci_high columns of a step value of a kind that does not stream."""
    return [Column(f"{name}_ci_{end}", section, unit, f"{word} bound of the {CI} of {name}.", how,
                   label=f"{label} CI {end}", fmt=fmt, metric=metric)
            for end, word in (("low", "Lower"), ("high", "Upper"))]  # fmt: skip


def _item_rate(items: str, section: str, header: str, done: str, article: str) -> tuple[list[Column], list[Column]]:
    """A batch kind's items/s column and its interval's, then its two halves (`stable` compares them: a batch run has
    no output tokens, so its tok/s halves are empty): e.g. inputs_per_s for embeddings, documents_per_s for rerank."""
    rate, unit, title = f"{items}_per_s", f"{items}/s", f"{items.capitalize()}/s"
    means = _BATCH_MEANS.replace("tokens", items)
    head = [
        Column(rate, section, unit, f"{items.capitalize()} {done} per second: {items} of {_COMPLETED} / window_s; "
               f"empty when no record carries {items} (not {article} {section} run).", f"sum({items}) / window_s",
               label=title, header=header, fmt="num1", metric=rate),
    ]  # fmt: skip
    halves = [
        Column(f"{rate}_{half}_half", section, unit, f"{title} over the {which} half of the step's measured window.",
               f"{items} of the ok requests completed in {span} / (window_s / 2)", label=f"{title}, {short} half",
               metric=rate)
        for half, which, short, span in (("first", "first", "1st", "[measure_start, mid)"),
                                         ("second", "second", "2nd", "[mid, end)"))
    ]  # fmt: skip
    return head, _emb_ci(rate, title, unit, "num1", means, rate, section) + halves


_INPUTS, _INPUTS_TAIL = _item_rate("inputs", EMBEDDINGS, "inputs/s", "embedded", "an")
_DOCUMENTS, _DOCUMENTS_TAIL = _item_rate("documents", RERANK, "docs/s", "ranked", "a")

# steps.csv, embeddings (issue 19): last in steps.csv (analysis/embeddings.py). Written for every run; inputs_per_s
# is empty outside an embeddings run, prompt_tok_s is a chat or completions run's prefill rate.
EMBEDDINGS_COLUMNS = [
    *_INPUTS,
    Column("prompt_tok_s", EMBEDDINGS, "tokens/s", f"Prompt tokens per second: the server's prompt_tokens of "
           f"{_COMPLETED} / window_s; empty when no record carries prompt_tokens.", "sum(prompt_tokens) / window_s",
           label="Prompt tok/s", header="prompt tok/s", fmt="num1", metric="prompt_tok_s"),
    *[Column(f"e2e_p{q}_s", EMBEDDINGS, "s", f"{q}th percentile of e2e_s over {_MEASURED}.", f"percentile(e2e_s, {q})",
             label=f"E2E p{q}", header=f"E2E p{q}" if q == 50 else f"p{q}", fmt="ms1", metric="e2e_s")
      for q in (50, 95, 99)],
    *_INPUTS_TAIL[:2],  # the interval of inputs/s, then the shared columns' intervals, then its halves
    *_emb_ci("prompt_tok_s", "Prompt tok/s", "tokens/s", "num1", _BATCH_MEANS, "prompt_tok_s"),
    *[c for q in (50, 95, 99) for c in _emb_ci(f"e2e_p{q}_s", f"E2E p{q}", "s", "ms1", _E2E_ORDER_STATS, "e2e_s")],
    *_INPUTS_TAIL[2:],
]  # fmt: skip

# steps.csv, rerank (issue 33): after the embeddings section. documents_per_s is empty outside a rerank run; a rerank
# run's prompt tok/s and E2E percentiles are the embeddings section's columns (they apply to any request kind).
RERANK_COLUMNS = [*_DOCUMENTS, *_DOCUMENTS_TAIL]

# requests.parquet: one row per request, in analysis/records.py SCHEMA's order.
_GPU_MEAN = "mean over the GPUs with samples in the window of each GPU's mean over its samples inside it"

# steps.csv, GPU (issue 20): last in steps.csv (analysis/gpu.py). Written for every run: the window's Unix times
# always, the GPU columns empty without --gpu-metrics-url or when a GPU does not export the field (never 0).
GPU_COLUMNS = [
    Column("window_start_time", GPU, "Unix s", "Start of the step's measured window (after its warm-up), in Unix "
           "seconds: joins any time series (Prometheus, DCGM, logs) to the step.", "measure_start",
           label="Window start (Unix s)", fmt="num3"),
    Column("window_end_time", GPU, "Unix s", "End of the step's measured window, in Unix seconds; empty while the "
           "step runs.", "end_time", label="Window end (Unix s)", fmt="num3"),
    Column("gpus", GPU, "GPUs", "GPUs with DCGM samples inside the window, over every --gpu-metrics-url; empty without "
           "GPU telemetry.", "count of distinct gpu_key (<Hostname>/<gpu>)", label="GPUs", header="gpus", fmt="int",
           shows="positive"),
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
