"""The columns of requests.parquet, the live tab and turns.csv; COLUMNS, every declared column, by section."""

from __future__ import annotations

import pandas as pd

from ..thresholds import (
    DRAM_ACTIVE_HIGH,
    GPU_ACTIVE_LOW,
    SM_ACTIVE_SATURATED,
)
from .columns import (
    CI,
    EMBEDDINGS,
    EMBEDDINGS_COLUMNS,
    GENERATOR,
    GENERATOR_COLUMNS,
    GPU,
    GPU_COLUMNS,
    LIVE,
    OPEN_LOOP,
    OPEN_LOOP_COLUMNS,
    ORDER_STATS,
    REASONING,
    REASONING_COLUMNS,
    REQUESTS,
    RERANK,
    RERANK_COLUMNS,
    SERVER,
    SERVER_BOUND_COLUMNS,
    SERVER_BOUNDS,
    SERVER_COLUMNS,
    STEP,
    STEP_COLUMNS,
    STEP_END,
    STEP_END_COLUMNS,
    TURNS,
    UNCERTAINTY,
    UNCERTAINTY_COLUMNS,
    Column,
    StepData,
    is_missing,
)
from .energy import ENERGY, ENERGY_COLUMNS
from .models import LORA, LORA_COLUMNS, MODEL_COLUMNS
from .spec_decode import SPEC, SPEC_COLUMNS, SPEC_REQUEST_COLUMNS
from .trials import TRIAL_COLUMNS, TRIALS

_REQUEST_COLUMNS = [
    Column("request_id", REQUESTS, "text", "Unique id of the request, given by the client.", live=True),
    Column("worker", REQUESTS, "text", "The load-generating process that sent it (<host>-<pid>)."),
    Column("step", REQUESTS, "index", "The load step it was sent in (0 = first).", live=True),
    Column("users", REQUESTS, "users", "Its step's target users, all processes together.", live=True),
    Column("warmup", REQUESTS, "bool", "Sent during its step's warm-up (--step-warmup): not measured.", live=True),
    Column("start_time", REQUESTS, "s", "Unix time of the send stamp (the request's bytes written).", live=True),
    Column("endpoint", REQUESTS, "text", "The API it called (--endpoint): completions, chat, embeddings or rerank."),
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
    Column("documents", REQUESTS, "documents", "Rerank (--endpoint rerank): the documents the request carried "
           "(--documents); none for the other kinds.", live=True),
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
    *[Column(f"{name}_ci_{end}", TURNS, "s", f"{word} bound of the {CI} of {name}.", ORDER_STATS,
             label=f"{label} CI {end}", fmt="ms1", metric=metric)
      for name, label, metric in (("ttft_p50_s", "TTFT p50", "ttft_s"), ("ttft_p95_s", "TTFT p95", "ttft_s"),
                                  ("tpot_p50_s", "TPOT p50", "tpot_s"))
      for end, word in (("low", "Lower"), ("high", "Upper"))],
    *[Column(f"prefix_cache_hit_rate_ci_{end}", TURNS, "fraction", f"{word} bound of the {CI} of "
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
           header="regime", fmt="text", shows="value"),
    *[Column(f"gpu_{name}_active_ci_{end}", GPU, "fraction", f"{word} bound of the {CI} of the mean {what} "
             f"activity over {_GPU_READINGS}.", _GPU_CI, label=f"{label} active CI {end}", fmt="num2")
      for name, what, label in (("dram", "DRAM", "DRAM"), ("sm", "SM", "SM"))
      for end, word in (("low", "Lower"), ("high", "Upper"))],
]  # fmt: skip

COLUMNS: dict[tuple[str, str], Column] = {
    (c.section, c.name): c
    for c in STEP_COLUMNS
    + SERVER_COLUMNS
    + GENERATOR_COLUMNS
    + OPEN_LOOP_COLUMNS
    + UNCERTAINTY_COLUMNS
    + SERVER_BOUND_COLUMNS
    + STEP_END_COLUMNS
    + REASONING_COLUMNS
    + EMBEDDINGS_COLUMNS
    + RERANK_COLUMNS
    + GPU_COLUMNS
    + _GPU_VERDICT_COLUMNS
    + ENERGY_COLUMNS
    + TRIAL_COLUMNS
    + SPEC_COLUMNS
    + _REQUEST_COLUMNS
    + SPEC_REQUEST_COLUMNS
    + _LIVE_COLUMNS
    + _TURN_COLUMNS
    + LORA_COLUMNS
    + MODEL_COLUMNS
}
# One column per name in the step table (steps.csv and the web UI's row): the requests' columns may share a name.
STEP_TABLE: dict[str, Column] = {
    c.name: c
    for c in COLUMNS.values()
    if c.section
    in (
        STEP,
        SERVER,
        GENERATOR,
        OPEN_LOOP,
        UNCERTAINTY,
        SERVER_BOUNDS,
        STEP_END,
        REASONING,
        EMBEDDINGS,
        RERANK,
        GPU,
        ENERGY,
        TRIALS,
        SPEC,
        LIVE,
        LORA,
    )
}

# The web UI's LLM tab, in the order shown.
WEB_UI = [
    "scope", "step", "probe", "users", "rate_rps", "requests", "errors", "aggregate_tok_s", "per_request_tok_s_mean",
    "ttft_p50_s", "ttft_p95_s", "ttft_p99_s", "ttfo_p50_s", "ttfo_p95_s", "reasoning_share", "tpot_p50_s",
    "tpot_p95_s", "schedule_lag_p99_s",
    "kv_cache_usage", "running", "waiting", "stable", "outlier",
    "inputs_per_s", "prompt_tok_s", "e2e_p95_s",  # issue 19: an embeddings run's (inputs/s empty in any other run)
    "documents_per_s",  # issue 33: a rerank run's (empty in any other run)
]  # fmt: skip


def columns(section: str) -> list[Column]:
    """The columns of one section, in the order they are written."""
    return [c for c in COLUMNS.values() if c.section == section]


def applies(table: pd.DataFrame, section: str) -> bool:
    """Whether a section that only some runs have applies to this step table: a column declared to show it
    (Column.shows) has a value, or a count above 0 (a GPU seen, a request that reasoned). Its console table, its report
    part and its columns in the report's step table appear only then. A section that declares none always applies."""
    marks = [c for c in columns(section) if c.shows is not None and c.name in table.columns]
    if not marks and not any(c.shows for c in columns(section)):
        return True
    for c in marks:
        cells = table[c.name]
        if c.shows == "positive" and bool((pd.to_numeric(cells, errors="coerce") > 0).any()):
            return True
        if c.shows == "value" and any(not is_missing(v) and v != "" for v in cells):
            return True
    return False


def names(section: str) -> list[str]:
    """The column names of one section, in the order they are written."""
    return [c.name for c in columns(section)]


def web_columns() -> list[Column]:
    """The web UI's columns, in the order shown."""
    return [STEP_TABLE[name] for name in WEB_UI]


def step_values(data: StepData) -> dict:
    """The computed core columns of one row (all but step and users): each column's own function."""
    return {c.name: c.compute(data) for c in columns(STEP) if c.compute is not None}
