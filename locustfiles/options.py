"""The suite's options after parsing: their checks (one `error:` line each), their parsers, and what run.json keeps.
The declarations are in the features' modules (declare.py; settings.py lists them).
"""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from locust.util.timespan import parse_timespan

from ..analysis import capacity, kinds, servers
from ..analysis.adaptive import AUTO, DEFAULT_CI_TARGET, DEFAULT_MAX_STEP_DURATION, parse_ci_target
from ..analysis.run import parse_rate
from ..analysis.schedule import GAMMA, check_burstiness, parse_rates

DEFAULT_STEPS = "1,2,4,8,16,32,64"
DEFAULT_STEP_DURATION = "30s"
DEFAULT_STEP_WARMUP = "5s"  # at most a fifth of a step shorter than 10 s (startup.fit_default_warmup)
DEFAULT_MAX_USERS = 1000

__all__ = ["parse_rate"]  # re-exported: the --max-error-rate parser, shared with analysis.finish


def api_key(options) -> str | None:
    """--api-key, else the environment variable named by --api-key-env; None when neither is set."""
    return options.api_key or os.environ.get(options.api_key_env or "OPENAI_API_KEY") or None


def parse_steps(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4]; raises ValueError with a one-line fix."""
    try:
        steps = [int(part) for part in str(text).replace(" ", "").split(",") if part]
    except ValueError:
        raise ValueError(f"--steps {text!r} is not a list of user counts; use e.g. --steps 1,2,4,8") from None
    if not steps or any(n < 1 for n in steps):
        raise ValueError(f"--steps {text!r} needs one or more positive user counts; use e.g. --steps 1,2,4,8")
    return steps


_SPAN = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|h|m|s)")
_SPAN_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str, name: str, allow_zero: bool = False) -> float:
    """'30s', '1.4s', '500ms', '2m', '1m30s' or plain seconds -> seconds; raises ValueError naming the option.
    Decimals are accepted with a unit too: the default warm-up of a 7 s step is written '1.4s' (startup.py)."""
    text = str(text).strip()
    try:
        value = float(text) if text.replace(".", "", 1).isdigit() else _timespan(text)
    except ValueError:
        raise ValueError(f"{name} {text!r} is not a duration; use e.g. {name} 30s") from None
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} {text!r} must be {'zero or ' if allow_zero else ''}positive; use e.g. {name} 30s")
    return value


def _timespan(text: str) -> float:
    """'1h30m', '1.5s', '250ms' -> seconds (Locust's parse_timespan takes whole numbers only)."""
    parts = _SPAN.findall(text.replace(" ", "").lower())
    if not parts or "".join(n + u for n, u in parts) != text.replace(" ", "").lower():
        return float(parse_timespan(text))  # raises ValueError for anything it does not read either
    return sum(float(n) * _SPAN_SECONDS[u] for n, u in parts)


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
    maximum_text = options.max_step_duration
    target_text = options.ci_target
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
    options are checked by locustfiles.datasets.check_dataset (startup.check_options runs both)."""
    parse_steps(options.steps)
    if options.rates:
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
    check_repeat(options)
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
    if options.model_bytes:
        from ..analysis.ceiling import parse_bytes

        if parse_bytes(options.model_bytes) <= 0:
            raise ValueError(f"--model-bytes {options.model_bytes} must be positive")
    bandwidth = options.memory_bandwidth_gbs
    if bandwidth is not None:
        # The web UI's start form hands back text (and "" for an empty field): one type from here on.
        try:
            options.memory_bandwidth_gbs = None if str(bandwidth).strip() == "" else float(bandwidth)
        except ValueError:
            raise ValueError(f"--memory-bandwidth-gbs {bandwidth!r} is not a number of GB/s, e.g. 3350") from None
        if options.memory_bandwidth_gbs is not None and options.memory_bandwidth_gbs <= 0:
            raise ValueError(f"--memory-bandwidth-gbs {bandwidth} must be positive (GB/s)")
    if options.gpu:
        from ..analysis.ceiling import bandwidth_gbs

        bandwidth_gbs(options.gpu, None)
    if options.slo:
        from ..analysis.slo import check_endpoint, parse_slo

        check_endpoint(parse_slo(options.slo), options.endpoint)


def gpu_metrics_urls(options: argparse.Namespace) -> list[str]:
    """--gpu-metrics-url as a list of http(s) URLs, each once: repeated flags, an environment variable or a web UI
    field holding several (commas or spaces); raises ValueError naming a URL that is not http(s)."""
    given = options.gpu_metrics_url or []
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
    """Each kind's own options (analysis/kinds.py: --batch-size, --encoding-format ...) only with that kind, --images
    and its companions only with a kind of chat messages, and a kind that does not stream only with the options that
    apply to a request that does not stream."""
    kind = kinds.of(options.endpoint)
    for other in kinds.KINDS.values():
        for attribute, flag, minimum, what in other.minimums:
            value = getattr(options, attribute)
            if value < minimum:
                raise ValueError(f"{flag} {value} must be at least {minimum} ({what})")
    images = parse_images(options.images)
    if not kind.streams:
        _refuse_streaming_options(options, kind, images)
    for other in kinds.KINDS.values():
        for attribute, flag, default in () if other is kind else other.own_options:
            value = getattr(options, attribute)
            if value != default:
                shown = f"{flag} {value}" if isinstance(default, int) else flag
                raise ValueError(f"{shown} only applies to --endpoint {other.name}; add it or drop {flag}")
    if not kind.streams:
        return
    if images is not None and not kind.chat:
        chat = next(k.name for k in kinds.KINDS.values() if k.chat)
        raise ValueError(
            f"--images only applies to --endpoint {chat} (images are chat content parts; this run's endpoint is "
            f"{kind.name}); add --endpoint {chat} or drop --images"
        )
    if images is None:
        for flag, given in (
            ("--image-reuse", bool(options.image_reuse)),
            ("--image-format", options.image_format != "png"),
        ):
            if given:
                raise ValueError(f"{flag} only applies with --images; add e.g. --images 1:512x512 or drop {flag}")


def _refuse_streaming_options(options: argparse.Namespace, kind: kinds.RequestKind, images) -> None:
    """Each of these shapes a streamed generation, which a request of `kind` does not have: refused rather than
    ignored, so a run measures what its options say."""
    refused = [
        ("--images", bool(images)),
        ("--ignore-eos", bool(options.ignore_eos)),
        ("--max-tokens-dist", bool(options.max_tokens_dist)),
        ("--turns", str(options.turns).strip() != "1"),
        ("--trace", bool(options.trace)),
        ("--chat-template-kwargs", bool(options.chat_template_kwargs)),
        ("--tools", bool(options.tools)),
        ("--tool-choice", bool(options.tool_choice)),
        ("--step-duration auto", parse_step_duration(options.step_duration) is None),
        ("--find-capacity", bool(options.find_capacity)),
    ]
    for flag, given in refused:
        if given:
            raise ValueError(
                f"{flag} does not apply to --endpoint {kind.name} (a request that does not stream or generate); "
                f"drop {flag}"
            )


def check_arrival(options: argparse.Namespace) -> None:
    """--burstiness is a positive finite number, and other than 1 only with --arrival gamma (elsewhere it would do
    nothing). --arrival gamma itself, like poisson and constant, only shapes an open loop's arrivals: a closed loop
    or a trace replay ignores it, as it always ignored --arrival."""
    burstiness = check_burstiness(options.burstiness)
    arrival = options.arrival
    if burstiness != 1 and arrival != GAMMA:
        raise ValueError(
            f"--burstiness {options.burstiness} only applies with --arrival gamma (this run's arrivals are "
            f"{arrival}); add --arrival gamma or drop --burstiness"
        )
    options.burstiness = burstiness  # the web UI's start form may hand back text: one type from here on


def check_repeat(options: argparse.Namespace) -> None:
    """--repeat N repeats a fixed plan (--steps or --rates) whole; a capacity search and a trace replay have none."""
    try:
        repeat = int(str(options.repeat).strip())
    except ValueError:
        raise ValueError(f"--repeat {options.repeat!r} is not a whole number of trials, e.g. --repeat 3") from None
    if repeat < 1:
        raise ValueError(f"--repeat {repeat} must be at least 1")
    options.repeat = repeat  # the web UI's start form may hand back text: one type from here on
    if repeat == 1:
        return
    if str(options.find_capacity or "").strip():
        raise ValueError(
            f"--repeat {repeat} is not supported with --find-capacity: the search picks each probe's load from the "
            "verdicts so far, so there is no fixed plan to repeat; repeat --steps or --rates at the loads it found"
        )
    if options.trace:
        raise ValueError(
            f"--repeat {repeat} is not supported with --trace: a replay's windows are the trace's own time, not "
            "steps of a fixed plan; replay it again as a separate run and compare the runs"
        )


def check_capacity(options: argparse.Namespace) -> None:
    """--find-capacity needs --slo and replaces --steps and --rates; its start, maximum and resolution are numbers.
    The capacity options without --find-capacity are refused, as the run would not do what they say."""
    mode = str(options.find_capacity or "").strip()
    if not mode:
        for name, attr, default in (
            ("--start-users", "start_users", capacity.DEFAULT_START_USERS),
            ("--start-rate", "start_rate", capacity.DEFAULT_START_RATE),
            ("--max-rate", "max_rate", ""),
            ("--capacity-resolution", "capacity_resolution", capacity.DEFAULT_RESOLUTION),
        ):
            value = getattr(options, attr)
            if str(value).strip() != str(default):
                raise ValueError(f"{name} {value} only applies with --find-capacity; add --find-capacity users|rate")
        return
    if mode not in capacity.MODES:  # the web UI's form hands back free text
        raise ValueError(f"--find-capacity {mode!r} is not one of {', '.join(capacity.MODES)}")
    if not options.slo:
        raise ValueError(
            f"--find-capacity {mode} needs objectives to search against; add e.g. --slo ttft_p95=500ms,tpot_p95=50ms"
        )
    if options.steps != DEFAULT_STEPS:
        raise ValueError(f"--find-capacity chooses the loads itself: drop --steps {options.steps}")
    if options.rates:
        raise ValueError(f"--find-capacity chooses the loads itself: drop --rates {options.rates}")
    capacity.parse_resolution(options.capacity_resolution)
    start = int(options.start_users or 0)
    if start < 1:
        raise ValueError(f"--start-users {start} must be at least 1")
    if mode == capacity.USERS and start > options.max_users:
        raise ValueError(f"--start-users {start} is above --max-users {options.max_users}")
    rate = capacity.parse_load(options.start_rate, "--start-rate")
    if rate is None:
        raise ValueError("--start-rate is empty; use e.g. --start-rate 1")
    maximum = capacity.parse_load(options.max_rate, "--max-rate")
    if mode == capacity.RATE and maximum is not None and rate > maximum:
        raise ValueError(f"--start-rate {options.start_rate} is above --max-rate {options.max_rate}")


def check_server_type(options: argparse.Namespace, server_type: str | None = None) -> None:
    """--server-type is known, and --ignore-eos and --chat-template-kwargs are fields the server takes
    (`server_type`: the resolved one)."""
    given = options.server_type or "auto"
    if given not in servers.SERVER_TYPES:  # the web UI's form hands back free text
        raise ValueError(f"--server-type {given!r} is not one of {', '.join(servers.SERVER_TYPES)}")
    name = server_type or given
    if name == "auto":
        return
    profile = servers.get(name)
    how = "" if server_type is None or given != "auto" else " (detected)"
    if str(options.chat_template_kwargs or "").strip() and not profile.chat_template_kwargs:
        # A strict API answers an unknown field with a 400 (every request would fail); another server would apply
        # no template argument, and thinking on and off would measure the same.
        raise ValueError(
            f"--chat-template-kwargs cannot be sent to a {profile.title} server (--server-type {name}{how}): it has "
            "no chat_template_kwargs field; drop it, pass --server-type vllm if the server is a vLLM, or send it "
            "anyway with --extra-body '{\"chat_template_kwargs\": ...}'"
        )
    if not options.ignore_eos:
        return
    if not profile.ignore_eos:
        raise ValueError(
            f"--ignore-eos cannot be sent to a {profile.title} server (--server-type {name}{how}): it has no "
            "ignore_eos field; drop --ignore-eos, or pass --server-type vllm if the server is a vLLM"
        )
