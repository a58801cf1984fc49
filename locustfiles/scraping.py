"""The server's /metrics and the GPU exporters over a run: the controller starts the scraper's child process
(locustfiles/scraper.py) as the run starts and stops it before the results are computed; its last scrape stays the
server's latest numbers for the web UI's tab."""

from __future__ import annotations

from ..analysis import servers
from . import options as opts_mod
from .scraper import MetricsScraper


class Scraping:
    """The controller's scraper: this run's, or the last run's once stopped."""

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.scraper: MetricsScraper | None = None

    def start(self, options, **_kw) -> None:
        self.scraper = None  # the last run's, if any: its numbers are not this run's
        url = options.metrics_url or (f"{(options.host or '').rstrip('/')}/metrics" if options.host else "")
        profile = servers.of_options(options)
        if not url or url == "off" or not profile.metrics:
            url = ""  # --server-type openai: no /metrics, and no series the suite could name
        gpu_urls = opts_mod.gpu_metrics_urls(options)  # checked before the run: valid here
        if not url and not gpu_urls:
            return
        # With --model the scraper keeps only that model's samples; otherwise the analysis filters by the model
        # the records name (a server serving several models labels each sample with its model_name).
        self.scraper = MetricsScraper(
            url,
            options.scrape_interval,
            self.ctx.run_dir,
            model=options.model or None,
            server=profile.name,
            gpu_urls=gpu_urls,
            warned=self.ctx.resources.gpu_unanswered,  # the preflight said so already: one warning per exporter
        ).start()

    def stop(self, **_kw) -> None:
        if self.scraper is not None:
            self.scraper.stop()  # kept: its last scrape stays the server's latest numbers (latest_samples)

    def latest_samples(self) -> list[tuple[str, dict, float]] | None:
        """The server's latest scrape: this run's, or the last run's last one (None when not scraped)."""
        return self.scraper.last_samples if self.scraper is not None else None


def register(environment, ctx) -> Scraping | None:
    """The controller's scraping, hooked into the run's phases (a worker scrapes nothing)."""
    if not ctx.is_controller:
        return None
    scraping = Scraping(ctx)
    ctx.run_events.started.add_listener(scraping.start)
    ctx.run_events.stopped.add_listener(scraping.stop)
    return scraping
