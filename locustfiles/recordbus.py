"""The controller's one stream of finished requests (issue 33's record bus): a local runner's records (the
`llm_request` event) and every batch of JSON lines a worker ships (`llm_worker_records`), each parsed once and handed
to every subscriber as dicts. The live table (webui.LLMTab), the adaptive step length (tracker.adaptive) and the
capacity probes (tracker.capacity) subscribe; none parses a line itself.

A subscriber asks for the per-chunk lists only when it needs them (an ITL objective): without, each shipped line is
parsed without its lists (most of its bytes), once for all subscribers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..analysis.records import SCHEMA, RequestRecord, parse_lines
from .distributed import RECORDS_EVENT

_LISTS = ("chunk_offsets_s", "chunk_tokens")
_SCALARS = tuple(n for n in SCHEMA.names if n not in _LISTS)


@dataclass(frozen=True)
class Subscriber:
    callback: Callable[[list[dict]], None]  # the rows of one batch (read-only: shared by every subscriber)
    active: Callable[[], bool]  # whether it wants records now (nothing is parsed for a bus with none active)
    lists: Callable[[], bool]  # whether it needs the per-chunk lists


class RecordBus:
    """Subscribe with `subscribe(callback, active=..., lists=...)`; `register` wires it to an environment's events."""

    def __init__(self) -> None:
        self._subscribers: list[Subscriber] = []

    def subscribe(
        self,
        callback: Callable[[list[dict]], None],
        active: Callable[[], bool] = lambda: True,
        lists: Callable[[], bool] = lambda: False,
    ) -> None:
        self._subscribers.append(Subscriber(callback, active, lists))

    def _listening(self) -> tuple[list[Subscriber], bool]:
        listening = [s for s in self._subscribers if s.active()]
        return listening, any(s.lists() for s in listening)

    def on_record(self, record: RequestRecord, **_kw) -> None:
        """Listener of llm_request (a local runner): one record."""
        listening, lists = self._listening()
        if not listening:
            return
        row = {name: getattr(record, name) for name in (SCHEMA.names if lists else _SCALARS)}
        for s in listening:
            s.callback([row])

    def on_lines(self, lines: bytes, **_kw) -> None:
        """Listener of llm_worker_records (a master): a worker's batch of JSON lines, parsed once."""
        listening, lists = self._listening()
        if not listening:
            return
        rows = parse_lines(lines, lists)
        for s in listening:
            s.callback(rows)


def register(environment, ctx) -> None:
    """The controller's bus (`ctx.bus`), listening to both events, with the step tracker's two subscribers: the
    adaptive step length's view of the current step and the capacity search's running probe (its per-chunk lists
    only for an ITL objective). A worker ships its records and has none."""
    if not ctx.is_controller:
        return
    bus = ctx.bus = RecordBus()
    events = environment.events
    events.llm_request.add_listener(bus.on_record)
    getattr(events, RECORDS_EVENT).add_listener(bus.on_lines)
    adaptive, probe = ctx.tracker.adaptive, ctx.tracker.capacity
    bus.subscribe(adaptive.add_rows, active=lambda: adaptive.active)  # --step-duration auto
    bus.subscribe(probe.add_rows, active=lambda: probe.active, lists=lambda: probe.itl)  # --find-capacity
