"""Wires the suite into a Locust environment: options, the run directory, the record writer, the step tracker,
the web UI's LLM tab, and the end of the run (computed by analysis.finish).

    from . import plugin
    plugin.install()          # in a locustfile: registers the arguments and calls register() at init

Extension points: `environment.events.llm_request` fires once per finished request with `record=RequestRecord`
(in the process that sent it); `environment.events.llm_worker_records` fires on the master with `lines=bytes`
(JSON lines of records) for every batch a worker ships during the run.
"""

from __future__ import annotations

import gc
import inspect
import logging
import os
import signal
import socket
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import gevent
import greenlet
import locust
import orjson
from gevent.event import AsyncResult
from locust.event import EventHook
from locust.runners import MasterRunner, WorkerRunner

from ..analysis import __version__ as SUITE_VERSION
from ..analysis import servers
from ..analysis.finish import Outcome, finish_run
from ..analysis.records import RECORDS_DIR, RecordWriter, RequestRecord
from ..analysis.run import write_run
from . import options as opts_mod
from . import selfcheck
from .datasets import Dataset, build_dataset, check_dataset
from .distributed import RECORDS_EVENT, RecordShipper, WorkerLedger, register_worker_stop
from .preflight import (
    _PREFLIGHT_DATASETS,
    SetupError,
    check_run_dir,
    dataset_key,
    discover_model,
    fetch_server_version,
    preflight,
    resolve_server,
    server_profile_entry,
)
from .scraper import MetricsScraper
from .shape import StepTracker
from .webui import LLMTab

logger = logging.getLogger("vllm_loadtest")

EXIT_OK = 0
EXIT_ERRORS = 1  # failed requests above --max-error-rate
EXIT_CRASH = 2  # the tool itself failed (an unhandled exception): never mistaken for a verdict on the server
EXIT_SETUP_ERROR = 3  # bad input found before any load was sent

# The suite's own events (see the module docstring).
SUITE_EVENTS = ("llm_request", RECORDS_EVENT)

# Options saved in run.json. An allow-list, so secrets among Locust's own options (--web-auth) never land there;
# every option of options.add_arguments but --api-key is in it (tests/test_saved_options.py).
SAVED_OPTIONS = [
    "host",
    "model",
    "endpoint",
    "prompt",
    "prompt_file",
    "max_tokens",
    "dataset",
    "num_prompts",
    "max_tokens_dist",
    "seed",
    "temperature",
    "ignore_eos",
    "read_timeout",
    "api_key_env",
    "no_continuous_usage",
    "server_type",
    "keep_alive",
    "steps",
    "rates",
    "arrival",
    "max_users",
    "find_capacity",
    "start_users",
    "start_rate",
    "max_rate",
    "capacity_resolution",
    "step_duration",
    "step_warmup",
    "max_step_duration",
    "ci_target",
    "max_error_rate",
    "slo",
    "gpu",
    "memory_bandwidth_gbs",
    "model_bytes",
    "run_dir",
    "no_report",
    "metrics_url",
    "scrape_interval",
    "num_users",
    "spawn_rate",
    "run_time",
    "stop_timeout",
    "processes",
    "headless",
    "master",
    "worker",
    "expect_workers",
]


def default_run_dir() -> Path:
    return Path("reports") / datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def unused_run_dir(path: Path) -> Path:
    """`path`, or `path-2`, `path-3` ... when it already holds records of another run (never mix two runs)."""
    candidate, n = path, 1
    while (candidate / RECORDS_DIR).is_dir() and any((candidate / RECORDS_DIR).iterdir()):
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    if candidate != path:
        logger.warning("%s already holds a run; writing this one to %s", path, candidate)
    return candidate


