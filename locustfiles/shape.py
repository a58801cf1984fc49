"""The load plans, one `LoadTestShape` each: `StepsShape` (--steps 1,2,4,... users), `RatesShape` (--rates 1,2,4,...
requests/s from one pool of --max-users), `CapacityShape` (--find-capacity users|rate: probe by probe) and
`TraceShape` (--trace: the rows at their times). Each holds a step for --step-duration, the first --step-warmup
excluded, or with --step-duration auto until it has measured enough (analysis/adaptive.py) or for
--max-step-duration: the `StepLength` strategy they share.

`StepLoadShape`, the bundled locustfile's shape, is the plan the options ask for (`plan_for`), chosen again at every
start (the web UI's form may change them). A locustfile of one's own may name one plan directly. The shapes run on
the master (or the local runner); `tracker.StepTracker` carries the current step to every process.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import ClassVar

from locust import LoadTestShape

from ..analysis import adaptive, capacity
from ..analysis.schedule import ARRIVALS, DEFAULT_ARRIVAL, parse_rates
from ..analysis.slo import parse_slo
from . import trace_run
from .declare import option
from .distributed import SHIP_INTERVAL_S
from .exitcodes import EXIT_SETUP_ERROR
from .options import (
    DEFAULT_MAX_USERS,
    DEFAULT_STEP_DURATION,
    DEFAULT_STEP_WARMUP,
    DEFAULT_STEPS,
    parse_duration,
    parse_step_duration,
    parse_steps,
)
from .tracker import StepTracker

logger = logging.getLogger("vllm_loadtest")
LATE_RECORDS_S = 10.0  # a capacity probe waits at most this long past its window for its workers' records


@dataclass(frozen=True)
class LoadPlanOptions:
    """The stepped plan: users (closed loop) or rates (open loop) per step, and each step's length."""

    GROUP: ClassVar[str] = "Load plan"

    steps: str = option("--steps", DEFAULT_STEPS, "Comma-separated user counts, one load step each")
    rates: str = option(
        "--rates",
        "",
        "Open loop instead of --steps: comma-separated request rates (requests/s, all load processes "
        "together), one step each; requests are sent at scheduled times, whether or not earlier ones have "
        "ended",
    )
    arrival: str = option(
        "--arrival",
        DEFAULT_ARRIVAL,
        "With --rates: poisson (exponential times between requests, seeded by --seed), constant (evenly "
        "spaced) or gamma (gamma-distributed times between requests of shape --burstiness, seeded by --seed)",
        choices=list(ARRIVALS),
    )
    burstiness: float = option(
        "--burstiness",
        1.0,
        "With --arrival gamma: the gamma distribution's shape (1 = Poisson, below 1 burstier, above 1 "
        "smoother), as vLLM bench serve's --burstiness",
    )
    max_users: int = option(
        "--max-users",
        DEFAULT_MAX_USERS,
        "With --rates (or --find-capacity rate): the pool of users that send the scheduled requests (at most "
        "this many in flight); a request whose time comes while all are busy is sent late, and its lateness "
        "recorded. With --find-capacity users: the most users probed",
    )
    step_duration: str = option(
        "--step-duration",
        DEFAULT_STEP_DURATION,
        "Length of each step, its warm-up included (e.g. 30s, 2m: 30s with --step-warmup 5s measures 25 s), or "
        "auto: each step runs until its aggregate tok/s interval is within --ci-target and its TTFT p95 has enough "
        "samples, or until --max-step-duration",
    )
    step_warmup: str = option(
        "--step-warmup",
        DEFAULT_STEP_WARMUP,
        "Start of each step excluded from its statistics, inside --step-duration (e.g. 5s): the requests sent in it "
        "are recorded but not measured. Default 5s, a fifth of the step when --step-duration is under 10 s",
    )
    repeat: int = option(
        "--repeat",
        1,
        "Run the whole --steps or --rates plan this many times, one trial after another (trial 1: every step, then "
        "trial 2: every step again, ...); steps.csv pools each step's trials and adds across-trial intervals, "
        "trials.csv has each trial's own rows. Not with --find-capacity or --trace",
    )


