"""What every request kind's requester shares: the failure it reports, one request per task in a closed or an open
loop, and the record's start (the step in force, or the open loop's slot)."""

from __future__ import annotations

from ...analysis import kinds
from ...analysis.records import RequestRecord
from ..openloop import Slot


class LLMRequestError(Exception):
    """A failed LLM request; str() is 'category: message', which is how Locust groups its failures."""

    def __init__(self, category: str, message: str) -> None:
        super().__init__(f"{category}: {message}")
        self.category = category
        self.message = message


class Requester:
    """One user's requests of one kind (locustfiles/kinds/: one module per kind). `user` is the Locust user: its
    connection (`http`), model, request options (`fields`), ids and run context."""

    accept = "application/json"  # the Accept header of its requests
    kind: kinds.RequestKind

    def __init__(self, user, opts) -> None:
        self.user = user

    def task(self) -> None:
        """One request: in an open loop at its slot's intended time (never backed off: the schedule is the load the
        user asked for), in a closed loop at once, then the backoff after a refused connection (against a dead server
        a tight loop sent 110,019 requests in 9 s, each a record; any answer resets the wait)."""
        user = self.user
        if user.open_loop:
            slot, user._slot = user._slot, None
            if slot is not None:  # None on the first run of the task, before wait_time took a slot
                self.request(slot)
                if slot.position is not None:
                    user.run.tracker.plan.answer()  # a trace row answered: the replay ends with its last row
            return
        user.back_off(self.request(None))

    def request(self, slot: Slot | None) -> RequestRecord:
        raise NotImplementedError
