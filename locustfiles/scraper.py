"""Polls the server's Prometheus `/metrics` during a run (master or local runner only) into metrics.jsonl.

A failed scrape is a gap (an `up = 0` sample with its error), warned about once, and never stops the run.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import gevent
from geventhttpclient import HTTPClient
from geventhttpclient.url import URL

from analysis.server_metrics import SCRAPES_FILE, parse_samples, scrape_line

logger = logging.getLogger("vllm_loadtest.scraper")


class MetricsScraper:
    def __init__(self, url: str, interval_s: float, run_dir: Path, model: str | None = None) -> None:
        self.url = URL(url)
        self.model = model
        self.interval_s = interval_s
        self.path = Path(run_dir) / SCRAPES_FILE
        self._file = open(self.path, "ab", buffering=0)
        self._greenlet: gevent.Greenlet | None = None
        self._warned = False
        self.scrapes = 0
        self.gaps = 0
        self.last_samples: list[tuple[str, dict, float]] | None = None  # the latest successful scrape (live view)
        timeout = max(1.0, min(5.0, interval_s * 2))
        self._client = HTTPClient.from_url(self.url, connection_timeout=timeout, network_timeout=timeout)

    def start(self) -> MetricsScraper:
        # The first scrape now, before any user starts: it is the baseline of every counter (integrity check).
        self.scrape_once()
        self._greenlet = gevent.spawn(self._loop)
        return self

    def scrape_once(self) -> None:
        t = time.time()
        try:
            response = self._client.get(self.url.request_uri)
            # Stamped when the answer arrived: a busy server renders its metrics well after the request was sent
            # (hundreds of ms at saturation), and the counters belong to that later moment.
            t = time.time()
            body = response.read()
            if response.status_code != 200:
                raise ValueError(f"HTTP {response.status_code}")
            samples = parse_samples(body.decode("utf-8", errors="replace"), model=self.model)
            line = scrape_line(t, samples)
            self.last_samples = samples
        except Exception as e:  # any failure is a gap: the load test goes on
            self.gaps += 1
            self.last_samples = None  # the live view shows the server's numbers as missing, not stale
            line = scrape_line(t, None, f"{type(e).__name__}: {e}")
            if not self._warned:
                self._warned = True
                logger.warning(
                    "cannot scrape %s (%s: %s); recording gaps, the run goes on (set --metrics-url)",
                    self.url,
                    type(e).__name__,
                    e,
                )
        self.scrapes += 1
        self._file.write(line)

    def _loop(self) -> None:
        next_at = time.monotonic()
        while True:
            next_at += self.interval_s
            gevent.sleep(max(0.0, next_at - time.monotonic()))
            self.scrape_once()

    def stop(self) -> None:
        """Stop polling after one last scrape, so the counters cover the whole run."""
        if self._greenlet is not None:
            self._greenlet.kill(block=True)
            self._greenlet = None
            self.scrape_once()
        self._client.close()
        self._file.close()
