"""Every option of the suite in one typed object: the features' declaration classes (declare.py), each in its own
module, composed into `SuiteOptions`. The parser's arguments come from the same declarations (`add_arguments`), and
the code reads a run's options as `read(environment.parsed_options)`: built again at each start, since the web UI's
start form may change them. The parsed namespace has the same attributes (its parser is made from the same
declarations), so a function annotated with SuiteOptions may be handed either; no code reads an option with a
default of its own.

A new feature's options: a declaration class in its module, listed once in OPTION_CLASSES and as a base of
SuiteOptions (tests/test_settings.py checks that the two agree)."""

from __future__ import annotations

from dataclasses import dataclass

from . import declare
from .conversation import ConversationOptions
from .datasets import DatasetOptions
from .distributed import DistributedOptions
from .gate import GateOptions
from .images import ImageOptions
from .kinds.embeddings import EmbeddingsOptions
from .kinds.rerank import RerankOptions
from .lora import LoraOptions
from .output import OutputOptions
from .preflight import ServerOptions
from .request_options import RequestOptions
from .scraper import GpuOptions, ScrapeOptions
from .shape import AdaptiveOptions, CapacityOptions, LoadPlanOptions
from .trace_run import TraceOptions

# The option groups (each class's GROUP) in the order --help and docs/reference/options.md show them.
GROUP_ORDER = ("Load plan", "Workload", "Request", "Server", "SLO and capacity", "Output", "Distributed")

# In the order the parser lists them (within a group, --help and the reference keep this order).
OPTION_CLASSES = (
    RequestOptions, LoraOptions, EmbeddingsOptions, RerankOptions, ImageOptions, DatasetOptions, ConversationOptions,
    LoadPlanOptions, AdaptiveOptions, CapacityOptions, TraceOptions, ServerOptions, ScrapeOptions, GpuOptions,
    GateOptions, OutputOptions, DistributedOptions,
)  # fmt: skip


@dataclass(frozen=True)
class LocustOptions:
    """Locust's own options that shape a run (its parser declares them), read beside the suite's and kept in
    run.json. An allow-list, so that Locust's secrets (--web-auth) never land there."""

    host: str | None = None
    num_users: int | None = None
    spawn_rate: float = 1.0
    run_time: int | None = None
    stop_timeout: float = 0.0
    processes: int | None = None
    headless: bool = False
    master: bool = False
    worker: bool = False
    expect_workers: int = 1


@dataclass(frozen=True)
class ServerProfileState:
    """The server type this run uses, as preflight.resolve_server decided it (--server-type, or detected), kept on
    the parsed options so that workers receive it with the master's spawn message."""

    server_profile: str = ""
    server_profile_how: str = ""
    server_profile_key: tuple | None = None


# Bases in reverse: a dataclass's fields follow the reversed method resolution order.
@dataclass(frozen=True)
class SuiteOptions(
    ServerProfileState, LocustOptions, DistributedOptions, OutputOptions, GateOptions, GpuOptions, ScrapeOptions,
    ServerOptions, TraceOptions, CapacityOptions, AdaptiveOptions, LoadPlanOptions, ConversationOptions, DatasetOptions,
    ImageOptions, RerankOptions, EmbeddingsOptions, LoraOptions, RequestOptions,
):  # fmt: skip
    """A run's options, typed: every feature's, Locust's own that shape a run, and the server type decided."""


def read(namespace: object) -> SuiteOptions:
    """The typed options of Locust's parsed options (an option the namespace lacks takes its default)."""
    if isinstance(namespace, SuiteOptions):
        return namespace
    return declare.read(SuiteOptions, namespace)


def add_arguments(parser) -> None:
    """Listener for `init_command_line_parser`: every declared option, one `error:` line for a bad one."""
    parser.error = declare.one_line_error
    for cls in OPTION_CLASSES:
        declare.add_to(parser, cls)
    # Not options: set at the start; present from parsing on, so every parsed namespace has each attribute.
    parser.set_defaults(**{f.name: f.default for f in declare.dataclasses.fields(ServerProfileState)})


def saved_names() -> tuple[str, ...]:
    """run.json's options: Locust's that shape a run, then every declared option but the secrets."""
    names = [f.name for f in declare.dataclasses.fields(LocustOptions)]
    for cls in OPTION_CLASSES:
        names += [f.name for f in declare.declared(cls) if not f.metadata["secret"]]
    return tuple(names)
