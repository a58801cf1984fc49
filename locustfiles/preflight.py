"""The checks before any load, and the server questions they ask: the host answers, the API key is accepted, the
model is served, the server's type (--server-type auto: detected from /metrics and /version), the run directory can
be made, the dataset can be built; plus the server's version for the report.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import gevent
from geventhttpclient import HTTPClient
from geventhttpclient.url import URL

from ..analysis import servers
from . import options as opts_mod
from .datasets import Dataset, build_dataset

logger = logging.getLogger("vllm_loadtest")


class SetupError(Exception):
    """Bad input or an unusable server, found before load is sent."""


def list_models(host: str, timeout: float, api_key: str | None = None) -> list[str] | None:
    """The model ids of GET <host>/v1/models; None when the server has no such endpoint (404).

    Raises SetupError with a one-line fix when the host cannot be reached or refuses the API key."""
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
    except Exception as e:  # any failure here is reported as one line
        raise SetupError(
            f"cannot reach {host}/v1/models ({type(e).__name__}: {e}); check --host, or pass --model"
        ) from None
    if response.status_code in (401, 403):
        raise SetupError(
            f"{host} refused the API key (HTTP {response.status_code}); set --api-key or the --api-key-env variable"
        )
    if response.status_code == 404:
        return None
    if response.status_code != 200:
        raise SetupError(f"{host}/v1/models answered HTTP {response.status_code}; pass --model explicitly")
    try:
        return [str(m["id"]) for m in json.loads(body)["data"]]
    except (ValueError, KeyError, TypeError):
        raise SetupError(f"{host}/v1/models answered something that is not a model list; pass --model") from None


def discover_model(host: str, timeout: float, api_key: str | None = None) -> str:
    """The first model <host>/v1/models lists."""
    models = list_models(host, timeout, api_key)
    if not models:
        raise SetupError(f"{host}/v1/models lists no model; pass --model explicitly")
    return models[0]


def check_run_dir(path: Path) -> None:
    """The run directory can be created: its nearest existing ancestor is a writable directory."""
    ancestor = Path(path).absolute()
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
        raise SetupError(
            f"cannot create run directory {path}: {ancestor} is not a writable directory; pass a writable --run-dir"
        )


# Datasets built by preflight(), by dataset_key(): the process's users take them instead of building them again.
_PREFLIGHT_DATASETS: dict[tuple, Dataset] = {}


def dataset_key(options, host: str, model: str) -> tuple:
    """Everything a built --dataset depends on."""
    o = options
    return (
        host, model, o.dataset, o.endpoint, o.seed, o.num_prompts, o.prompt, getattr(o, "prompt_file", ""),
        getattr(o, "server_profile", ""),  # the tokenizer endpoint is the profile's
    )  # fmt: skip


def preflight(options) -> None:
    """Before any load (headless): the host answers, the API key is accepted, --model is a model it serves, and
    --dataset can be built against it (a prompt length the tokenizer cannot make, a file nothing of fits)."""
    models = list_models(options.host, options.read_timeout, opts_mod.api_key(options))
    if models is None:
        if not options.model:
            raise SetupError(f"{options.host} has no /v1/models to discover the model from; pass --model")
        logger.warning("%s has no /v1/models: --model %s is not checked", options.host, options.model)
    elif options.model and options.model not in models:
        served = ", ".join(models[:5]) + (" …" if len(models) > 5 else "")
        raise SetupError(f"--model {options.model!r} is not served by {options.host} (it serves: {served})")
    elif not options.model and not models:
        raise SetupError(f"{options.host}/v1/models lists no model; pass --model explicitly")
    model = options.model or models[0]
    resolve_server(options)  # before the dataset: the tokenizer endpoint is the profile's
    key = dataset_key(options, options.host, model)
    _PREFLIGHT_DATASETS[key] = build_dataset(options.dataset, options, options.host, model, opts_mod.api_key(options))


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
    url = getattr(options, "metrics_url", "") or ""
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


def detect_server(options, timeout: float | None = None) -> tuple[servers.ServerProfile, str]:
    """The network part of --server-type auto: the names at /metrics and the answer of /version (asked at once),
    judged by the pure servers.detect(). Timeout: a scrape's (1-5 s), since it delays the start of the run."""
    if timeout is None:
        timeout = max(1.0, min(5.0, float(getattr(options, "scrape_interval", 1.0) or 1.0) * 2))
    url = metrics_url(options)
    names = gevent.spawn(fetch_metric_names, url, timeout) if url else None
    version = _get_json(f"{options.host.rstrip('/')}/version", timeout) if options.host else None
    return servers.detect(names.get() if names is not None else None, version)


def resolve_server(options) -> servers.ServerProfile:
    """The run's server profile: --server-type, or detected (auto); set on the options (so workers receive it with
    their spawn message) and stated in one log line. Raises SetupError when --ignore-eos cannot be sent to it."""
    given = getattr(options, "server_type", "auto") or "auto"
    key = [given, options.host or "", metrics_url(options), bool(getattr(options, "ignore_eos", False))]
    if getattr(options, "server_profile", "") and getattr(options, "server_profile_key", None) == key:
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
    name = getattr(options, "server_profile", "")
    if not name:
        return None
    given = (getattr(options, "server_type", "auto") or "auto") != "auto"
    return servers.run_entry(servers.get(name), getattr(options, "server_profile_how", ""), given)


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