class RunContext:
    """Per-process state of one Locust process: run directory, record file, step tracker, resolved model."""

    def __init__(self, environment) -> None:
        self.environment = environment
        self.worker_name = f"{socket.gethostname()}-{os.getpid()}"
        self.tracker = StepTracker(environment, on_change=self._save_timeline)
        self.run_dir: Path | None = None
        self.writer: RecordWriter | None = None
        self.started_at: float | None = None
        self._models: dict[str, AsyncResult] = {}
        self._datasets: dict[tuple, gevent.Greenlet] = {}
        self.dataset_info: dict | None = None  # how this process built --dataset, for run.json
        self._generated_run_dir: str | None = None
        self.scraper: MetricsScraper | None = None  # this run's, or the last run's once stopped
        self.server_version: str | None = None
        self.shipper: RecordShipper | None = None
        self.workers: list[dict] = []
        self.ledger: WorkerLedger | None = None
        self.selfcheck = selfcheck.register(environment)  # None in a master: it generates no load
        self.outcome: Outcome | None = None  # the last finished run's end (analysis.finish), for the exit code
        if isinstance(environment.runner, MasterRunner):
            self.ledger = WorkerLedger(environment, on_change=self._workers_changed)
        elif isinstance(environment.runner, WorkerRunner):
            register_worker_stop(environment)

    @property
    def is_controller(self) -> bool:
        """The master, or the only process of a local run: it owns the shape, the timeline and the tables."""
        return not isinstance(self.environment.runner, WorkerRunner)

    @property
    def generates_load(self) -> bool:
        return not isinstance(self.environment.runner, MasterRunner)

    # --- model discovery -------------------------------------------------------------------------------
    def model(self, host: str) -> str:
        """The --model option, or the first model the server lists; looked up once per process."""
        chosen = self.environment.parsed_options.model
        if chosen:
            return chosen
        if host not in self._models:
            result = AsyncResult()
            self._models[host] = result
            try:
                options = self.environment.parsed_options
                result.set(discover_model(host, options.read_timeout, opts_mod.api_key(options)))
            except SetupError as e:
                result.set_exception(e)
        try:
            return self._models[host].get()
        except SetupError as e:
            self.environment.process_exit_code = EXIT_SETUP_ERROR
            raise locust.exception.StopTest(str(e)) from None

    def dataset(self, host: str, model: str) -> Dataset:
        """The run's prompts (--dataset), built once per process and options by a greenlet of its own, so a user
        stopped while waiting for it cannot leave the others waiting forever."""
        o = self.environment.parsed_options
        key = dataset_key(o, host, model)
        if key not in self._datasets:  # a failed build stays failed: it is a setup error, not retried per user
            if key in _PREFLIGHT_DATASETS:  # built (and so validated) before any load, by preflight()
                self._datasets[key] = gevent.spawn(_PREFLIGHT_DATASETS.pop, key)
            else:
                self._datasets[key] = gevent.spawn(build_dataset, o.dataset, o, host, model, opts_mod.api_key(o))
        try:
            dataset = self._datasets[key].get()
        except ValueError as e:  # DatasetError, or an unreadable --prompt-file
            self.environment.process_exit_code = EXIT_SETUP_ERROR
            raise locust.exception.StopTest(str(e)) from None
        if self.dataset_info is None:
            self.dataset_info = dataset.info
            self._save_timeline(self.tracker.timeline)
        return dataset

    # --- lifecycle -------------------------------------------------------------------------------------
    def on_test_start(self, environment, **_kw) -> None:
        # Locust's Runner.stop() calls inspect.stack(), whose first call scans every loaded module (~40 ms here)
        # while the event loop is blocked and streams are still in flight. Paying it now, before any request
        # is sent, keeps the stop from delaying the last requests' timestamps.
        inspect.stack(0)
        if self.generates_load:
            # Everything alive now (Locust, pandas, pyarrow, plotly: ~half a million objects) leaves the garbage
            # collector's view. A full collection scanned them all: a 105 ms stall of every stream's timestamps,
            # seen mid-run at 64 users. Requests make no reference cycles, so nothing the run frees is missed.
            gc.collect()
            gc.freeze()
        options = environment.parsed_options
        if self.is_controller and not options.headless:
            try:
                check_options(options)  # the web UI's start form may have changed them
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
        try:
            (self.run_dir / RECORDS_DIR).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            if self.is_controller:
                raise SetupError(
                    f"cannot create run directory {self.run_dir}: {e.strerror}; pass a writable --run-dir"
                ) from None
            # A worker on another host may not have the master's path: the master's copy is then the only one.
            logger.warning("no local copy of this worker's records: cannot create %s (%s)", self.run_dir, e.strerror)
        if self.generates_load and (self.run_dir / RECORDS_DIR).is_dir():
            self.writer = RecordWriter(self.run_dir / RECORDS_DIR / f"{self.worker_name}.jsonl")
        if isinstance(environment.runner, WorkerRunner):
            self.shipper = RecordShipper(environment, self.worker_name, self.run_dir)
        if self.selfcheck is not None:
            self.selfcheck.start(self.run_dir, self.worker_name, self._intended_users)
        if self.ledger is not None:
            self.workers = []
            self.ledger.start(self.run_dir)
        self.dataset_info = None  # this run's, once its first user has built (or reused) it
        if self.is_controller:
            self.server_version = None
            self._save_timeline(self.tracker.timeline)
            if options.host:
                gevent.spawn(self._read_server_version, options.host)
            logger.info("Run directory: %s", self.run_dir)
            self._start_scraper(options)

    def on_test_stopping(self, environment, **_kw) -> None:
        if self.generates_load:
            self.tracker.plan.finish()  # the schedule ends with the run, not when the stopped users have finished

    def on_test_stop(self, environment, **_kw) -> None:
        if self.generates_load:
            self.tracker.plan.close()  # logs the scheduled requests that were due and never sent
        if self.writer is not None:
            self.writer.close()
            logger.info("%d request record(s) in %s", self.writer.count, self.writer.path)
            self.writer = None
        if self.selfcheck is not None:
            self.selfcheck.stop()  # before the shipper's final message: the master merges once that has arrived
        if self.shipper is not None:
            self.shipper.close()
            self.shipper = None
        if self.ledger is not None and self.ledger.run_dir is not None:
            # Workers still stream (the headless master stops itself first): let them finish and report.
            self.workers = self.ledger.finish(environment.stop_timeout or 0.0)
        if self.scraper is not None:
            self.scraper.stop()  # kept: its last scrape stays the server's latest numbers (latest_samples)
        if self.is_controller and self.run_dir is not None:
            self.tracker.end()
            self._save_timeline(self.tracker.timeline, finished=True)
            # Every table and verdict, the files and the console text (analysis.finish).
            self.outcome = finish_run(
                self.run_dir,
                report=not getattr(environment.parsed_options, "no_report", False),
                echo=lambda text: print(text, flush=True),
            )
            self.tracker.reset()
            self.run_dir = None  # finish once per run, even if Locust fires test_stop twice

    def _intended_users(self) -> int | None:
        """The current step's target users (all processes together), for the self-check rows."""
        state = self.tracker.state
        return state.users if state is not None else getattr(self.environment.runner, "target_user_count", None)

    def latest_samples(self) -> list[tuple[str, dict, float]] | None:
        """The server's latest scrape: this run's, or the last run's last one (None when not scraped)."""
        return self.scraper.last_samples if self.scraper is not None else None

    def on_quitting(self, environment, **_kw) -> None:
        """The process exit code: 0 ok, 1 errors over --max-error-rate or a broken --slo (headless), 2 the tool
        crashed, 3 bad input; with --find-capacity, 0 when a capacity was found, 1 when even the first probe broke
        an objective."""
        if environment.process_exit_code is not None or not self.is_controller:
            return  # already decided (bad input), or a worker: the master's code is the run's
        if locust.log.unhandled_greenlet_exception or environment.runner.exceptions:
            # An exception escaped the suite's own code (Locust logs it with its traceback): a bug, not a verdict.
            environment.process_exit_code = EXIT_CRASH
        elif self.outcome is not None:
            # A broken SLO fails a headless run (a pipeline's gate); in the web UI it is shown, not an exit code.
            headless = environment.parsed_options.headless
            if self.outcome.capacity is not None:
                # A capacity search breaks objectives (and may fail requests) beyond the capacity on purpose: its
                # verdict is whether any load met them all.
                environment.process_exit_code = EXIT_OK if self.outcome.capacity_found or not headless else EXIT_ERRORS
                return
            slo_failed = self.outcome.slo_failed and headless
            over = self.outcome.errors_over_limit
            environment.process_exit_code = EXIT_ERRORS if over or slo_failed else EXIT_OK

    def _start_scraper(self, options) -> None:
        self.scraper = None  # the last run's, if any: its numbers are not this run's
        url = options.metrics_url or (f"{(options.host or '').rstrip('/')}/metrics" if options.host else "")
        if not url or url == "off" or not servers.of_options(options).metrics:
            return  # --server-type openai: no /metrics, and no series the suite could name
        # With --model the scraper keeps only that model's samples; otherwise the analysis filters by the model
        # the records name (a server serving several models labels each sample with its model_name).
        server = servers.of_options(options).name
        self.scraper = MetricsScraper(
            url, options.scrape_interval, self.run_dir, model=options.model or None, server=server
        ).start()

    def _read_server_version(self, host: str) -> None:
        """vLLM's version from its /version endpoint, for the report's metadata; absent on other servers."""
        self.server_version = fetch_server_version(host, profile=servers.of_options(self.environment.parsed_options))
        self._save_timeline(self.tracker.timeline)

    def on_record(self, record: RequestRecord, **_kw) -> None:
        if self.writer is None and self.shipper is None:
            logger.error("request %s finished outside a run; its record is not saved", record.request_id)
            return
        if self.writer is not None:
            line = self.writer.write(record)
        else:
            line = orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)
        if self.shipper is not None:
            self.shipper.add(line)

    def _workers_changed(self) -> None:
        if self.ledger is not None:
            self.workers = sorted(self.ledger.workers.values(), key=lambda e: e["connected_at"])
        self._save_timeline(self.tracker.timeline)

    def _save_timeline(self, timeline: list[dict], finished: bool = False) -> None:
        if not self.is_controller or self.run_dir is None:
            return
        options = self.environment.parsed_options
        data = {
            "started_at": self.started_at,
            "finished_at": time.time() if finished else None,
            "locust_version": locust.__version__,
            "suite_version": SUITE_VERSION,
            "server_version": self.server_version,
            "options": {k: getattr(options, k, None) for k in SAVED_OPTIONS},
            "server_profile": server_profile_entry(options),  # the server type used and how it was decided
            # How this process built --dataset (tokenizer or estimates, items, notes); a master builds none.
            "dataset": self.dataset_info or {"spec": getattr(options, "dataset", "fixed")},
            "timeline": timeline,
            "workers": self.workers,
        }
        write_run(self.run_dir, data)


