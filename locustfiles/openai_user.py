"""A Locust user that sends the run's requests (--endpoint: its kind's requester, locustfiles/kinds/) to an
OpenAI-compatible server and records every streamed chunk's arrival.

Why not HttpUser/FastHttpUser: for a streamed response their Locust entry carries the time to the headers,
`catch_response` loses exceptions that are not ResponseErrors (a reset mid-stream would vanish), and their
line iterators read 1 KiB blocks, which delays and bunches token arrivals. This user owns one connection
(locustfiles/stream_client.py: connect, stamp, send prepared bytes; one stamp per read), its requester parses each
line as it is read (a few µs), and it fires exactly one Locust request event per request with the end-to-end time
and a categorized failure.
"""

from __future__ import annotations

import itertools
import secrets

from geventhttpclient.url import URL
from locust import User, task
from locust.exception import StopTest

from ..analysis import glossary, kinds
from ..analysis.outages import next_backoff, refused
from ..analysis.records import RequestRecord
from . import options as options_mod
from . import trace_run
from .exitcodes import EXIT_SETUP_ERROR
from .kinds import LLMRequestError, build_payload, requester
from .openloop import Slot
from .stream_client import StreamClient

CONNECT_TIMEOUT_S = 30.0

__all__ = ["LLMRequestError", "OpenAIStreamingUser", "build_payload"]


