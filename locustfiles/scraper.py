"""Polls the server's Prometheus `/metrics` during a run (master or local runner only) into metrics.jsonl.

The polling and parsing run in a child process (`python -m vllm_loadtest.locustfiles.scraper`), not in the load
generator's event loop: parsing vLLM 0.32's 53 KB of metrics text with prometheus_client takes ~14 ms, and in a
local run that stalled every stream's timestamps for that long once a second (a 1 % tail: exactly a p99). The parent
only reads one status line per scrape from the child's stdout.

A failed scrape is a gap (an `up = 0` sample with its error), warned about once, and never stops the run.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import orjson

from ..analysis.prometheus_text import SCRAPES_FILE, parse_samples, scrape_line

logger = logging.getLogger("vllm_loadtest.scraper")

FIRST_SCRAPE_WAIT_S = 30.0  # the first scrape is the counters' baseline: the run waits for it (timeout x 2 + startup)


class MetricsScraper:
    """The parent's handle on the scraping child process: start, counts, the latest samples, stop."""

    def __init__(
        self, url: str, interval_s: float, run_dir: Path, model: str | None = None, server: str = "vllm"
    ) -> None:
        self.url = url
        self.model = model
        self.server = server  # the profile name: the child process maps the server's names with it
        self.interval_s = interval_s
        self.path = Path(run_dir) / SCRAPES_FILE
        self.timeout_s = max(1.0, min(5.0, interval_s * 2))
        self._proc = None
        self._reader = None
        self._first = None
        self._warned = False
        self.scrapes = 0
        self.gaps = 0
        self.last_samples: list[tuple[str, dict, float]] | None = None  # the latest successful scrape (live view)

    def start(self) -> MetricsScraper:
        import gevent
        import gevent.event
        from gevent import subprocess

        args = [
            sys.executable, "-m", __name__, "--url", self.url, "--interval", str(self.interval_s),
            "--timeout", str(self.timeout_s), "--out", str(self.path.resolve()),
        ]  # fmt: skip
        if self.model:
            args += ["--model", self.model]
        args += ["--server", self.server]
        root = Path(__file__).resolve().parents[1]
        self._first = gevent.event.Event()
        self._proc = subprocess.Popen(args, cwd=root, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._reader = gevent.spawn(self._read_status)
        # The first scrape before any user starts: it is the baseline of every counter (integrity check).
        if not self._first.wait(FIRST_SCRAPE_WAIT_S):
            logger.warning("the metrics scraper has not reported its first scrape after %.0f s", FIRST_SCRAPE_WAIT_S)
        return self

    def _read_status(self) -> None:
        for line in self._proc.stdout:
            status = orjson.loads(line)
            self.scrapes += 1
            if status.get("error") is None:
                self.last_samples = [tuple(s) for s in status["samples"]]
            else:
                self.gaps += 1
                self.last_samples = None  # the live view shows the server's numbers as missing, not stale
                if not self._warned:
                    self._warned = True
                    logger.warning(
                        "cannot scrape %s (%s); recording gaps, the run goes on (set --metrics-url)",
                        self.url,
                        status["error"],
                    )
            self._first.set()
        self._first.set()

    def stop(self) -> None:
        """Stop polling after one last scrape, so the counters cover the whole run."""
        if self._proc is None:
            return
        from gevent import subprocess

        try:
            self._proc.stdin.close()  # the child's signal to take its last scrape and exit
        except OSError:
            pass
        try:
            self._proc.wait(timeout=self.timeout_s * 2 + 5)
        except subprocess.TimeoutExpired:  # the child hangs; its file has every scrape it finished
            logger.warning("the metrics scraper did not stop in time; killed")
            self._proc.kill()
            self._proc.wait()
        self._reader.join(timeout=5)
        self._proc = None


def scrape_once(url: str, timeout_s: float, model: str | None, server: str = "vllm") -> bytes:
    """One scrape as a metrics.jsonl line: the samples (under the canonical names of `server`'s profile), or a gap
    with its error."""
    t = time.time()
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            # Stamped when the answer arrived: a busy server renders its metrics well after the request was sent
            # (hundreds of ms at saturation), and the counters belong to that later moment.
            t = time.time()
            body = response.read()
        text = body.decode("utf-8", errors="replace")
        return scrape_line(t, parse_samples(text, model=model, profile=server))
    except urllib.error.HTTPError as e:
        return scrape_line(t, None, f"HTTP {e.code}")
    except Exception as e:  # any failure is a gap: the load test goes on
        return scrape_line(t, None, f"{type(e).__name__}: {e}")


def main() -> None:
    ap = argparse.ArgumentParser(description="scrape a Prometheus endpoint until stdin closes (run by the plugin)")
    ap.add_argument("--url", required=True)
    ap.add_argument("--interval", type=float, required=True)
    ap.add_argument("--timeout", type=float, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model")
    ap.add_argument("--server", default="vllm", help="the server profile (analysis/servers) naming its series")
    a = ap.parse_args()
    # Ctrl-C reaches the whole process group: the parent stops this process itself, after its last scrape.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    stop = threading.Event()

    def wait_for_eof() -> None:
        sys.stdin.buffer.read()  # returns when the parent closes the pipe or dies
        stop.set()

    threading.Thread(target=wait_for_eof, daemon=True).start()
    with open(a.out, "ab", buffering=0) as out:

        def record() -> None:
            line = scrape_once(a.url, a.timeout, a.model, a.server)
            out.write(line)
            try:
                sys.stdout.buffer.write(line)
                sys.stdout.buffer.flush()
            except BrokenPipeError:  # the parent is gone: its file still gets this last scrape
                pass

        next_at = time.monotonic()
        while True:
            record()
            if stop.is_set():
                return
            next_at += a.interval
            if stop.wait(max(0.0, next_at - time.monotonic())):
                record()  # the last scrape: the counters cover the whole run
                return


if __name__ == "__main__":
    main()
