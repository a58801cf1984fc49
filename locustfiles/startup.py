"""A run's start, before any user: the options checked, Ctrl-C delivered where it stops the run cleanly, plain
Locust's `-u`/`-t` turned into one step, and the headless preflight (locustfiles/preflight.py)."""

from __future__ import annotations

import inspect
import logging
import signal
import sys
from pathlib import Path
from types import MappingProxyType

import gevent
import greenlet
from locust import argument_parser
from locust.runners import WorkerRunner

from . import conversation, diskspace, lora, request_options, trace_run
from . import options as opts_mod
from .datasets import check_dataset
from .exitcodes import EXIT_SETUP_ERROR
from .preflight import Built, SetupError, check_run_dir, preflight, remove_created

logger = logging.getLogger("vllm_loadtest")


def check_options(options, traces: trace_run.Traces | None = None) -> None:
    """Every check of the suite's options that needs no server; raises ValueError with a one-line message. `traces`:
    the process's, so that the trace read here is not read again."""
    trace_run.check(options, traces)  # first: --trace with --rates or --find-capacity is named as such
    opts_mod.check(options)
    request_options.check(options)  # --chat-template-kwargs, --tools, --tool-choice, --extra-body
    check_dataset(options)
    conversation.check(options)  # --turns, --history, --think-time (with --dataset and --trace)
    lora.check(options)  # --lora-mix's form, with --endpoint and --trace


class NoStopCallerLookup:
    """`inspect` as locust.runners sees it, without `stack()`.

    Runner.stop() looks up its caller for a debug line with inspect.stack(), which resolves every frame's source
    (inspect.getmodule: a realpath per module imported since the last lookup): measured with gevent's blocking
    monitor, 30-40 ms with the event loop blocked right when the stop begins, while the last requests are still
    being read. Their first tokens then arrived together with later ones, and their TTFT came out 30-40 ms long
    (tests/benchmarks/bench_last_records.py). Raising here sends Locust to its own fallback ("couldn't determine
    where stop() was called from"), at debug level; nothing else in locust.runners uses inspect."""

    def __getattr__(self, name: str):
        return getattr(inspect, name)

    @staticmethod
    def stack(context: int = 1):
        raise RuntimeError("the caller lookup is skipped: it blocks the event loop while streams are read")


def compute_locust_defaults_once() -> None:
    """A worker's spawn handler keeps the master's own options with `k not in default_args_dict()`, a call that builds
    and parses Locust's whole argument parser, made once per option in the message (124 with the suite's): 0.3 CPU-s
    with the worker's event loop blocked at every step change, chunks stamped up to 0.5 s late, and on a busy machine
    no heartbeat for seconds (tests/benchmarks/bench_spawn_message.py). Locust's defaults are fixed in a process."""
    locusts = getattr(argument_parser.default_args_dict, "__wrapped__", argument_parser.default_args_dict)
    defaults = MappingProxyType(locusts())

    def locust_defaults() -> MappingProxyType:
        return defaults

    locust_defaults.__wrapped__ = locusts  # Locust's own, for the next environment of the process (tests)
    argument_parser.default_args_dict = locust_defaults


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
    if options.rates or trace_run.active(options):
        # Said, not silently ignored (Locust ignores -u with a shape): an open-loop run's users are its pool.
        users = options.num_users
        flag = "--rates: each rate step" if options.rates else "--trace: the replay"
        return f"-u {users} is ignored with {flag} runs {options.max_users} users (--max-users)"
    options.steps = str(options.num_users)
    if options.run_time and options.step_duration == opts_mod.DEFAULT_STEP_DURATION:
        options.step_duration = f"{options.run_time}s"
        if opts_mod.parse_duration(options.step_warmup, "--step-warmup", allow_zero=True) >= options.run_time:
            options.step_warmup = "0s"
    return (
        f"-u {options.num_users}{f' -t {options.run_time}s' if options.run_time else ''}: running one step "
        f"(--steps {options.steps} --step-duration {options.step_duration} --step-warmup {options.step_warmup})"
    )


def fit_default_warmup(options) -> str | None:
    """The default --step-warmup (5 s) in steps shorter than 10 s would leave half a step or less to measure (none
    at 5 s): a fifth of the step instead, said in one line. A warm-up given explicitly is checked as given."""
    if options.step_warmup != opts_mod.DEFAULT_STEP_WARMUP:
        return None
    try:
        duration = opts_mod.parse_step_duration(options.step_duration)
    except ValueError:
        return None  # check_options says what is wrong with it
    if duration is None or opts_mod.parse_duration(options.step_warmup, "--step-warmup") < duration / 2:
        return None
    options.step_warmup = f"{duration / 5:g}s"
    return f"--step-warmup {options.step_warmup}: a fifth of each {options.step_duration} step (5s is for longer steps)"


def prepare(environment) -> Built:
    """At Locust's init, before any load: signals, the -u shortcut, every check of the options, and the headless
    preflight (the server answers, the dataset and trace are built); bad input exits with one `error:` line and
    code 3 (headless) or is said in the web UI. Returns what the preflight built, for the process's RunContext."""
    options = environment.parsed_options
    if options is not None:
        # Workers too: Ctrl-C in a terminal reaches every process of a --processes run.
        _deliver_signals_to_the_main_greenlet()
    if options is not None and options.headless and not isinstance(environment.runner, WorkerRunner):
        for message in (apply_users_shortcut(options), fit_default_warmup(options)):
            if message:
                logger.info(message)
    built = Built()
    if options is not None and environment.runner is not None and not isinstance(environment.runner, WorkerRunner):
        created: list[Path] = []
        try:
            check_options(options, built.traces)
            if options.headless:
                # Created and written before any load (a probe file); the default's timestamped folder is made
                # under reports/ at the start, on the same disk.
                run_dir = Path(options.run_dir or "reports")
                created = check_run_dir(run_dir)
                warning = diskspace.before_run(options, run_dir)
                if warning:
                    logger.warning(warning)
            if options.headless and options.host:
                preflight(options, built)
                lora.preflight(options)  # --lora-mix: auto's adapters found, given names served
        except (ValueError, SetupError) as e:
            remove_created(created)  # a run that does not start leaves no empty run directory behind
            if options.headless:
                sys.stderr.write(f"error: {e}\n")
                sys.exit(EXIT_SETUP_ERROR)
            logger.error("%s (fix it in the start form)", e)
    return built
