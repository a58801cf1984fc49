"""The master's intake: a shipped line's per-chunk lists left out for the live views (every other field exact), and
the live table's refresh held back as its computation grows (tests/benchmarks/bench_master_intake.py measures)."""

from __future__ import annotations

import random

import orjson
import pytest
from vllm_loadtest.analysis.live import FIELDS, LiveRecords
from vllm_loadtest.analysis.records import RequestRecord, parse_lines, without_lists
from vllm_loadtest.locustfiles.recordbus import RecordBus
from vllm_loadtest.locustfiles.webui import REFRESH_MIN_S, refresh_hold_s

pytestmark = pytest.mark.unit

LISTS = ("chunk_offsets_s", "chunk_tokens")


def record(i: int, chunks: int = 256, **kw) -> RequestRecord:
    rng = random.Random(i)
    offsets = sorted(rng.random() * 5 for _ in range(chunks))
    base = dict(
        request_id=f"id{i}", worker="host-1", step=2, users=16, warmup=False, start_time=1.7e9 + i,
        endpoint="chat", model="m", ttft_s=offsets[0] if offsets else None, e2e_s=offsets[-1] if offsets else None,
        output_tokens=chunks, chunks=chunks, chunk_offsets_s=offsets, chunk_tokens=[1 + k % 3 for k in range(chunks)],
        dataset="sharegpt", max_tokens=512, intended_start_time=1.7e9 + i - 0.01, schedule_lag_s=0.01, turn=3,
        reasoning_tokens=40, ttfo_s=0.2, inputs=None,
    )  # fmt: skip
    return RequestRecord(**{**base, **kw})


def without(d: dict) -> dict:
    return {k: v for k, v in d.items() if k not in LISTS}


@pytest.mark.parametrize(
    "rec",
    [
        record(1),
        record(2, chunks=1),
        record(3, chunks=0, status="error", error_type="http_500", error='bad ] "chunk_tokens":[1] ,"chunk_offsets_s"'),
        record(4, error="a ] in an error of an ok record", finish_reason="length"),
    ],
    ids=["256 chunks", "one chunk", "error with brackets and the keys in its text", "brackets before the lists"],
)
def test_every_field_but_the_lists_parses_exactly_as_the_whole_line(rec):
    line = orjson.dumps(rec)
    cut = without_lists(line)
    assert len(cut) < len(line) or not rec.chunk_offsets_s
    assert orjson.loads(cut) == without(orjson.loads(line))
    assert b"chunk_offsets_s" not in cut or b"chunk_offsets_s" in rec.error.encode()


@pytest.mark.parametrize(
    "line",
    [
        b'{"request_id":"x","step":1}',  # no lists at all
        b'{"chunk_offsets_s":[0.1],"chunk_tokens":[1],"request_id":"x"}',  # the lists first: no comma before them
        b'{"request_id":"x","chunk_offsets_s":[0.1],"other":1,"chunk_tokens":[1]}',  # not adjacent
        b'{"request_id":"x","chunk_offsets_s":null,"chunk_tokens":[1]}',  # not a list
        b'{"request_id":"x","chunk_offsets_s":[0.1],"chunk_tokens":[1',  # cut off
    ],
)
def test_a_line_not_shaped_as_a_record_is_left_whole(line):
    assert without_lists(line) == line


def test_the_live_view_holds_the_same_rows_from_shipped_lines_as_from_the_records():
    records = [record(i) for i in range(50)] + [record(99, chunks=0, status="error", error_type="timeout")]
    from_lines, from_records = LiveRecords(), LiveRecords()
    shipped, local = RecordBus(), RecordBus()  # a master's bus (shipped lines) and a local runner's (records)
    shipped.subscribe(from_lines.add_rows)
    local.subscribe(from_records.add_rows)
    shipped.on_lines(b"".join(orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE) for r in records))
    for r in records:
        local.on_record(r)
    a, b = from_lines.frame(), from_records.frame()
    assert list(a.columns) == list(FIELDS) and len(a) == len(records)
    assert a.equals(b)
    assert a["intended_start_time"].notna().all()  # a field after the lists is kept
    assert a.loc[a["request_id"] == "id7", "ttfo_s"].item() == 0.2


def test_the_live_table_is_refreshed_less_often_as_its_computation_grows():
    assert refresh_hold_s(0.0) == REFRESH_MIN_S
    assert refresh_hold_s(0.05) == REFRESH_MIN_S
    # A computation of 0.5 s is served for 2.5 s: it takes a fifth of the event loop, however many browsers poll.
    assert refresh_hold_s(0.5) == pytest.approx(2.5)
    assert refresh_hold_s(2.0) == pytest.approx(10.0)


def test_a_batch_is_read_line_by_line_blank_lines_and_a_last_line_without_newline_included():
    lines = [orjson.dumps(record(i)) for i in range(3)]
    batch = lines[0] + b"\n\n" + lines[1] + b"\n  \n" + lines[2]  # the last one without its newline
    live = LiveRecords()
    live.add_rows(parse_lines(batch))
    assert list(live.frame()["request_id"]) == ["id0", "id1", "id2"]
    start = len(lines[0]) + 2
    assert orjson.loads(without_lists(batch, start, start + len(lines[1]))) == without(orjson.loads(lines[1]))


def test_the_live_table_is_computed_while_the_event_loop_goes_on():
    import time

    import gevent
    from vllm_loadtest.locustfiles.webui import _off_loop

    ticks = []

    def ticker() -> None:
        while True:
            ticks.append(time.perf_counter())
            gevent.sleep(0.01)

    def busy(seconds: float) -> str:  # pure CPU, as pandas' table is: it never yields to gevent by itself
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass
        return "done"

    g = gevent.spawn(ticker)
    gevent.sleep(0)
    try:
        start = len(ticks)
        assert _off_loop(busy, 0.3) == "done"
        # Run in the event loop, the computation would have let no tick through; in a thread, the loop went on.
        assert len(ticks) - start >= 3
    finally:
        g.kill()
