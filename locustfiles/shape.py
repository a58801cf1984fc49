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
from . import trace_run
from .distributed import SHIP_INTERVAL_S
from .exitcodes import EXIT_SETUP_ERROR
from .openloop import OpenLoopPlan
from .options import parse_duration, parse_step_duration, parse_steps

STEP_MESSAGE = "vllm_loadtest_step"

logger = logging.getLogger("vllm_loadtest")


@dataclass
class TraceState:
    """A trace replay as the controller runs it (--trace, locustfiles/trace_run.py)."""

    ranks: dict[str, int] = field(default_factory=dict)  # a master's workers: client id -> rank
    ready: dict[str, str | None] = field(default_factory=dict)  # who is ready (an error, or None)
    done: set[str] = field(default_factory=set)  # who has had all of its rows answered
    windows: list[tuple[float, float, int]] = field(default_factory=list)  # (start, end, rows) of replay time
    start_wall: float | None = None  # time.time() when the replay began: intended = start_wall + offset
    window_s: float = 0.0  # --step-duration: the windows' length
    window: int = -1  # the timeline's last window


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
        self.trace = TraceState()  # --trace: the controller's view of the replay
        self.trace_rank = (0, 1)  # --trace: this load process's (rank, processes), from the controller
        self.trace_ready_local: str | bool | None = False  # a local run: False until ready, then None or an error
        self.plan.on_trace_done = self._trace_done
        # The controller asks the shape to end the run at its next tick (a result file cannot be written: plugin).
        self.stop_requested = False
        if isinstance(runner, WorkerRunner):
            runner.register_message(STEP_MESSAGE, self._on_message)
            runner.register_message(trace_run.BEGIN_MESSAGE, self._on_trace_begin)
        elif isinstance(runner, MasterRunner):
            runner.register_message(trace_run.READY_MESSAGE, self._on_trace_ready)
            runner.register_message(trace_run.DONE_MESSAGE, self._on_trace_done_message)

    def reset(self) -> None:
        self.state = None
        self.stop_requested = False
        self.timeline = []
        self.plan.reset()
        self.trace = TraceState()
        self.trace_ready_local = False

    # --- trace replay (--trace) ----------------------------------------------------------------------
    def trace_ranks(self, users: int) -> None:
        """Controller: each load process's share of the rows, decided once for the replay (before the pool is
        spawned: a worker learns its rank before its users build their prompts)."""
        runner = self.environment.runner
        self.trace = TraceState()
        # Set now (a master's first start() resets its shape unless a step is under way) and read by the self-checks.
        self.state = StepState(0, users, time.perf_counter())
        if isinstance(runner, MasterRunner):
            nodes = runner.clients.ready + runner.clients.spawning + runner.clients.running
            ids = sorted((node.id for node in nodes), key=runner.get_worker_index)
            self.trace.ranks = {client_id: rank for rank, client_id in enumerate(ids)}
            runner.send_message(trace_run.BEGIN_MESSAGE, {"ranks": self.trace.ranks})
        else:
            self.trace_rank = (0, 1)

    def report_trace_ready(self, error: str | None, prompts: dict | None = None) -> None:
        """This load process has built its replay (or failed to: `error`); `prompts`: how (TracePrompts.info)."""
        runner = self.environment.runner
        if isinstance(runner, WorkerRunner):
            runner.send_message(trace_run.READY_MESSAGE, {"error": error, "prompts": prompts})
        else:
            self.trace_ready_local = error

    def trace_readiness(self) -> tuple[bool, str | None]:
        """Controller: (every load process is ready, the first error one reported)."""
        if not isinstance(self.environment.runner, MasterRunner):
            ready = self.trace_ready_local
            return ready is not False, ready if isinstance(ready, str) else None
        ready = self.trace.ready
        error = next((e for e in ready.values() if e), None)
        return all(cid in ready for cid in self.trace.ranks), error

    def begin_trace(self, windows: list[tuple[float, float, int]], window_s: float, users: int, warmup_s: float):
        """Controller: the replay starts now. Every window of replay time becomes a step of the timeline as its time
        comes (`advance_trace`); every load process starts its rows' schedule."""
        now, now_perf = time.time(), time.perf_counter()
        self.trace.windows, self.trace.start_wall, self.trace.window_s, self.trace.window = windows, now, window_s, -1
        self.timeline = []
        self.advance_trace(now, users, warmup_s)
        runner = self.environment.runner
        message = {"begin": True, "window_s": window_s, "warmup_s": warmup_s, "users": users}
        if isinstance(runner, MasterRunner):
            runner.send_message(trace_run.BEGIN_MESSAGE, message)
        else:
            self._start_trace_plan(message, now_perf, now)

    def advance_trace(self, now: float, users: int, warmup_s: float = 0.0) -> None:
        """Controller: open the windows whose start has come, each ending exactly where the next begins."""
        trace = self.trace
        changed = False
        # Windows after the last one with rows are never opened: the run ends with the last row's answer.
        last = max((k for k, window in enumerate(trace.windows) if window[2] > 0), default=0)
        while trace.window < last and trace.start_wall + trace.windows[trace.window + 1][0] <= now:
            trace.window += 1
            k = trace.window
            start, end, rows = trace.windows[k]
            begins = trace.start_wall + start
            if self.timeline and self.timeline[-1]["end_time"] is None:
                self.timeline[-1]["end_time"] = begins
                self.timeline[-1]["end_reason"] = adaptive.FIXED
            warm = warmup_s if k == 0 else 0.0
            self.timeline.append(
                {
                    "step": k, "users": users, "start_time": begins, "measure_start": begins + warm,
                    "end_time": None, "rate_rps": trace_run.window_rate(start, end, rows, trace.window_s),
                    "trace_window": [start, end], "trace_rows": rows,
                }
            )  # fmt: skip
            self.state = StepState(k, users, time.perf_counter() + max(0.0, begins + warm - time.time()))
            changed = True
        if changed and self.on_change:
            self.on_change(self.timeline)

    def trace_finished(self) -> bool:
        """Controller: every load process has had all of its rows answered (a worker that left counts as done:
        its rows are lost, which the log says)."""
        runner = self.environment.runner
        if not isinstance(runner, MasterRunner):
            return self.plan.trace_done
        present = {client.id for client in runner.clients.all}
        for cid in self.trace.ranks:
            if cid not in self.trace.done and cid not in present:
                logger.warning("worker %s left before its trace rows were all answered", cid)
                self.trace.done.add(cid)
        return all(cid in self.trace.done for cid in self.trace.ranks)

    def _start_trace_plan(self, message: dict, now: float | None = None, now_wall: float | None = None) -> None:
        ctx = self.environment.vllm_loadtest
        replay = ctx.resources.trace_replay_built()
        if replay is None:
            logger.error("the trace replay began before this process had built its prompts; it sends no row")
            return
        trace = replay.trace
        rank, processes = self.trace_rank
        positions = trace.shard(rank, processes)
        window_s = float(message["window_s"])
        windows = trace_run.windows(trace.offsets_s, trace_run.span_s(trace, self.environment.parsed_options), window_s)
        self.plan.begin_trace(
            trace.offsets_s[positions], positions, windows, window_s, int(message["users"]),
            float(message["warmup_s"]), now=now, now_wall=now_wall,
        )  # fmt: skip

    def _trace_done(self) -> None:
        runner = self.environment.runner
        if isinstance(runner, WorkerRunner):
            runner.send_message(trace_run.DONE_MESSAGE, {"rows": self.plan.answered})

    def _on_trace_begin(self, environment, msg, **_kwargs) -> None:
        data = msg.data
        if "ranks" in data:
            ranks = data["ranks"] or {}
            rank = ranks.get(self.environment.runner.client_id)
            if rank is None:
                # Not counted by the master (it connected just now): it sends nothing, rather than rows twice.
                logger.warning("this worker was not counted for the trace replay; it sends no row")
                rank = -1
            self.trace_rank = (rank, max(len(ranks), 1))
            return
        if self.trace_rank[0] < 0:
            return
        self._start_trace_plan(data)

    def _on_trace_ready(self, environment, msg, **_kwargs) -> None:
        data = msg.data or {}
        self.trace.ready[msg.node_id] = data.get("error")
        info = environment.vllm_loadtest.resources.trace_info
        if info is not None and data.get("prompts") and not info.get("prompts"):
            info["prompts"] = data["prompts"]  # every worker builds them alike: the first one's, for run.json

    def _on_trace_done_message(self, environment, msg, **_kwargs) -> None:
        self.trace.done.add(msg.node_id)

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
            message.update(arrival=options.arrival, seed=options.seed, burstiness=_burstiness(options))
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
            self.plan.begin(
                step, users, rate_rps, warmup_s, options.arrival, options.seed, key=message.get("key"),
                burstiness=message["burstiness"],
            )  # fmt: skip
        if self.on_change:
            self.on_change(self.timeline)

    def end(self, reason: str = adaptive.RUN_STOPPED) -> None:
        """Close the last step at the end of the run: ended by the shape for `reason`, else stopped before its end."""
        if self.timeline and self.timeline[-1]["end_time"] is None:
            last = self.timeline[-1]
            last["end_time"] = time.time()
            last["end_reason"] = reason
            if last.get("trace_rows") and last["end_time"] > last["start_time"]:
                # A trace's last window lasts until the run ends (its last answers, the next tick), not its nominal
                # length: its rate is its rows over the time it was measured, as its achieved_rps is (a 4.4 s window
                # measured for 5.0 s read 5.23 req/s intended beside 4.60 achieved).
                last["rate_rps"] = last["trace_rows"] / (last["end_time"] - last["start_time"])
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
                burstiness=float(data.get("burstiness", 1.0)),
            )  # fmt: skip


