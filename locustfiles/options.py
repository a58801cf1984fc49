"""The suite's custom Locust arguments.

Each one is settable on the command line, in `locust.conf`, in `pyproject.toml [tool.locust]`, through a
`LOCUST_*` environment variable, and in the web UI's start form.
"""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from locust.util.timespan import parse_timespan

from ..analysis import capacity, servers
from ..analysis.adaptive import AUTO, DEFAULT_CI_TARGET, DEFAULT_MAX_STEP_DURATION, parse_ci_target
from ..analysis.run import parse_rate
from ..analysis.schedule import ARRIVALS, DEFAULT_ARRIVAL, GAMMA, check_burstiness, parse_rates

__all__ = ["parse_rate"]  # re-exported: the --max-error-rate parser, shared with analysis.finish

DEFAULT_PROMPT = "Explica en detalle cómo funciona la fotosíntesis."
DEFAULT_STEPS = "1,2,4,8,16,32,64"
DEFAULT_STEP_DURATION = "30s"
DEFAULT_MAX_USERS = 1000
ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions", "embeddings": "/v1/embeddings"}


# Locust's own options that shape a run: run.json keeps them beside every option of the suite's. An allow-list,
# so that Locust's secrets (--web-auth) never land there.
LOCUST_SAVED = (
    "host", "num_users", "spawn_rate", "run_time", "stop_timeout", "processes", "headless", "master", "worker",
    "expect_workers",
)  # fmt: skip


def saved_names() -> tuple[str, ...]:
    """run.json's options: LOCUST_SAVED, then every option add_arguments declares but the secrets (is_secret),
    read off a parser so that a new option is saved without a list to keep up to date."""
    from locust.argument_parser import LocustArgumentParser

    parser = LocustArgumentParser(add_help=False)
    add_arguments(parser)
    return LOCUST_SAVED + tuple(a.dest for a in parser._actions if not getattr(a, "is_secret", False))


def api_key(options) -> str | None:
    """--api-key, else the environment variable named by --api-key-env; None when neither is set."""
    return getattr(options, "api_key", "") or os.environ.get(options.api_key_env or "OPENAI_API_KEY") or None


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
        help="completions (/v1/completions), chat (/v1/chat/completions) or embeddings (/v1/embeddings: not "
        "streamed, --batch-size inputs per request)",
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


