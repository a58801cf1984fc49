"""--lora-mix: each request asks for a model drawn by weight from a mix (the base model and LoRA adapters, by their
served names), so one run measures several adapters side by side (issue 35).

    --lora-mix base-model:1,sql-adapter:1,chat-adapter:2    weights, normalised
    --lora-mix auto                                          the base model and every adapter /v1/models lists under it

Each user draws with its own random.Random, seeded by its seed (`--seed`, its process and its order of start: the
same layout draws the same models) and "lora"; a request's record says the model drawn (`model`). The analysis reads
the mix from run.json's `lora_mix` (analysis/lora.py: models.csv, the per-model rows).
"""

from __future__ import annotations

import bisect
import itertools
import logging
import math
import random
from dataclasses import dataclass
from typing import ClassVar

from gevent.event import AsyncResult

from . import options as opts_mod
from .declare import option
from .preflight import SetupError, model_entries

logger = logging.getLogger("vllm_loadtest")

AUTO = "auto"
_FORMAT = "NAME:WEIGHT,... (e.g. base-model:1,sql-adapter:1,chat-adapter:2) or auto"
_START_LORA = (
    "start vLLM with --enable-lora --lora-modules NAME=PATH ... (each adapter is then listed with parent = the base "
    "model), or name the models: --lora-mix NAME:WEIGHT,..."
)


@dataclass(frozen=True)
class LoraOptions:
    """Which model each request asks for."""

    GROUP: ClassVar[str] = "Request"

    lora_mix: str = option(
        "--lora-mix",
        "",
        "Each request's model drawn by weight from a mix of served names, the base model by its name too: "
        "NAME:WEIGHT,... (weights positive, normalised), or auto: the base model (--model) and every adapter "
        "/v1/models lists with it as parent, equal weights. Drawn per user with --seed; per-model rows in "
        "models.csv. Default: every request asks for --model",
    )


@dataclass(frozen=True)
class Mix:
    """The models of a mix and their normalised weights, in the order given."""

    names: tuple[str, ...]
    weights: tuple[float, ...]
    how: str = "given"  # given (--lora-mix NAME:WEIGHT,...) or auto (from /v1/models)

    def __post_init__(self) -> None:
        cumulative = list(itertools.accumulate(self.weights))
        object.__setattr__(self, "_cumulative", cumulative)

    def draw(self, rng: random.Random) -> str:
        """One model, drawn by weight: the first whose cumulative weight exceeds a uniform draw in [0, 1)."""
        u = rng.random() * self._cumulative[-1]  # the last sum is 1 up to rounding
        return self.names[min(bisect.bisect_right(self._cumulative, u), len(self.names) - 1)]

    def info(self, spec: str) -> dict:
        """run.json's `lora_mix`: the option, how the models were decided, each model's weight."""
        models = [{"name": n, "weight": w} for n, w in zip(self.names, self.weights)]
        return {"spec": spec, "how": self.how, "models": models}


def normalised(pairs: list[tuple[str, float]], how: str = "given") -> Mix:
    total = sum(w for _, w in pairs)
    return Mix(tuple(n for n, _ in pairs), tuple(w / total for _, w in pairs), how)


def parse_mix(text: str) -> list[tuple[str, float]] | None:
    """--lora-mix's value: [(name, weight), ...] as given, or None for auto (and for an empty value: no mix).
    Raises ValueError with a one-line fix."""
    text = (text or "").strip()
    if not text or text.lower() == AUTO:
        return None
    out: list[tuple[str, float]] = []
    for part in text.split(","):
        name, colon, weight = part.strip().rpartition(":")  # a served name may hold a colon: the weight is last
        name = name.strip()
        if not colon or not name:
            raise ValueError(f"--lora-mix {text!r}: {part.strip()!r} is not NAME:WEIGHT; write {_FORMAT}")
        try:
            value = float(weight)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise ValueError(
                f"--lora-mix {text!r}: the weight of {name!r} must be a positive number, not {weight.strip()!r}"
            )
        if name in (n for n, _ in out):
            raise ValueError(f"--lora-mix {text!r}: {name!r} is named twice; give each model once with its weight")
        out.append((name, value))
    return out


def check(options) -> None:
    """What can be checked without a server: the value's form, and a load plan that can carry a mix."""
    text = (options.lora_mix or "").strip()
    if not text:
        return
    parse_mix(text)
    if options.trace:
        raise ValueError("--lora-mix does not apply to a trace replay (--trace): its rows' bodies are built ahead")


