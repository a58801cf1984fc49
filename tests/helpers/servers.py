"""A handle on a running tests/fakeserver.py process (a subprocess, so its timing is exact)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

from tests.helpers.paths import ROOT


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
