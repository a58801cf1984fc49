"""A handle on a running tests/fakeserver.py process (a subprocess, so its timing is exact)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

from tests.helpers.paths import ROOT


class FakeServer:
    """Handle on a running tests/fakeserver.py process."""

    script = "fakeserver.py"

    def __init__(self, args: list[str], port: int = 0) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / self.script), "--port", str(port), *args],
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

    def post(self, path: str, body: dict) -> dict:
        request = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(request, timeout=10) as r:
            return json.load(r)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


class FakeDCGM(FakeServer):
    """Handle on a running tests/fakedcgm.py process (a fake dcgm-exporter); its endpoint is `metrics_url`."""

    script = "fakedcgm.py"

    @property
    def metrics_url(self) -> str:
        return self.url + "/metrics"