@dataclass(frozen=True)
class AdaptiveOptions:
    """--step-duration auto: each step runs until its throughput's interval is narrow enough."""

    GROUP: ClassVar[str] = "Load plan"

    max_step_duration: str = option(
        "--max-step-duration",
        adaptive.DEFAULT_MAX_STEP_DURATION,
        "With --step-duration auto: the longest a step may run, warm-up included (e.g. 120s, 5m); a step that"
        " reaches it is flagged (end_reason max_duration)",
    )
    ci_target: str = option(
        "--ci-target",
        adaptive.DEFAULT_CI_TARGET,
        "With --step-duration auto: the 95%% interval half-width of a step's aggregate tok/s, relative to its"
        " value, at which the step ends (e.g. 5%% or 0.05)",
    )


@dataclass(frozen=True)
class CapacityOptions:
    """--find-capacity: a search for the highest load that meets --slo."""

    GROUP: ClassVar[str] = "SLO and capacity"

    find_capacity: str = option(
        "--find-capacity",
        "",
        "Search for the highest load meeting every --slo objective instead of running --steps: users (closed "
        "loop) or rate (open loop, with --arrival and --seed). Probes double from --start-users / --start-"
        "rate until an objective breaks, then bisect to --capacity-resolution; each probe is a step",
        choices=["", *capacity.MODES],
    )
    start_users: int = option(
        "--start-users",
        capacity.DEFAULT_START_USERS,
        "With --find-capacity users: the first probe's users (the probes stop at --max-users)",
    )
    start_rate: str = option(
        "--start-rate", capacity.DEFAULT_START_RATE, "With --find-capacity rate: the first probe's requests/s"
    )
    max_rate: str = option(
        "--max-rate",
        "",
        "With --find-capacity rate: the highest rate probed (requests/s). Default: no limit but the SLOs and "
        "the throughput",
    )
    capacity_resolution: str = option(
        "--capacity-resolution",
        capacity.DEFAULT_RESOLUTION,
        "With --find-capacity: bisect until the highest passing and the lowest failing probe are this close, "
        "relative to the passing one (e.g. 10%%; never finer than 1 user)",
    )


@dataclass(frozen=True)
class StepLength:
    """When a step ends: after --step-duration, or (None: auto) when its interval reaches --ci-target, or at
    --max-step-duration."""

    duration: float | None
    max_duration: float
    target: float

    @classmethod
    def of(cls, opts) -> StepLength:
        maximum = parse_duration(opts.max_step_duration, "--max-step-duration")
        target = adaptive.parse_ci_target(opts.ci_target)
        return cls(parse_step_duration(opts.step_duration), maximum, target)

    def end(self, tracker: StepTracker, elapsed_s: float) -> str | None:
        """Why the running step ends now (analysis/adaptive.END_REASONS), or None while it goes on."""
        if self.duration is not None:
            return adaptive.FIXED if elapsed_s >= self.duration else None
        if not tracker.timeline:  # the run was reset under the shape (a stop in the web UI): nothing to judge
            return None
        entry = tracker.timeline[-1]
        decision = tracker.adaptive.decide(
            entry["measure_start"], time.time(), elapsed_s, self.max_duration, self.target
        )
        if decision.checked:
            logger.debug("step %s after %.1f s: %s", entry["step"], elapsed_s, decision)
        if not decision.stop:
            return None
        entry["end_check"] = decision.to_dict()
        if decision.reason == adaptive.MAX_DURATION:
            logger.warning(
                adaptive.max_duration_line(
                    entry["step"], entry["users"], self.max_duration, self.target, decision.rel_half_width,
                    decision.ttft_samples,
                )
            )  # fmt: skip
        return decision.reason


def _spawn(users: int) -> tuple[int, float]:
    """A step's users spawned within a fraction of a second: the lab fires c requests at once."""
    return users, float(max(100, users))


class SuiteShape(LoadTestShape):
    """The suite's shapes: options read at the first tick of each start, the run ended at the next tick when the
    controller asks (a result file cannot be written: plugin.RunContext._write_failed)."""

    abstract = True

    def __init__(self) -> None:
        super().__init__()
        self.reset_time()

    def reset_time(self) -> None:
        super().reset_time()
        # A master's first start() calls this again after the first tick began step 0: keep a run in progress.
        ctx = getattr(getattr(getattr(self, "runner", None), "environment", None), "vllm_loadtest", None)
        if ctx is not None and ctx.tracker.state is not None:
            return
        self._ready = False  # re-read options on every start (web UI edits)
        self._index = -1
        self._step_began = 0.0

    @property
    def tracker(self) -> StepTracker:
        return self.runner.environment.vllm_loadtest.tracker

    def tick(self) -> tuple[int, float] | None:
        tracker = self.tracker
        if tracker.stop_requested:
            tracker.end(adaptive.RUN_STOPPED)
            return None
        if not getattr(self, "_ready", False):
            self.setup(self.runner.environment.parsed_options, tracker)
            self._ready = True
        # Each step is timed from its own beginning, not from the run's start: a master's start() blocks until
        # the workers confirm their users (up to seconds), which would otherwise eat into the following steps.
        return self.plan_tick(tracker, time.monotonic())

    def setup(self, opts, tracker: StepTracker) -> None:
        self.length = StepLength.of(opts)
        self.warmup = parse_duration(opts.step_warmup, "--step-warmup", allow_zero=True)
        tracker.adaptive.active = self.length.duration is None
        tracker.capacity.active = False

    def plan_tick(self, tracker: StepTracker, now: float) -> tuple[int, float] | None:
        raise NotImplementedError


