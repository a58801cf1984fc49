"""Open-loop load (--rates): each load process's schedule of intended send times, shared by its users.

Every rate step appends a segment to the process's plan: its share of the step's rate (rate / processes), its
arrival times (analysis.schedule.arrival_times) from the step's start. A user that is free takes the next intended
time, waits until then, and sends. When no user is free at an intended time, the request keeps its time and is
sent by the next user that becomes free: late, with its lag recorded, never skipped. A step's times that fall
after its end belong to no step and are not sent; times of an ended step that were due but not yet sent (a
backlog) are still sent first, tagged with their own step.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Iterator

from gevent.event import Event
from gevent.lock import Semaphore

from ..analysis.schedule import arrival_times

logger = logging.getLogger("vllm_loadtest")


class Segment:
    """One rate step of one process: its arrival times, from its start until the next step begins."""

    __slots__ = ("end", "measure_from", "rate_rps", "start", "start_wall", "step", "times", "upcoming", "users")

    def __init__(
        self, step: int, users: int, rate_rps: float, start: float, start_wall: float, warmup_s: float,
        times: Iterator[float],
    ) -> None:  # fmt: skip
        self.step = step
        self.users = users
        self.rate_rps = rate_rps
        self.start = start  # time.perf_counter() when the step began in this process
        self.start_wall = start_wall  # time.time() at the same moment: intended times are recorded on this clock
        self.measure_from = start + warmup_s
        self.times = times
        self.upcoming = start + next(times)
        self.end = math.inf  # set when the next step begins


class Slot:
    """One intended send: its time on both clocks and the step it belongs to."""

    __slots__ = ("intended", "intended_wall", "segment")

    def __init__(self, segment: Segment, intended: float) -> None:
        self.segment = segment
        self.intended = intended  # perf_counter
        self.intended_wall = segment.start_wall + (intended - segment.start)

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
        # Only one free user at a time holds the next time and waits for it; the other free users queue here
        # without a timer each. With 1000 users each holding a time, a step change woke all of them at once:
        # the event loop stalled 118 ms (generator lag max) and that step's TTFT p99 read 101 ms for 24 ms.
        self._turn = Semaphore()

    def reset(self) -> None:
        self._segments.clear()
        self._returned.clear()
        self.taken = 0
        self._notify()

    def begin(
        self, step: int, users: int, rate_rps: float, warmup_s: float, arrival: str, seed: int | str,
        rank: int = 0, processes: int = 1, now: float | None = None, now_wall: float | None = None,
        key: str | None = None,
    ) -> None:  # fmt: skip
        """A rate step begins now: this process sends its share (rate_rps / processes) from now on; `key` replaces
        the step in the stream's seed (a capacity search keys each probe by its rate)."""
        if step == 0:
            self.reset()  # a new run (the web UI can start one after another)
        now = time.perf_counter() if now is None else now
        now_wall = time.time() if now_wall is None else now_wall
        if self._segments:
            self._segments[-1].end = now
        # The seed includes the step, so each step's times are the same whatever happened in the steps before it.
        times = arrival_times(rate_rps, arrival, f"{seed}:{step if key is None else key}", rank, processes)
        self._segments.append(Segment(step, users, rate_rps, now, now_wall, warmup_s, times))
        self._notify()

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
            segment.upcoming = segment.start + next(segment.times)
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
                segment.upcoming = segment.start + next(segment.times)
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
        if self._segments and self._segments[-1].end == math.inf:
            self._segments[-1].end = time.perf_counter() if now is None else now
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
