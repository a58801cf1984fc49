"""The stepped load: --steps 1,2,4,... users, each held for --step-duration, the first --step-warmup excluded.

The shape runs on the master (or the local runner). `StepTracker` carries the current step to every process
so each record is tagged with the step and user count in force when its request started.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from locust import LoadTestShape
from locust.runners import MasterRunner, WorkerRunner

from locustfiles.options import parse_duration, parse_steps

STEP_MESSAGE = "vllm_loadtest_step"


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
        runner = environment.runner
        if isinstance(runner, WorkerRunner):
            runner.register_message(STEP_MESSAGE, self._on_message)

    def reset(self) -> None:
        self.state = None
        self.timeline = []

    def current(self) -> tuple[int, int, bool]:
        """(step, users, in warm-up) for a request starting now."""
        state = self.state
        if state is None:
            # No stepped shape (a plain -u N run): one step whose users are what this process runs.
            return 0, self.environment.runner.user_count, False
        return state.step, state.users, time.perf_counter() < state.measure_from

    def begin_step(self, step: int, users: int, warmup_s: float) -> None:
        now = time.time()
        if self.timeline and self.timeline[-1]["end_time"] is None:
            self.timeline[-1]["end_time"] = now
        self.timeline.append(
            {"step": step, "users": users, "start_time": now, "measure_start": now + warmup_s, "end_time": None}
        )
        self.state = StepState(step, users, time.perf_counter() + warmup_s)
        runner = self.environment.runner
        if isinstance(runner, MasterRunner):
            runner.send_message(STEP_MESSAGE, {"step": step, "users": users, "warmup_s": warmup_s})
        if self.on_change:
            self.on_change(self.timeline)

    def end(self) -> None:
        """Close the last step at the end of the run."""
        if self.timeline and self.timeline[-1]["end_time"] is None:
            self.timeline[-1]["end_time"] = time.time()
            if self.on_change:
                self.on_change(self.timeline)

    def _on_message(self, environment, msg, **_kwargs) -> None:
        data = msg.data
        self.state = StepState(int(data["step"]), int(data["users"]), time.perf_counter() + float(data["warmup_s"]))


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
        self._plan: tuple[list[int], float, float] | None = None  # re-read options on every start (web UI edits)
        self._index = -1
        self._step_began = 0.0

    def _read_plan(self) -> tuple[list[int], float, float]:
        opts = self.runner.environment.parsed_options
        steps = parse_steps(opts.steps)
        duration = parse_duration(opts.step_duration, "--step-duration")
        warmup = parse_duration(opts.step_warmup, "--step-warmup", allow_zero=True)
        return steps, duration, warmup

    def tick(self) -> tuple[int, float] | None:
        if getattr(self, "_plan", None) is None:
            self._plan = self._read_plan()
        steps, duration, warmup = self._plan
        tracker: StepTracker = self.runner.environment.vllm_loadtest.tracker
        # Each step is timed from its own beginning, not from the run's start: a master's start() blocks until
        # the workers confirm their users (up to seconds), which would otherwise eat into the following steps.
        now = time.monotonic()
        if self._index < 0 or now - self._step_began >= duration:
            self._index += 1
            self._step_began = now
            if self._index >= len(steps):
                tracker.end()
                return None
            tracker.begin_step(self._index, steps[self._index], warmup)
        users = steps[self._index]
        # Spawn a step's new users within a fraction of a second: the lab fires c requests at once.
        return users, float(max(100, users))
