"""Real Locust processes, started as a user starts them: headless runs, a web UI, a master with its workers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.helpers.net import free_port
from tests.helpers.paths import LOCUSTFILE, ROOT


def locust_command(*args: str, headless: bool = True, locustfile: str = LOCUSTFILE) -> list[str]:
    """`python -m locust -f <the suite's locustfile> [--headless] ARGS` with this interpreter; a --processes run gets
    a master port of its own."""
    if "--processes" in args and "--master-bind-port" not in args:
        # Its master listens on 5557 by default: two such runs at once (pytest -n, or another checkout's tests on the
        # same machine) would each take the other's workers.
        port = str(free_port())
        args = (*args, "--master-bind-port", port, "--master-port", port)
    return [sys.executable, "-m", "locust", "-f", locustfile, *(["--headless"] if headless else []), *args]


def locust(*args: str, cwd=None, env=None, timeout=120, locustfile: str = LOCUSTFILE) -> subprocess.CompletedProcess:
    """A headless run to its end (in the repository unless cwd), its output captured."""
    return subprocess.run(
        locust_command(*args, locustfile=locustfile),
        cwd=cwd or ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def short_run(host: str, run_dir, *args: str) -> subprocess.CompletedProcess:
    """Two 2 s steps (1 and 2 users, no warm-up) of 8-token requests: the shortest run with a table and a report."""
    return locust(
        "--host", host, "--steps", "1,2", "--step-duration", "2s", "--step-warmup", "0s", "--max-tokens", "8",
        "--run-dir", str(run_dir), *args,
    )  # fmt: skip


def start_locust(args: list[str], log: Path) -> subprocess.Popen:
    """`locust -f <locustfile> ARGS` in the background, in its own process group, logging to `log`."""
    return subprocess.Popen(
        locust_command(*args, headless=False),
        cwd=ROOT,
        stdout=open(log, "w"),  # the child keeps the descriptor; the parent exits the test soon
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def wait_until(
    condition: Callable[[], bool], timeout: float, interval: float = 0.1, sleep: Callable[[float], None] = time.sleep
) -> bool:
    """Poll `condition` until it holds (True) or `timeout` seconds have passed (False). `sleep=gevent.sleep` lets
    this process's greenlets run meanwhile (an xdist worker's standard library is not patched)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        sleep(interval)
    return True


def kill_still_running(*procs: subprocess.Popen) -> None:
    """SIGKILL the process group of each process that has not exited yet, and reap it."""
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


@contextmanager
def cluster(tmp_path: Path, n_workers: int, host: str, *args: str) -> Iterator[tuple[subprocess.Popen, list]]:
    """A headless master on a free loopback port and `n_workers` workers, logging to tmp_path/master.log and
    tmp_path/worker<i>.log; whatever still runs when the block ends is killed."""
    port = free_port()
    master = start_locust(
        ["--master", "--headless", "--expect-workers", str(n_workers), "--master-bind-host", "127.0.0.1",
         "--master-bind-port", str(port), "--host", host, *args],
        tmp_path / "master.log",
    )  # fmt: skip
    workers = [
        start_locust(
            ["--worker", "--master-host", "127.0.0.1", "--master-port", str(port)], tmp_path / f"worker{i}.log"
        )
        for i in range(n_workers)
    ]
    try:
        yield master, workers
    finally:
        kill_still_running(master, *workers)
