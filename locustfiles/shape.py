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

    def reset_time(self) -> None:
        super().reset_time()
        self._plan: tuple[list[int], float, float] | None = None  # re-read options on every start (web UI edits)

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
        index = int(self.get_run_time() // duration)
        tracker: StepTracker = self.runner.environment.vllm_loadtest.tracker
        if index >= len(steps):
            tracker.end()
            return None
        users = steps[index]
        if tracker.state is None or tracker.state.step != index:
            tracker.begin_step(index, users, warmup)
        # Spawn a step's new users within a fraction of a second: the lab fires c requests at once.
        return users, float(max(100, users))
