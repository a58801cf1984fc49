"""The checks before any load, and the server questions they ask: the host answers, the API key is accepted, the
model is served, the server's type (--server-type auto: detected from /metrics and /version), the run directory can
be made, the dataset can be built; plus the server's version for the report.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import gevent
from geventhttpclient import HTTPClient
from geventhttpclient.url import URL

from ..analysis import error_body, kinds, servers
from ..analysis.diskio import remove_quietly
from ..analysis.prometheus_text import scrape_timeout_s
from . import options as opts_mod
from . import request_options, trace_run
from .datasets import Dataset, build_dataset
from .declare import option

logger = logging.getLogger("vllm_loadtest")


@dataclass(frozen=True)
class ServerOptions:
    """Who the server is and how to reach it."""

    GROUP: ClassVar[str] = "Server"

    api_key: str = option(
        "--api-key",
        "",
        "API key sent as a Bearer token (masked in the web UI, never saved). Default: the --api-key-env variable",
        secret=True,
    )
    api_key_env: str = option(
        "--api-key-env",
        "OPENAI_API_KEY",
        "Name of the environment variable holding the API key (sent as a Bearer token)",
    )
    server_type: str = option(
        "--server-type",
        "auto",
        "The server's kind, for its metric names, request extensions, /tokenize and version endpoint: vllm, "
        "sglang, tgi, llamacpp, or openai (any OpenAI-compatible API: no vendor fields, no /metrics). Default"
        " auto: detected from /metrics and /version before any load; openai when neither is recognised",
        choices=list(servers.SERVER_TYPES),
    )


class SetupError(Exception):
    """Bad input or an unusable server, found before load is sent."""


class RunDirError(SetupError):
    """The run directory cannot be created or written: what was tried (`doing`: create, write in) and why."""

    def __init__(self, path: Path, doing: str, why: str) -> None:
        super().__init__(f"cannot {doing} run directory {path} ({why}); pass a writable --run-dir")
        self.path, self.doing, self.why = Path(path), doing, why


def list_models(host: str, timeout: float, api_key: str | None = None) -> list[str] | None:
    """The model ids of GET <host>/v1/models; None when the server has no such endpoint (404).

    Raises SetupError with a one-line fix when the host cannot be reached or refuses the API key."""
    entries = model_entries(host, timeout, api_key)
    return None if entries is None else [str(m["id"]) for m in entries]


def model_entries(host: str, timeout: float, api_key: str | None = None) -> list[dict] | None:
    """The entries of GET <host>/v1/models (each with its id; vLLM's LoRA adapters with `parent` = the base model);
    None when the server has no such endpoint (404). Raises SetupError as list_models."""
    base = URL(host)
    headers = {"Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    try:
        client = HTTPClient.from_url(base, connection_timeout=min(10.0, timeout), network_timeout=min(30.0, timeout))
        try:
            response = client.get(base.path.rstrip("/") + "/v1/models", headers=headers)
            body = response.read()
        finally:
            client.close()
    except ConnectionRefusedError:
        raise SetupError(
            f"nothing is listening at {host} (connection refused); start the server, or fix --host"
        ) from None
    except Exception as e:  # any failure here is reported as one line
        raise SetupError(f"cannot reach {host}/v1/models ({type(e).__name__}: {e}); check --host") from None
    if response.status_code in (401, 403):
        raise SetupError(
            f"{host} refused the API key (HTTP {response.status_code}); set --api-key or the --api-key-env variable"
        )
    if response.status_code == 404:
        return None
    if response.status_code != 200:
        raise SetupError(f"{host}/v1/models answered HTTP {response.status_code}; pass --model explicitly")
    try:
        entries = json.loads(body)["data"]
        if not all(isinstance(m, dict) and "id" in m for m in entries):
            raise TypeError("an entry without an id")
        return entries
    except (ValueError, KeyError, TypeError):
        raise SetupError(f"{host}/v1/models answered something that is not a model list; pass --model") from None


def discover_model(host: str, timeout: float, api_key: str | None = None) -> str:
    """The first model <host>/v1/models lists."""
    models = list_models(host, timeout, api_key)
    if not models:
        raise SetupError(f"{host}/v1/models lists no model; pass --model explicitly")
    return models[0]


PROBE_PREFIX = ".write-probe-"  # the probe file check_run_dir writes and removes (no reader globs it)


def check_run_dir(path: Path) -> list[Path]:
    """The run directory can be made and written: it is created (with its missing parents), and a probe file is
    written into it and removed, the only reliable test (asking whether the nearest existing parent is writable
    said yes for /proc/nope/run, whose mkdir then failed at the start of the load). Returns the folders it created,
    outermost first (remove_created removes them when the run does not start); raises RunDirError (a SetupError)
    with a one-line fix."""
    path = Path(path)
    missing, ancestor = [], path.absolute()
    while not ancestor.exists() and ancestor != ancestor.parent:
        missing.append(ancestor)
        ancestor = ancestor.parent
    created = list(reversed(missing))
    doing, probe = "create", path / f"{PROBE_PREFIX}{os.getpid()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        doing = "write in"
        with open(probe, "wb", buffering=0) as f:
            f.write(b"probe\n")
        probe.unlink()
    except OSError as e:
        remove_quietly(probe)
        remove_created(created)
        where = f"{e.filename}: " if e.filename and Path(e.filename) != path else ""
        raise RunDirError(path, doing, f"{where}{e.strerror or e}") from None
    return created


def remove_created(folders: list[Path]) -> None:
    """Remove the folders check_run_dir created, innermost first, where they are still empty (a run that never
    started leaves none behind)."""
    for folder in reversed(folders):
        try:
            folder.rmdir()
        except OSError:
            return  # not empty (or gone): it and its parents stay


@dataclass
class Built:
    """What the headless preflight built before any load, handed to the process's RunContext (plugin.register): its
    users take the dataset and the trace's replay (by dataset_key, trace_run.replay_key) instead of building them
    again, and the scraper does not warn again about the GPU exporters the preflight found silent."""

    datasets: dict[tuple, Dataset] = field(default_factory=dict)
    replays: dict[tuple, object] = field(default_factory=dict)  # trace_run.Replay
    gpu_unanswered: frozenset[str] = frozenset()
    traces: trace_run.Traces = field(default_factory=trace_run.Traces)  # --trace, read once per process


def dataset_key(options, host: str, model: str) -> tuple:
    """Everything a built --dataset depends on."""
    o = options
    return (
        host, model, o.dataset, o.endpoint, o.seed, o.num_prompts, o.prompt, o.prompt_file,
        o.server_profile,  # the tokenizer endpoint is the profile's
        o.turns,  # conversations: sharegpt builds whole conversations, synthetic frames turn 1
        request_options.tokenize_key(o),  # chat prompts are counted with the tools and template arguments
    )  # fmt: skip


def preflight(options, built: Built | None = None) -> Built:
    """Before any load (headless): the host answers, the API key is accepted, --model is a model it serves, and
    --dataset can be built against it (a prompt length the tokenizer cannot make, a file nothing of fits)."""
    models = list_models(options.host, options.read_timeout, opts_mod.api_key(options))
    if models is None:
        if not options.model:
            raise SetupError(
                f"{options.host}/v1/models answered HTTP 404: not an OpenAI-compatible API at this URL? Check --host "
                "(the server's base URL, without /v1), or pass --model for a server that does not list its models"
            )
        logger.warning("%s has no /v1/models: --model %s is not checked", options.host, options.model)
        if kinds.of(options.endpoint).streams:
            check_openai_api(options, options.model)
    elif options.model and options.model not in models:
        served = ", ".join(models[:5]) + (" …" if len(models) > 5 else "")
        raise SetupError(f"--model {options.model!r} is not served by {options.host} (it serves: {served})")
    elif not options.model and not models:
        raise SetupError(f"{options.host}/v1/models lists no model; pass --model explicitly")
    model = options.model or models[0]
    resolve_server(options)  # before the dataset: the tokenizer endpoint is the profile's
    if not kinds.of(options.endpoint).streams:
        check_fetched_kind(options, model)
    built = built or Built()
    built.gpu_unanswered = check_gpu_endpoints(options)
    key = dataset_key(options, options.host, model)
    built.datasets[key] = build_dataset(options.dataset, options, options.host, model, opts_mod.api_key(options))
    if trace_run.active(options):
        # The trace reads and its prompts can be built (a master sends none: it only reads the trace).
        try:
            key = opts_mod.api_key(options)
            replay = trace_run.preflight(options, options.host, model, key, options.master, built.traces)
        except ValueError as e:
            raise SetupError(str(e)) from None
        if replay is not None:
            built.replays[trace_run.replay_key(options, options.host, model)] = replay
    return built


def check_openai_api(options, model: str) -> None:
    """A server without /v1/models: one request of one token (not streamed) must answer as an OpenAI-compatible API
    does, else every request of the run would fail the same way (a web server, a wrong path: 404, 405, 501, HTML)."""
    kind = kinds.of(options.endpoint)
    base = URL(options.host)
    url = f"{options.host.rstrip('/')}{kinds.path_of(kind, options)}"
    prompt = {"messages": [{"role": "user", "content": "hello"}]} if kind.chat else {"prompt": "hello"}
    headers = {"Content-Type": "application/json", "Accept": "application/json", "Accept-Encoding": "identity"}
    key = opts_mod.api_key(options)
    if key:
        headers["Authorization"] = f"Bearer {key}"
    timeout = min(60.0, float(options.read_timeout))
    try:
        client = HTTPClient.from_url(base, connection_timeout=min(10.0, timeout), network_timeout=timeout)
        try:
            body = json.dumps({"model": model, **prompt, "max_tokens": 1})
            response = client.post(base.path.rstrip("/") + kinds.path_of(kind, options), body=body, headers=headers)
            answer = response.read()
        finally:
            client.close()
    except Exception as e:  # any failure here is reported as one line
        raise SetupError(f"{url} did not answer ({type(e).__name__}: {e}); check --host") from None
    try:
        answered = response.status_code == 200 and "choices" in json.loads(answer)
    except (ValueError, TypeError):
        answered = False
    if not answered and (response.status_code in (200, 404, 405, 501) or answer.lstrip()[:1] == b"<"):
        what = "an HTML page" if answer.lstrip()[:1] == b"<" else error_body.message_from_body(answer)
        raise SetupError(
            f"{url} answered HTTP {response.status_code} ({what}): not an OpenAI-compatible API; check --host (the "
            "server's base URL, without /v1) and --endpoint"
        )


def check_fetched_kind(options, model: str) -> None:
    """A kind that does not stream (e.g. embeddings): one small request must answer 200 and keep the kind's
    contract. A server whose model does not serve the kind has no such endpoint (vLLM 0.32 adds the embeddings route
    only for a model with the embed task: 404 for a generation model); without this check every request of the run
    would fail the same way."""
    from .kinds import requester

    kind = kinds.of(options.endpoint)
    cls = requester(kind.name)
    host = options.host.rstrip("/")
    base = URL(options.host)
    path = base.path.rstrip("/") + kinds.path_of(kind, options)
    url = f"{host}{kinds.path_of(kind, options)}"
    headers = {"Content-Type": "application/json", "Accept": "application/json", "Accept-Encoding": "identity"}
    key = opts_mod.api_key(options)
    if key:
        headers["Authorization"] = f"Bearer {key}"
    payload, check = cls.probe(options, model)  # the run's own fields too: a server refusing them refuses every one
    timeout = min(60.0, float(options.read_timeout))
    try:
        client = HTTPClient.from_url(base, connection_timeout=min(10.0, timeout), network_timeout=timeout)
        try:
            response = client.post(path, body=json.dumps(payload), headers=headers)
            body = response.read()
        finally:
            client.close()
    except Exception as e:  # any failure here is reported as one line
        raise SetupError(
            f"--endpoint {kind.name}: {url} did not answer ({type(e).__name__}: {e}); check --host"
        ) from None
    if response.status_code != 200:
        others = " or ".join(k for k in kinds.KINDS if kinds.KINDS[k].streams)
        raise SetupError(
            f"--endpoint {kind.name}: {url} answered HTTP {response.status_code} for model {model!r} "
            f"({error_body.message_from_body(body)}); {cls.serve_hint} or use --endpoint {others}"
        )
    breach = check(body)
    if breach is not None:
        raise SetupError(
            f"--endpoint {kind.name}: {url} answered a body that is not {cls.answer_noun} ({breach}); point --host at "
            f"an OpenAI-compatible {kind.name} server"
        )


def _get(url: str, timeout: float, accept: str = "application/json") -> tuple[int, bytes]:
    """GET an absolute URL: (status, body); raises on transport errors."""
    target = URL(url)
    client = HTTPClient.from_url(target, connection_timeout=timeout, network_timeout=timeout)
    try:
        response = client.get(target.request_uri or "/", headers={"Accept": accept})
        return response.status_code, response.read()
    finally:
        client.close()


def _get_json(url: str, timeout: float) -> object:
    """The JSON answer of GET url; None for anything but a 200 with JSON (optional metadata, never an error)."""
    try:
        status, body = _get(url, timeout)
        return json.loads(body) if status == 200 else None
    except Exception as e:  # optional metadata: the run goes on without it, but say why
        logger.debug("no JSON from %s: %s: %s", url, type(e).__name__, e)
        return None


def metrics_url(options) -> str:
    """--metrics-url, else <host>/metrics; '' when off or without a host."""
    url = options.metrics_url or ""
    if url == "off":
        return ""
    return url or (f"{(options.host or '').rstrip('/')}/metrics" if options.host else "")


def fetch_metric_names(url: str, timeout: float = 5.0) -> set[str] | None:
    """The sample names of a Prometheus endpoint's answer; None when it gives none (no answer, not Prometheus)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        status, body = _get(url, timeout, accept="text/plain")
        if status != 200:
            return None
        text = body.decode("utf-8", errors="replace")
        return {s.name for family in text_string_to_metric_families(text) for s in family.samples} or None
    except Exception as e:  # not Prometheus text, or no answer: detection goes on without it
        logger.debug("no metric names from %s: %s: %s", url, type(e).__name__, e)
        return None


def check_gpu_endpoints(options, timeout: float | None = None) -> frozenset[str]:
    """Each --gpu-metrics-url answers with DCGM_ series; one warning per exporter that does not, and the run goes on
    (GPU telemetry is optional: its columns stay empty while it is missing). Asked at once, a scrape's timeout.
    Returns the exporters warned about: the scraper does not warn about them again (one warning per exporter)."""
    urls = opts_mod.gpu_metrics_urls(options)
    if not urls:
        return frozenset()
    if timeout is None:
        timeout = scrape_timeout_s(options.scrape_interval or 1.0)
    asked = {url: gevent.spawn(_gpu_answer, url, timeout) for url in urls}
    unanswered = set()
    for url, job in asked.items():
        problem = job.get()
        if problem is not None:
            unanswered.add(url)
            logger.warning("%s; the run goes on, without its GPU samples (check --gpu-metrics-url)", problem)
    return frozenset(unanswered)


def _gpu_answer(url: str, timeout: float) -> str | None:
    """None when url serves DCGM_ series, else what is wrong, as a sentence."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        status, body = _get(url, timeout, accept="text/plain")
    except Exception as e:  # no answer: said, and the run goes on
        return f"the GPU metrics at {url} do not answer ({type(e).__name__}: {e})"
    if status != 200:
        return f"the GPU metrics at {url} answer HTTP {status}"
    try:
        text = body.decode("utf-8", errors="replace")
        names = {s.name for family in text_string_to_metric_families(text) for s in family.samples}
    except Exception:  # not Prometheus text
        names = set()
    if not any(name.startswith("DCGM_") for name in names):
        return f"{url} serves no DCGM_ series (is it a dcgm-exporter?)"
    return None


def detect_server(options, timeout: float | None = None) -> tuple[servers.ServerProfile, str]:
    """The network part of --server-type auto: the names at /metrics and the answer of /version (asked at once),
    judged by the pure servers.detect(). Timeout: a scrape's (1-5 s), since it delays the start of the run."""
    if timeout is None:
        timeout = max(1.0, min(5.0, float(options.scrape_interval or 1.0) * 2))
    url = metrics_url(options)
    names = gevent.spawn(fetch_metric_names, url, timeout) if url else None
    version = _get_json(f"{options.host.rstrip('/')}/version", timeout) if options.host else None
    return servers.detect(names.get() if names is not None else None, version)


def resolve_server(options) -> servers.ServerProfile:
    """The run's server profile: --server-type, or detected (auto); set on the options (so workers receive it with
    their spawn message) and stated in one log line. Raises SetupError when --ignore-eos or --chat-template-kwargs
    cannot be sent to it."""
    given = options.server_type or "auto"
    key = [
        given, options.host or "", metrics_url(options), bool(options.ignore_eos),
        bool(str(options.chat_template_kwargs or "").strip()),  # refused for some profiles
    ]  # fmt: skip
    if options.server_profile and options.server_profile_key == key:
        return servers.get(options.server_profile)  # decided already for these options (preflight, then start)
    if given == "auto":
        profile, how = detect_server(options)
    else:
        profile, how = servers.get(given), f"given (--server-type {given})"
    try:
        opts_mod.check_server_type(options, profile.name)
    except ValueError as e:
        raise SetupError(str(e)) from None
    options.server_profile = profile.name
    options.server_profile_how = how
    options.server_profile_key = key
    logger.info(servers.describe(profile, how))
    return profile


def server_profile_entry(options) -> dict | None:
    """run.json's `server_profile`: the profile and how it was decided; None before it is."""
    name = options.server_profile
    if not name:
        return None
    given = (options.server_type or "auto") != "auto"
    return servers.run_entry(servers.get(name), options.server_profile_how, given)


def fetch_server_version(
    host: str, timeout: float = 5.0, profile: servers.ServerProfile | str | None = None
) -> str | None:
    """The server's version from its profile's version endpoint (vLLM's GET /version {"version": ...} by
    default); None when the server does not say, or has no such endpoint."""
    endpoint = servers.get(profile).version
    if endpoint is None:
        return None
    answer = _get_json(f"{host.rstrip('/')}{endpoint.path}", timeout)
    return servers.version_of(endpoint, answer)
