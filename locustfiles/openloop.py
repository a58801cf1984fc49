"""Open-loop load (--rates): each load process's schedule of intended send times, shared by its users.

Every rate step appends a segment to the process's plan: its share of the step's rate (rate / processes), its
arrival times (analysis.schedule.arrival_times) from the step's start. A user that is free takes the next intended
time, waits until then, and sends. When no user is free at an intended time, the request keeps its time and is
sent by the next user that becomes free: late, with its lag recorded, never skipped. A step's times that fall
after its end belong to no step and are not sent; times of an ended step that were due but not yet sent (a
backlog) are still sent first, tagged with their own step.

A trace replay (--trace, locustfiles/trace_run.py) appends all its windows at once, each a TraceSegment holding
its rows' offsets and positions in the trace: the slot carries the row, and late rows are sent late, never skipped.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterator

import numpy as np
from gevent.event import Event
from gevent.lock import Semaphore

from ..analysis.schedule import arrival_times
from .trace_run import window_of, window_rate

logger = logging.getLogger("vllm_loadtest")


class Segment:
    """One rate step of one process: its arrival times, from its start until the next step begins."""

    __slots__ = (
        "end", "measure_from", "position", "rate_rps", "start", "start_wall", "step", "times", "upcoming", "users",
    )  # fmt: skip

    def __init__(
        self, step: int, users: int, rate_rps: float, start: float, start_wall: float, warmup_s: float,
        times: Iterator[float] | None,
    ) -> None:  # fmt: skip
        self.step = step
        self.users = users
        self.rate_rps = rate_rps
        self.start = start  # time.perf_counter() when the step began in this process
        self.start_wall = start_wall  # time.time() at the same moment: intended times are recorded on this clock
        self.measure_from = start + warmup_s
        self.times = times
        self.position: int | None = None  # a trace replay's row of the upcoming time (None in a rate step)
        self.end = math.inf  # set when the next step begins
        self.advance()

    def advance(self) -> None:
        """The next intended time becomes the upcoming one."""
        self.upcoming = self.start + next(self.times)


class TraceSegment(Segment):
    """One window of a trace replay in one process: its rows (positions in the trace) and their offsets from the
    window's start, in order; once they are all taken its upcoming time is infinite (the window is done)."""

    __slots__ = ("_index", "_offsets", "_positions")

    def __init__(
        self, step: int, users: int, rate_rps: float, start: float, start_wall: float, warmup_s: float,
        offsets_s, positions,
    ) -> None:  # fmt: skip
        self._offsets = offsets_s
        self._positions = positions
        self._index = 0
        super().__init__(step, users, rate_rps, start, start_wall, warmup_s, None)

    def advance(self) -> None:
        i = self._index
        if i < len(self._offsets):
            self.upcoming = self.start + float(self._offsets[i])
            self.position = int(self._positions[i])
            self._index = i + 1
        else:
            self.upcoming = math.inf
            self.position = None


class Slot:
    """One intended send: its time on both clocks and the step it belongs to."""

    __slots__ = ("intended", "intended_wall", "position", "segment")

    def __init__(self, segment: Segment, intended: float) -> None:
        self.segment = segment
        self.intended = intended  # perf_counter
        self.intended_wall = segment.start_wall + (intended - segment.start)
        self.position = segment.position  # a trace replay's row to send (None in a rate step)

    @property
    def step(self) -> int:
        return self.segment.step

    @property
    def users(self) -> int:
        return self.segment.users

    @property
    def warmup(self) -> bool:
        return self.intended < self.segment.measure_from

    def valid(self) -> bool:
        """Still part of its step: a step that ended before this time does not send it."""
        return self.intended < self.segment.end