class StepsShape(SuiteShape):
    """--steps: each user count in turn; with --repeat N the whole plan N times, one trial after another (a step's
    trials a whole plan apart, so they sample the slow drift a step's own interval cannot see)."""

    abstract = True

    def loads(self, opts) -> tuple[list[int], list[float] | None]:
        """Each step's users, and its rate (None: a closed loop)."""
        return parse_steps(opts.steps), None

    def setup(self, opts, tracker: StepTracker) -> None:
        super().setup(opts, tracker)
        self.steps, self.rates = self.loads(opts)
        self.trials = max(1, int(opts.repeat))

    def plan_tick(self, tracker: StepTracker, now: float) -> tuple[int, float] | None:
        """Step `_index` of the run is the plan's step `_index % S` of trial `_index // S + 1`: the timeline's step
        stays a unique running index (records are tagged with it), its entry carries plan_step and trial."""
        count = len(self.steps)
        reason = self.length.end(tracker, now - self._step_began) if self._index >= 0 else None
        if self._index < 0 or reason is not None:
            self._index += 1
            self._step_began = now
            if self._index >= count * self.trials:
                tracker.end(reason or adaptive.FIXED)
                return None
            plan_step, trial = self._index % count, self._index // count + 1
            rate = self.rates[plan_step] if self.rates else None
            repeat = (plan_step, trial, self.trials) if self.trials > 1 else None
            tracker.begin_step(self._index, self.steps[plan_step], self.warmup, rate, end_reason=reason, repeat=repeat)
        return _spawn(self.steps[self._index % count])


class RatesShape(StepsShape):
    """--rates: each rate in turn, from one pool of --max-users users at every step: no users stopped (and requests
    cut off) between steps, and enough of them that a free one is there at each intended time."""

    abstract = True

    def loads(self, opts) -> tuple[list[int], list[float] | None]:
        rates = parse_rates(opts.rates)
        return [opts.max_users] * len(rates), rates


@dataclass
class _Search:
    """A capacity search's settings and the probes judged so far (--find-capacity)."""

    mode: str
    objectives: list
    start: float
    maximum: float | None
    resolution: float
    probes: list = field(default_factory=list)

    def judge(self, tracker: StepTracker, until: float | None = None) -> capacity.Probe:
        """The last probe over its window up to `until` (its end), or as measured until now (a master: until a
        shipping interval ago)."""
        entry = tracker.timeline[-1]
        load = float(entry["rate_rps"]) if self.mode == capacity.RATE else float(entry["users"])
        end = until if until is not None else time.time() - tracker.adaptive.lag_s
        return tracker.capacity.judge(len(self.probes) + 1, load, self.objectives, entry["measure_start"], end)


def _search(opts) -> _Search:
    """The capacity search the options ask for."""
    mode = str(opts.find_capacity).strip()
    if mode == capacity.USERS:
        start, maximum = float(opts.start_users), float(opts.max_users)
    else:
        start, maximum = (
            capacity.parse_load(opts.start_rate, "--start-rate"),
            capacity.parse_load(opts.max_rate, "--max-rate"),
        )
    return _Search(mode, parse_slo(opts.slo), start, maximum, capacity.parse_resolution(opts.capacity_resolution))


