"""Loopback ports and small HTTP calls for the tests that talk to a web UI or a server."""

from __future__ import annotations

import json
import socket
import time
import urllib.parse
import urllib.request


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the OS picks it; another process may take it later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# A download the web UI builds in a subprocess (report.html, requests.parquet: python, pandas and plotly starting) took
# over 10 s beside the parallel contract tests on 2 cores (CI, 2026-12-03).
BUILD_TIMEOUT_S = 120


def get(url: str, timeout: float = 10) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def post(url: str, form: dict) -> dict:
    data = urllib.parse.urlencode(form).encode()
    with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=10) as r:
        return json.load(r)


def wait_for(url: str, timeout: float = 60) -> None:
    """Until GET url answers 2xx (no connection or an HTTP error: tried again), at most `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            get(url)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