def adapters_of(entries: list[dict], base: str) -> list[str]:
    """The ids /v1/models lists with `parent` = the base model (vLLM lists a LoRA adapter so: root = its path)."""
    return [str(e["id"]) for e in entries if e.get("parent") == base and str(e.get("id")) != base]


def resolve(options, host: str, base: str, entries: list[dict] | None) -> Mix | None:
    """The run's mix: None without --lora-mix; auto: the base model and its adapters from /v1/models' entries
    (`entries`; None: the server has no /v1/models), equal weights; given: each name checked against the entries when
    there are any. Raises SetupError with a one-line fix."""
    text = (options.lora_mix or "").strip()
    if not text:
        return None
    try:
        pairs = parse_mix(text)
    except ValueError as e:
        raise SetupError(str(e)) from None
    if pairs is None:  # auto
        if entries is None:
            raise SetupError(f"--lora-mix auto: {host} has no /v1/models to list its adapters; {_START_LORA}")
        adapters = adapters_of(entries, base)
        if not adapters:
            raise SetupError(f"--lora-mix auto: {host}/v1/models lists no adapter under the base model {base!r}; "
                             f"{_START_LORA}")  # fmt: skip
        return normalised([(name, 1.0) for name in (base, *adapters)], AUTO)
    if entries is not None:
        served = [str(e.get("id")) for e in entries]
        unknown = [n for n, _ in pairs if n not in served]
        if unknown:
            names = ", ".join(repr(n) for n in unknown)
            raise SetupError(f"--lora-mix: {names} not served by {host} (it serves: {', '.join(served)}); name the "
                             f"served models, or {_START_LORA.split(', or ')[0]}")  # fmt: skip
    return normalised(pairs)


def preflight(options) -> Mix | None:
    """Before any load (headless): the mix resolved against the server's /v1/models; logged in one line."""
    if not (options.lora_mix or "").strip():
        return None
    entries = model_entries(options.host, options.read_timeout, opts_mod.api_key(options))
    base = options.model or (str(entries[0]["id"]) if entries else "")
    mix = resolve(options, options.host, base, entries)
    logger.info("LoRA mix: %s", ", ".join(f"{n} {w:.0%}" for n, w in zip(mix.names, mix.weights)))
    return mix


class Mixes:
    """This process's mixes, resolved once per (option, host, base model): what `register` returns (ctx.features
    ["lora"]); the users ask it for theirs."""

    def __init__(self, environment) -> None:
        self.environment = environment
        self._mixes: dict[tuple, AsyncResult] = {}
        self.last: dict | None = None  # run.json's lora_mix: the last mix resolved in this process

    def mix(self, options, host: str, base: str) -> Mix | None:
        """The mix of these options, or None without --lora-mix; raises SetupError."""
        text = (options.lora_mix or "").strip()
        if not text:
            return None
        key = (text, host, base)
        if key not in self._mixes:
            result = AsyncResult()
            self._mixes[key] = result
            try:
                needs_list = parse_mix(text) is None
                key_ = opts_mod.api_key(options)
                entries = model_entries(host, options.read_timeout, key_) if needs_list else None
                result.set(resolve(options, host, base, entries))
            except (SetupError, ValueError) as e:
                result.set_exception(SetupError(str(e)))
        mix = self._mixes[key].get()
        self.last = mix.info(text)
        return mix

    def for_user(self, user, opts) -> tuple[Mix, random.Random] | None:
        """A user's mix and its own generator of draws, or None without --lora-mix; a mix that cannot be resolved
        stops the run as bad input (exit code 3, as the model's lookup). After the user's seed is set."""
        try:
            mix = self.mix(opts, user.host, user.model)
        except SetupError as e:
            raise user.shared._setup_error(e) from None
        return None if mix is None else (mix, user_rng(user._seed))


def user_rng(seed: str) -> random.Random:
    """A user's draws of models: its own stream, apart from its prompts' (seeded by its seed and "lora")."""
    return random.Random(f"{seed}:lora")


def register(environment, ctx) -> Mixes:
    mixes = Mixes(environment)
    ctx.sections["lora_mix"] = lambda: mixes.last

    def started(options, **_kw) -> None:
        # The controller resolves it too (a master runs no user): run.json says the mix the run drew from.
        if not ctx.is_controller or not (options.lora_mix or "").strip() or not options.host:
            return
        try:
            mixes.mix(options, options.host, options.model or ctx.resources.model(options.host))
        except Exception as e:  # a SetupError, or the model lookup's StopTest: the users say it again and stop
            logger.error("%s", e)

    ctx.run_events.started.add_listener(started)
    return mixes
