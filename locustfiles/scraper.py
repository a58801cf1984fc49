"""Polls the server's Prometheus `/metrics` and each GPU exporter (`--gpu-metrics-url`, NVIDIA's dcgm-exporter)
during a run (master or local runner only) into metrics.jsonl.

The polling and parsing run in a child process (`python -m vllm_loadtest.locustfiles.scraper`), not in the load
generator's event loop: parsing vLLM 0.32's 53 KB of metrics text with prometheus_client takes ~14 ms, and in a
local run that stalled every stream's timestamps for that long once a second (a 1 % tail: exactly a p99). The parent
only reads one status line per scrape from the child's stdout.

A failed scrape is a gap (an `up = 0` sample with its error), warned about once per endpoint, and never stops the
run. Each endpoint is polled by its own thread of the child, on its own schedule: a GPU exporter that hangs for its
timeout does not delay the server's scrapes (the counters' baselines), nor the other way round. A GPU exporter's
lines carry its URL as `source`; the server's carry none (old runs read the same).
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
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import ClassVar

import orjson

from ..analysis.diskio import LineFile, WriteFailure
from ..analysis.prometheus_text import (
    SCRAPES_FILE,
    parse_gpu_samples,
    parse_samples,
    scrape_line,
    scrape_timeout_s,
)
from .declare import option

logger = logging.getLogger("vllm_loadtest.scraper")


@dataclass(frozen=True)
class ScrapeOptions:
    """The server's Prometheus metrics, scraped during the run."""

    GROUP: ClassVar[str] = "Server"

    metrics_url: str = option(
        "--metrics-url",
        "",
        "Prometheus endpoint of the server, scraped during the run. Default: <host>/metrics; 'off' to disable",
    )
    scrape_interval: float = option(
        "--scrape-interval",
        1.0,
        "Seconds between two scrapes of --metrics-url (and of each --gpu-metrics-url)",
    )


@dataclass(frozen=True)
class GpuOptions:
    """GPU telemetry (dcgm-exporter) and the roofline's GPU figures."""

    GROUP: ClassVar[str] = "Server"

    gpu_metrics_url: list[str] | None = option(  # noqa: RUF009 (None: nothing given; a list once parsed)
        "--gpu-metrics-url",
        None,
        "A GPU exporter's Prometheus endpoint (NVIDIA dcgm-exporter, e.g. http://gpu-node:9400/metrics), "
        "scraped beside --metrics-url for steps.csv's GPU columns; repeat it once per GPU host (the "
        "environment variable takes several, separated by commas or spaces)",
    )
    gpu: str = option(
        "--gpu",
        "",
        "The server's accelerator, for the efficiency ceiling: a preset memory bandwidth (h100-sxm, "
        "a100-80gb-sxm, l40s, l4, mi300x, ...; see docs/explanation/options-in-depth.md)",
    )
    memory_bandwidth_gbs: float | None = option(
        "--memory-bandwidth-gbs",
        None,
        "The accelerator's memory bandwidth in GB/s (overrides --gpu), for the efficiency ceiling",
    )
    model_bytes: str = option(
        "--model-bytes",
        "",
        "The model's weight size (e.g. 16GB, 15.3GiB), for the efficiency ceiling (vLLM does not report it)",
    )


FIRST_SCRAPE_WAIT_S = 30.0  # the first scrape is the counters' baseline: the run waits for it (timeout x 2 + startup)


