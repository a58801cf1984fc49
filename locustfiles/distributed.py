"""Master/worker runs: every worker's records reach the master's run directory exactly once, and the master waits
for them before it merges.

Each worker writes its records to its own file in the run directory on its host (`records/<host>-<pid>.jsonl`:
the durable copy, which survives a master that dies) and ships the same lines to the master every
`SHIP_INTERVAL_S`, which appends them to `records/received/<host>-<pid>.jsonl` in its run directory. On one host,
or with a shared volume, both copies land side by side; the merge keeps one row per `request_id`. Workers on
other hosts need nothing shared: the master's copy is complete except for the lines of the last interval of a
worker that is killed, which its own file on its host still holds (`python -m analysis report` merges copies of
those files dropped into `records/`).

At the end the master asks every worker to stop (in-flight streams get Locust's `--stop-timeout`, then are
recorded as cut off) and waits for each worker's final message, which carries how many records it wrote, before
merging. A worker that goes missing (no heartbeat) is not waited for; the run directory says when it went.

The self-check samples of each worker (`locustfiles/selfcheck.py`) travel the same way, into `generator/` and
`generator/received/`, one message per row; a worker sends its last row before its final message.

Each batch is appended whole or not at all (analysis/diskio.py). When the master cannot write a worker's records (a
full disk), the plugin stops the run (one line, exit code 4); each worker's own file still holds them. A worker whose
own copy cannot be written says so once and goes on shipping.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import gevent
import locust.runners
from locust.runners import HEARTBEAT_INTERVAL, STATE_MISSING

from ..analysis.diskio import LineFile, WriteFailure
from ..analysis.generator import GENERATOR_DIR
from ..analysis.records import RECEIVED_DIR, RECORDS_DIR
from .declare import option

logger = logging.getLogger("vllm_loadtest.distributed")

RECORDS_MESSAGE = "vllm_loadtest_records"  # worker -> master: {"worker", "run_dir", "lines": bytes}
FINAL_MESSAGE = "vllm_loadtest_final"  # worker -> master: {"worker", "run_dir", "records": n}
GENERATOR_MESSAGE = "vllm_loadtest_generator"  # worker -> master: {"worker", "run_dir", "lines": bytes}
STOP_MESSAGE = "vllm_loadtest_stop"  # master -> worker: stop your users now and send your final message
RECORDS_EVENT = "llm_worker_records"  # environment.events.<this>: the master received a batch of a worker's records
SHIP_INTERVAL_S = 0.5
FINAL_GRACE_S = 15.0  # beyond --stop-timeout, for the last messages to arrive
MISSING_GRACE_S = 10.0  # how long a worker without heartbeat may still come back with its final message


@dataclass(frozen=True)
class DistributedOptions:
    """How long the master waits for a silent worker."""

    GROUP: ClassVar[str] = "Distributed"

    heartbeat_timeout: float = option(
        "--heartbeat-timeout",
        10.0,
        "Seconds a worker may go without a heartbeat before the master counts it missing (Locust alone: about 5). A "
        "worker whose CPU is saturated misses heartbeats; a missing worker gets no users, and when every worker is "
        "missing Locust stops the run (exit code 5). Read by the master",
    )


def apply_heartbeat_timeout(seconds: float) -> None:
    """Locust's master reads HEARTBEAT_LIVENESS from its module at every beat (a process-wide setting of Locust's):
    a worker's count is reset to it by each heartbeat, lowered once per HEARTBEAT_INTERVAL, and the worker is
    missing at the first check that finds it below 0, LIVENESS + 2 intervals after its last heartbeat."""
    locust.runners.HEARTBEAT_LIVENESS = max(0, math.ceil(seconds / HEARTBEAT_INTERVAL) - 2)


class RecordShipper:
    """Worker side: batches serialized records and sends them to the master."""

    def __init__(self, environment, worker: str, run_dir: Path) -> None:
        self.environment = environment
        self.worker = worker
        self.run_dir = str(run_dir)
        self._lines: list[bytes] = []
        self.count = 0
        self._greenlet = gevent.spawn(self._loop)

    def add(self, line: bytes) -> None:
        self._lines.append(line)
        self.count += 1

    def flush(self) -> None:
        """Ship the lines gathered since the last flush; with none, an empty batch: its `sent_at` tells the master
        that every record this worker finished before then has been shipped (the capacity search waits for it)."""
        lines, self._lines = self._lines, []
        self.environment.runner.send_message(
            RECORDS_MESSAGE,
            {"worker": self.worker, "run_dir": self.run_dir, "lines": b"".join(lines), "sent_at": time.time()},
        )

    def _loop(self) -> None:
        while True:
            gevent.sleep(SHIP_INTERVAL_S)
            try:
                self.flush()
            except Exception:  # the master is gone: keep the lines, the local file has them anyway
                logger.exception("cannot ship records to the master; they stay in this worker's own file")

    def close(self) -> None:
        """Ship what is left, then tell the master this worker's run is complete."""
        self._greenlet.kill(block=True)
        self.flush()
        self.environment.runner.send_message(
            FINAL_MESSAGE, {"worker": self.worker, "run_dir": self.run_dir, "records": self.count}
        )