def parse_steps(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4]; raises ValueError with a one-line fix."""
    try:
        steps = [int(part) for part in str(text).replace(" ", "").split(",") if part]
    except ValueError:
        raise ValueError(f"--steps {text!r} is not a list of user counts; use e.g. --steps 1,2,4,8") from None
    if not steps or any(n < 1 for n in steps):
        raise ValueError(f"--steps {text!r} needs one or more positive user counts; use e.g. --steps 1,2,4,8")
    return steps


def parse_duration(text: str, name: str, allow_zero: bool = False) -> float:
    """'30s', '2m', '1m30s' or plain seconds -> seconds; raises ValueError naming the option."""
    text = str(text).strip()
    try:
        value = float(text) if text.replace(".", "", 1).isdigit() else float(parse_timespan(text))
    except ValueError:
        raise ValueError(f"{name} {text!r} is not a duration; use e.g. {name} 30s") from None
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} {text!r} must be {'zero or ' if allow_zero else ''}positive; use e.g. {name} 30s")
    return value


def parse_step_duration(text: str) -> float | None:
    """--step-duration: seconds, or None for auto (adaptive steps, analysis/adaptive.py)."""
    if str(text).strip().lower() == AUTO:
        return None
    return parse_duration(text, "--step-duration")


def check_step_length(options: argparse.Namespace) -> None:
    """--step-duration (a duration or auto), --step-warmup shorter than a step, --max-step-duration and --ci-target.

    --max-step-duration or --ci-target changed from its default without --step-duration auto is refused: each
    step would still run its fixed length, and the run would not measure what its options say."""
    duration = parse_step_duration(options.step_duration)
    warmup = parse_duration(options.step_warmup, "--step-warmup", allow_zero=True)
    maximum_text = getattr(options, "max_step_duration", DEFAULT_MAX_STEP_DURATION)
    target_text = getattr(options, "ci_target", DEFAULT_CI_TARGET)
    maximum = parse_duration(maximum_text, "--max-step-duration")
    parse_ci_target(target_text)
    if duration is not None:
        for name, text, default in (
            ("--max-step-duration", maximum_text, DEFAULT_MAX_STEP_DURATION),
            ("--ci-target", target_text, DEFAULT_CI_TARGET),
        ):
            if str(text).strip() != default:
                raise ValueError(
                    f"{name} {text} only applies with --step-duration auto (this run's steps are "
                    f"{options.step_duration} each); add --step-duration auto or drop {name}"
                )
        if warmup >= duration:
            raise ValueError(
                f"--step-warmup {options.step_warmup} must be shorter than --step-duration {options.step_duration}"
            )
    elif warmup >= maximum:
        raise ValueError(f"--step-warmup {options.step_warmup} must be shorter than --max-step-duration {maximum_text}")


def check(options: argparse.Namespace) -> None:
    """Validate the options that have no argparse type; raises ValueError with a one-line message. The prompt
    options are checked by locustfiles.datasets.check_dataset (plugin.check_options runs both)."""
    parse_steps(options.steps)
    if getattr(options, "rates", ""):
        parse_rates(options.rates)
        # Only a --steps that differs from its default counts as given: an option's source is not kept by argparse.
        if options.steps != DEFAULT_STEPS:
            raise ValueError(
                f"--rates {options.rates} and --steps {options.steps} are alternatives (open loop, closed loop); "
                "give only one"
            )
        if options.max_users < 1:
            raise ValueError(f"--max-users {options.max_users} must be at least 1")
    check_step_length(options)
    check_capacity(options)
    check_arrival(options)
    check_request_kind(options)
    if options.max_tokens < 1:
        raise ValueError(f"--max-tokens {options.max_tokens} must be at least 1")
    if options.scrape_interval <= 0:
        raise ValueError(f"--scrape-interval {options.scrape_interval} must be positive (seconds)")
    options.gpu_metrics_url = gpu_metrics_urls(options) or None  # one type from here on: a list of checked URLs
    if options.read_timeout <= 0:
        raise ValueError(f"--read-timeout {options.read_timeout} must be positive (seconds)")
    parse_rate(options.max_error_rate, "--max-error-rate")
    check_server_type(options)
    if getattr(options, "model_bytes", ""):
        from ..analysis.ceiling import parse_bytes

        if parse_bytes(options.model_bytes) <= 0:
            raise ValueError(f"--model-bytes {options.model_bytes} must be positive")
    bandwidth = getattr(options, "memory_bandwidth_gbs", None)
    if bandwidth is not None:
        # The web UI's start form hands back text (and "" for an empty field): one type from here on.
        try:
            options.memory_bandwidth_gbs = None if str(bandwidth).strip() == "" else float(bandwidth)
        except ValueError:
            raise ValueError(f"--memory-bandwidth-gbs {bandwidth!r} is not a number of GB/s, e.g. 3350") from None
        if options.memory_bandwidth_gbs is not None and options.memory_bandwidth_gbs <= 0:
            raise ValueError(f"--memory-bandwidth-gbs {bandwidth} must be positive (GB/s)")
    if getattr(options, "gpu", ""):
        from ..analysis.ceiling import bandwidth_gbs

        bandwidth_gbs(options.gpu, None)
    if getattr(options, "slo", ""):
        from ..analysis.slo import check_endpoint, parse_slo

        check_endpoint(parse_slo(options.slo), getattr(options, "endpoint", ""))


def gpu_metrics_urls(options: argparse.Namespace) -> list[str]:
    """--gpu-metrics-url as a list of http(s) URLs, each once: repeated flags, an environment variable or a web UI
    field holding several (commas or spaces); raises ValueError naming a URL that is not http(s)."""
    given = getattr(options, "gpu_metrics_url", None) or []
    if isinstance(given, str):
        given = [given]
    urls: list[str] = []
    for item in given:
        for url in re.split(r"[\s,]+", str(item).strip()):
            if not url or url in urls:
                continue
            parts = urlsplit(url)
            try:
                parts.port  # noqa: B018 (raises ValueError on a port that is not a number)
                valid = parts.scheme in ("http", "https") and bool(parts.hostname)
            except ValueError:
                valid = False
            if not valid:
                raise ValueError(
                    f"--gpu-metrics-url {url!r} is not an http(s) URL; give the exporter's address, e.g. "
                    "--gpu-metrics-url http://gpu-node:9400/metrics"
                )
            urls.append(url)
    return urls


@dataclass(frozen=True)
class ImageSpec:
    """--images N:WIDTHxHEIGHT."""

    count: int
    width: int
    height: int


MAX_IMAGE_SIDE = 8192  # pixels: beyond any vision encoder's input, and a 8192x8192 PNG is ~200 MB of pixels


def parse_images(text: str) -> ImageSpec | None:
    """--images N:WIDTHxHEIGHT (e.g. 2:512x512) as an ImageSpec; "" is None (no images)."""
    text = str(text or "").strip()
    if not text:
        return None
    m = re.fullmatch(r"(\d+):(\d+)[xX](\d+)", text)
    if not m:
        raise ValueError(f"--images {text!r} is not N:WIDTHxHEIGHT; give e.g. --images 2:512x512")
    count, width, height = (int(g) for g in m.groups())
    if count < 1:
        raise ValueError(f"--images {text}: the number of images must be at least 1, e.g. --images 1:512x512")
    if not (1 <= width <= MAX_IMAGE_SIDE and 1 <= height <= MAX_IMAGE_SIDE):
        raise ValueError(f"--images {text}: each side must be 1 to {MAX_IMAGE_SIDE} pixels, e.g. --images 1:512x512")
    return ImageSpec(count, width, height)


def check_request_kind(options: argparse.Namespace) -> None:
    """--batch-size, --encoding-format (embeddings), --images, --image-reuse, --image-format (chat): each only where
    it applies, and an embeddings run only with the options that apply to a request that does not stream."""
    endpoint = getattr(options, "endpoint", "completions")
    batch = getattr(options, "batch_size", 1)
    if batch < 1:
        raise ValueError(f"--batch-size {batch} must be at least 1 (inputs per embeddings request)")
    images = parse_images(getattr(options, "images", ""))
    if endpoint == "embeddings":
        # Each of these shapes a streamed generation, which an embeddings request does not have: refused rather
        # than ignored, so a run measures what its options say.
        refused = [
            ("--images", bool(images)),
            ("--ignore-eos", bool(getattr(options, "ignore_eos", False))),
            ("--max-tokens-dist", bool(getattr(options, "max_tokens_dist", ""))),
            ("--turns", str(getattr(options, "turns", "1")).strip() != "1"),
            ("--trace", bool(getattr(options, "trace", ""))),
            ("--chat-template-kwargs", bool(getattr(options, "chat_template_kwargs", ""))),
            ("--tools", bool(getattr(options, "tools", ""))),
            ("--tool-choice", bool(getattr(options, "tool_choice", ""))),
            ("--step-duration auto", parse_step_duration(options.step_duration) is None),
            ("--find-capacity", bool(getattr(options, "find_capacity", ""))),
        ]
        for flag, given in refused:
            if given:
                raise ValueError(
                    f"{flag} does not apply to --endpoint embeddings (a request that does not stream or generate); "
                    f"drop {flag}"
                )
        return
    if batch != 1:
        raise ValueError(f"--batch-size {batch} only applies to --endpoint embeddings; add it or drop --batch-size")
    if getattr(options, "encoding_format", "float") != "float":
        raise ValueError("--encoding-format only applies to --endpoint embeddings; add it or drop --encoding-format")
    if images is not None and endpoint != "chat":
        raise ValueError(
            f"--images only applies to --endpoint chat (images are chat content parts; this run's endpoint is "
            f"{endpoint}); add --endpoint chat or drop --images"
        )
    if images is None:
        for flag, given in (
            ("--image-reuse", bool(getattr(options, "image_reuse", False))),
            ("--image-format", getattr(options, "image_format", "png") != "png"),
        ):
            if given:
                raise ValueError(f"{flag} only applies with --images; add e.g. --images 1:512x512 or drop {flag}")


def check_arrival(options: argparse.Namespace) -> None:
    """--burstiness is a positive finite number, and other than 1 only with --arrival gamma (elsewhere it would do
    nothing). --arrival gamma itself, like poisson and constant, only shapes an open loop's arrivals: a closed loop
    or a trace replay ignores it, as it always ignored --arrival."""
    burstiness = check_burstiness(getattr(options, "burstiness", 1.0))
    arrival = getattr(options, "arrival", DEFAULT_ARRIVAL)
    if burstiness != 1 and arrival != GAMMA:
        raise ValueError(
            f"--burstiness {options.burstiness} only applies with --arrival gamma (this run's arrivals are "
            f"{arrival}); add --arrival gamma or drop --burstiness"
        )
    options.burstiness = burstiness  # the web UI's start form may hand back text: one type from here on


def check_capacity(options: argparse.Namespace) -> None:
    """--find-capacity needs --slo and replaces --steps and --rates; its start, maximum and resolution are numbers.
    The capacity options without --find-capacity are refused, as the run would not do what they say."""
    mode = str(getattr(options, "find_capacity", "") or "").strip()
    if not mode:
        for name, attr, default in (
            ("--start-users", "start_users", capacity.DEFAULT_START_USERS),
            ("--start-rate", "start_rate", capacity.DEFAULT_START_RATE),
            ("--max-rate", "max_rate", ""),
            ("--capacity-resolution", "capacity_resolution", capacity.DEFAULT_RESOLUTION),
        ):
            value = getattr(options, attr, default)
            if str(value).strip() != str(default):
                raise ValueError(f"{name} {value} only applies with --find-capacity; add --find-capacity users|rate")
        return
    if mode not in capacity.MODES:  # the web UI's form hands back free text
        raise ValueError(f"--find-capacity {mode!r} is not one of {', '.join(capacity.MODES)}")
    if not getattr(options, "slo", ""):
        raise ValueError(
            f"--find-capacity {mode} needs objectives to search against; add e.g. --slo ttft_p95=500ms,tpot_p95=50ms"
        )
    if options.steps != DEFAULT_STEPS:
        raise ValueError(f"--find-capacity chooses the loads itself: drop --steps {options.steps}")
    if getattr(options, "rates", ""):
        raise ValueError(f"--find-capacity chooses the loads itself: drop --rates {options.rates}")
    capacity.parse_resolution(options.capacity_resolution)
    start = int(getattr(options, "start_users", capacity.DEFAULT_START_USERS) or 0)
    if start < 1:
        raise ValueError(f"--start-users {start} must be at least 1")
    if mode == capacity.USERS and start > options.max_users:
        raise ValueError(f"--start-users {start} is above --max-users {options.max_users}")
    rate = capacity.parse_load(options.start_rate, "--start-rate")
    if rate is None:
        raise ValueError("--start-rate is empty; use e.g. --start-rate 1")
    maximum = capacity.parse_load(getattr(options, "max_rate", ""), "--max-rate")
    if mode == capacity.RATE and maximum is not None and rate > maximum:
        raise ValueError(f"--start-rate {options.start_rate} is above --max-rate {options.max_rate}")


def check_server_type(options: argparse.Namespace, server_type: str | None = None) -> None:
    """--server-type is known, and --ignore-eos and --chat-template-kwargs are fields the server takes
    (`server_type`: the resolved one)."""
    given = getattr(options, "server_type", "auto") or "auto"
    if given not in servers.SERVER_TYPES:  # the web UI's form hands back free text
        raise ValueError(f"--server-type {given!r} is not one of {', '.join(servers.SERVER_TYPES)}")
    name = server_type or given
    if name == "auto":
        return
    profile = servers.get(name)
    how = "" if server_type is None or given != "auto" else " (detected)"
    if str(getattr(options, "chat_template_kwargs", "") or "").strip() and not profile.chat_template_kwargs:
        # A strict API answers an unknown field with a 400 (every request would fail); another server would apply
        # no template argument, and thinking on and off would measure the same.
        raise ValueError(
            f"--chat-template-kwargs cannot be sent to a {profile.title} server (--server-type {name}{how}): it has "
            "no chat_template_kwargs field; drop it, pass --server-type vllm if the server is a vLLM, or send it "
            "anyway with --extra-body '{\"chat_template_kwargs\": ...}'"
        )
    if not getattr(options, "ignore_eos", False):
        return
    if not profile.ignore_eos:
        raise ValueError(
            f"--ignore-eos cannot be sent to a {profile.title} server (--server-type {name}{how}): it has no "
            "ignore_eos field; drop --ignore-eos, or pass --server-type vllm if the server is a vLLM"
        )