class CapacityShape(SuiteShape):
    """--find-capacity: the loads chosen probe by probe (analysis/capacity.py) until the capacity is bracketed."""

    abstract = True

    def reset_time(self) -> None:
        super().reset_time()
        if not getattr(self, "_ready", False):
            self._draining = False  # a probe has ended, its users stopped; judged at the next tick
            self._pending: float | None = None  # a rate search: the next probe's rate, once its pool is up

    def setup(self, opts, tracker: StepTracker) -> None:
        super().setup(opts, tracker)
        self.search = _search(opts)
        self.pool = opts.max_users
        tracker.capacity.active = True
        tracker.capacity.itl = any(o.metric == "itl" for o in self.search.objectives)

    def _probe_end(self, tracker: StepTracker, reason: str | None, elapsed_s: float) -> str | None:
        """A probe that reached its interval target while an objective's interval still straddles its limit goes on,
        up to --max-step-duration, where it ends as MAX_DURATION: the search needs a verdict, not a narrow tok/s.
        (The maximum is also a check point that a narrow tok/s passes as CI_TARGET: without the bound, a 28-user
        probe against the real vLLM whose TTFT p95 straddled 200 ms ran 66 s of a 30 s maximum.)"""
        if reason != adaptive.CI_TARGET or not tracker.timeline:
            return reason
        probe = self.search.judge(tracker)
        if probe.verdict != capacity.UNCERTAIN:
            return reason
        maximum = self.length.max_duration
        if elapsed_s < maximum:
            logger.debug("probe %s at %s: uncertain, extended", probe.probe, probe.load)
            return None
        entry = tracker.timeline[-1]
        entry.setdefault("end_check", {}).update(reason=adaptive.MAX_DURATION, objective_straddled=True)
        straddling = ", ".join(c.objective for c in probe.checks if c.verdict == capacity.UNCERTAIN)
        logger.warning(
            "Probe %s (%s) reached --max-step-duration %.0f s with %s still straddling its limit: judged uncertain",
            probe.probe, capacity.load_text(probe.load, self.search.mode), maximum, straddling,
        )  # fmt: skip
        return adaptive.MAX_DURATION

    def _records_arrived(self, end_time: float) -> bool:
        """Whether every worker has shipped the records it finished in the probe's window (a local run: at once).
        Under load a worker's last batch can trail by seconds; a probe is judged without it after LATE_RECORDS_S."""
        ledger = getattr(self.runner.environment, "vllm_loadtest", None)
        ledger = ledger.ledger if ledger is not None else None
        if ledger is None or ledger.shipped_until() >= end_time + SHIP_INTERVAL_S:
            return True
        if time.time() - end_time < LATE_RECORDS_S:
            return False
        logger.warning("a worker's records of the probe's last %.1f s had not arrived after %.0f s: judged without "
                       "them", SHIP_INTERVAL_S, LATE_RECORDS_S)  # fmt: skip
        return True

    def plan_tick(self, tracker: StepTracker, now: float) -> tuple[int, float] | None:
        """A probe that ends is closed, its schedule stopped and its users stopped (their requests in flight recorded
        as cut off, and aborted at the server); once every worker has shipped its records of the window (a tick
        later; up to LATE_RECORDS_S on a busy machine), it is judged, and the next probe starts with all its users at
        once (a rate probe's pool is spawned first, its schedule one tick
        later). So every probe starts from an idle server, as its own benchmark would, and its verdict does not
        depend on the path of the search: a fake server of 8 slots met TTFT p95 <= 100 ms with 9 users carried over
        from 10 and broke it with 9 users started together; an overloaded rate probe's backlog slowed the next
        three probes."""
        search = self.search
        if self._pending is not None:  # a rate probe: its pool is up, its schedule starts now
            load, self._pending = self._pending, None
            return self._begin_probe(tracker, load, now)
        if self._draining:
            entry = tracker.timeline[-1]
            if not self._records_arrived(entry["end_time"]):
                return 0, float(max(100, entry["users"]))  # as the tick that stopped its users: nothing changes
            self._draining = False
            probe = search.judge(tracker, until=entry["end_time"])
            search.probes.append(probe)
            entry["probe_check"] = probe.to_dict(search.mode)  # the live verdict the search acted on
            logger.info(
                "Probe %s (%s): %s", probe.probe, capacity.load_text(probe.load, search.mode),
                probe.verdict + "".join(f"; {c.objective} {c.verdict}" for c in probe.checks),
            )  # fmt: skip
        elif self._index >= 0:
            elapsed = now - self._step_began
            reason = self._probe_end(tracker, self.length.end(tracker, elapsed), elapsed)
            entry = tracker.timeline[-1]
            if reason is None:
                return _spawn(entry["users"])
            tracker.pause(reason)  # the probe's window and schedule end now, before its users stop
            self._draining = True
            # Locust stops users at the spawn rate: all of them within this tick, so none sends into the next probe.
            return 0, float(max(100, entry["users"]))
        load, limit = capacity.next_load(search.mode, search.probes, search.start, search.maximum, search.resolution)
        if load is None:
            if tracker.timeline:
                tracker.timeline[-1]["capacity_limit"] = limit
                if tracker.on_change:
                    tracker.on_change(tracker.timeline)
            return None
        if search.mode == capacity.RATE and self._index >= 0:
            self._pending = load  # spawn the pool now; the schedule starts at the next tick
            return _spawn(self.pool)
        return self._begin_probe(tracker, load, now)

    def _begin_probe(self, tracker: StepTracker, load: float, now: float) -> tuple[int, float]:
        search = self.search
        self._index += 1
        self._step_began = now
        users = int(load) if search.mode == capacity.USERS else self.pool
        rate = float(load) if search.mode == capacity.RATE else None
        tracker.begin_step(self._index, users, self.warmup, rate, probe=len(search.probes) + 1)
        return _spawn(users)


