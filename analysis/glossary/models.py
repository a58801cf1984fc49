"""The columns of a model mix (--lora-mix, issue 35): models.csv, one row per step and model (analysis/lora.py), and
steps.csv's LoRA section, vLLM's adapters running and waiting in each step's window (vllm:lora_requests_info)."""

from __future__ import annotations

from .columns import CI, ORDER_STATS, Column

MODELS = "models"  # models.csv: one row per step and model asked for, written when the run drew from a mix
LORA = "lora"  # steps.csv: vLLM's LoRA adapters running and waiting over each step's window, after the GPU section

_SENT = "the step's requests sent after its warm-up, any outcome (cut off included)"
_OK = "the model's measured ok requests in the step"
_SCRAPES = (
    "over the scrapes inside the step's measured window, each scrape's state the label set of vllm:lora_requests_info "
    "with the largest value (vLLM sets the current set to the time and keeps the earlier sets)"
)
_WILSON = (
    "Wilson score interval of sent / step_sent: (p + z^2/2n ± z sqrt(p(1 - p)/n + z^2/4n^2)) / (1 + z^2/n), "
    "z = 1.96, n = step_sent; the draws are independent of when a request is sent, so the count is binomial"
)
_BATCH = "batch means over the model's tokens completed in the window, as steps.csv's aggregate_tok_s_ci_low/high"


# fmt: off
def _quantiles() -> list[Column]:
    """TTFT and TPOT p50 and p99 with their order-statistic intervals."""
    out = []
    for metric, label, q, header in (("ttft", "TTFT", 50, "TTFT p50"), ("ttft", "TTFT", 99, "p99"),
                                     ("tpot", "TPOT", 50, "TPOT p50"), ("tpot", "TPOT", 99, "p99")):
        name = f"{metric}_p{q}_s"
        out.append(Column(name, MODELS, "s", f"{'Median' if q == 50 else '99th percentile of the'} {label} of "
                          f"{_OK}" + ("; one-token answers have none." if metric == "tpot" else "."),
                          f"percentile({metric}_s, {q})", label=f"{label} p{q}", header=header, fmt="ms1",
                          web_fmt="ms2" if metric == "tpot" else None, metric=f"{metric}_s"))
        out += [Column(f"{name}_ci_{end}", MODELS, "s", f"{word} bound of the {CI} of {name}.", ORDER_STATS,
                       label=f"{label} p{q} CI {end}", fmt="ms1", metric=f"{metric}_s")
                for end, word in (("low", "Lower"), ("high", "Upper"))]
    return out
# fmt: on


MODEL_COLUMNS = [
    Column("step", MODELS, "index", "Index of the load step (as steps.csv).", label="Step", header="step", fmt="int"),
    Column("users", MODELS, "users", "The step's target users (as steps.csv).", label="Users", header="users",
           fmt="int"),
    Column("rate_rps", MODELS, "requests/s", "The step's intended rate in a rate run (as steps.csv); empty in a "
           "closed loop.", label="Rate (req/s)", fmt="g"),
    Column("model", MODELS, "text", "The model the requests asked for: the base model or an adapter, by its served "
           "name.", "requests.parquet's model", label="Model", header="model", fmt="text"),
    Column("sent", MODELS, "requests", f"Requests of the model among {_SENT}: what its share counts.", "count",
           label="Sent", fmt="int"),
    Column("step_sent", MODELS, "requests", f"All models' requests: the count of {_SENT}.", "count",
           label="Step sent", fmt="int"),
    Column("share", MODELS, "fraction", "The model's share of the step's requests.", "sent / step_sent",
           label="Share", header="share", fmt="pct0"),
    Column("share_low", MODELS, "fraction", f"Lower bound of the {CI} of share.", _WILSON, label="Share CI low",
           header="low", fmt="pct0"),
    Column("share_high", MODELS, "fraction", f"Upper bound of the {CI} of share.", _WILSON, label="Share CI high",
           header="high", fmt="pct0"),
    Column("expected_share", MODELS, "fraction", "The model's weight in --lora-mix, normalised: the share the draws "
           "aim at; empty for a model the mix does not name (or a run.json without it).",
           "weight / sum of the weights (run.json's lora_mix)", label="Expected share", header="expected",
           fmt="pct0"),
    Column("requests", MODELS, "requests", f"Ok requests measured: the count of {_OK} (started after the warm-up, "
           "not cut off).", "count", label="Requests ok", header="reqs", fmt="int"),
    Column("errors", MODELS, "requests", "The model's failed requests started after the step's warm-up, not cut off.",
           "count", label="Errors", header="errors", fmt="int"),
    Column("aggregate_tok_s", MODELS, "tokens/s", "The model's output tokens per second over the step's measured "
           "window: its part of steps.csv's aggregate_tok_s.", "output tokens of the model's ok requests completed "
           "in the window / window_s", label="Aggregate tok/s", header="agg tok/s", metric="aggregate_tok_s"),
    *[Column(f"aggregate_tok_s_ci_{end}", MODELS, "tokens/s", f"{word} bound of the {CI} of aggregate_tok_s.",
             _BATCH, label=f"Aggregate tok/s CI {end}", metric="aggregate_tok_s")
      for end, word in (("low", "Lower"), ("high", "Upper"))],
    *_quantiles(),
    Column("few_samples", MODELS, "text", "The row's percentile columns with too few samples for an interval "
           "(marked ~ on the console).", "names, space-separated, of the percentiles whose n < 10 / (1 - q); empty "
           "when none", label="Too few samples", fmt="text"),
    Column("lora_running_share", MODELS, "fraction", f"Share of the window's scrapes in which vLLM listed the model "
           f"among its running adapters, {_SCRAPES}; empty without such scrapes, and for a model no scrape of the run "
           "names (the base model).", "scrapes with the model in running_lora_adapters / scrapes",
           label="Adapter running", header="running", fmt="pct0"),
    Column("lora_waiting_share", MODELS, "fraction", "Share of the window's scrapes in which vLLM listed the model "
           "among its waiting adapters (requests queued for an adapter slot); empty as lora_running_share.",
           "scrapes with the model in waiting_lora_adapters / scrapes", label="Adapter waiting", header="waiting",
           fmt="pct0"),
]  # fmt: skip

# steps.csv, LoRA (issue 35): after the GPU section. Written for every run, empty without vllm:lora_requests_info.
LORA_COLUMNS = [
    Column("lora_models", LORA, "models", "How many models the step's requests sent after its warm-up asked for, when "
           "more than one (a --lora-mix: models.csv has their rows); empty when one.", "count of distinct model",
           label="Models", header="models", fmt="int", shows="value"),
    Column("lora_running_max", LORA, "adapters", f"Most LoRA adapters running at once, {_SCRAPES}; empty without "
           "vllm:lora_requests_info (a server without --enable-lora).", "max of len(running_lora_adapters)",
           label="Adapters running max", header="running max", fmt="int", shows="value"),
    Column("lora_waiting_max", LORA, "adapters", f"Most LoRA adapters with requests waiting at once, {_SCRAPES}.",
           "max of len(waiting_lora_adapters)", label="Adapters waiting max", header="waiting max", fmt="int"),
    Column("lora_max_loras", LORA, "adapters", "The adapters vLLM can run in one batch (--max-loras), from the same "
           "series: running_max at it means requests for other adapters wait.", "max of the max_lora label",
           label="Max LoRAs", header="max loras", fmt="int"),
]  # fmt: skip