def check_options(options) -> None:
    """Every check of the suite's options that needs no server; raises ValueError with a one-line message."""
    opts_mod.check(options)
    check_dataset(options)


def register(environment) -> RunContext:
    """Attach the suite to an environment (call from an `init` listener)."""
    events = environment.events
    for name in SUITE_EVENTS:
        if not hasattr(events, name):
            setattr(events, name, EventHook())
    ctx = RunContext(environment)
    environment.vllm_loadtest = ctx
    events.test_start.add_listener(ctx.on_test_start)
    events.test_stopping.add_listener(ctx.on_test_stopping)
    events.test_stop.add_listener(ctx.on_test_stop)
    events.llm_request.add_listener(ctx.on_record)
    if ctx.is_controller:  # --step-duration auto: the shape's live view of the current step
        events.llm_request.add_listener(ctx.tracker.adaptive.on_record)
        getattr(events, RECORDS_EVENT).add_listener(ctx.tracker.adaptive.on_lines)
        events.llm_request.add_listener(ctx.tracker.capacity.on_record)  # --find-capacity: the running probe
        getattr(events, RECORDS_EVENT).add_listener(ctx.tracker.capacity.on_lines)
    events.quitting.add_listener(ctx.on_quitting)
    if getattr(environment, "web_ui", None) is not None and ctx.is_controller:
        # Registered after the run context: its test_start resolves the run directory the tab reads, and its
        # test_stop has finished the run when the tab's runs.
        LLMTab(environment, latest_samples=ctx.latest_samples)
    return ctx


