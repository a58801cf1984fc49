"""Which step is running, in every process. The load plan (locustfiles/shape.py) runs on the master (or the local
runner); `StepTracker` carries the current step to every process so each record is tagged with the step and user
count in force when its request started; for a rate step it also starts each load process's share of the schedule
(locustfiles/openloop.py); for a trace replay, each process's rows.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from locust.runners import MasterRunner, WorkerRunner

from ..analysis import adaptive, capacity
from . import trace_run
from .distributed import SHIP_INTERVAL_S
from .openloop import OpenLoopPlan

STEP_MESSAGE = "vllm_loadtest_step"
# A worker, once its handlers are registered, asks the master for the step in force: Locust's master may start the
# run (and send the first step) as soon as the worker said client_ready, before the worker's init listeners have
# registered the step's handler; that message is then dropped ("Unknown message type"), and a rate step's share of
# that worker is never sent.
SYNC_MESSAGE = "vllm_loadtest_sync"

logger = logging.getLogger("vllm_loadtest")


def answer_syncs(environment, tracker: Callable[[], StepTracker | None]) -> None:
    """A master: answer the workers' SYNC_MESSAGE from the start of init, with the step `tracker()` has in force.
    The workers of --processes connect while the master's preflight is still waiting on the server, before its
    tracker exists; their request was dropped with Locust's "Unknown message type" warning. No step is in force
    before the tracker exists: nothing is owed then."""

    def on_sync(environment, msg, **_kwargs) -> None:
        current = tracker()
        if current is not None:
            current.on_sync(environment, msg)

    environment.runner.register_message(SYNC_MESSAGE, on_sync)


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
        self._sent: dict | None = None  # a master: the message of the step in force (None between runs, or paused)
        self._began: tuple | None = None  # a worker: the step it began, so a message sent twice begins it once
        if isinstance(runner, WorkerRunner):
            runner.register_message(STEP_MESSAGE, self._on_message)
            runner.register_message(trace_run.BEGIN_MESSAGE, self._on_trace_begin)
            runner.send_message(SYNC_MESSAGE, None)
        elif isinstance(runner, MasterRunner):
            runner.register_message(trace_run.READY_MESSAGE, self._on_trace_ready)
            runner.register_message(trace_run.DONE_MESSAGE, self._on_trace_done_message)

    def reset(self) -> None:
        self._sent = None
        self._began = None
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
        repeat: tuple[int, int, int] | None = None,
    ) -> None:
        """Start a step; the previous one (still open) ends now, for `end_reason` (analysis/adaptive.END_REASONS);
        `probe`: its order in a capacity search; `repeat`: (plan step, trial, trials) with --repeat N > 1."""
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
        if repeat is not None:  # only then: a run without --repeat keeps its run.json as it was
            self.timeline[-1].update(plan_step=repeat[0], trial=repeat[1], trials=repeat[2])
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
            message["started"] = now  # the step's identity (a message sent twice begins it once)
            self._sent = message
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
            self._sent = None
            self.environment.runner.send_message(STEP_MESSAGE, {"pause": True})
        else:
            self.plan.finish()

    def on_sync(self, environment, msg) -> None:
        """A master: a worker asks for the step in force (it may have missed its message): sent to it alone."""
        if self._sent is not None:
            logger.info("worker %s joined during step %s: sending it the step", msg.node_id, self._sent["step"])
            environment.runner.send_message(STEP_MESSAGE, self._sent, client_id=msg.node_id)

    def _on_message(self, environment, msg, **_kwargs) -> None:
        data = msg.data
        if data.get("pause"):
            self.plan.finish()
            return
        began = (data.get("step"), data.get("started"))
        if began == self._began:
            return  # the same step sent again (this worker's sync crossed the step's own message)
        self._began = began
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
    return float(options.burstiness)
