"""SGLang (launched with --enable-metrics).

Sources: python/sglang/srt/metrics/collector.py (SchedulerMetricsCollector, TokenizerMetricsCollector:
https://github.com/sgl-project/sglang/blob/main/python/sglang/srt/metrics/collector.py), the production metrics
page (https://docs.sglang.ai/references/production_metrics.html), python/sglang/srt/entrypoints/http_server.py
(/tokenize and /v1/tokenize, no /version: the version is in /get_server_info) and
python/sglang/srt/entrypoints/openai/protocol.py (StreamOptions.continuous_usage_stats, ignore_eos).

Mapping notes:
- sglang:token_usage is the share of the KV-cache pool in use (0-1), as vllm:kv_cache_usage_perc.
- sglang:num_retracted_requests_total (requests retracted to free KV cache and re-run later) is SGLang's
  preemption; older releases only had the gauge sglang:num_retracted_reqs, which is not a counter: missing there.
- The prefix-cache hit rate is a token ratio in vLLM (hits / queries, in prompt tokens); SGLang's counters of the
  same tokens are sglang:cached_tokens_total and sglang:prompt_tokens_total (its sglang:cache_hit_rate gauge is a
  moving value the step windows cannot take an increase of).
- sglang:num_requests_total counts finished requests without a finish-reason label, aborted ones included (a
  client that disconnects aborts its request: TokenizerManager.abort_request counts it in
  sglang:num_aborted_requests_total, and the request then finishes); the integrity check subtracts the aborts.
- No waiting-by-reason and no cache-config series: missing.
- Per request, with --enable-cache-report, the final usage chunk of a stream carries
  usage.prompt_tokens_details.cached_tokens, vLLM's shape; but only when it is above 0 (UsageProcessor.
  _details_if_cached in python/sglang/srt/entrypoints/openai/usage_processor.py): in a run where some answers carry
  it, an answer with usage and without it had none cached (CACHED_TOKENS_ZERO_OMITTED).
"""

NAME = "sglang"
TITLE = "SGLang"
PREFIXES = ("sglang:",)
SERIES = {
    "kv_cache_usage": "sglang:token_usage",
    "running": "sglang:num_running_reqs",
    "waiting": "sglang:num_queue_reqs",
    "waiting_by_reason": None,
    "preemptions": "sglang:num_retracted_requests_total",
    "success": "sglang:num_requests_total",
    "generation_tokens": "sglang:generation_tokens_total",
    "prefix_cache_queries": "sglang:prompt_tokens_total",
    "prefix_cache_hits": "sglang:cached_tokens_total",
    "ttft_histogram": "sglang:time_to_first_token_seconds",
    "queue_histogram": "sglang:queue_time_seconds",
    "cache_config": None,
    "lora_info": None,
}
SUCCESS_REASONS = None
ABORTED_COUNTER = "sglang:num_aborted_requests_total"
CONTINUOUS_USAGE_STATS = True
IGNORE_EOS = True
# chat_template_kwargs: ChatCompletionRequest (python/sglang/srt/entrypoints/openai/protocol.py)
CHAT_TEMPLATE_KWARGS = True
# {"model", "prompt", "add_special_tokens"} -> {"tokens", "count", "max_model_len"}: vLLM's shape, prompts only.
TOKENIZER = {"path": "/tokenize", "style": "vllm", "chat": False}
VERSION = None
METRICS = True
CACHED_TOKENS_ZERO_OMITTED = True
SOURCES = (
    "https://github.com/sgl-project/sglang/blob/main/python/sglang/srt/metrics/collector.py",
    "https://docs.sglang.ai/references/production_metrics.html",
    "https://github.com/sgl-project/sglang/blob/main/python/sglang/srt/entrypoints/http_server.py",
    "https://github.com/sgl-project/sglang/blob/main/python/sglang/srt/entrypoints/openai/usage_processor.py",
)
