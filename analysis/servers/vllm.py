"""vLLM (V1 engine, 0.32): the suite's reference server; its names are the canonical ones.

Sources: https://docs.vllm.ai/en/latest/design/metrics.html and vllm/v1/metrics/loggers.py (the Prometheus
names); vllm/entrypoints/openai/api_server.py (/tokenize, /version); vllm/entrypoints/openai/protocol.py
(stream_options.continuous_usage_stats, ignore_eos). Checked against a real capture:
tests/fixtures/vllm-0.32-cpu-metrics.txt.
"""

NAME = "vllm"
TITLE = "vLLM"
PREFIXES = ("vllm:",)
SERIES = {
    "kv_cache_usage": "vllm:kv_cache_usage_perc",
    "running": "vllm:num_requests_running",
    "waiting": "vllm:num_requests_waiting",
    "waiting_by_reason": "vllm:num_requests_waiting_by_reason",
    "preemptions": "vllm:num_preemptions_total",
    "success": "vllm:request_success_total",
    "generation_tokens": "vllm:generation_tokens_total",
    "prefix_cache_queries": "vllm:prefix_cache_queries_total",
    "prefix_cache_hits": "vllm:prefix_cache_hits_total",
    "ttft_histogram": "vllm:time_to_first_token_seconds",
    "queue_histogram": "vllm:request_queue_time_seconds",
    "cache_config": "vllm:cache_config_info",
    "lora_info": "vllm:lora_requests_info",  # v1/metrics/loggers.py: gauge_lora_info, set_to_current_time()
    # With --speculative-config only (vllm/v1/spec_decode/metrics.py SpecDecodingProm).
    "spec_drafts": "vllm:spec_decode_num_drafts_total",
    "spec_draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "spec_accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total",
    "spec_accepted_per_position": "vllm:spec_decode_num_accepted_tokens_per_pos_total",
}
# Old (V0 engine) names -> the names of vLLM 0.32 (V1 engine).
ALIASES = {
    "vllm:gpu_cache_usage_perc": "vllm:kv_cache_usage_perc",
    "vllm:cpu_cache_usage_perc": "vllm:kv_cache_usage_perc",
    "vllm:gpu_prefix_cache_queries_total": "vllm:prefix_cache_queries_total",
    "vllm:gpu_prefix_cache_hits_total": "vllm:prefix_cache_hits_total",
}
SUCCESS_REASONS = ("stop", "length")  # vllm:request_success_total{finished_reason=stop|length|abort}
CONTINUOUS_USAGE_STATS = True
IGNORE_EOS = True
# chat_template_kwargs: ChatCompletionRequest (entrypoints/openai/chat_completion/protocol.py)
CHAT_TEMPLATE_KWARGS = True
TOKENIZER = {"path": "/tokenize", "style": "vllm", "chat": True}
VERSION = {"path": "/version", "field": "version"}
METRICS = True
SOURCES = (
    "https://docs.vllm.ai/en/latest/design/metrics.html",
    "https://github.com/vllm-project/vllm/blob/main/vllm/v1/metrics/loggers.py",
    "https://github.com/vllm-project/vllm/blob/main/vllm/entrypoints/openai/api_server.py",
    "https://github.com/vllm-project/vllm/blob/main/vllm/v1/spec_decode/metrics.py",
)