class MetricsScraper:
    """The parent's handle on the scraping child process: start, counts, the latest samples, stop."""

    def __init__(
        self,
        url: str,
        interval_s: float,
        run_dir: Path,
        model: str | None = None,
        server: str = "vllm",
        gpu_urls: list[str] | tuple[str, ...] = (),
        warned: set[str] | frozenset[str] = frozenset(),
    ) -> None:
        self.url = url  # the server's /metrics; "" when only GPU exporters are scraped
        self.gpu_urls = list(gpu_urls)
        self.model = model
        self.server = server  # the profile name: the child process maps the server's names with it
        self.interval_s = interval_s
        self.path = Path(run_dir) / SCRAPES_FILE
        self.timeout_s = scrape_timeout_s(interval_s)
        self._proc = None
        self._reader = None
        self._first = None
        self._warned = False
        self.scrapes = 0
        self.gaps = 0
        self.last_samples: list[tuple[str, dict, float]] | None = None  # the latest successful scrape (live view)
        # Per GPU exporter: its scrapes and gaps; an endpoint the preflight already warned about is not warned again.
        self.gpu_scrapes = dict.fromkeys(self.gpu_urls, 0)
        self.gpu_gaps = dict.fromkeys(self.gpu_urls, 0)
        self._gpu_warned = set(warned)

    def start(self) -> MetricsScraper:
        import gevent
        import gevent.event
        from gevent import subprocess

        args = [
            sys.executable, "-m", __name__, "--interval", str(self.interval_s),
            "--timeout", str(self.timeout_s), "--out", str(self.path.resolve()),
        ]  # fmt: skip
        if self.url:
            args += ["--url", self.url]
        for gpu_url in self.gpu_urls:
            args += ["--gpu-url", gpu_url]
        if self.model:
            args += ["--model", self.model]
        args += ["--server", self.server]
        root = Path(__file__).resolve().parents[1]
        self._first = gevent.event.Event()
        self._proc = subprocess.Popen(args, cwd=root, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._reader = gevent.spawn(self._read_status)
        # The first scrape before any user starts: it is the baseline of every counter (integrity check). GPU
        # exporters serve gauges only: nothing to wait for.
        if self.url and not self._first.wait(FIRST_SCRAPE_WAIT_S):
            logger.warning("the metrics scraper has not reported its first scrape after %.0f s", FIRST_SCRAPE_WAIT_S)
        return self

    def _read_status(self) -> None:
        for line in self._proc.stdout:
            status = orjson.loads(line)
            if status.get("write_error") is not None:  # metrics.jsonl cannot be written: said once, here
                logger.warning("%s: the scrapes go on unrecorded (%s)", status["write_error"], status["fix"])
                continue
            if status.get("source") is not None:
                self._gpu_status(status)
                continue
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

    def _gpu_status(self, status: dict) -> None:
        """A GPU exporter's scrape: counted; its first failure warned about, once for the whole run."""
        source = status["source"]
        self.gpu_scrapes[source] = self.gpu_scrapes.get(source, 0) + 1
        error = status.get("error")
        if error is None and status.get("samples", 0) > 0:
            return
        if error is not None:
            self.gpu_gaps[source] = self.gpu_gaps.get(source, 0) + 1
        if source in self._gpu_warned:
            return
        self._gpu_warned.add(source)
        if error is not None:
            logger.warning(
                "cannot scrape the GPU metrics at %s (%s); recording gaps, the run goes on (check --gpu-metrics-url)",
                source,
                error,
            )
        else:
            logger.warning(
                "%s serves no DCGM_ series; its GPU columns stay empty (point --gpu-metrics-url at a dcgm-exporter)",
                source,
            )

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


def scrape_gpu_once(url: str, timeout_s: float) -> bytes:
    """One scrape of a GPU exporter as a metrics.jsonl line: its DCGM_ samples as DCGM names them, with every label
    (never renamed by the server's profile), or a gap with its error; `source` is the URL."""
    t = time.time()
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            t = time.time()  # stamped when the answer arrived, as the server's
            body = response.read()
        return scrape_line(t, parse_gpu_samples(body.decode("utf-8", errors="replace")), source=url)
    except urllib.error.HTTPError as e:
        return scrape_line(t, None, f"HTTP {e.code}", source=url)
    except Exception as e:  # any failure is a gap: the load test goes on
        return scrape_line(t, None, f"{type(e).__name__}: {e}", source=url)


def gpu_status(line: bytes) -> bytes:
    """What the parent reads of a GPU scrape: its source, error and sample count (not the samples: the parent shares
    its event loop with the users in a local run, and a DCGM scrape of 8 GPUs is ~60 KB)."""
    scrape = orjson.loads(line)
    n = len(scrape["samples"]) if scrape.get("samples") is not None else 0
    status = {"source": scrape["source"], "t": scrape["t"], "error": scrape.get("error"), "samples": n}
    return orjson.dumps(status, option=orjson.OPT_APPEND_NEWLINE)


def main() -> None:
    ap = argparse.ArgumentParser(description="scrape Prometheus endpoints until stdin closes (run by the plugin)")
    ap.add_argument("--url", help="the server's /metrics (its samples renamed by --server's profile)")
    ap.add_argument("--gpu-url", action="append", default=[], help="a GPU exporter (dcgm-exporter); repeatable")
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
    lock = threading.Lock()  # one line at a time, in the file and on stdout

    def tell(status: bytes) -> None:
        try:
            sys.stdout.buffer.write(status)
            sys.stdout.buffer.flush()
        except BrokenPipeError:  # the parent is gone: its file still gets this last scrape
            pass

    try:
        out: LineFile | None = LineFile(a.out, unit="scrapes")
    except WriteFailure as e:  # the parent says it, once; the scrapes still feed its live view
        out = None
        tell(write_error_status(e))
    # Each scrape is one complete line or none (a full disk truncates it away); the first failed write is told
    # to the parent, which says it once: the scrapes go on for its live view, unrecorded.

    def emit(line: bytes, status: bytes) -> None:
        with lock:
            if out is not None:
                try:
                    out.write(line)
                except WriteFailure as e:
                    tell(write_error_status(e))
            tell(status)

    def poll(scrape, status) -> None:
        next_at = time.monotonic()
        while True:
            line = scrape()
            emit(line, status(line))
            if stop.is_set():
                return
            next_at += a.interval
            if stop.wait(max(0.0, next_at - time.monotonic())):
                line = scrape()  # the last scrape: the counters cover the whole run
                emit(line, status(line))
                return

    pollers = []
    if a.url:  # the parent reads the server's whole line: its live view shows the latest samples
        pollers.append((partial(scrape_once, a.url, a.timeout, a.model, a.server), bytes))
    for gpu_url in dict.fromkeys(a.gpu_url):  # each exporter once, even when given twice
        pollers.append((partial(scrape_gpu_once, gpu_url, a.timeout), gpu_status))
    threads = [threading.Thread(target=poll, args=p, daemon=True) for p in pollers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if out is not None:
        out.close(sync=False)


def write_error_status(failure: WriteFailure) -> bytes:
    """The status line telling the parent that metrics.jsonl cannot be written."""
    return orjson.dumps({"write_error": str(failure), "fix": failure.fix}, option=orjson.OPT_APPEND_NEWLINE)


if __name__ == "__main__":
    main()