def _deliver_signals_to_the_main_greenlet() -> None:
    """Ctrl-C and SIGTERM become a KeyboardInterrupt in the main greenlet, where Locust handles it by stopping
    the users and firing test_stop (which writes the results).

    Python's own SIGINT handler raises KeyboardInterrupt in whatever greenlet is running: seen here killing a
    user in the middle of writing its record, so a completed request was lost. And in a headless run with a
    load shape, Locust waits on the shape before installing its SIGTERM handler, so SIGTERM killed the process
    without writing anything. (Locust's own SIGTERM handler replaces this one where it does get installed.)"""
    main = greenlet.getcurrent()

    def handler() -> None:
        logger.warning("Interrupted: stopping the run and writing the results")
        main.throw(KeyboardInterrupt)

    gevent.signal_handler(signal.SIGINT, handler)
    gevent.signal_handler(signal.SIGTERM, handler)


def apply_users_shortcut(options) -> str | None:
    """Plain Locust habits keep working with the stepped shape: headless `-u 16 -t 60s` without --steps runs one
    step of 16 users for 60 s (Locust itself ignores -u and -t when a locustfile has a shape)."""
    if not options.headless or options.num_users is None or options.steps != opts_mod.DEFAULT_STEPS:
        return None
    if getattr(options, "rates", ""):
        # Said, not silently ignored (Locust ignores -u with a shape): an open-loop run's users are its pool.
        users = options.num_users
        return f"-u {users} is ignored with --rates: each rate step runs {options.max_users} users (--max-users)"
    options.steps = str(options.num_users)
    if options.run_time and options.step_duration == opts_mod.DEFAULT_STEP_DURATION:
        options.step_duration = f"{options.run_time}s"
        if opts_mod.parse_duration(options.step_warmup, "--step-warmup", allow_zero=True) >= options.run_time:
            options.step_warmup = "0s"
    return (
        f"-u {options.num_users}{f' -t {options.run_time}s' if options.run_time else ''}: running one step "
        f"(--steps {options.steps} --step-duration {options.step_duration} --step-warmup {options.step_warmup})"
    )


def _on_init(environment, **_kw) -> None:
    options = environment.parsed_options
    if options is not None:
        # Workers too: Ctrl-C in a terminal reaches every process of a --processes run.
        _deliver_signals_to_the_main_greenlet()
    if options is not None and options.headless and not isinstance(environment.runner, WorkerRunner):
        message = apply_users_shortcut(options)
        if message:
            logger.info(message)
    if options is not None and environment.runner is not None and not isinstance(environment.runner, WorkerRunner):
        try:
            check_options(options)
            if options.headless:
                check_run_dir(Path(options.run_dir or "reports"))
            if options.headless and options.host:
                preflight(options)
        except (ValueError, SetupError) as e:
            if options.headless:
                sys.stderr.write(f"error: {e}\n")
                sys.exit(EXIT_SETUP_ERROR)
            logger.error("%s (fix it in the start form)", e)
    register(environment)


def install(events=None) -> None:
    """Register the suite's arguments and its init listener on Locust's global events."""
    events = events or locust.events
    events.init_command_line_parser.add_listener(opts_mod.add_arguments)
    events.init.add_listener(_on_init)
