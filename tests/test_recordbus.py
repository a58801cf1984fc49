"""The controller's record bus (locustfiles/recordbus.py): a local record or a worker's shipped batch is parsed once and
handed to every active subscriber; an inactive one gets nothing, the per-chunk lists come only when one asks, and a
line that is not a record reaches nobody."""

from __future__ import annotations

import orjson
import pytest
from vllm_loadtest.analysis.live import LiveRecords
from vllm_loadtest.analysis.records import serialize
from vllm_loadtest.locustfiles import recordbus
from vllm_loadtest.locustfiles.recordbus import RecordBus

from tests.test_intake import record

pytestmark = pytest.mark.unit


class Seen:
    def __init__(self) -> None:
        self.batches: list[list[dict]] = []

    def __call__(self, rows: list[dict]) -> None:
        self.batches.append(rows)


def test_a_shipped_batch_is_parsed_once_for_every_active_subscriber(monkeypatch):
    parses = []
    real = recordbus.parse_lines
    monkeypatch.setattr(recordbus, "parse_lines", lambda *a: parses.append(a) or real(*a))
    bus, a, b, idle = RecordBus(), Seen(), Seen(), Seen()
    bus.subscribe(a)
    bus.subscribe(b)
    bus.subscribe(idle, active=lambda: False)
    lines = serialize(record(0)) + serialize(record(1)) + b"not json\n[1, 2]\n"
    bus.on_lines(lines)
    assert len(parses) == 1 and a.batches[0] is b.batches[0] and not idle.batches
    assert [r["request_id"] for r in a.batches[0]] == [record(0).request_id, record(1).request_id]
    assert "chunk_offsets_s" not in a.batches[0][0]  # no subscriber asked for the lists: never parsed


def test_the_lists_come_when_an_active_subscriber_asks_and_a_local_record_too():
    bus, plain, itl = RecordBus(), Seen(), Seen()
    asks = [False]
    bus.subscribe(plain)
    bus.subscribe(itl, lists=lambda: asks[0])
    bus.on_record(record(2, chunks=4))
    assert "chunk_offsets_s" not in plain.batches[0][0]
    asks[0] = True
    bus.on_lines(serialize(record(3, chunks=4)))
    bus.on_record(record(4, chunks=4))
    assert [len(b[0]["chunk_offsets_s"]) for b in itl.batches[1:]] == [4, 4]


def test_nobody_listening_costs_no_parse(monkeypatch):
    monkeypatch.setattr(recordbus, "parse_lines", lambda *a: pytest.fail("parsed for no subscriber"))
    bus = RecordBus()
    bus.subscribe(Seen(), active=lambda: False)
    bus.on_lines(serialize(record(5)))
    bus.on_record(record(5))


def test_the_live_table_keeps_a_request_once_however_often_it_arrives():
    live, row = LiveRecords(), orjson.loads(serialize(record(6)))
    live.add_rows([row, row])
    live.add_rows([row])
    assert len(live) == 1