class WorkerLedger:
    """Master side: writes the records workers ship, tracks each worker's connection, disappearance and final
    message, and waits for the finals at the end of a run."""

    def __init__(self, environment, on_change=None, on_write_failure=None) -> None:
        self.environment = environment
        self.on_change = on_change
        # Called once with the WriteFailure when a worker's records cannot be written here (the plugin stops the
        # run); a failed self-check copy is only warned about (once per file).
        self.on_write_failure = on_write_failure
        # Fired with lines=bytes for every batch of record lines of the current run (the web UI's live view
        # listens); the plugin creates it, a ledger without it fires nothing.
        self.records_event = getattr(environment.events, RECORDS_EVENT, None)
        self.run_dir: Path | None = None
        self.workers: dict[str, dict] = {}  # Locust client id -> what we know of it
        self._files: dict[Path, LineFile | None] = {}  # None: it failed (said once), nothing more is written
        self._watch: gevent.Greenlet | None = None
        runner = environment.runner
        runner.register_message(RECORDS_MESSAGE, self._on_records)
        runner.register_message(FINAL_MESSAGE, self._on_final)
        runner.register_message(GENERATOR_MESSAGE, self._on_generator)

    # --- during the run -------------------------------------------------------------------------------
    def start(self, run_dir: Path) -> None:
        self.close_files()
        self.run_dir = Path(run_dir)
        self.workers = {}
        self._poll()
        self._watch = gevent.spawn(self._watch_loop)

    def _entry(self, client_id: str) -> dict:
        return self.workers.setdefault(
            client_id,
            {
                "client_id": client_id,
                "worker": None,
                "connected_at": time.time(),
                "missing_at": None,
                "records_received": 0,
                "records_reported": None,
                "final_at": None,
                "left_at": None,
            },
        )

    def _poll(self) -> None:
        changed = False
        present = {client.id for client in self.environment.runner.clients.all}
        for client_id, entry in self.workers.items():
            if client_id not in present and entry["final_at"] is None and entry.get("left_at") is None:
                # It quit (Ctrl-C on its host, or Locust dropped it after a long silence): nothing more will come.
                entry["left_at"] = time.time()
                changed = True
                logger.warning("worker %s left without its final message", entry["worker"] or client_id)
        for client in self.environment.runner.clients.all:
            known = client.id in self.workers
            entry = self._entry(client.id)
            changed |= not known
            if client.state == STATE_MISSING and entry["missing_at"] is None and entry["final_at"] is None:
                entry["missing_at"] = time.time()
                changed = True
                # With none left, Locust stops the run, and the master's error line says so: not "goes on".
                others = any(c.state != STATE_MISSING for c in self.environment.runner.clients.all)
                logger.warning(
                    "worker %s went missing (no heartbeat); its records so far are kept%s",
                    entry["worker"] or client.id,
                    ", the run goes on" if others else "",
                )
            elif client.state != STATE_MISSING and entry["missing_at"] is not None and entry["final_at"] is None:
                logger.warning("worker %s is back (heartbeat again)", entry["worker"] or client.id)
                entry.setdefault("missing_periods", []).append([entry["missing_at"], time.time()])
                entry["missing_at"] = None
                changed = True
        if changed and self.on_change is not None:
            self.on_change()

    def _watch_loop(self) -> None:
        while True:
            gevent.sleep(0.5)
            self._poll()

    def _write(self, run_dir: Path, worker: str, lines: bytes, kind: str = RECORDS_DIR) -> None:
        """Append a batch of a worker's lines to its received copy, whole or not at all (analysis/diskio.py)."""
        path = run_dir / kind / RECEIVED_DIR / f"{worker}.jsonl"
        try:
            if path not in self._files:
                self._files[path] = LineFile(path, unit="records" if kind == RECORDS_DIR else "samples")
            f = self._files[path]
            if f is not None:
                f.write(lines, lines.count(b"\n"))
        except WriteFailure as failure:
            self._files[path] = None
            if kind == RECORDS_DIR and self.on_write_failure is not None:
                self.on_write_failure(failure)
            else:
                logger.warning("%s: the copies shipped to the master stop here (%s)", failure, failure.fix)

    def _on_records(self, environment, msg, **_kw) -> None:
        data = msg.data
        run_dir = Path(data["run_dir"])
        if data["lines"]:
            self._write(run_dir, data["worker"], data["lines"])
        if self.run_dir is not None and run_dir == self.run_dir:
            entry = self._entry(msg.node_id)
            entry["worker"] = data["worker"]
            entry["shipped_until"] = max(entry.get("shipped_until", -math.inf), data.get("sent_at", -math.inf))
            if not data["lines"]:
                return
            entry["records_received"] += data["lines"].count(b"\n")
            if self.records_event is not None:
                self.records_event.fire(lines=data["lines"])
        elif data["lines"]:
            logger.warning(
                "records from worker %s arrived after %s was merged; `python -m analysis report %s` includes them",
                data["worker"],
                run_dir,
                run_dir,
            )

    def shipped_until(self) -> float:
        """The time up to which every worker still running has shipped the records it finished: the least of their
        last batches' send times (-inf while one has sent none; +inf without such a worker)."""
        running = [e for e in self.workers.values() if e["final_at"] is None and e["left_at"] is None
                   and e["missing_at"] is None]  # fmt: skip
        return min((e.get("shipped_until", -math.inf) for e in running), default=math.inf)

    def _on_generator(self, environment, msg, **_kw) -> None:
        data = msg.data
        run_dir = Path(data["run_dir"])
        self._write(run_dir, data["worker"], data["lines"], GENERATOR_DIR)
        if self.run_dir is None or run_dir != self.run_dir:
            logger.warning(
                "self-check samples from worker %s arrived after %s was merged; `python -m analysis report %s` "
                "includes them",
                data["worker"],
                run_dir,
                run_dir,
            )

    def _on_final(self, environment, msg, **_kw) -> None:
        data = msg.data
        if self.run_dir is None or Path(data["run_dir"]) != self.run_dir:
            return
        entry = self._entry(msg.node_id)
        entry["worker"] = data["worker"]
        entry["records_reported"] = int(data["records"])
        entry["final_at"] = time.time()

    # --- at the end -----------------------------------------------------------------------------------
    def finish(self, stop_timeout: float) -> list[dict]:
        """Ask every worker to stop, wait for their final messages (bounded), and return the worker list."""
        self._poll()
        asked: set[str] = set()
        deadline = time.monotonic() + stop_timeout + FINAL_GRACE_S
        pending = self._pending()
        while pending and time.monotonic() < deadline:
            for client_id in self._live(pending) - asked:
                asked.add(client_id)
                try:
                    self.environment.runner.send_message(STOP_MESSAGE, None, client_id=client_id)
                except Exception as e:
                    logger.warning("cannot ask worker %s to stop: %s", client_id, e)
            gevent.sleep(0.1)
            self._poll()
            pending = self._pending()
        if self._watch is not None:
            self._watch.kill(block=False)
            self._watch = None
        for client_id in pending:
            entry = self.workers[client_id]
            logger.warning(
                "worker %s sent no final message (%s); merging what arrived",
                entry["worker"] or client_id,
                "missing" if entry["missing_at"] is not None else f"not within --stop-timeout + {FINAL_GRACE_S:.0f} s",
            )
        for entry in self.workers.values():
            reported = entry["records_reported"]
            if reported is not None and reported != entry["records_received"]:
                logger.warning(
                    "worker %s wrote %d records but %d reached the master; its own file in the run directory on "
                    "its host has all of them",
                    entry["worker"],
                    reported,
                    entry["records_received"],
                )
        self.close_files()
        self.run_dir = None
        return sorted(self.workers.values(), key=lambda e: e["connected_at"])

    def _live(self, client_ids: list[str]) -> set[str]:
        states = {c.id: c.state for c in self.environment.runner.clients.all}
        return {cid for cid in client_ids if cid in states and states[cid] != STATE_MISSING}

    def _pending(self) -> list[str]:
        """Workers whose final message is still to come: live ones, and missing ones for MISSING_GRACE_S (a worker
        starved of CPU misses heartbeats but comes back; a dead one does not)."""
        now = time.time()
        return [
            cid
            for cid, e in self.workers.items()
            if e["final_at"] is None
            and e.get("left_at") is None
            and (e["missing_at"] is None or now - e["missing_at"] < MISSING_GRACE_S)
        ]

    def close_files(self) -> None:
        for f in self._files.values():
            if f is not None:
                f.close(sync=False)
        self._files = {}


def register_worker_stop(environment) -> None:
    """Worker side: the master's STOP_MESSAGE stops this worker's users (concurrently: stopping waits for
    in-flight streams up to --stop-timeout, and the message loop must keep answering meanwhile)."""

    def on_stop(environment, msg, **_kw) -> None:
        environment.runner.stop()

    environment.runner.register_message(STOP_MESSAGE, on_stop, concurrent=True)

    def on_quitting(environment, **_kw) -> None:
        # `quitting` fires in reverse order, so this runs before Locust's own listener tells the master that this
        # worker quit (after which the master forgets it): stop first, so the last records and the final message
        # (sent from test_stop) reach the master before the worker is gone.
        environment.runner.stop()

    environment.events.quitting.add_listener(on_quitting)
