"""docs/reference/metrics.md, generated from the declarations."""

from __future__ import annotations

from .columns import (
    EMBEDDINGS,
    FORMAT,
    FORMAT_WORDS,
    GENERATOR,
    GPU,
    LIVE,
    OPEN_LOOP,
    REASONING,
    REQUESTS,
    RERANK,
    SERVER,
    SERVER_BOUNDS,
    SHOWS,
    STEP,
    STEP_END,
    TURNS,
    UNCERTAINTY,
    Column,
)
from .energy import ENERGY
from .metrics import markdown_table
from .models import LORA, MODELS
from .registry import WEB_UI, columns
from .spec_decode import SPEC
from .trials import TRIALS

# --- docs/reference/metrics.md ---------------------------------------------------------------------------------

DOCS_FILE = "docs/reference/metrics.md"
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
     "([reasoning-models.md](../how-to/reasoning-models.md#what-is-measured)), last in steps.csv "
     "(`analysis/reasoning.py`), over the step table's measured ok requests. The parser tells each token-carrying "
     "chunk apart: answer (delta.content), tool call (delta.tool_calls) or reasoning (delta.reasoning, "
     "delta.reasoning_content). TTFT counts the first token of any kind, thinking included; TTFO is the first "
     "token of the answer, what the user waits for: the gap is "
     "the time spent reasoning. Written for every run: without reasoning TTFO equals TTFT and the reasoning share "
     "is 0; the console's \"Reasoning\" table, the web UI's TTFO cells and the report's Reasoning section appear "
     "when a request reasoned or called a tool. A request whose stream ended inside the thought has no TTFO: it "
     "counts as never answered (+inf) in the TTFO percentiles and their intervals (shown \"no answer\"), and in "
     "no_answer_requests; leaving it out would make the percentiles read better than the requests did."),
    (EMBEDDINGS, "steps.csv: embeddings", "Embeddings runs (`--endpoint embeddings`, "
     "[embeddings-rerank-images.md](../how-to/embeddings-rerank-images.md#embeddings-the-results)), last in steps.csv "
     "(`analysis/batch.py`). An embeddings request does not stream: its throughput is inputs and prompt tokens "
     "per second, counted when the request completes inside the step's window, with batch-means intervals as "
     "aggregate tok/s's; its latency is E2E, from the send stamp to the body's last byte, with order-statistic "
     "intervals as TTFT's. Written for every run: inputs_per_s is empty outside an embeddings run, prompt_tok_s is "
     "any run's prompt (prefill) rate; the console's \"Embeddings\" table replaces the batching curve in an "
     "embeddings run, whose streaming columns do not apply."),
    (RERANK, "steps.csv: rerank", "Rerank runs (`--endpoint rerank`, "
     "[embeddings-rerank-images.md](../how-to/embeddings-rerank-images.md#rerank)), after the embeddings columns "
     "(`analysis/batch.py`). "
     "A rerank request does not stream either: its throughput is documents per second (its prompt tokens per second "
     "and E2E percentiles are the embeddings section's columns), with the same intervals. Written for every run: "
     "documents_per_s is empty outside a rerank run; the console's \"Rerank\" table replaces the batching curve in "
     "a rerank run."),
    (GPU, "steps.csv: GPU telemetry", "The step's measured window in Unix seconds (always written: it joins any "
     "time series to the step), then NVIDIA dcgm-exporter's samples (`--gpu-metrics-url`, one per GPU host) over "
     "that window ([gpu-telemetry.md](../how-to/gpu-telemetry.md)), last in steps.csv (`analysis/gpu.py`). The "
     "samples are "
     "kept raw in metrics.parquet with all their labels and `source` = the exporter's URL; a GPU is "
     "`<Hostname>/<gpu>` (its UUID without a Hostname label). Each GPU's samples inside the window are averaged "
     "first, then the GPUs, so a GPU scraped less often (gaps) weighs the same. A field a GPU does not export "
     "(DCGM_FI_PROF_* on a consumer GPU; DCGM_FI_PROF_SM_ACTIVE is not in dcgm-exporter's default counters) and "
     "DCGM's blank values are missing, never 0. Then the roofline verdict on them (`analysis/roofline.py`, "
     "[gpu-telemetry.md](../how-to/gpu-telemetry.md#reading-the-gpu-verdict))."),
    (ENERGY, "steps.csv: energy", "The GPUs' energy per step (issue 35, `analysis/energy.py`, "
     "[gpu-telemetry.md](../how-to/gpu-telemetry.md#energy-per-token-and-per-request)), after the GPU section: "
     "dcgm-exporter's DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, a counter in mJ since boot, over each step's "
     "measured window. A window rarely starts or ends on a scrape: the counter's value at each edge is interpolated "
     "between the two scrapes around it, exact when the power holds between them and otherwise off by at most the "
     "power's change within one scrape interval at each edge (scaling the increase between the scrapes around the "
     "whole window to its length would mix in up to two intervals of power outside it). Gaps inside the window cost "
     "nothing: the counter kept counting. A GPU without the field (or with DCGM's blank value) is left out and "
     "energy_gpus counts the others; a run without it leaves every column empty, never 0. The run's totals, and "
     "each GPU's joules per step, are summary.json's `energy`."),
    (TRIALS, "steps.csv: across trials (--repeat)", "Runs with `--repeat N` (N > 1) only, last in steps.csv "
     "(`analysis/trials.py`; a run without it writes none of these columns, so its steps.csv is as before). Such "
     "a run runs the whole plan N times, one trial after another; "
     "steps.csv keeps one row per plan step, its core columns (and their within-step intervals) computed over the "
     "requests of all its trials pooled (tok/s: the tokens completed in any of its trials' windows / their total "
     "length; batch means over those windows laid end to end; `stable` compares the first half of that time with "
     "the second), the columns measured over a window of the server or the machine (server series, self-checks, "
     "GPUs) averaged over the trials (a flag: set when any trial's is). trials.csv has each trial's own row: the "
     "same step table over that trial's window alone, led by `trial` and `plan_step` (`step` there is the running "
     "step the records carry). The across-trial interval is a t-interval over the N trials' own values: it "
     "holds the drift between trials a whole plan apart, which a step's own interval cannot see "
     "([compare-runs.md](../how-to/compare-runs.md#repeat-a-run))."),
    (SPEC, "steps.csv: speculative decoding", "Speculative decoding (issue 35, "
     "[gpu-telemetry.md](../how-to/gpu-telemetry.md#speculative-decoding)), after the LoRA section "
     "(`analysis/spec_decode.py`). The server's side: vLLM's counters vllm:spec_decode_num_drafts_total, "
     "_num_draft_tokens_total and _num_accepted_tokens_total (served only with --speculative-config), their increase "
     "over the step's window as every server counter's, a drop read as a restart; empty, never 0, when the server "
     "exports none. The acceptance rate per draft position (vllm:spec_decode_num_accepted_tokens_per_pos_total / "
     "drafts) has as many values as the server's speculative tokens, so it is in summary.json's `spec_decode` and "
     "the report, not in steps.csv's fixed columns. The client's side: the output tokens each token-carrying chunk "
     "brought, exact per chunk with continuous usage (vLLM's stream_options.continuous_usage_stats, sent to vLLM "
     "and SGLang): a speculating server streams the tokens of an engine step in one chunk, so the tokens per chunk "
     "follow the acceptance length the client sees."),
    (TURNS, "turns.csv: per turn", "Conversation runs (`--turns`) only: one row per turn index, from "
     "requests.parquet (`analysis/turns.py`); on the console as \"Per turn\", after the step table. A turn's "
     "requests are the k-th request of every conversation, over every step, measured by the step table's rules "
     "(started after their step's warm-up, not in flight when the load generator began to stop). Percentiles are "
     "exact, with order-statistic intervals as in steps.csv; the prefix-cache hit rate is the server's own count "
     "per request (usage.prompt_tokens_details.cached_tokens), so it needs a server that sends it (vLLM: "
     "`--enable-prompt-tokens-details`, on in the embedded server; SGLang: `--enable-cache-report`)."),
    (LORA, "steps.csv: LoRA adapters", "A model mix (`--lora-mix`): how many models each step's requests asked for, "
     "then vLLM's LoRA adapters over each step's measured window, after the GPU "
     "section (`analysis/lora.py`), from `vllm:lora_requests_info` (vLLM with `--enable-lora`): a gauge whose labels "
     "name the adapters running and waiting (comma-separated) and `max_lora`, set to the current time whenever the "
     "engine logs; vLLM keeps every label set it has seen, so a scrape's state is the set with the largest value. "
     "Written for every run, empty without the series."),
    (MODELS, "models.csv: per model", "Runs that drew each request's model from a mix (`--lora-mix`, "
     "[lora-mixes.md](../how-to/lora-mixes.md)) only: one row per step and model, from requests.parquet "
     "(`analysis/lora.py`), each computed by the step table's own functions (`analysis/steps.py`) on the model's "
     "records, so a model's requests, tok/s and percentiles are what steps.csv would say of a run of that model's "
     "requests alone, intervals included. The share counts every request sent after the step's warm-up, whatever "
     "its outcome: a request's model is drawn independently of when it is sent, so the count is binomial and the "
     "Wilson interval covers the weight 95 % of the time (a slower model's requests are not fewer among them, as "
     "they would be among those completed). On the console as \"Per model\", after the step table, when the run "
     "asked for more than one model; summary.json's `per_model` holds the same columns over the whole measured run "
     "(tok/s over the sum of the windows, without an interval, as the step table's run row)."),
    (REQUESTS, "requests.parquet", "One row per request, written as each finishes (`analysis/records.py`)."),
    (LIVE, "The web UI's LLM tab only", "Written nowhere: the row's scope and the server's latest gauges."),
]  # fmt: skip


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _format_words(fmt: str, flag: str | None) -> str:
    kind, digits = FORMAT.match(fmt).groups()
    d = int(digits or 0)
    return FORMAT_WORDS[kind].format(d=d, s="" if d == 1 else "s", flag=flag)


def _shown_as(c: Column) -> str:
    words = _format_words(c.fmt, c.flag)
    if c.web_fmt and c.web_fmt != c.fmt:
        words += f"; web UI: {_format_words(c.web_fmt, c.flag)}"
    return words


def docs_markdown() -> str:
    """docs/reference/metrics.md: the metric definitions, then every column of every table, from this module."""
    out = [
        "# Metrics and columns",
        "",
        f"Generated from `analysis/glossary/`; do not edit by hand: regenerate with `{DOCS_COMMAND}`.",
        "Times are seconds unless a column says otherwise. Missing values are empty in the files (NaN / null) and "
        "`-` on the console, in the report and in the web UI, never 0.",
        "",
        "## Metrics",
        "",
        markdown_table(),
    ]
    for section, heading, intro in _DOCS_SECTIONS:
        out += ["", f"## {heading}", "", intro, ""]
        marks = [f"`{c.name}` {SHOWS[c.shows]}" for c in columns(section) if c.shows is not None]
        if marks:
            when = " or ".join(marks)
            out += [
                f"Applies to a run when {when}; otherwise its console table, its report section (if any) and its "
                "empty columns in the report's step table are left out.",
                "",
            ]
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
