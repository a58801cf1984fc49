"""llama.cpp's llama-server (its /metrics needs --metrics).

Sources: the server's README, "GET /metrics" and "POST /tokenize" sections
(https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md), and the metrics handler in the
server's source (tools/server/server.cpp: counters llamacpp:prompt_tokens_total, llamacpp:tokens_predicted_total,
llamacpp:n_decode_total ...; gauges llamacpp:requests_processing, llamacpp:requests_deferred,
llamacpp:kv_cache_usage_ratio in builds before the 2025 KV-cache rework removed it). POST /tokenize takes
{"content", "add_special"} and answers {"tokens": [...]}; GET /props states "build_info".

Mapping notes:
- llamacpp:requests_processing (busy slots) is "running"; llamacpp:requests_deferred (requests waiting for a free
  slot) is "waiting".
- No request-success counter (the integrity check is not available), no preemption, prefix-cache, TTFT or queue
  histograms: missing. KV-cache usage only where the build still has llamacpp:kv_cache_usage_ratio.
- ignore_eos is a llama-server completion parameter; continuous usage is not.
"""

NAME = "llamacpp"
TITLE = "llama.cpp server"
PREFIXES = ("llamacpp:",)
SERIES = {
    "kv_cache_usage": "llamacpp:kv_cache_usage_ratio",
    "running": "llamacpp:requests_processing",
    "waiting": "llamacpp:requests_deferred",
    "waiting_by_reason": None,
    "preemptions": None,
    "success": None,
    "generation_tokens": "llamacpp:tokens_predicted_total",
    "prefix_cache_queries": None,
    "prefix_cache_hits": None,
    "ttft_histogram": None,
    "queue_histogram": None,
    "cache_config": None,
    "lora_info": None,
}
SUCCESS_REASONS = None
CONTINUOUS_USAGE_STATS = False
IGNORE_EOS = True
# chat_template_kwargs: merged into the Jinja template's arguments (tools/server/utils.hpp)
CHAT_TEMPLATE_KWARGS = True
TOKENIZER = {"path": "/tokenize", "style": "llamacpp", "chat": False}
VERSION = {"path": "/props", "field": "build_info"}
METRICS = True
SOURCES = (
    "https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md",
    "https://github.com/ggml-org/llama.cpp/blob/master/tools/server/server.cpp",
)
