"""The stepped load: --steps 1,2,4,... users (or --rates 1,2,4,... requests/s), each held for --step-duration, the
first --step-warmup excluded; with --step-duration auto, each held until it has measured enough (analysis/adaptive.py)
or for --max-step-duration.

The shape runs on the master (or the local runner). `StepTracker` carries the current step to every process
so each record is tagged with the step and user count in force when its request started; for a rate step it also
starts each load process's share of the schedule (locustfiles/openloop.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from locust import LoadTestShape
from locust.runners import MasterRunner, WorkerRunner

from ..analysis import adaptive, capacity
from ..analysis.schedule import parse_rates
from ..analysis.slo import parse_slo
from .distributed import SHIP_INTERVAL_S
from .openloop import OpenLoopPlan
from .options import parse_duration, parse_step_duration, parse_steps

STEP_MESSAGE = "vllm_loadtest_step"

logger = logging.getLogger("vllm_loadtest")


@dataclass
class StepState:
    step: int
    users: int
    measure_from: float  # time.perf_counter() of this process when the warm-up ends


class StepTracker:
    """Which step is running, and the timeline of steps (wall-clock) kept on the master or local runner."""

    def __init__(self, environment, on_change: Callable[[list[dict]], None] | None = None) -> None:
        self.environment = environment
        self.state: StepState | None = None
        self.timeline: list[dict] = []
        self.on_change = on_change
        self.plan = OpenLoopPlan()  # this process's schedule of a rate run (unused in a closed loop)
        runner = environment.runner
        # --step-duration auto: the controller's live view of the current step (fed by plugin.register's listeners).
        # A master's records arrive up to a shipping interval late (and a little more in transit): it judges the
        # window up to that much before now, so a last batch still on its way does not read as a slump.
        self.adaptive = adaptive.StepAccumulator(lag_s=2 * SHIP_INTERVAL_S if isinstance(runner, MasterRunner) else 0)
        self.capacity = capacity.ProbeRecords()  # --find-capacity: the running probe's requests
        if isinstance(runner, WorkerRunner):
            runner.register_message(STEP_MESSAGE, self._on_message)

    def reset(self) -> None:
        self.state = None
        self.timeline = []
        self.plan.reset()

    def current(self) -> tuple[int, int, bool]:
        """(step, users, in warm-up) for a request starting now."""
        state = self.state
        if state is None:
            # No stepped shape (a plain -u N run): one step whose users are what this process runs.
            return 0, self.environment.runner.user_count, False
        return state.step, state.users, time.perf_counter() < state.measure_from

    def begin_step(
        self,
        step: int,
        users: int,
        warmup_s: float,
        rate_rps: float | None = None,
        end_reason: str | None = None,
        probe: int | None = None,
    ) -> None:
        """Start a step; the previous one (still open) ends now, for `end_reason` (analysis/adaptive.END_REASONS);
        `probe`: its order in a capacity search."""
        now = time.time()
        if self.timeline and self.timeline[-1]["end_time"] is None:
            self.timeline[-1]["end_time"] = now
            self.timeline[-1]["end_reason"] = end_reason
        self.adaptive.reset(step)
        self.capacity.reset(step)
        self.timeline.append(
            {
                "step": step, "users": users, "start_time": now, "measure_start": now + warmup_s, "end_time": None,
                "rate_rps": rate_rps,
            }
        )  # fmt: skip
        if probe is not None:
            self.timeline[-1]["probe"] = probe
        self.state = StepState(step, users, time.perf_counter() + warmup_s)
        runner = self.environment.runner
        options = self.environment.parsed_options
        message = {"step": step, "users": users, "warmup_s": warmup_s, "rate_rps": rate_rps}
        if rate_rps is not None:
            # Sent with the step, not read from the worker's options: a worker holds its own defaults until the
            # spawn message, which comes after the first step's message.
            message.update(arrival=options.arrival, seed=options.seed)
            if probe is not None:
                # A probe's arrivals are keyed by its rate, not by its place in the search: the same rate gets the
                # same times whatever path led to it, so one verdict flipped by noise does not change the later
                # probes' arrivals too.
                message["key"] = f"rate={rate_rps:g}"
        if isinstance(runner, MasterRunner):
            if rate_rps is not None:
                # Each worker sends rate / workers: its rank among the workers now connected interleaves the
                # constant schedules and gives each Poisson stream its own seed.
                nodes = runner.clients.ready + runner.clients.spawning + runner.clients.running
                ids = sorted((node.id for node in nodes), key=runner.get_worker_index)
                message["ranks"] = {client_id: rank for rank, client_id in enumerate(ids)}
            runner.send_message(STEP_MESSAGE, message)
        elif rate_rps is not None:
            self.plan.begin(step, users, rate_rps, warmup_s, options.arrival, options.seed, key=message.get("key"))
        if self.on_change:
            self.on_change(self.timeline)

    def end(self, reason: str = adaptive.RUN_STOPPED) -> None:
        """Close the last step at the end of the run: ended by the shape for `reason`, else stopped before its end."""
        if self.timeline and self.timeline[-1]["end_time"] is None:
            self.timeline[-1]["end_time"] = time.time()
            self.timeline[-1]["end_reason"] = reason
            if self.on_change:
                self.on_change(self.timeline)

    def pause(self, reason: str) -> None:
        """End the running step now, and every load process's schedule with it: between two probes of a capacity
        search, no request may start that belongs to neither."""
        self.end(reason)
        if isinstance(self.environment.runner, MasterRunner):
            self.environment.runner.send_message(STEP_MESSAGE, {"pause": True})
        else:
            self.plan.finish()

    def _on_message(self, environment, msg, **_kwargs) -> None:
        data = msg.data
        if data.get("pause"):
            self.plan.finish()
            return
        self.state = StepState(int(data["step"]), int(data["users"]), time.perf_counter() + float(data["warmup_s"]))
        if data.get("rate_rps") is not None:
            ranks = data.get("ranks") or {}
            rank = ranks.get(self.environment.runner.client_id)
            if rank is None:
                # Not among the workers the master counted (it connected just now): it sends a share as if it
                # were one more worker, so the rate is exceeded a little rather than its share silently lost.
                logger.warning("this worker was not counted for step %s's rate; sending an extra share", data["step"])
                rank = len(ranks)
            self.plan.begin(
                int(data["step"]), int(data["users"]), float(data["rate_rps"]), float(data["warmup_s"]),
                str(data["arrival"]), data["seed"], rank=rank, processes=max(len(ranks), rank + 1), key=data.get("key"),
            )  # fmt: skip


class StepLoadShape(LoadTestShape):
    """Holds each user count of --steps for --step-duration, then stops the test."""

    def __init__(self) -> None:
        super().__init__()
        self.reset_time()

    def reset_time(self) -> None:
        super().reset_time()
        # A master's first start() calls this again after the first tick began step 0: keep a run in progress.
        ctx = getattr(getattr(getattr(self, "runner", None), "environment", None), "vllm_loadtest", None)
        if ctx is not None and ctx.tracker.state is not None:
            return
        self._plan: _Plan | None = None  # re-read options on every start (web UI edits)
        self._index = -1
        self._step_began = 0.0
        self._draining = False  # --find-capacity: a probe has ended, its users stopped; judged at the next tick
        self._pending: float | None = None  # --find-capacity rate: the next probe's rate, once its pool is up

    def _read_plan(self) -> _Plan:
        opts = self.runner.environment.parsed_options
        rates = parse_rates(opts.rates) if getattr(opts, "rates", "") else None
        # A rate run holds one pool of --max-users users at every step: no users stopped (and requests cut off)
        # between steps, and enough of them that a free one is there at each intended time.
        steps = [opts.max_users] * len(rates) if rates else parse_steps(opts.steps)
        duration = parse_step_duration(opts.step_duration)
        warmup = parse_duration(opts.step_warmup, "--step-warmup", allow_zero=True)
        maximum = parse_duration(
            getattr(opts, "max_step_duration", adaptive.DEFAULT_MAX_STEP_DURATION), "--max-step-duration"
        )
        target = adaptive.parse_ci_target(getattr(opts, "ci_target", adaptive.DEFAULT_CI_TARGET))
        tracker = self.runner.environment.vllm_loadtest.tracker
        tracker.adaptive.active = duration is None
        search = _search(opts)
        tracker.capacity.active = search is not None
        if search is not None:
            tracker.capacity.itl = any(o.metric == "itl" for o in search.objectives)
            steps, rates = [], None  # the loads are chosen probe by probe
        return _Plan(steps, duration, warmup, rates, maximum, target, search)

    def _step_end(self, plan: _Plan, tracker: StepTracker, elapsed_s: float) -> str | None:
        """Why the running step ends now (analysis/adaptive.END_REASONS), or None while it goes on."""
        if plan.duration is not None:
            return adaptive.FIXED if elapsed_s >= plan.duration else None
        if not tracker.timeline:  # the run was reset under the shape (a stop in the web UI): nothing to judge
            return None
        entry = tracker.timeline[-1]
        decision = tracker.adaptive.decide(
            entry["measure_start"], time.time(), elapsed_s, plan.max_duration, plan.target
        )
        if decision.checked:
            logger.debug("step %s after %.1f s: %s", entry["step"], elapsed_s, decision)
        if not decision.stop:
            return None
        entry["end_check"] = decision.to_dict()
        if decision.reason == adaptive.MAX_DURATION:
            logger.warning(
                adaptive.max_duration_line(
                    entry["step"],
                    entry["users"],
                    plan.max_duration,
                    plan.target,
                    decision.rel_half_width,
                    decision.ttft_samples,
                )
            )
        return decision.reason

    def _probe_end(self, plan: _Plan, tracker: StepTracker, reason: str | None, elapsed_s: float) -> str | None:
        """A capacity probe that reached its interval target while an objective's interval still straddles its limit
        goes on, up to --max-step-duration, where it ends as MAX_DURATION: the search needs a verdict, not a narrow
        tok/s. (The maximum is also a check point that a narrow tok/s passes as CI_TARGET: without the bound, a
        28-user probe against the real vLLM whose TTFT p95 straddled 200 ms ran on past the 30 s maximum, 66 s
        until the run was stopped.)"""
        if reason != adaptive.CI_TARGET or plan.search is None or not tracker.timeline:
            return reason
        probe = plan.search.judge(tracker)
        if probe.verdict != capacity.UNCERTAIN:
            return reason
        if elapsed_s < plan.max_duration:
            logger.debug("probe %s at %s: uncertain, extended", probe.probe, probe.load)
            return None
        entry = tracker.timeline[-1]
        entry.setdefault("end_check", {}).update(reason=adaptive.MAX_DURATION, objective_straddled=True)
        straddling = ", ".join(c.objective for c in probe.checks if c.verdict == capacity.UNCERTAIN)
        logger.warning(
            "Probe %s (%s) reached --max-step-duration %.0f s with %s still straddling its limit: judged uncertain",
            probe.probe, capacity.load_text(probe.load, plan.search.mode), plan.max_duration, straddling,
        )  # fmt: skip
        return adaptive.MAX_DURATION

    def _capacity_tick(self, plan: _Plan, tracker: StepTracker, now: float) -> tuple[int, float] | None:
        """One tick of a capacity search. A probe that ends is closed, its schedule stopped and its users stopped
        (their requests in flight recorded as cut off, and aborted at the server); one tick later, with its last
        records arrived, it is judged, and the next probe starts with all its users at once (a rate probe's pool is
        spawned first, its schedule one tick later). So every probe starts from an idle server, as its own benchmark
        would, and its verdict does not depend on the path of the search: a fake server of 8 slots met TTFT p95 <=
        100 ms with 9 users carried over from 10 (their requests had spread out over the slots) and broke it with 9
        users started together; an overloaded rate probe's backlog slowed the next three probes."""
        search = plan.search
        pool = self.runner.environment.parsed_options.max_users
        if self._pending is not None:  # a rate probe: its pool is up, its schedule starts now
            load, self._pending = self._pending, None
            return self._begin_probe(plan, tracker, load, now)
        if self._draining:
            self._draining = False
            entry = tracker.timeline[-1]
            probe = search.judge(tracker, until=entry["end_time"])
            search.probes.append(probe)
            entry["probe_check"] = probe.to_dict(search.mode)  # the live verdict the search acted on
            logger.info(
                "Probe %s (%s): %s", probe.probe, capacity.load_text(probe.load, search.mode),
                probe.verdict + "".join(f"; {c.objective} {c.verdict}" for c in probe.checks),
            )  # fmt: skip
        elif self._index >= 0:
            elapsed = now - self._step_began
            reason = self._probe_end(plan, tracker, self._step_end(plan, tracker, elapsed), elapsed)
            entry = tracker.timeline[-1]
            if reason is None:
                return entry["users"], float(max(100, entry["users"]))
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
            return pool, float(max(100, pool))
        return self._begin_probe(plan, tracker, load, now)

    def _begin_probe(self, plan: _Plan, tracker: StepTracker, load: float, now: float) -> tuple[int, float]:
        search = plan.search
        self._index += 1
        self._step_began = now
        users = int(load) if search.mode == capacity.USERS else self.runner.environment.parsed_options.max_users
        rate = float(load) if search.mode == capacity.RATE else None
        tracker.begin_step(self._index, users, plan.warmup, rate, probe=len(search.probes) + 1)
        return users, float(max(100, users))

    def tick(self) -> tuple[int, float] | None:
        if getattr(self, "_plan", None) is None:
            self._plan = self._read_plan()
        plan = self._plan
        steps = plan.steps
        tracker: StepTracker = self.runner.environment.vllm_loadtest.tracker
        # Each step is timed from its own beginning, not from the run's start: a master's start() blocks until
        # the workers confirm their users (up to seconds), which would otherwise eat into the following steps.
        now = time.monotonic()
        if plan.search is not None:
            return self._capacity_tick(plan, tracker, now)
        reason = self._step_end(plan, tracker, now - self._step_began) if self._index >= 0 else None
        if self._index < 0 or reason is not None:
            self._index += 1
            self._step_began = now
            if self._index >= len(steps):
                tracker.end(reason or adaptive.FIXED)
                return None
            rate = plan.rates[self._index] if plan.rates else None
            tracker.begin_step(self._index, steps[self._index], plan.warmup, rate, end_reason=reason)
        users = steps[self._index]
        # Spawn a step's new users within a fraction of a second: the lab fires c requests at once.
        return users, float(max(100, users))


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


def _search(opts) -> _Search | None:
    """The capacity search the options ask for, or None (a run of --steps or --rates)."""
    mode = str(getattr(opts, "find_capacity", "") or "").strip()
    if not mode:
        return None
    if mode == capacity.USERS:
        start, maximum = float(opts.start_users), float(opts.max_users)
    else:
        start, maximum = (
            capacity.parse_load(opts.start_rate, "--start-rate"),
            capacity.parse_load(opts.max_rate, "--max-rate"),
        )
    return _Search(mode, parse_slo(opts.slo), start, maximum, capacity.parse_resolution(opts.capacity_resolution))


@dataclass(frozen=True)
class _Plan:
    """The shape's options, read at each start (the web UI's form may have changed them)."""

    steps: list[int]
    duration: float | None  # None: --step-duration auto
    warmup: float
    rates: list[float] | None
    max_duration: float
    target: float
    search: _Search | None = None  # --find-capacity: the loads come from the search, probe by probe
