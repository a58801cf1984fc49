"""The locustfile of the master-intake benchmark (tests/benchmarks/bench_master_intake.py): the suite's plugin and
step shape, and a user that sends no HTTP request but fires `llm_request` with a realistic record (INTAKE_CHUNKS
one-token chunks, default 256) at INTAKE_USER_RATE records/s (default 100), so each record takes the path a
streaming user's does: the worker's own file, the RecordShipper, Locust's zmq transport, the master's WorkerLedger.

Each record ends when it is fired: start_time = now - e2e_s, so the benchmark reads every record's lag from its
end (start_time + e2e_s) to its arrival in the master's records/received/ file.
"""

from __future__ import annotations

import itertools
import os
import random
import secrets
import time

from locust import User, task
from vllm_loadtest.analysis.records import RequestRecord
from vllm_loadtest.locustfiles import plugin, shape

plugin.install()

RATE = float(os.environ.get("INTAKE_USER_RATE", "100"))  # records/s per user
CHUNKS = int(os.environ.get("INTAKE_CHUNKS", "256"))
TICK_S = 0.01  # how often a user fires the records that have come due (its share of the rate, at most ~RATE/100)
TTFT_S, ITL_S = 0.05, 0.02


def chunk_offsets(rng: random.Random) -> list[float]:
    """Offsets as a real stream gives them: perf_counter differences, full-precision floats (their JSON length is
    most of a record's bytes)."""
    t, out = TTFT_S * (0.8 + 0.4 * rng.random()), []
    for _ in range(CHUNKS):
        out.append(t)
        t += ITL_S * (0.5 + rng.random())
    return out


class IntakeUser(User):
    """Fires INTAKE_USER_RATE records/s, each with its own offsets (a pool of 64 per user, reused in turn)."""

    def wait_time(self) -> float:
        return TICK_S  # Locust marks the user as waiting meanwhile: a step's end stops it at once

    def on_start(self) -> None:
        self.run = self.environment.vllm_loadtest
        rng = random.Random(secrets.randbits(32))
        self.pool = [chunk_offsets(rng) for _ in range(64)]
        self._ids = map(f"{secrets.token_hex(10)}{{:012x}}".format, itertools.count())
        self._t0: float | None = None
        self._fired = 0

    @task
    def fire_due(self) -> None:
        now = time.monotonic()
        if self._t0 is None:
            self._t0 = now
        due = int((now - self._t0) * RATE) - self._fired
        for _ in range(due):
            self._fire()
        self._fired += due

    def _fire(self) -> None:
        offsets = self.pool[self._fired % len(self.pool)]
        step, users, warmup = self.run.tracker.current()
        e2e = offsets[-1]
        record = RequestRecord(
            request_id=next(self._ids), worker=self.run.worker_name, step=step, users=users, warmup=warmup,
            start_time=time.time() - e2e, endpoint="completions", model="m", status="ok", http_status=200,
            ttft_s=offsets[0], e2e_s=e2e, tpot_s=(e2e - offsets[0]) / (CHUNKS - 1), duration_s=e2e + 0.0004,
            output_tokens=CHUNKS, output_tokens_estimated=False, prompt_tokens=128, chunks=CHUNKS,
            finish_reason="length", chunk_offsets_s=offsets, chunk_tokens=[1] * CHUNKS, dataset="fixed",
            max_tokens=CHUNKS,
        )  # fmt: skip
        self.environment.events.llm_request.fire(record=record)
        self.environment.events.request.fire(
            request_type="POST", name="/v1/completions", response_time=e2e * 1000.0, response_length=CHUNKS * 180,
            response=None, context={"request_id": record.request_id}, exception=None,
        )  # fmt: skip


class Steps(shape.StepLoadShape):
    pass
