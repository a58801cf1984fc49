"""The run directory's disk: the free space a run needs, warned about before the load when its rate is known and
during the run from the rate the disk is measured to fill at (the run itself stops when a record cannot be
written: locustfiles/plugin.py, analysis/diskio.py).

    line = before_run(options, run_dir)        # a warning line, or None
    watch = DiskWatch(run_dir, planned_s).start()   # the controller, at test_start; watch.stop() at test_stop

Why two checks: an open loop (--rates) knows its requests before it starts (rate x duration per step), so their
records' size is known up to their output lengths (--max-tokens, or --max-tokens-dist's mean). A closed loop's
rate is the server's answer to its users (users / request time): unknown until it runs, and no assumption would
hold from a tiny model to a large one. So the closed loop, and every run beside it, is watched instead: the free
space sampled every few seconds, its drop over the last minute is the rate the run fills the disk at (records,
scrapes, self-check samples, and anything else writing there), and when the disk would be full before the run's
planned end at that rate, one warning says so. The rate grows with the load step by step; the warning comes when
it does.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import gevent

from ..analysis import kinds
from ..analysis.diskio import fill_forecast, free_bytes, record_bytes, size_text
from ..analysis.schedule import parse_rates
from . import options as opts_mod
from . import trace_run

logger = logging.getLogger("vllm_loadtest")

WATCH_INTERVAL_S = 5.0
# A run whose length is not planned (a capacity search, a trace replay) is warned when its disk fills within this.
UNPLANNED_HORIZON_S = 600.0


def planned_seconds(options) -> float | None:
    """The run's planned length: its steps (or rates) times --step-duration (with auto, --max-step-duration: an
    upper bound) times --repeat's trials; None for a capacity search or a trace replay, whose length depends on the
    server."""
    if str(options.find_capacity or "").strip() or trace_run.active(options):
        return None
    try:
        rates = options.rates or ""
        n = len(parse_rates(rates)) if rates else len(opts_mod.parse_steps(options.steps))
        duration = opts_mod.parse_step_duration(options.step_duration)
        if duration is None:
            maximum = options.max_step_duration
            duration = opts_mod.parse_duration(maximum, "--max-step-duration")
        trials = max(1, int(options.repeat))
    except (ValueError, AttributeError, TypeError):
        return None  # refused by the option checks; nothing to plan
    return n * duration * trials


def expected_output_tokens(options) -> float:
    """The mean output length the options ask for: --max-tokens, or --max-tokens-dist's mean (a uniform's middle, a
    normal's mean); 0 for a kind that does not stream (no per-token lists in its records)."""
    if not kinds.of(options.endpoint).streams:
        return 0.0
    dist = str(options.max_tokens_dist or "").strip().lower()
    kind, _, rest = dist.partition(":")
    try:
        a, b = (float(x) for x in rest.split(":"))
    except ValueError:
        return float(options.max_tokens)
    return (a + b) / 2 if kind == "uniform" else a


def before_run(options, run_dir: Path) -> str | None:
    """The warning line when the free space of `run_dir`'s disk is below what an open loop's records need (its
    scheduled requests x the record size of its output length); None when it suffices, or for a closed loop."""
    rates_text = options.rates or ""
    if not rates_text or planned_seconds(options) is None:
        return None
    free = free_bytes(run_dir)
    if free is None:
        return None
    rates = parse_rates(rates_text)
    step_s = planned_seconds(options) / len(rates)  # each rate's time over all its trials
    requests = sum(rates) * step_s
    tokens = expected_output_tokens(options)
    need = requests * record_bytes(tokens)
    if free >= need:
        return None
    return (
        f"the disk of {run_dir} has {size_text(free)} free, and this run's {requests:,.0f} scheduled requests need "
        f"about {size_text(need)} of records alone ({size_text(record_bytes(tokens))} per {tokens:.0f}-token "
        f"request): it will fill, and the run stop, before the end; free space, or pass --run-dir on a larger disk"
    )


def _duration_text(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


class DiskWatch:
    """The controller's watch on its run directory's disk during a run: one warning when, at the rate the free
    space drops, the disk is full before the planned end of the run."""

    def __init__(self, run_dir: Path, planned_s: float | None, interval_s: float = WATCH_INTERVAL_S) -> None:
        self.run_dir = Path(run_dir)
        self.planned_s = planned_s
        self.interval_s = interval_s
        self.samples: list[tuple[float, int]] = []
        self.warned: str | None = None
        self._greenlet: gevent.Greenlet | None = None
        self._began = time.monotonic()

    def start(self) -> DiskWatch:
        self._began = time.monotonic()
        self._greenlet = gevent.spawn(self._loop)
        return self

    def stop(self) -> None:
        if self._greenlet is not None:
            self._greenlet.kill(block=False)
            self._greenlet = None

    def _loop(self) -> None:
        while self.warned is None:
            self.check(time.monotonic())
            gevent.sleep(self.interval_s)

    def check(self, now: float) -> str | None:
        """Sample the free space; the warning line, logged, when the disk now fills before the end (once)."""
        free = free_bytes(self.run_dir)
        if free is None or self.warned is not None:
            return None
        self.samples.append((now, free))
        self.samples = [s for s in self.samples if now - s[0] <= 2 * 60.0]
        forecast = fill_forecast(self.samples)
        if forecast is None:
            return None
        if self.planned_s is not None:
            left = self.planned_s - (now - self._began)
            if left <= 0 or forecast.full_in_s >= left:
                return None
            end = f"before the run's planned end in {_duration_text(left)}"
        elif forecast.full_in_s < UNPLANNED_HORIZON_S:
            end = "(this run's length is not planned: a capacity search or a trace replay)"
        else:
            return None
        self.warned = (
            f"the disk of {self.run_dir} fills in about {_duration_text(forecast.full_in_s)} at the rate this run "
            f"writes ({size_text(forecast.rate_bps)}/s over the last {forecast.span_s:.0f} s, {size_text(free)} "
            f"free), {end}; the run stops when a record cannot be written: free space, or pass --run-dir on a "
            "larger disk"
        )
        logger.warning(self.warned)
        return self.warned
