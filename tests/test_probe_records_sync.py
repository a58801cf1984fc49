"""A distributed capacity probe is judged once every worker has shipped its records of the probe's window: each
batch (an empty one too) carries the worker's send time, and the master waits until every running worker's last
batch was sent after the window closed, at most LATE_RECORDS_S. Under load a worker's last batch trailed the old
one-tick wait by seconds: the live verdict then counted 73 of a probe's 84 requests."""

from __future__ import annotations

import math
import time
from types import SimpleNamespace

import pytest
from vllm_loadtest.locustfiles.distributed import SHIP_INTERVAL_S, WorkerLedger
from vllm_loadtest.locustfiles.shape import LATE_RECORDS_S, CapacityShape

pytestmark = pytest.mark.unit


def worker(shipped_until: float | None = None, **state) -> dict:
    entry = {"final_at": None, "left_at": None, "missing_at": None, **state}
    if shipped_until is not None:
        entry["shipped_until"] = shipped_until
    return entry


def ledger(*entries: dict) -> SimpleNamespace:
    return SimpleNamespace(workers={str(i): e for i, e in enumerate(entries)})


def test_the_least_send_time_of_the_running_workers_bounds_what_has_arrived():
    assert WorkerLedger.shipped_until(ledger(worker(10.0), worker(12.0))) == 10.0
    assert WorkerLedger.shipped_until(ledger(worker(10.0), worker())) == -math.inf  # one has shipped nothing yet
    # A worker that went missing, left or sent its final message is not waited for.
    gone = [worker(1.0, missing_at=5.0), worker(1.0, left_at=5.0), worker(1.0, final_at=5.0)]
    assert WorkerLedger.shipped_until(ledger(worker(10.0), *gone)) == 10.0
    assert WorkerLedger.shipped_until(ledger()) == math.inf


def shape_with(shipped_until: float | None) -> SimpleNamespace:
    ledger = SimpleNamespace(shipped_until=lambda: shipped_until)
    ctx = None if shipped_until is None else SimpleNamespace(ledger=ledger)
    return SimpleNamespace(runner=SimpleNamespace(environment=SimpleNamespace(vllm_loadtest=ctx)))


def test_a_probe_waits_for_a_batch_sent_after_its_window_then_no_longer_than_the_limit(caplog):
    end = time.time()
    arrived = CapacityShape._records_arrived
    assert arrived(shape_with(None), end)  # a local run: its records are its own
    assert not arrived(shape_with(end), end)  # sent as the window closed: a record may still be on its way
    assert arrived(shape_with(end + SHIP_INTERVAL_S), end)
    assert arrived(shape_with(end - 100), end - LATE_RECORDS_S - 1)  # waited long enough: judged without them
    assert "judged without them" in caplog.text