def _burstiness(options) -> float:
    """--arrival gamma's shape (options.check made it a float; 1, Poisson's, for options without it)."""
    return float(getattr(options, "burstiness", 1.0))


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
        trace = trace_run.active(opts)
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
        if trace:
            steps, rates = [], None  # the load is the trace's rows at their times
        return _Plan(steps, duration, warmup, rates, maximum, target, search, trace)

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

    def _trace_tick(self, plan: _Plan, tracker: StepTracker, now: float) -> tuple[int, float] | None:
        """One tick of a trace replay (--trace): the pool is spawned; once every load process has built its replay
        (and the pool is up), the replay starts; its windows become steps as their times come; the run ends when
        every process has had all of its rows answered, or at --run-time."""
        environment = self.runner.environment
        opts = environment.parsed_options
        pool = int(opts.max_users)
        spawn = (pool, float(max(100, pool)))
        if self._index < 0:
            self._index = 0
            self._step_began = now  # the run's start, for --run-time (Locust ignores -t with a load shape)
            self._waiting_said = now
            tracker.trace_ranks(pool)  # before the pool: each worker's users build only its share of the bodies
            return spawn
        run_time = getattr(opts, "run_time", None)
        if run_time and now - self._step_began >= float(run_time):
            if tracker.trace.start_wall is not None and not tracker.trace_finished():
                logger.warning("--run-time %ss reached before every trace row was answered: the replay stops", run_time)
            tracker.end(adaptive.RUN_STOPPED)
            return None
        if tracker.trace.start_wall is None:
            ready, error = tracker.trace_readiness()
            if error:
                logger.error("%s", error)
                environment.process_exit_code = EXIT_SETUP_ERROR
                tracker.end(adaptive.RUN_STOPPED)
                return None
            if not ready or (self.runner.user_count < pool and now - self._step_began < trace_run.USERS_WAIT_S):
                if now - self._waiting_said >= 10:
                    self._waiting_said = now
                    logger.info("waiting for every load process to build the trace's prompts and spawn its users")
                return spawn
            trace = trace_run.load(opts, environment.vllm_loadtest.resources.traces)
            span = trace_run.span_s(trace, opts)
            windows = trace_run.windows(trace.offsets_s, span, plan.duration)
            logger.info(
                "Replaying %d trace rows over %.1f s in %d window(s) of %g s", len(trace), span,
                len(windows), plan.duration,
            )  # fmt: skip
            tracker.begin_trace(windows, plan.duration, pool, plan.warmup)
            return spawn
        tracker.advance_trace(time.time(), pool)
        if tracker.trace_finished():
            tracker.end(adaptive.FIXED)
            return None
        return spawn

    def tick(self) -> tuple[int, float] | None:
        if getattr(self, "_plan", None) is None:
            self._plan = self._read_plan()
        plan = self._plan
        steps = plan.steps
        tracker: StepTracker = self.runner.environment.vllm_loadtest.tracker
        if tracker.stop_requested:  # the run cannot be recorded any more (plugin.RunContext._write_failed)
            tracker.end(adaptive.RUN_STOPPED)
            return None
        # Each step is timed from its own beginning, not from the run's start: a master's start() blocks until
        # the workers confirm their users (up to seconds), which would otherwise eat into the following steps.
        now = time.monotonic()
        if plan.search is not None:
            return self._capacity_tick(plan, tracker, now)
        if plan.trace:
            return self._trace_tick(plan, tracker, now)
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
    trace: bool = False  # --trace: the load is the trace's rows, each window of --step-duration a step
