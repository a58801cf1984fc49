"""How a feature declares its options: a frozen dataclass whose fields are the options, each with its flag, default
and help (`option`). One declaration gives the Locust argument (its `LOCUST_*` variable, its web UI field and
config-file key come with it), the typed attribute the code reads, and the row of docs/reference/options.md.

    @dataclass(frozen=True)
    class TraceOptions:
        trace: str = option("--trace", "", "Replay a trace file ...")

The field's annotation is the type: bool is a switch (store_true), int and float are parsed as such, `list[str] |
None` may be repeated (append), anything else is text."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

GROUP = "group"  # the metadata key of a field's group title (the class's GROUP, for --help and the reference)


def option(flag: str, default: Any, help: str, *, choices: list | tuple | None = None, secret: bool = False) -> Any:
    """One option: its flag (--name), default and help; `secret`: a password field, never saved in run.json."""
    meta = {"flag": flag, "help": help, "choices": None if choices is None else list(choices), "secret": secret}
    return dataclasses.field(default=default, metadata=meta)


def env_var(flag: str) -> str:
    """--trace-speed -> LOCUST_TRACE_SPEED (Locust's own convention)."""
    return "LOCUST_" + flag.lstrip("-").upper().replace("-", "_")


def declared(cls: type) -> list[dataclasses.Field]:
    """The option fields of a declaration class (inherited ones included), in declaration order."""
    return [f for f in dataclasses.fields(cls) if "flag" in f.metadata]


def _kind(annotation: object) -> dict:
    text = str(annotation).replace(" ", "")
    if text == "bool":
        return {"action": "store_true"}
    if text in ("int", "int|None"):
        return {"type": int}
    if text in ("float", "float|None"):
        return {"type": float}
    if text.startswith("list["):
        return {"action": "append"}
    return {}


def add_to(parser, cls: type) -> None:
    """Add a declaration class's options to a (Locust) argument parser, in their declaration order. With the
    parser's own add_argument, not an argument group: only it marks the options for the web UI's form."""
    for f in declared(cls):
        meta = f.metadata
        flag = meta["flag"]
        kwargs: dict[str, Any] = {"default": f.default, "help": meta["help"], **_kind(f.type)}
        if flag.lstrip("-").replace("-", "_") != f.name:
            kwargs["dest"] = f.name
        if meta["choices"] is not None:
            kwargs["choices"] = meta["choices"]
        if meta["secret"]:
            kwargs["is_secret"] = True
        parser.add_argument(flag, env_var=env_var(flag), **kwargs)


def read(cls: type, namespace: object) -> Any:
    """The typed options of `cls` from a parsed namespace (Locust's parsed_options, as the web UI's start form may
    have changed it); an option the namespace lacks (a parser without the suite's arguments) takes its default."""
    values = {f.name: getattr(namespace, f.name, f.default) for f in dataclasses.fields(cls)}
    return cls(**values)


def one_line_error(message: str) -> None:
    """argparse's error(), as one line and the bad-input exit code (argparse prints its usage and exits 2)."""
    sys.stderr.write(f"error: {message}; see --help\n")
    sys.exit(3)