class OpenAIStreamingUser(User):
    """Closed loop: each user sends one request after another, with no think time, but backs off after a refused
    connection. Open loop (--rates): each user waits for the next intended send time of its process's schedule,
    then sends one request. What a request is, its kind's requester decides (locustfiles/kinds/)."""

    abstract = True
    _backoff_s = 0.0  # closed loop: the wait before the next request, after refusals (analysis.outages)
    requester = None  # this user's requests (its kind's Requester), from on_start

    def wait_time(self) -> float:
        """Closed loop: no wait, or the backoff after a refusal. Open loop: block until the next intended send time
        has come and keep its slot. Locust calls this with the user marked as waiting, so stopping the run stops a
        waiting or backing-off user at once, and its sleep is this user's greenlet's alone. In a conversation, the
        wait before its next turn is the think time (no slot: an open loop's schedule starts conversations)."""
        player = getattr(self.requester, "conversation", None)
        if player is not None and player.in_conversation:
            return player.take_think_time()
        if self.open_loop:
            self._slot = self.run.tracker.plan.next_slot()
            return 0.0
        return self._backoff_s

    def user_seed(self, opts) -> str:
        """This user's seed: reproducible for the same --seed and user layout (worker, order of start)."""
        return f"{opts.seed}:{getattr(self.environment.runner, 'worker_index', 0)}:{next(self.shared.user_numbers)}"

    def on_start(self) -> None:
        env = self.environment
        self.run = env.vllm_loadtest
        # The run's options, typed, read once per user: the requesters read them per request (settings.py).
        opts = self.options = self.run.options
        self.shared = self.run.resources  # the process's model, prompts, images and trace replay
        # --rates, or a capacity search over rates: each probe is a rate step; --trace: each row at its time.
        self.trace = trace_run.active(opts)
        self.open_loop = bool(opts.rates) or opts.find_capacity == "rate" or self.trace
        self._slot: Slot | None = None
        try:
            self.fields = self.shared.request_fields(opts)  # a worker reads its own copy of the --tools file
        except ValueError as e:
            env.process_exit_code = EXIT_SETUP_ERROR  # bad input, nothing sent
            raise StopTest(str(e)) from None
        self.model = self.shared.model(self.host)
        self.endpoint = opts.endpoint
        kind = requester(opts.endpoint)
        base = URL(self.host)
        headers = {
            "Content-Type": "application/json",
            "Accept": kind.accept,
            # A compressed event stream cannot be stamped line by line; a compressed whole answer would time the
            # server's compression, not the model.
            "Accept-Encoding": "identity",
        }
        # Without --keep-alive, a fresh connection per request (StreamClient sends "Connection: close"). Reusing
        # one at once races uvicorn's keep-alive timer (uvicorn #824/#1637): a request that arrives before the
        # server has finished the previous response is closed 5 s later without an answer. Seen here 13 times in
        # one demo run; a loopback connect costs ~0.1 ms, and it is made before the send stamp.
        api_key = options_mod.api_key(opts)
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self.request_name = kinds.path_of(kinds.of(opts.endpoint), opts)  # Locust's name of the requests: the path
        self.path = base.path.rstrip("/") + self.request_name
        self.http = StreamClient(
            base,
            self.path,
            headers,
            connection_timeout=min(CONNECT_TIMEOUT_S, opts.read_timeout),
            network_timeout=opts.read_timeout,
            keep_alive=opts.keep_alive,
        )
        # Request ids: a random per-user prefix and a counter (32 hex digits like a uuid4, without a getrandom
        # system call per request: 50 µs each under the profiler). Session ids share the prefix.
        self.id_prefix = secrets.token_hex(10)
        self._ids = map(f"{self.id_prefix}{{:012x}}".format, itertools.count())
        self.dataset_spec: str | None = None  # set by a requester that reads --dataset
        self.requester = kind(self, opts)

    def on_stop(self) -> None:
        slot = getattr(self, "_slot", None)
        if slot is not None:  # stopped between taking its send time and sending: another user sends it
            self._slot = None
            self.run.tracker.plan.give_back(slot)
        http = getattr(self, "http", None)
        if http is not None:
            http.close()

    @task
    def completion(self) -> None:
        self.requester.task()

    def back_off(self, record: RequestRecord) -> None:
        """Closed loop: a refused (or reset before answering) connection is retried after a doubling wait, not at
        once; any answer resets the wait."""
        self._backoff_s = next_backoff(self._backoff_s, refused(record.error_type, record.http_status))

    def new_record(self, slot: Slot | None, dataset: bool = True) -> RequestRecord:
        """A request's record before its send: the slot's intended time and step (open loop), else the step in force
        now."""
        if slot is None:
            step, users, warmup = self.run.tracker.current()
            intended = None
        else:
            step, users, warmup, intended = slot.step, slot.users, slot.warmup, slot.intended_wall
        return RequestRecord(
            request_id=next(self._ids), worker=self.run.worker_name, step=step, users=users, warmup=warmup,
            start_time=0.0, endpoint=self.endpoint, model=self.model, intended_start_time=intended,
            dataset=self.dataset_spec if dataset else None,
        )  # fmt: skip

    def stamp_send(self, record: RequestRecord, done: float) -> float:
        """The record's start and HTTP status from the connection; returns the attempt's duration until `done`:
        from the send stamp, or (failed while connecting, nothing sent) the time spent connecting."""
        http = self.http
        record.http_status = http.status or None
        if http.t0:
            record.start_time = http.start_time
            duration = done - http.t0
        else:
            record.start_time = http.connect_time
            duration = done - http.connect_t
        if record.intended_start_time is not None:
            record.schedule_lag_s = glossary.schedule_lag_s(record.start_time, record.intended_start_time)
        return duration

    def report(
        self, record: RequestRecord, e2e: float | None, duration: float, failure: LLMRequestError | None, report: bool
    ) -> RequestRecord:
        """Hand the finished record to the suite's listeners, then (unless cut off) report it to Locust, timed by its
        E2E when ok and by its duration when it failed."""
        self.environment.events.llm_request.fire(record=record)
        if report:
            self.environment.events.request.fire(
                request_type="POST",
                name=self.request_name,
                response_time=((e2e if failure is None else duration) or 0.0) * 1000.0,
                response_length=self.http.nbytes,
                response=None,
                context={"request_id": record.request_id},
                exception=failure,
            )
        return record
