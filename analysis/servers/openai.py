"""A generic OpenAI-compatible endpoint (OpenAI's API, hosted providers, proxies): nothing beyond the API itself.

Source: https://platform.openai.com/docs/api-reference/chat/create (stream_options.include_usage: the usage of the
whole request in a last chunk). OpenAI's API rejects a field it does not know with HTTP 400, so no vendor extension
is sent: tokens are counted from that final usage. No /metrics, /tokenize or /version is asked for.
"""

NAME = "openai"
TITLE = "generic OpenAI-compatible API"
PREFIXES = ()
SERIES: dict = {}
SUCCESS_REASONS = None
CONTINUOUS_USAGE_STATS = False
IGNORE_EOS = False
# not an OpenAI API field (a strict API answers it with a 400)
CHAT_TEMPLATE_KWARGS = False
TOKENIZER = None
VERSION = None
METRICS = False
SOURCES = ("https://platform.openai.com/docs/api-reference/chat/create",)
