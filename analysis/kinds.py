"""The request kinds (--endpoint), declared once: where each is sent, whether it streams, what one request carries.

The load side finds each kind's requester by its name (locustfiles/kinds/: one module per kind, as vLLM's
`ASYNC_REQUEST_FUNCS`); the analysis reads what applies from the declaration (a kind that does not stream has no
TTFT, TPOT nor ITL; a batch kind's throughput is its items per second), never from the kind's name. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RequestKind:
    name: str  # --endpoint's value, and the records' `endpoint`
    path: str  # appended to --host's path
    streams: bool  # an SSE stream of tokens (TTFT, TPOT, ITL, output tokens apply)
    chat: bool = False  # the body carries chat messages (images, tools, chat template fields apply)
    items: str | None = None  # a batch kind: the records' field counting what one request carries
    item_rate: str | None = None  # and steps.csv's column of those per second
    title: str = ""  # the console's table of a batch kind's steps
    # The options only this kind takes: (attribute, flag, default); given elsewhere, they are refused.
    own_options: tuple[tuple[str, str, object], ...] = ()
    # Their smallest values: (attribute, flag, minimum, what it counts).
    minimums: tuple[tuple[str, str, int, str], ...] = ()
    path_option: str | None = None  # the option that may name another path of the same API (its value, if any)

    @property
    def batch(self) -> bool:
        return self.items is not None


COMPLETIONS = RequestKind("completions", "/v1/completions", streams=True)
CHAT = RequestKind("chat", "/v1/chat/completions", streams=True, chat=True)
EMBEDDINGS = RequestKind(
    "embeddings", "/v1/embeddings", streams=False, items="inputs", item_rate="inputs_per_s", title="Embeddings",
    own_options=(("batch_size", "--batch-size", 1), ("encoding_format", "--encoding-format", "float")),
    minimums=(("batch_size", "--batch-size", 1, "inputs per request"),),
)  # fmt: skip

RERANK = RequestKind(
    "rerank", "/v1/rerank", streams=False, items="documents", item_rate="documents_per_s", title="Rerank",
    own_options=(
        ("documents_per_request", "--documents", 8), ("top_n", "--top-n", 0), ("rerank_path", "--rerank-path", ""),
    ),
    minimums=(("documents_per_request", "--documents", 1, "documents per request"),
              ("top_n", "--top-n", 0, "results asked per request, 0 for all")),
    path_option="rerank_path",
)  # fmt: skip

KINDS: dict[str, RequestKind] = {k.name: k for k in (COMPLETIONS, CHAT, EMBEDDINGS, RERANK)}
DEFAULT = COMPLETIONS.name
BATCH_KINDS = tuple(k for k in KINDS.values() if k.batch)


def of(name: str | None) -> RequestKind:
    """The kind of --endpoint `name` (the default's when none is given: records of runs before the option)."""
    return KINDS.get(str(name or DEFAULT), COMPLETIONS)


def by_item_rate(column: str) -> RequestKind | None:
    """The batch kind whose items/s `column` is (None: not a batch kind's column)."""
    return next((k for k in BATCH_KINDS if k.item_rate == column), None)


def paths() -> dict[str, str]:
    return {k.name: k.path for k in KINDS.values()}


def path_of(kind: RequestKind, options) -> str:
    """The path a run's requests of `kind` go to: its path option's value when given, else its own path."""
    chosen = str(getattr(options, kind.path_option, "") or "") if kind.path_option else ""
    return chosen or kind.path
