"""The suite's custom Locust arguments, declared: name, default, variable, choices and help of each (docs/options.md's
reference table is generated from them: locustfiles/options_reference.py).

Each one is settable on the command line, in `locust.conf`, in `pyproject.toml [tool.locust]`, through a
`LOCUST_*` environment variable, and in the web UI's start form. Checking and parsing their values: options.py.
"""

from __future__ import annotations

from ..analysis import capacity, kinds, servers
from ..analysis.adaptive import DEFAULT_CI_TARGET, DEFAULT_MAX_STEP_DURATION
from ..analysis.schedule import ARRIVALS, DEFAULT_ARRIVAL

DEFAULT_PROMPT = "Explica en detalle cómo funciona la fotosíntesis."
DEFAULT_STEPS = "1,2,4,8,16,32,64"
DEFAULT_STEP_DURATION = "30s"
DEFAULT_MAX_USERS = 1000
ENDPOINTS = kinds.paths()  # --endpoint's choices: the request kinds (analysis/kinds.py)


def one_line_error(message: str) -> None:
    """argparse's error(), as one line and the bad-input exit code (argparse prints its usage and exits 2)."""
    import sys

    sys.stderr.write(f"error: {message}; see --help\n")
    sys.exit(3)


def add_arguments(parser) -> None:
    """Listener for `init_command_line_parser`."""
    parser.error = one_line_error
    # parser.add_argument, not an argument group: only the parser's own method marks options for the web UI.
    parser.add_argument(
        "--model",
        default="",
        env_var="LOCUST_MODEL",
        help="Model name to request. Default: the first model listed by the server's /v1/models",
    )
    parser.add_argument(
        "--endpoint",
        default="completions",
        choices=sorted(ENDPOINTS),
        env_var="LOCUST_ENDPOINT",
        help="completions (/v1/completions), chat (/v1/chat/completions), embeddings (/v1/embeddings: not "
        "streamed, --batch-size inputs per request) or rerank (/v1/rerank: not streamed, a query and --documents "
        "documents per request)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=1,
        env_var="LOCUST_BATCH_SIZE",
        help="--endpoint embeddings: inputs per request, taken in turn from --dataset",
    )
    parser.add_argument(
        "--encoding-format",
        default="float",
        choices=["float", "base64"],
        env_var="LOCUST_ENCODING_FORMAT",
        help="--endpoint embeddings: the vectors as JSON floats or base64 (little-endian float32)",
    )
    parser.add_argument(
        "--documents",
        dest="documents_per_request",
        type=int,
        default=8,
        env_var="LOCUST_DOCUMENTS",
        help="--endpoint rerank: documents ranked per request against its query (query and documents are "
        "consecutive texts of --dataset)",
    )
    parser.add_argument(
        "--top-n",
        type=int,
        default=0,
        env_var="LOCUST_TOP_N",
        help="--endpoint rerank: the results asked per request (top_n); 0: every document ranked, top_n not sent",
    )
    parser.add_argument(
        "--rerank-path",
        default="",
        choices=["", "/v1/rerank", "/rerank", "/v2/rerank"],
        env_var="LOCUST_RERANK_PATH",
        help="--endpoint rerank: the API's path (vLLM serves all three; /v2/rerank is the Cohere-style one). "
        "Default: /v1/rerank",
    )
    parser.add_argument(
        "--images",
        default="",
        env_var="LOCUST_IMAGES",
        help="--endpoint chat: N:WIDTHxHEIGHT, N generated images (seeded by --seed) added to every request as "
        "image_url parts with base64 data URLs, e.g. 2:512x512; distinct per request unless --image-reuse",
    )
    parser.add_argument(
        "--image-reuse",
        action="store_true",
        default=False,
        env_var="LOCUST_IMAGE_REUSE",
        help="With --images: every request sends the same images (to measure the server's image cache)",
    )
    parser.add_argument(
        "--image-format",
        default="png",
        choices=["png", "jpeg"],
        env_var="LOCUST_IMAGE_FORMAT",
        help="With --images: the images' encoding",
    )
    parser.add_argument(
        "--prompt", default=DEFAULT_PROMPT, env_var="LOCUST_PROMPT", help="Prompt text sent with every request"
    )
    parser.add_argument(
        "--prompt-file",
        default="",
        env_var="LOCUST_PROMPT_FILE",
        help="JSON list of prompt strings used in turn instead of --prompt",
    )
    parser.add_argument(
        "--dataset",
        default="fixed",
        env_var="LOCUST_DATASET",
        help="Prompt source: fixed (--prompt / --prompt-file), synthetic:N (prompts of N tokens), sharegpt:PATH "
        "(a ShareGPT JSON file), shared-prefix:L (a system prompt of L tokens shared by every request)",
    )
    parser.add_argument(
        "--num-prompts",
        type=int,
        default=100,
        env_var="LOCUST_NUM_PROMPTS",
        help="Distinct prompts built by synthetic and shared-prefix, conversations drawn by sharegpt",
    )
    parser.add_argument(
        "--max-tokens", type=int, default=256, env_var="LOCUST_MAX_TOKENS", help="max_tokens per request"
    )
    parser.add_argument(
        "--max-tokens-dist",
        default="",
        env_var="LOCUST_MAX_TOKENS_DIST",
        help="Per-request max_tokens: fixed (--max-tokens), reference (the dataset's answer lengths), "
        "uniform:LOW:HIGH or normal:MEAN:SD. Default: reference for sharegpt, else fixed",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        env_var="LOCUST_SEED",
        help="Seed of the generated and sampled prompts, of --max-tokens-dist and of --arrival poisson's and gamma's "
        "times (the same seed gives the same prompts and schedule, in every worker)",
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        env_var="LOCUST_TEMPERATURE",
        help="Sampling temperature (0 for deterministic comparisons)",
    )
    parser.add_argument(
        "--ignore-eos",
        action="store_true",
        default=False,
        env_var="LOCUST_IGNORE_EOS",
        help="Send ignore_eos (vLLM, SGLang, llama.cpp) so every request generates exactly --max-tokens. Refused "
        "(exit code 3, nothing sent) with a server type that has no such field (openai, tgi): lengths would not be "
        "exact, and a strict API rejects the field",
    )
    parser.add_argument(
        "--chat-template-kwargs",
        default="",
        env_var="LOCUST_CHAT_TEMPLATE_KWARGS",
        help="Chat endpoint: a JSON object sent as chat_template_kwargs, e.g. '{\"enable_thinking\": false}' for Qwen3",
    )
    parser.add_argument(
        "--tools",
        default="",
        env_var="LOCUST_TOOLS",
        help="Chat endpoint: a JSON file holding a list of OpenAI tool definitions sent with every request "
        "(run.json keeps its path, sha256 and tool names)",
    )
    parser.add_argument(
        "--tool-choice",
        default="",
        env_var="LOCUST_TOOL_CHOICE",
        help="With --tools: auto, none, required or the NAME of one of the tools (sent as tool_choice)",
    )
    parser.add_argument(
        "--extra-body",
        default="",
        env_var="LOCUST_EXTRA_BODY",
        help="A JSON object merged into every request body (server-specific fields, e.g. '{\"top_k\": 20}'; saved in "
        "run.json: no secrets): objects merge key by key, other values replace the suite's; model, prompt, messages, "
        "max_tokens (their own options) and a stream other than true are refused",
    )
    parser.add_argument(
        "--read-timeout",
        type=float,
        default=600.0,
        env_var="LOCUST_READ_TIMEOUT",
        help="Seconds to wait for any bytes from the server (a queued request may wait minutes for its first token)",
    )
    parser.add_argument(
        "--api-key",
        default="",
        env_var="LOCUST_API_KEY",
        is_secret=True,  # a password field in the web UI's start form
        help="API key sent as a Bearer token (masked in the web UI, never saved). Default: the --api-key-env variable",
    )
    parser.add_argument(
        "--api-key-env",
        default="OPENAI_API_KEY",
        env_var="LOCUST_API_KEY_ENV",
        help="Name of the environment variable holding the API key (sent as a Bearer token)",
    )
    parser.add_argument(
        "--no-continuous-usage",
        action="store_true",
        default=False,
        env_var="LOCUST_NO_CONTINUOUS_USAGE",
        help="Do not ask for stream_options.continuous_usage_stats (for servers that reject it)",
    )
    parser.add_argument(
        "--server-type",
        default="auto",
        choices=list(servers.SERVER_TYPES),
        env_var="LOCUST_SERVER_TYPE",
        help="The server's kind, for its metric names, request extensions, /tokenize and version endpoint: vllm, "
        "sglang, tgi, llamacpp, or openai (any OpenAI-compatible API: no vendor fields, no /metrics). Default auto: "
        "detected from /metrics and /version before any load; openai when neither is recognised",
    )
    parser.add_argument(
        "--keep-alive",
        action="store_true",
        default=False,
        env_var="LOCUST_KEEP_ALIVE",
        help="Reuse each user's connection between requests. Off by default: uvicorn (vLLM's HTTP server) can drop "
        "a request that arrives right after the previous response on the same connection",
    )
    parser.add_argument(
        "--steps", default=DEFAULT_STEPS, env_var="LOCUST_STEPS", help="Comma-separated user counts, one load step each"
    )
    parser.add_argument(
        "--rates",
        default="",
        env_var="LOCUST_RATES",
        help="Open loop instead of --steps: comma-separated request rates (requests/s, all load processes "
        "together), one step each; requests are sent at scheduled times, whether or not earlier ones have ended",
    )
    parser.add_argument(
        "--arrival",
        default=DEFAULT_ARRIVAL,
        choices=list(ARRIVALS),
        env_var="LOCUST_ARRIVAL",
        help="With --rates: poisson (exponential times between requests, seeded by --seed), constant (evenly "
        "spaced) or gamma (gamma-distributed times between requests of shape --burstiness, seeded by --seed)",
    )
    parser.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        env_var="LOCUST_BURSTINESS",
        help="With --arrival gamma: the gamma distribution's shape (1 = Poisson, below 1 burstier, above 1 smoother), "
        "as vLLM bench serve's --burstiness",
    )
    parser.add_argument(
        "--turns",
        default="1",
        env_var="LOCUST_TURNS",
        help="Conversations: each user holds conversations of N turns (chat endpoint: every turn resends the whole "
        "history; completions: the history as text); all: each sharegpt conversation's own human turns",
    )
    parser.add_argument(
        "--history",
        default="generated",
        choices=["generated", "reference"],
        env_var="LOCUST_HISTORY",
        help="With --turns: the answers resent as history: generated (what the server streamed) or reference "
        "(the dataset's own answers, sharegpt)",
    )
    parser.add_argument(
        "--think-time",
        default="0",
        env_var="LOCUST_THINK_TIME",
        help="With --turns: the wait between a turn's answer and the next turn, excluded from latency: 0, "
        "constant:2s, exponential:5s (mean) or uniform:1s:4s",
    )
    parser.add_argument(
        "--trace",
        default="",
        env_var="LOCUST_TRACE",
        help="Replay a timestamped trace instead of --steps/--rates: each row sent once, open loop, at its time",
    )
    parser.add_argument(
        "--trace-format",
        default="auto",
        choices=["auto", "mooncake", "azure", "jsonl"],
        env_var="LOCUST_TRACE_FORMAT",
        help="With --trace: mooncake (JSONL: timestamp ms, input_length, output_length, hash_ids), azure (CSV: "
        "TIMESTAMP, ContextTokens, GeneratedTokens) or jsonl (timestamp s or ms, prompt or input_length, "
        "output_length); auto detects it from the content",
    )
    parser.add_argument(
        "--trace-speed",
        type=float,
        default=1.0,
        env_var="LOCUST_TRACE_SPEED",
        help="With --trace: replay speed (2 = twice as fast: every gap between rows halved)",
    )
    parser.add_argument(
        "--trace-start",
        default="0s",
        env_var="LOCUST_TRACE_START",
        help="With --trace: replay from this offset into the trace (e.g. 10m), in the trace's own time",
    )
    parser.add_argument(
        "--trace-duration",
        default="",
        env_var="LOCUST_TRACE_DURATION",
        help="With --trace: replay only this much of the trace from --trace-start (e.g. 5m), in the trace's own "
        "time. Default: to the end",
    )
    parser.add_argument(
        "--trace-block-tokens",
        type=int,
        default=512,
        env_var="LOCUST_TRACE_BLOCK_TOKENS",
        help="With --trace: tokens per hash_id block (Mooncake's 512): rows sharing a hash_id share that text block",
    )
    parser.add_argument(
        "--max-users",
        type=int,
        default=DEFAULT_MAX_USERS,
        env_var="LOCUST_MAX_USERS",
        help="With --rates (or --find-capacity rate): the pool of users that send the scheduled requests (at most "
        "this many in flight); a request whose time comes while all are busy is sent late, and its lateness "
        "recorded. With --find-capacity users: the most users probed",
    )
    parser.add_argument(
        "--find-capacity",
        default="",
        choices=["", *capacity.MODES],
        env_var="LOCUST_FIND_CAPACITY",
        help="Search for the highest load meeting every --slo objective instead of running --steps: users (closed "
        "loop) or rate (open loop, with --arrival and --seed). Probes double from --start-users / --start-rate "
        "until an objective breaks, then bisect to --capacity-resolution; each probe is a step",
    )
    parser.add_argument(
        "--start-users",
        type=int,
        default=capacity.DEFAULT_START_USERS,
        env_var="LOCUST_START_USERS",
        help="With --find-capacity users: the first probe's users (the probes stop at --max-users)",
    )
    parser.add_argument(
        "--start-rate",
        default=capacity.DEFAULT_START_RATE,
        env_var="LOCUST_START_RATE",
        help="With --find-capacity rate: the first probe's requests/s",
    )
    parser.add_argument(
        "--max-rate",
        default="",
        env_var="LOCUST_MAX_RATE",
        help="With --find-capacity rate: the highest rate probed (requests/s). Default: no limit but the SLOs and "
        "the throughput",
    )
    parser.add_argument(
        "--capacity-resolution",
        default=capacity.DEFAULT_RESOLUTION,
        env_var="LOCUST_CAPACITY_RESOLUTION",
        help="With --find-capacity: bisect until the highest passing and the lowest failing probe are this close, "
        "relative to the passing one (e.g. 10%%; never finer than 1 user)",
    )
    parser.add_argument(
        "--step-duration",
        default=DEFAULT_STEP_DURATION,
        env_var="LOCUST_STEP_DURATION",
        help="Length of each step (e.g. 30s, 2m), or auto: each step runs until its aggregate tok/s interval is "
        "within --ci-target and its TTFT p95 has enough samples, or until --max-step-duration",
    )
    parser.add_argument(
        "--max-step-duration",
        default=DEFAULT_MAX_STEP_DURATION,
        env_var="LOCUST_MAX_STEP_DURATION",
        help="With --step-duration auto: the longest a step may run, warm-up included (e.g. 120s, 5m); a step "
        "that reaches it is flagged (end_reason max_duration)",
    )
    parser.add_argument(
        "--ci-target",
        default=DEFAULT_CI_TARGET,
        env_var="LOCUST_CI_TARGET",
        help="With --step-duration auto: the 95%% interval half-width of a step's aggregate tok/s, relative to its "
        "value, at which the step ends (e.g. 5%% or 0.05)",
    )
    parser.add_argument(
        "--step-warmup",
        default="5s",
        env_var="LOCUST_STEP_WARMUP",
        help="Start of each step excluded from its statistics (e.g. 5s)",
    )
    parser.add_argument(
        "--metrics-url",
        default="",
        env_var="LOCUST_METRICS_URL",
        help="Prometheus endpoint of the server, scraped during the run. Default: <host>/metrics; 'off' to disable",
    )
    parser.add_argument(
        "--scrape-interval",
        type=float,
        default=1.0,
        env_var="LOCUST_SCRAPE_INTERVAL",
        help="Seconds between two scrapes of --metrics-url (and of each --gpu-metrics-url)",
    )
    parser.add_argument(
        "--gpu-metrics-url",
        action="append",
        default=None,
        env_var="LOCUST_GPU_METRICS_URL",
        help="A GPU exporter's Prometheus endpoint (NVIDIA dcgm-exporter, e.g. http://gpu-node:9400/metrics), "
        "scraped beside --metrics-url for steps.csv's GPU columns; repeat it once per GPU host (the environment "
        "variable takes several, separated by commas or spaces)",
    )
    parser.add_argument(
        "--no-report",
        action="store_true",
        default=False,
        env_var="LOCUST_NO_REPORT",
        help="Do not write report.html at the end of the run (summary.json and summary.md are still written)",
    )
    parser.add_argument(
        "--slo",
        default="",
        env_var="LOCUST_SLO",
        help="Service-level objectives every step must meet, e.g. ttft_p95=500ms,tpot_p95=50ms,e2e_p99=20s,"
        "error_rate=1%% (a reasoning model: ttfo_p95=2s, the first answer token): goodput per step, summary.md, and "
        "exit code 1 in headless mode when one is broken",
    )
    parser.add_argument(
        "--gpu",
        default="",
        env_var="LOCUST_GPU",
        help="The server's accelerator, for the efficiency ceiling: a preset memory bandwidth (h100-sxm, "
        "a100-80gb-sxm, l40s, l4, mi300x, ...; see docs/options.md)",
    )
    parser.add_argument(
        "--memory-bandwidth-gbs",
        type=float,
        default=None,
        env_var="LOCUST_MEMORY_BANDWIDTH_GBS",
        help="The accelerator's memory bandwidth in GB/s (overrides --gpu), for the efficiency ceiling",
    )
    parser.add_argument(
        "--model-bytes",
        default="",
        env_var="LOCUST_MODEL_BYTES",
        help="The model's weight size (e.g. 16GB, 15.3GiB), for the efficiency ceiling (vLLM does not report it)",
    )
    parser.add_argument(
        "--max-error-rate",
        default="0",
        env_var="LOCUST_MAX_ERROR_RATE",
        help="Exit code 1 when failed requests exceed this share of all measured requests (e.g. 1%% or 0.01). "
        "Default 0: any failed request fails the run",
    )
    parser.add_argument(
        "--run-dir",
        default="",
        env_var="LOCUST_RUN_DIR",
        help="Where records and tables go. Default: reports/<UTC timestamp>/",
    )