class TraceShape(SuiteShape):
    """--trace: the pool is spawned; once every load process has built its replay (and the pool is up), the replay
    starts; its windows of --step-duration become steps as their times come; the run ends when every process has had
    all of its rows answered, or at --run-time."""

    abstract = True

    def setup(self, opts, tracker: StepTracker) -> None:
        super().setup(opts, tracker)
        self.pool = int(opts.max_users)
        self.run_time = opts.run_time

    def plan_tick(self, tracker: StepTracker, now: float) -> tuple[int, float] | None:
        environment = self.runner.environment
        spawn = _spawn(self.pool)
        if self._index < 0:
            self._index = 0
            self._step_began = now  # the run's start, for --run-time (Locust ignores -t with a load shape)
            self._waiting_said = now
            tracker.trace_ranks(self.pool)  # before the pool: each worker's users build only its share of the bodies
            return spawn
        if self.run_time and now - self._step_began >= float(self.run_time):
            if tracker.trace.start_wall is not None and not tracker.trace_finished():
                logger.warning(
                    "--run-time %ss reached before every trace row was answered: the replay stops", self.run_time
                )
            tracker.end(adaptive.RUN_STOPPED)
            return None
        if tracker.trace.start_wall is None:
            return self._start_replay(environment, tracker, now, spawn)
        tracker.advance_trace(time.time(), self.pool)
        if tracker.trace_finished():
            tracker.end(adaptive.FIXED)
            return None
        return spawn

    def _start_replay(self, environment, tracker: StepTracker, now: float, spawn) -> tuple[int, float] | None:
        ready, error = tracker.trace_readiness()
        if error:
            logger.error("%s", error)
            environment.process_exit_code = EXIT_SETUP_ERROR
            tracker.end(adaptive.RUN_STOPPED)
            return None
        if not ready or (self.runner.user_count < self.pool and now - self._step_began < trace_run.USERS_WAIT_S):
            if now - self._waiting_said >= 10:
                self._waiting_said = now
                logger.info("waiting for every load process to build the trace's prompts and spawn its users")
            return spawn
        opts = environment.parsed_options
        trace = trace_run.load(opts, environment.vllm_loadtest.resources.traces)
        span = trace_run.span_s(trace, opts)
        window_s = self.length.duration
        windows = trace_run.windows(trace.offsets_s, span, window_s)
        logger.info(
            "Replaying %d trace rows over %.1f s in %d window(s) of %g s", len(trace), span, len(windows), window_s
        )
        tracker.begin_trace(windows, window_s, self.pool, self.warmup)
        return spawn


def plan_for(opts) -> type[SuiteShape]:
    """The load plan the options ask for (options.check refuses the combinations that would be ambiguous)."""
    if trace_run.active(opts):
        return TraceShape
    if str(opts.find_capacity or "").strip():
        return CapacityShape
    if opts.rates:
        return RatesShape
    return StepsShape


class StepLoadShape(SuiteShape):
    """The bundled locustfile's shape: the plan the options ask for (`plan_for`), chosen at each start."""

    abstract = True

    def reset_time(self) -> None:
        super().reset_time()
        if not self._ready:
            self._plan: SuiteShape | None = None

    def tick(self) -> tuple[int, float] | None:
        if not self._ready or self._plan is None:
            self._plan = plan_for(self.runner.environment.parsed_options)()
            self._plan.runner = self.runner
            self._ready = True
        return self._plan.tick()
