"""Wires the suite into a Locust environment: options, the run directory, the record writer, the step tracker,
the web UI's LLM tab, and the end of the run (computed by analysis.finish).

    from . import plugin
    plugin.install()          # in a locustfile: registers the arguments and calls register() at init

The run context holds the run directory and record writer, the step tracker and its load plans, the self-check and
the distributed ledger; the features in FEATURES register themselves on it (`register(environment, ctx)`), hooking
into its phases (`ctx.run_events`) and adding their run.json sections (`ctx.sections`).

Extension points: `environment.events.llm_request` fires once per finished request with `record=RequestRecord`
(in the process that sent it); `environment.events.llm_worker_records` fires on the master with `lines=bytes`
(JSON lines of records) for every batch a worker ships during the run.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

import gevent
import locust
from locust.event import EventHook
from locust.runners import STATE_MISSING, MasterRunner, WorkerRunner

from ..analysis import __version__ as SUITE_VERSION
from ..analysis import servers
from ..analysis.diskio import WriteFailure
from ..analysis.finish import Outcome, compute_run, finish_run
from ..analysis.records import RECORDS_DIR, RecordWriter, RequestRecord, serialize
from ..analysis.run import write_run
from . import (
    console,
    diskspace,
    gate,
    images,
    lora,
    recordbus,
    request_options,
    scraping,
    selfcheck,
    settings,
    startup,
    trace_run,
    webui,
)
from .distributed import (
    RECORDS_EVENT,
    RecordShipper,
    WorkerLedger,
    apply_heartbeat_timeout,
    register_worker_stop,
)
from .exitcodes import EXIT_SETUP_ERROR, EXIT_WORKERS_LOST, EXIT_WRITE_FAILED
from .output import default_run_dir, unused_run_dir
from .preflight import (
    Built,
    RunDirError,
    SetupError,
    check_run_dir,
    fetch_server_version,
    resolve_server,
    server_profile_entry,
)
from .resources import ProcessResources
from .shape import SuiteShape
from .tracker import StepTracker, answer_syncs

logger = logging.getLogger("vllm_loadtest")


# The suite's own events (see the module docstring).
SUITE_EVENTS = ("llm_request", RECORDS_EVENT)

# The features that register themselves beside the run context, in this order (each `register(environment, ctx)`,
# its return value kept in ctx.features under the module's name): the record bus (the controller's one parse of
# every record), the headless console's step lines (a bus subscriber), the exit code, the images' warm pool, the
# trace replay's summary, what every request carries, the model each request asks for (--lora-mix), the server's
# /metrics and GPU exporters, the web UI's LLM tab (a bus subscriber, reading the scraper's latest samples). Their
# options are declared in their modules and composed in settings.py.
FEATURES = (recordbus, console, gate, images, trace_run, request_options, lora, scraping, webui)


class RunEvents:
    """A run's phases, for the features (Locust's EventHook): `started` once the run directory is known (options=),
    `timeline` on the controller whenever a step begins or ends (timeline=, the steps so far), `stopped` when the
    load has stopped and before the results are computed."""

    def __init__(self) -> None:
        self.started = EventHook()
        self.timeline = EventHook()
        self.stopped = EventHook()


class RunContext:
    """Per-process state of one Locust process: run directory, record file, step tracker, resolved model."""

    def __init__(self, environment, built: Built | None = None) -> None:
        self.environment = environment
        self.worker_name = f"{socket.gethostname()}-{os.getpid()}"
        self.tracker = StepTracker(environment, on_change=self._save_timeline)
        # What the process builds once and its users share (model, prompts, images, trace replay).
        self.resources = ProcessResources(
            environment, built, self.tracker, on_info=lambda: self._save_timeline(self.tracker.timeline)
        )
        self.run_dir: Path | None = None
        self.writer: RecordWriter | None = None
        self.started_at: float | None = None
        self._generated_run_dir: str | None = None
        self.run_events = RunEvents()
        self.sections: dict[str, Callable[[], object]] = {}  # run.json's sections the features add, by key
        self.features: dict[str, object] = {}  # what each feature's register returned, by its module's name
        self.server_version: str | None = None
        self.shipper: RecordShipper | None = None
        self.workers: list[dict] = []
        self.ledger: WorkerLedger | None = None
        self.selfcheck = selfcheck.register(environment)  # None in a master: it generates no load
        self.outcome: Outcome | None = None  # the last finished run's end (analysis.finish), for the exit code
        self.write_failure: WriteFailure | None = None  # this run's first failed write of a result file
        self._run_json_failed = False  # run.json could not be replaced this run (said once)
        self._stopping = False  # the run is being stopped (test_stopping fired): a failed write stops nothing more
        self.disk_watch: diskspace.DiskWatch | None = None
        self.bus: recordbus.RecordBus | None = None  # the controller's (recordbus.register)
        self._refused = False  # this run's start was refused (its run directory cannot be written): said once
        self._finishing: gevent.Greenlet | None = None  # the end of the run (on_test_stop's work), under way or done
        if isinstance(environment.runner, MasterRunner):
            apply_heartbeat_timeout(self.options.heartbeat_timeout)
            self.ledger = WorkerLedger(
                environment, on_change=self._workers_changed, on_write_failure=self._write_failed
            )
        elif isinstance(environment.runner, WorkerRunner):
            register_worker_stop(environment)

    @property
    def options(self) -> settings.SuiteOptions:
        """This run's options, typed (read again each time: the web UI's form and the start change them)."""
        return settings.read(self.environment.parsed_options)

    @property
    def is_controller(self) -> bool:
        """The master, or the only process of a local run: it owns the shape, the timeline and the tables."""
        return not isinstance(self.environment.runner, WorkerRunner)

    @property
    def generates_load(self) -> bool:
        return not isinstance(self.environment.runner, MasterRunner)

    # --- lifecycle -------------------------------------------------------------------------------------
    def on_test_start(self, environment, **_kw) -> None:
        if self.is_controller and self.run_dir is not None and not self._stopping:
            # Locust's master fires test_start again, without test_stop, when every worker missed its heartbeat at
            # once (check_stopped reads them all as stopped): the same run goes on, in its own directory.
            logger.warning("Locust restarted the run without stopping it (its workers missed their heartbeats); "
                           "the run goes on in %s", self.run_dir)  # fmt: skip
            return
        if self.generates_load:
            # Everything alive now (Locust, pandas, pyarrow, plotly: ~half a million objects) leaves the garbage
            # collector's view. A full collection scanned them all: a 105 ms stall of every stream's timestamps,
            # seen mid-run at 64 users. Requests make no reference cycles, so nothing the run frees is missed.
            gc.collect()
            gc.freeze()
        options = environment.parsed_options
        self.resources.start_run()
        if self.is_controller and not options.headless:
            try:
                startup.check_options(options, self.resources.traces)  # the web UI's start form may have changed them
            except ValueError as e:
                logger.error("%s; fix it in the start form", e)
                gevent.spawn(environment.runner.stop)
                return
        if self.is_controller and options.host:
            try:
                resolve_server(options)  # --server-type (auto: detected); a headless run's preflight decided it
            except SetupError as e:
                logger.error("%s; fix it in the start form", e)
                gevent.spawn(environment.runner.stop)
                return
        if self.is_controller:
            if not options.run_dir or options.run_dir == self._generated_run_dir:
                self._generated_run_dir = str(default_run_dir())
                options.run_dir = self._generated_run_dir
            options.run_dir = str(unused_run_dir(Path(options.run_dir)))
            # Set on the options, so the workers receive the same directory with their spawn message.
            self.started_at = time.time()
        self.run_dir = Path(options.run_dir)
        self.write_failure = None
        self._run_json_failed = False
        self._stopping = False
        self._refused = False
        self._finishing = None
        self.tracker.stop_requested = False
        try:
            # Created, and a probe file written and removed in it: on every process (a worker's own copy too).
            check_run_dir(self.run_dir / RECORDS_DIR)
            if self.generates_load:
                self.writer = RecordWriter(self.run_dir / RECORDS_DIR / f"{self.worker_name}.jsonl")
        except (RunDirError, WriteFailure) as e:
            why = f"cannot {e.doing} {e.path} ({e.why})" if isinstance(e, RunDirError) else str(e)
            if self.is_controller:
                self._refuse_start(f"{why}; pass a writable --run-dir")
                return
            # A worker on another host may not have the master's path: the master's copy is then the only one.
            logger.warning("no local copy of this worker's records: %s", why)
        if isinstance(environment.runner, WorkerRunner):
            self.shipper = RecordShipper(environment, self.worker_name, self.run_dir)
        if self.selfcheck is not None:
            self.selfcheck.start(self.run_dir, self.worker_name, self._intended_users)
        if self.ledger is not None:
            apply_heartbeat_timeout(self.options.heartbeat_timeout)  # the web UI's start form may have changed it
            self.workers = []
            self.ledger.start(self.run_dir)
        if self.is_controller:
            self.server_version = None
            logger.info("Run directory: %s", self.run_dir)
        self.run_events.started.fire(options=options)
        if self.is_controller:
            self._save_timeline(self.tracker.timeline)
            if options.host:
                gevent.spawn(self._read_server_version, options.host)
            self.disk_watch = diskspace.DiskWatch(self.run_dir, diskspace.planned_seconds(options)).start()

    def _refuse_start(self, message: str) -> None:
        """The run cannot start (its run directory cannot be written): one line, exit code 3, the run stopped."""
        headless = self.environment.parsed_options.headless
        logger.error("%s%s", message, "" if headless else " (fix it in the start form)")
        self.environment.process_exit_code = EXIT_SETUP_ERROR
        self.run_dir = None  # nothing to finish
        self._refused = self._stopping = True
        self._stop_run()

    def _stop_run(self) -> None:
        """Stop the run now, as the end of its last step does. A run of the stepped shape ends at the shape's next
        tick, within a second (SuiteShape.tick returns None, as at a capacity search's end, and Locust stops, or
        quits when headless, from the shape's own greenlet: a stop from any other greenlet would let Locust's main
        greenlet, which waits on the shape in a headless or --autostart run, stop the run a second time and finish
        it twice). Without the shape (a locustfile of one's own) Locust is told from a greenlet of its own, never
        from the user's greenlet whose write failed: the stop kills the users' greenlets."""
        environment = self.environment
        runner = environment.runner
        shape = getattr(runner, "shape_greenlet", None)
        if isinstance(environment.shape_class, SuiteShape) and shape is not None and not shape.dead:
            self.tracker.stop_requested = True
            return
        gevent.spawn(runner.quit if environment.parsed_options.headless else runner.stop)

    def _write_failed(self, failure: WriteFailure) -> None:
        """A result file of this run cannot be written (its records, or the copies workers ship to the master): said
        once, the exit code set, and the run stopped (_stop_run: within a second, at the shape's next tick). The
        records finishing meanwhile are counted as not saved (RecordWriter.dropped), never written after the gap."""
        if self.write_failure is not None:
            return
        self.write_failure = failure
        torn = " (its last, partial line could not be removed: every reader skips it)" if failure.torn else ""
        stopping = "the run is stopping" if self._stopping else "stopping the run"
        logger.error("%s%s: %s; %s", failure, torn, stopping, failure.fix)
        self.environment.process_exit_code = EXIT_WRITE_FAILED
        if not self._stopping:
            self._stopping = True
            self._stop_run()

    def _local_copy_failed(self, failure: WriteFailure) -> None:
        """A worker's own copy of its records cannot be written: said once; its records still ship to the master,
        whose copy is the run's (a worker that cannot write its run directory at all only ships, the same)."""
        logger.warning(
            "%s: this worker's own copy of its records stops here; they still reach the master (%s)",
            failure,
            failure.fix,
        )

    def on_test_stopping(self, environment, **_kw) -> None:
        self._stopping = True
        if self.generates_load:
            self.tracker.plan.finish()  # the schedule ends with the run, not when the stopped users have finished
        if self.ledger is not None and self.run_dir is not None and self._every_worker_missing():
            self._workers_lost()

    def _every_worker_missing(self) -> bool:
        clients = list(self.environment.runner.clients.all)
        return bool(clients) and all(c.state == STATE_MISSING for c in clients)

    def _workers_lost(self) -> None:
        """Locust stops a run when its last worker goes missing, and its headless master quits at once: one line,
        exit code 5, and the end of the run completed with what arrived (settle)."""
        step = self.tracker.state.step if self.tracker.state is not None else None
        logger.error(
            "every worker went missing (no heartbeat for --heartbeat-timeout %g s)%s, so Locust stopped the run; the "
            "records that reached the master are merged; give the workers CPU to spare (more workers, or fewer "
            "users each) or raise --heartbeat-timeout",
            self.options.heartbeat_timeout,
            "" if step is None else f" in step {step}",
        )
        if self.environment.process_exit_code is None:
            self.environment.process_exit_code = EXIT_WORKERS_LOST

    def on_test_stop(self, environment, **_kw) -> None:
        # In a greenlet of its own: Locust's headless master may kill the greenlet that fired test_stop (it quits at
        # once when its last worker went missing); settle() then waits for this one to complete.
        if self._finishing is None or self._finishing.dead:
            self._finishing = gevent.spawn(self._end_run, environment)
        self._finishing.get()

    def settle(self) -> Outcome | None:
        """The last run's outcome once its end is complete (called as the process quits): an end under way is waited
        for, and one that Locust never let start (its master quit as it stopped the run) is run now."""
        if self._finishing is not None and not self._finishing.dead:
            self._finishing.join()
        elif self.is_controller and self._finishing is None and self._stopping and self.run_dir is not None:
            self._end_run(self.environment)
        return self.outcome

    def _end_run(self, environment) -> None:
        if self.generates_load:
            self.tracker.plan.close()  # logs the scheduled requests that were due and never sent
            self.resources.stop_run()
        if self.writer is not None:
            try:
                self.writer.close()
            except WriteFailure as failure:  # the flush to the disk failed (an I/O error, a network disk)
                if self.shipper is None:
                    self._write_failed(failure)
                else:
                    self._local_copy_failed(failure)
            dropped = self.writer.dropped
            lost = f"; {dropped} finished after the failed write and were not saved" if dropped else ""
            logger.info("%d request record(s) in %s%s", self.writer.count, self.writer.path, lost)
            self.writer = None
        if self.disk_watch is not None:
            self.disk_watch.stop()
            self.disk_watch = None
        if self.selfcheck is not None:
            self.selfcheck.stop()  # before the shipper's final message: the master merges once that has arrived
        if self.shipper is not None:
            self.shipper.close()
            self.shipper = None
        if self.ledger is not None and self.ledger.run_dir is not None:
            # Workers still stream (the headless master stops itself first): let them finish and report.
            self.workers = self.ledger.finish(environment.stop_timeout or 0.0)
        self.run_events.stopped.fire()
        if self.is_controller and self.run_dir is not None:
            self.tracker.end()
            self._save_timeline(self.tracker.timeline, finished=True)
            # Every table and verdict, the files and the console text (analysis.finish).
            echoed: list[str] = []

            def echo(text: str) -> None:
                echoed.append(text)
                print(text, flush=True)

            try:
                self.outcome = finish_run(self.run_dir, report=not self.options.no_report, echo=echo)
            except WriteFailure as failure:
                self._results_failed(failure, printed=bool(echoed))
            self.tracker.reset()
            self.run_dir = None  # finish once per run, even if Locust fires test_stop twice

    def _results_failed(self, failure: WriteFailure, printed: bool) -> None:
        """The end-of-run files could not be written (the disk is full): one line, and the console's results
        computed without writing, when none were printed yet; the raw files are kept, complete, for `python -m
        analysis report` once there is room."""
        line = (
            f"{failure}: the results from it on were not written; once there is room, `python -m analysis report "
            f"{self.run_dir}` builds them from the records kept"
        )
        if self.write_failure is None:  # the first failure of this run: the exit code is that of a failed write
            self.write_failure = failure
            self.environment.process_exit_code = EXIT_WRITE_FAILED
            logger.error("%s (%s)", line, failure.fix)
        else:
            logger.warning(line)
        if not printed:
            try:
                self.outcome = compute_run(self.run_dir, echo=lambda text: print(text, flush=True))
            except OSError as e:  # the raw files cannot even be read back (an I/O error)
                logger.warning("the results cannot be computed either (%s: %s)", type(e).__name__, e)

    def _intended_users(self) -> int | None:
        """The current step's target users (all processes together), for the self-check rows."""
        state = self.tracker.state
        return state.users if state is not None else getattr(self.environment.runner, "target_user_count", None)

    def _read_server_version(self, host: str) -> None:
        """vLLM's version from its /version endpoint, for the report's metadata; absent on other servers."""
        self.server_version = fetch_server_version(host, profile=servers.of_options(self.environment.parsed_options))
        self._save_timeline(self.tracker.timeline)

    def on_record(self, record: RequestRecord, **_kw) -> None:
        if self.writer is None and self.shipper is None:
            if not self._refused:  # a refused start said why already
                logger.error("request %s finished outside a run; its record is not saved", record.request_id)
            return
        line = serialize(record)
        if self.writer is not None:
            try:
                self.writer.write_line(line)
            except WriteFailure as failure:  # the file is truncated back to its last complete record
                if self.shipper is None:
                    self._write_failed(failure)
                else:
                    self._local_copy_failed(failure)
        if self.shipper is not None:
            self.shipper.add(line)

    def _workers_changed(self) -> None:
        if self.ledger is not None:
            self.workers = sorted(self.ledger.workers.values(), key=lambda e: e["connected_at"])
        self._save_timeline(self.tracker.timeline)

    def _save_timeline(self, timeline: list[dict], finished: bool = False) -> None:
        if not self.is_controller or self.run_dir is None:
            return
        self.run_events.timeline.fire(timeline=timeline)
        options = self.environment.parsed_options
        typed = settings.read(options)
        data = {
            "started_at": self.started_at,
            "finished_at": time.time() if finished else None,
            "locust_version": locust.__version__,
            "suite_version": SUITE_VERSION,
            "server_version": self.server_version,
            "options": {k: getattr(typed, k) for k in settings.saved_names()},
            "server_profile": server_profile_entry(options),  # the server type used and how it was decided
            # How this process built --dataset (tokenizer or estimates, items, notes); a master builds none.
            "dataset": self.resources.dataset_info or {"spec": typed.dataset},
            **{key: section() for key, section in self.sections.items()},
            "timeline": timeline,
            "workers": self.workers,
        }
        try:
            write_run(self.run_dir, data)
        except WriteFailure as e:  # the previous run.json stays whole; tried again at the next change
            if not self._run_json_failed:
                self._run_json_failed = True
                logger.warning("%s: it keeps its previous version (%s)", e, e.fix)


def register(environment, built: Built | None = None) -> RunContext:
    """Attach the suite to an environment (call from an `init` listener); `built`: what the preflight built."""
    locust.runners.inspect = startup.NoStopCallerLookup()
    startup.compute_locust_defaults_once()
    events = environment.events
    for name in SUITE_EVENTS:
        if not hasattr(events, name):
            setattr(events, name, EventHook())
    ctx = RunContext(environment, built)
    environment.vllm_loadtest = ctx
    events.test_start.add_listener(ctx.on_test_start)
    events.test_stopping.add_listener(ctx.on_test_stopping)
    events.test_stop.add_listener(ctx.on_test_stop)
    events.llm_request.add_listener(ctx.on_record)
    # After the run context's listeners: the tab's test_start reads the run directory the context resolved, and
    # its test_stop comes once the run is finished.
    for feature in FEATURES:
        ctx.features[feature.__name__.rsplit(".", 1)[-1]] = feature.register(environment, ctx)
    return ctx


def install(events=None) -> None:
    """Register the suite's arguments and its init listener on Locust's global events."""
    events = events or locust.events
    events.init_command_line_parser.add_listener(settings.add_arguments)
    events.init.add_listener(_on_init)


def _on_init(environment, **_kw) -> None:
    if isinstance(environment.runner, MasterRunner):
        # Before the preflight, which waits on the server while the workers connect and ask for the step.
        answer_syncs(environment, lambda: getattr(getattr(environment, "vllm_loadtest", None), "tracker", None))
    register(environment, startup.prepare(environment))
