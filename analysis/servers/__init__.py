"""Server profiles: what differs between the OpenAI-compatible servers the suite load-tests.

A profile says which Prometheus series a server exposes and how they map onto the suite's canonical series, which
request extensions it accepts, and where its tokenizer and version endpoints are. The canonical series names are
vLLM 0.32's (`CANONICAL`): a server's samples are renamed to them when a scrape is parsed, so a vLLM run's
metrics.parquet is what it always was, and the analysis reads one set of names whatever the server. Samples
without a canonical counterpart keep the server's own names.

Pure data and pure functions; the network part of detection (fetching /metrics and /version) is in
locustfiles/preflight.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from . import llamacpp, openai, sglang, tgi, vllm

# The suite's canonical series: key -> the name the analysis reads (vLLM 0.32's). Histograms are family names
# (their samples end in _bucket, _sum, _count); the others are sample names.
CANONICAL: dict[str, str] = {
    "kv_cache_usage": "vllm:kv_cache_usage_perc",  # a fraction 0-1, despite the name
    "running": "vllm:num_requests_running",
    "waiting": "vllm:num_requests_waiting",
    "waiting_by_reason": "vllm:num_requests_waiting_by_reason",  # label reason = capacity | deferred
    "preemptions": "vllm:num_preemptions_total",
    "success": "vllm:request_success_total",  # requests finished; label finished_reason where the server has it
    "generation_tokens": "vllm:generation_tokens_total",
    "prefix_cache_queries": "vllm:prefix_cache_queries_total",  # prompt tokens looked up in the prefix cache
    "prefix_cache_hits": "vllm:prefix_cache_hits_total",  # prompt tokens found there
    "ttft_histogram": "vllm:time_to_first_token_seconds",
    "queue_histogram": "vllm:request_queue_time_seconds",
    "cache_config": "vllm:cache_config_info",  # labels describe the KV cache (block size, blocks)
    # LoRA adapters: labels running_lora_adapters, waiting_lora_adapters (comma-separated names) and max_lora; the
    # value the Unix time the label set was last the engine's state (earlier sets are kept)
    "lora_info": "vllm:lora_requests_info",
    # Speculative decoding (vllm/v1/spec_decode/metrics.py): drafts proposed, their tokens, the tokens accepted, and
    # those accepted at each draft position (label position = 0 .. k-1); only served with --speculative-config.
    "spec_drafts": "vllm:spec_decode_num_drafts_total",
    "spec_draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "spec_accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total",
    "spec_accepted_per_position": "vllm:spec_decode_num_accepted_tokens_per_pos_total",
}
HISTOGRAMS = frozenset({"ttft_histogram", "queue_histogram"})
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")

DEFAULT = "vllm"  # an unresolved `auto` (no detection ran): today's behaviour
FALLBACK = "openai"  # `auto` with nothing recognisable: see detect()


@dataclass(frozen=True)
class TokenizerEndpoint:
    """A server's tokenizer: POST `path`; `style` names the request and answer shapes (see tokenize_body)."""

    path: str
    style: str  # vllm: {"model", "prompt" | "messages", "add_special_tokens"} -> {"count", "max_model_len"}
    # tgi: {"inputs", "add_special_tokens"} -> [token, ...]; llamacpp: {"content", "add_special"} -> {"tokens"}
    chat: bool = False  # counts chat messages with the server's chat template ({"messages": ...})


@dataclass(frozen=True)
class VersionEndpoint:
    """GET `path` answers a JSON object whose `field` is the server's version."""

    path: str
    field: str = "version"


