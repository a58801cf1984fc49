"""Locust in the test's own process: the suite's option parser, and a local-runner run of a user class."""

from __future__ import annotations

import time
from pathlib import Path

import gevent
import locust  # noqa: F401 - imported first: it monkey-patches the standard library for gevent
from locust.argument_parser import get_parser
from locust.env import Environment
from locust.event import Events
from vllm_loadtest.locustfiles import plugin, settings


def parse_options(*args: str):
    """Locust's own parser (get_parser) with the suite's arguments registered, as a locustfile run has it."""
    parser = get_parser(default_config_files=[])
    if not any(a.dest == "max_tokens" for a in parser._actions):
        settings.add_arguments(parser)
    return parser.parse_args(list(args))


def _finished(env) -> int:
    """The requests this process has recorded so far."""
    writer = env.vllm_loadtest.writer
    return 0 if writer is None else writer.count


def run_in_process(
    user_class,
    host: str,
    run_dir: Path,
    *args: str,
    users: int | None = None,
    seconds: float | None = None,
    shape=None,
    timeout: float = 120,
    stop_timeout: float | None = None,
    min_records: int = 0,
):
    """Run Locust in this process (local runner) and return its environment once the run has stopped. Without a
    shape the run lasts `seconds`, and longer (up to `timeout`) until `min_records` requests have finished: what a
    test needs of the run, not a bet on how fast a busy machine gets there."""
    opts = parse_options("--host", host, "--run-dir", str(run_dir), "--headless", *args)
    env = Environment(user_classes=[user_class], events=Events(), parsed_options=opts, host=host, shape_class=shape)
    if stop_timeout is not None:
        env.stop_timeout = stop_timeout  # let in-flight requests finish instead of cutting them off
    runner = env.create_local_runner()
    plugin.register(env)
    if shape is not None:
        runner.start_shape()
        deadline = time.monotonic() + timeout
        gevent.sleep(0.5)
        while runner.state not in ("stopped",) and time.monotonic() < deadline:
            gevent.sleep(0.2)
        if runner.state != "stopped":
            runner.quit()
            raise AssertionError("shape run did not stop in time")
    else:
        runner.start(users, spawn_rate=max(100, users))
        deadline = time.monotonic() + timeout
        gevent.sleep(seconds)
        while _finished(env) < min_records and time.monotonic() < deadline:
            gevent.sleep(0.1)
        runner.stop()
    runner.quit()
    return env
