"""Hugging Face Text Generation Inference (TGI).

Sources: the metrics reference (https://huggingface.co/docs/text-generation-inference/reference/metrics), the
router's metric calls (router/src/server.rs: tgi_request_success once a stream ends normally, histograms
tgi_request_queue_duration and tgi_request_generated_tokens per finished request,
https://github.com/huggingface/text-generation-inference/blob/main/router/src/server.rs) and the OpenAPI
description (https://raw.githubusercontent.com/huggingface/text-generation-inference/main/docs/openapi.json:
POST /tokenize takes a GenerateRequest {"inputs", "add_special_tokens"} and answers a list of tokens; GET /info
states "version").

Mapping notes:
- tgi_batch_current_size (requests in the running batch) is "running", tgi_queue_size "waiting".
- The tokens a request generated are observed in the histogram tgi_request_generated_tokens: its _sum is the
  generation-token counter.
- TGI exposes no KV-cache usage, preemption, prefix-cache or time-to-first-token series: missing.
- No ignore_eos and no continuous usage in its OpenAI-compatible routes.
"""

NAME = "tgi"
TITLE = "Text Generation Inference"
PREFIXES = ("tgi_",)
SERIES = {
    "kv_cache_usage": None,
    "running": "tgi_batch_current_size",
    "waiting": "tgi_queue_size",
    "waiting_by_reason": None,
    "preemptions": None,
    "success": "tgi_request_success_total",
    "generation_tokens": "tgi_request_generated_tokens_sum",
    "prefix_cache_queries": None,
    "prefix_cache_hits": None,
    "ttft_histogram": None,
    "queue_histogram": "tgi_request_queue_duration",
    "cache_config": None,
    "lora_info": None,
}
# TGI renders the counter as `tgi_request_success` (metrics-exporter-prometheus appends no _total); the parser
# (prometheus_client) names a counter's sample with _total, the alias keeps either spelling.
ALIASES = {"tgi_request_success": "tgi_request_success_total"}
SUCCESS_REASONS = None
CONTINUOUS_USAGE_STATS = False
IGNORE_EOS = False
# no chat_template_kwargs in its ChatRequest
CHAT_TEMPLATE_KWARGS = False
TOKENIZER = {"path": "/tokenize", "style": "tgi", "chat": False}
VERSION = {"path": "/info", "field": "version"}
METRICS = True
SOURCES = (
    "https://huggingface.co/docs/text-generation-inference/reference/metrics",
    "https://github.com/huggingface/text-generation-inference/blob/main/router/src/server.rs",
    "https://raw.githubusercontent.com/huggingface/text-generation-inference/main/docs/openapi.json",
)