@dataclass(frozen=True, eq=False)  # one instance per server type: compared (and hashed) by identity
class ServerProfile:
    """What the suite must know about one kind of server."""

    name: str
    title: str
    prefixes: tuple[str, ...]  # the /metrics samples kept (the others belong to the process, Python, HTTP ...)
    series: Mapping[str, str | None]  # canonical key -> the server's name; None: the server has no such series
    aliases: Mapping[str, str] = field(default_factory=dict)  # older server names -> current server names
    # finished_reason values that are a normal end in the success counter; None: the counter has no such label
    # and counts only requests that finished normally.
    success_reasons: tuple[str, ...] | None = ("stop", "length")
    aborted_counter: str | None = None  # with success_reasons None: a counter of aborted requests the success
    # counter includes, subtracted (kept under the server's own name)
    continuous_usage_stats: bool = False  # accepts stream_options.continuous_usage_stats (usage in every chunk)
    ignore_eos: bool = False  # accepts ignore_eos (exact output lengths)
    chat_template_kwargs: bool = False  # its chat endpoint passes chat_template_kwargs to the chat template
    tokenizer: TokenizerEndpoint | None = None
    version: VersionEndpoint | None = None
    metrics: bool = True  # serves Prometheus text at /metrics
    # usage.prompt_tokens_details.cached_tokens is left out when 0 (SGLang): missing then means none cached, in a run
    # where other answers carry it
    cached_tokens_zero_omitted: bool = False
    sources: tuple[str, ...] = ()  # where the names come from
    renames: Mapping[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        out = dict(self.aliases)
        for key, name in self.series.items():
            if name is None or name == CANONICAL[key]:
                continue
            if key in HISTOGRAMS:
                for suffix in HISTOGRAM_SUFFIXES:
                    out[name + suffix] = CANONICAL[key] + suffix
            else:
                out[name] = CANONICAL[key]
        for old, new in self.aliases.items():  # an old name of a renamed series lands on the canonical name
            out[old] = out.get(new, new)
        object.__setattr__(self, "renames", out)

    def has(self, key: str) -> bool:
        return self.series.get(key) is not None

    def server_name(self, key: str) -> str | None:
        """The server's own name of a canonical series, for messages."""
        return self.series.get(key)


def _profile(module) -> ServerProfile:
    """A profile from a server module's plain constants (the modules import nothing: no import cycle)."""
    unknown = set(module.SERIES) - set(CANONICAL)
    if unknown:
        raise KeyError(f"{module.__name__}: unknown canonical series {sorted(unknown)}")
    return ServerProfile(
        name=module.NAME,
        title=module.TITLE,
        prefixes=tuple(module.PREFIXES),
        series={key: module.SERIES.get(key) for key in CANONICAL},
        aliases=dict(getattr(module, "ALIASES", {})),
        success_reasons=module.SUCCESS_REASONS,
        aborted_counter=getattr(module, "ABORTED_COUNTER", None),
        continuous_usage_stats=module.CONTINUOUS_USAGE_STATS,
        ignore_eos=module.IGNORE_EOS,
        chat_template_kwargs=getattr(module, "CHAT_TEMPLATE_KWARGS", False),
        tokenizer=TokenizerEndpoint(**module.TOKENIZER) if module.TOKENIZER else None,
        version=VersionEndpoint(**module.VERSION) if module.VERSION else None,
        metrics=module.METRICS,
        cached_tokens_zero_omitted=getattr(module, "CACHED_TOKENS_ZERO_OMITTED", False),
        sources=tuple(module.SOURCES),
    )


PROFILES: dict[str, ServerProfile] = {p.name: p for p in map(_profile, (vllm, sglang, tgi, llamacpp, openai))}
SERVER_TYPES = ("auto", *PROFILES)  # --server-type's choices: detection, then every profile


def get(name: str | ServerProfile | None) -> ServerProfile:
    """The profile of a server type name (None: the default, vLLM)."""
    if isinstance(name, ServerProfile):
        return name
    if not name or name == "auto":
        return PROFILES[DEFAULT]
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(
            f"--server-type {name!r} is not a known server type; use one of {', '.join(SERVER_TYPES)}"
        ) from None


def of_options(options: object) -> ServerProfile:
    """The run's profile: the resolved one (options.server_profile), else --server-type, else the default."""
    resolved = getattr(options, "server_profile", "") or ""
    return get(resolved or getattr(options, "server_type", "") or DEFAULT)


def of_run(run: Mapping | None) -> ServerProfile:
    """The profile a run was made with, from its run.json (runs from before profiles: vLLM)."""
    entry = (run or {}).get("server_profile") or {}
    name = entry.get("name") if isinstance(entry, Mapping) else None
    return PROFILES.get(name or "", PROFILES[DEFAULT])


def detect(metric_names: Iterable[str] | None, version: object = None) -> tuple[ServerProfile, str]:
    """The server's profile from its /metrics sample names (the profile whose prefix most names carry) and its
    /version answer; returns (profile, how it was decided, one phrase)."""
    names = list(metric_names or ())
    counts = {p.name: sum(1 for n in names if n.startswith(p.prefixes)) for p in PROFILES.values() if p.prefixes}
    best = max(counts, key=counts.get, default=None)
    if best is not None and counts[best] > 0:
        prefix = PROFILES[best].prefixes[0]
        return PROFILES[best], f"detected from /metrics ({counts[best]} {prefix}* series)"
    # vLLM's /version answers {"version": "..."} and nothing else; SGLang, TGI, llama.cpp and hosted APIs serve no
    # /version (TGI's is /info, llama.cpp's /props, both with more fields).
    if isinstance(version, Mapping) and set(version) == {"version"} and isinstance(version["version"], str):
        return PROFILES["vllm"], f"detected from /version ({version['version']!r}, vLLM's answer shape)"
    # Nothing recognisable. vLLM serves /metrics and /version unconditionally, so a server with neither is not a
    # vLLM (or hides behind a proxy). Sending vLLM's extensions to a server that rejects unknown fields (OpenAI's
    # API does, with HTTP 400) fails every request; the generic profile works everywhere, at the cost of per-chunk
    # usage (tokens are counted from the final usage) and of --ignore-eos (refused: see the option's help).
    return PROFILES[FALLBACK], "fallback: neither /metrics names nor /version recognised"


def metric_names(samples: Iterable[tuple]) -> set[str]:
    """The distinct sample names of parsed samples."""
    return {s[0] for s in samples}


def tokenize_body(endpoint: TokenizerEndpoint, model: str, prompt: str | list[dict], special: bool = True) -> dict:
    """The JSON body that asks `endpoint` for the tokens of a prompt (or chat messages, where it can)."""
    if isinstance(prompt, list):
        if not endpoint.chat:
            raise ValueError(f"{endpoint.path} cannot count chat messages")
        return {"model": model, "messages": prompt}
    if endpoint.style == "vllm":
        return {"model": model, "prompt": prompt, "add_special_tokens": special}
    if endpoint.style == "tgi":
        return {"inputs": prompt, "add_special_tokens": special}
    if endpoint.style == "llamacpp":
        return {"content": prompt, "add_special": special}
    raise ValueError(f"unknown tokenizer style {endpoint.style!r}")


def token_count(endpoint: TokenizerEndpoint, answer: object) -> int:
    """The number of tokens in a tokenizer answer; raises ValueError, KeyError or TypeError on another shape."""
    if endpoint.style == "vllm":
        return int(answer["count"])  # type: ignore[index]
    if endpoint.style == "tgi":
        if not isinstance(answer, list):
            raise TypeError("not a token list")
        return len(answer)
    if endpoint.style == "llamacpp":
        tokens = answer["tokens"]  # type: ignore[index]
        if not isinstance(tokens, list):
            raise TypeError("not a token list")
        return len(tokens)
    raise ValueError(f"unknown tokenizer style {endpoint.style!r}")


def max_model_len(endpoint: TokenizerEndpoint, answer: object) -> int | None:
    """The context length a tokenizer answer states (vLLM's and SGLang's do), else None."""
    value = answer.get("max_model_len") if isinstance(answer, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def version_of(endpoint: VersionEndpoint, answer: object) -> str | None:
    """The version a version endpoint's JSON answer states, else None."""
    value = answer.get(endpoint.field) if isinstance(answer, Mapping) else None
    return str(value) if value is not None else None


def describe(profile: ServerProfile, how: str) -> str:
    """The one console line about the chosen profile."""
    sent = [x for x, on in (("continuous_usage_stats", profile.continuous_usage_stats),
                            ("ignore_eos", profile.ignore_eos)) if on]  # fmt: skip
    return (
        f"Server type: {profile.name} ({profile.title}), {how}; request extensions: "
        f"{', '.join(sent) if sent else 'none'}; tokenizer: {profile.tokenizer.path if profile.tokenizer else 'none'}"
        f"; metrics: {'/metrics' if profile.metrics else 'none'}"
    )


def run_entry(profile: ServerProfile, how: str, given: bool) -> dict:
    """run.json's `server_profile` entry."""
    return {
        "name": profile.name,
        "decided": "given" if given else "detected",
        "how": how,
        "continuous_usage_stats": profile.continuous_usage_stats,
        "ignore_eos": profile.ignore_eos,
        "tokenizer": profile.tokenizer.path if profile.tokenizer else None,
        "version_endpoint": profile.version.path if profile.version else None,
        "metrics": profile.metrics,
    }
