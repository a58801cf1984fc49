"""Self-checks of every process that generates load: an event-loop lag probe, the process's CPU use and its
running users, one row about once a second into `generator/<host>-<pid>.jsonl` in the run directory (and, on a
worker, shipped to the master like the records), merged into `generator.parquet` at the end of the run.

    check = selfcheck.register(environment)   # None in a master, which generates no load
    check.start(run_dir, worker_name, intended_users)   # at test_start
    check.stop()                              # at test_stop, before the worker's final message

Why a probe: every stream's timestamps are taken by greenlets of one event loop. When that loop is busy, a
greenlet whose data has arrived waits for the CPU, and its stamp is late by that wait. A greenlet that sleeps
10 ms and measures how late it woke sees the same wait. Its cost: about 8 µs per wake-up (0.08 % of a core at
100 wake-ups per second), plus one row per second.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import gevent
from locust.runners import MasterRunner, WorkerRunner

from ..analysis.diskio import LineFile, WriteFailure
from ..analysis.generator import GENERATOR_DIR, PROBE_INTERVAL_S, ROW_INTERVAL_S, sample_line
from .distributed import GENERATOR_MESSAGE

logger = logging.getLogger("vllm_loadtest.selfcheck")


class SelfCheck:
    """The probe greenlet of one load-generating process, and the rows it writes and ships."""

    def __init__(self, environment) -> None:
        self.environment = environment
        self._greenlet: gevent.Greenlet | None = None
        self._file = None
        self._lags: list[float] = []
        self.rows = 0
        self.ship_failures = 0

    def start(self, run_dir: Path, worker: str, intended_users: Callable[[], int | None]) -> None:
        self.stop()
        self.run_dir = Path(run_dir)
        self.worker = worker
        self.intended_users = intended_users
        self.rows = 0
        self.ship_failures = 0
        self._ship = isinstance(self.environment.runner, WorkerRunner)
        try:
            # Unbuffered: each row is one write() to the OS, so a crash or a kill keeps every row written so far;
            # a row whose write fails is truncated away and said once (analysis/diskio.py).
            self._file = LineFile(self.run_dir / GENERATOR_DIR / f"{worker}.jsonl", unit="samples")
        except WriteFailure as e:
            # A worker on another host may not have the master's path: the master's copy is then the only one.
            logger.warning("no local copy of the self-check samples: %s", e)
            self._file = None
        self._lags = []
        self._last_wall = time.perf_counter()
        self._last_cpu = time.process_time()
        self._greenlet = gevent.spawn(self._probe)

    def _probe(self) -> None:
        me = gevent.getcurrent()
        loop = gevent.get_hub().loop
        next_row = time.perf_counter() + ROW_INTERVAL_S
        while True:
            intended = time.perf_counter() + PROBE_INTERVAL_S
            # The loop's cached clock dates from the start of its current iteration; a timer started from it after
            # other greenlets ran would fire early and hide their delay.
            loop.update_now()
            gevent.sleep(PROBE_INTERVAL_S)
            if self._greenlet is not me:
                return  # stopped (its last row is written): nothing may follow the worker's final message
            woke = time.perf_counter()
            self._lags.append(woke - intended)
            if woke >= next_row:
                self._row(woke)
                next_row = woke + ROW_INTERVAL_S

    def _row(self, now: float) -> None:
        cpu = time.process_time()
        lags, self._lags = self._lags, []
        line = sample_line(
            time.time(),
            self.worker,
            now - self._last_wall,
            cpu - self._last_cpu,
            self.environment.runner.user_count,
            self.intended_users(),
            lags,
        )
        self._last_wall, self._last_cpu = now, cpu
        self.rows += 1
        if self._file is not None:
            try:
                self._file.write(line)
            except WriteFailure as e:  # the disk is full: the records' writer stops the run; this is said once
                logger.warning("%s: the self-check samples stop here (%s)", e, e.fix)
        if self._ship:
            try:
                self.environment.runner.send_message(
                    GENERATOR_MESSAGE, {"worker": self.worker, "run_dir": str(self.run_dir), "lines": line}
                )
            except Exception as e:  # the master is gone: the row stays in this worker's own file
                self.ship_failures += 1
                if self.ship_failures == 1:
                    logger.warning("cannot ship self-check samples to the master (%s: %s)", type(e).__name__, e)

    def stop(self) -> None:
        """Stop the probe and write the last, partial interval's row (so the end of the last step is covered)."""
        if self._greenlet is None:
            return
        # Nothing here waits for another greenlet: Locust may fire test_stop twice at once on a worker, and a stop
        # that yielded would let the other one send the final message before this last row.
        probe, self._greenlet = self._greenlet, None
        probe.kill(block=False)
        now = time.perf_counter()
        if self._lags or now - self._last_wall >= PROBE_INTERVAL_S:
            # (A last row of a few microseconds would only add a meaningless CPU fraction.)
            self._row(now)
        if self._file is not None:
            self._file.close(sync=False)
            self._file = None
        if self.ship_failures:
            logger.warning(
                "%d self-check row(s) of %s did not reach the master; its own file has them",
                self.ship_failures,
                self.worker,
            )


def register(environment) -> SelfCheck | None:
    """The self-check of a load-generating process (local runner or worker); None for a master."""
    if isinstance(environment.runner, MasterRunner):
        return None
    return SelfCheck(environment)