class OpenLoopPlan:
    """The schedule of one load process: rate steps appended as they begin, taken slot by slot by its users.

    Greenlets are cooperative: take() runs without a switch, so two users never get the same slot.
    """

    def __init__(self) -> None:
        self._segments: deque[Segment] = deque()
        self._returned: deque[Slot] = deque()  # slots of users stopped before sending them: taken again first
        self.changed = Event()  # set (and replaced) whenever a step begins: wakes the user waiting on a future time
        self.taken = 0
        # A trace replay (--trace): this process's rows, and how many of them have been answered (or failed).
        self.trace_rows: int | None = None
        self.answered = 0
        self.on_trace_done: Callable[[], None] | None = None  # called once all of them have been answered
        # Only one free user at a time holds the next time and waits for it; the other free users queue here
        # without a timer each. With 1000 users each holding a time, a step change woke all of them at once:
        # the event loop stalled 118 ms (generator lag max) and that step's TTFT p99 read 101 ms for 24 ms.
        self._turn = Semaphore()

    def reset(self) -> None:
        self._segments.clear()
        self._returned.clear()
        self.taken = 0
        self.trace_rows, self.answered = None, 0
        self._notify()

    def begin(
        self, step: int, users: int, rate_rps: float, warmup_s: float, arrival: str, seed: int | str,
        rank: int = 0, processes: int = 1, now: float | None = None, now_wall: float | None = None,
        key: str | None = None, burstiness: float = 1.0,
    ) -> None:  # fmt: skip
        """A rate step begins now: this process sends its share (rate_rps / processes) from now on; `key` replaces
        the step in the stream's seed (a capacity search keys each probe by its rate); `burstiness`: --arrival
        gamma's shape."""
        if step == 0:
            self.reset()  # a new run (the web UI can start one after another)
        now = time.perf_counter() if now is None else now
        now_wall = time.time() if now_wall is None else now_wall
        if self._segments:
            self._segments[-1].end = now
        # The seed includes the step, so each step's times are the same whatever happened in the steps before it.
        times = arrival_times(
            rate_rps, arrival, f"{seed}:{step if key is None else key}", rank, processes, burstiness=burstiness
        )
        self._segments.append(Segment(step, users, rate_rps, now, now_wall, warmup_s, times))
        self._notify()

    def begin_trace(
        self, offsets_s, positions, windows: list[tuple[float, float, int]], window_s: float, users: int,
        warmup_s: float, now: float | None = None, now_wall: float | None = None,
    ) -> None:  # fmt: skip
        """A trace replay begins now: this process sends the rows at `positions` (ascending `offsets_s`, s of replay
        time from now), each window of `windows` ((start, end, rows of the whole replay)) a step whose rate is its
        rows per second; --step-warmup applies to the first window only (the replay's start, on an idle server)."""
        self.reset()
        now = time.perf_counter() if now is None else now
        now_wall = time.time() if now_wall is None else now_wall
        offsets_s = np.asarray(offsets_s, dtype=float)
        positions = np.asarray(positions, dtype=np.int64)
        self.trace_rows = len(positions)
        index = window_of(offsets_s, window_s, len(windows))
        for k, (start, end, rows) in enumerate(windows):
            lo, hi = np.searchsorted(index, [k, k + 1])
            if hi <= lo:
                continue
            mine = slice(int(lo), int(hi))
            rate = window_rate(start, end, rows, window_s)
            self._segments.append(
                TraceSegment(
                    k, users, rate, now + start, now_wall + start, warmup_s if k == 0 else 0.0,
                    offsets_s[mine] - start, positions[mine],
                )
            )  # fmt: skip
        self._notify()
        if self.trace_done and self.on_trace_done is not None:  # no row for this process (more processes than rows)
            self.on_trace_done()

    @property
    def trace_done(self) -> bool:
        """A trace replay's rows of this process have all been sent and answered (or failed)."""
        return self.trace_rows is not None and self.answered >= self.trace_rows

    def answer(self) -> None:
        """One of a trace replay's rows has been answered (or has failed)."""
        self.answered += 1
        if self.answered == self.trace_rows and self.on_trace_done is not None:
            self.on_trace_done()

    def take(self) -> Slot | None:
        """The next intended send (possibly already past: then it is late); None before the first rate step."""
        returned = self._returned
        while returned:
            slot = returned.popleft()
            if slot.valid():
                return slot
        segments = self._segments
        while segments:
            segment = segments[0]
            if segment.upcoming >= segment.end:
                segments.popleft()  # the step ended: its later times belong to no step
                continue
            slot = Slot(segment, segment.upcoming)
            segment.advance()
            self.taken += 1
            return slot
        return None

    def overdue(self, now: float | None = None) -> int:
        """Intended sends that were due by `now` (and before their step's end) and not taken; counted by consuming
        them, so only at the end of a run."""
        now = time.perf_counter() if now is None else now
        count = sum(1 for slot in self._returned if slot.valid() and slot.intended < now)
        self._returned.clear()
        for segment in self._segments:
            limit = min(now, segment.end)
            while segment.upcoming < limit:
                count += 1
                segment.advance()
        return count

    def give_back(self, slot: Slot) -> None:
        """A user stopped (Locust can stop users mid-run) before sending its slot: the next free user sends it."""
        self._returned.append(slot)
        self._notify()

    def wait(self, slot: Slot) -> bool:
        """Sleep until the slot's intended time; False when its step ended meanwhile (take another slot)."""
        while True:
            delay = slot.intended - time.perf_counter()
            if delay <= 0:
                return slot.valid()
            # Woken early by a step change only to check whether this slot still belongs to a running step.
            if self.changed.wait(delay) and not slot.valid():
                return False

    def next_slot(self) -> Slot:
        """Block until a slot's time has come (waiting for the first rate step if needed); return it. The next
        free user takes the following slot as soon as this one returns, so a late slot is sent by whichever user
        becomes free first."""
        with self._turn:
            while True:
                slot = self.take()
                if slot is None:
                    self.changed.wait()
                    continue
                try:
                    if self.wait(slot):
                        return slot
                except BaseException:  # GreenletExit: this user is stopped; the slot is not lost
                    self.give_back(slot)
                    raise

    def finish(self, now: float | None = None) -> None:
        """The run is stopping: the last step ends now (users waiting for a later time are stopped)."""
        now = time.perf_counter() if now is None else now
        ended = False
        for segment in self._segments:  # a trace replay holds all its windows at once; a rate run only the last
            if segment.end == math.inf:
                segment.end = now
                ended = True
        if ended:
            self._notify()

    def close(self) -> int:
        """At the end of the run: log, never drop silently, the intended sends that were due and not sent."""
        self.finish()
        missed = self.overdue()
        if missed:
            logger.warning(
                "%d scheduled request(s) were due before the run stopped but never sent: all --max-users users were "
                "busy (the schedule lag columns show how far behind the client was)",
                missed,
            )
        self._segments.clear()
        return missed

    def _notify(self) -> None:
        old, self.changed = self.changed, Event()
        old.set()
