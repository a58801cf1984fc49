"""A Locust user that streams completions from an OpenAI-compatible server and records every chunk's arrival.

Why not HttpUser/FastHttpUser: for a streamed response their Locust entry carries the time to the headers,
`catch_response` loses exceptions that are not ResponseErrors (a reset mid-stream would vanish), and their
line iterators read 1 KiB blocks, which delays and bunches token arrivals. This user owns one connection
(locustfiles/stream_client.py: connect, stamp, send prepared bytes; one stamp per read), parses each line as
it is read (a few µs), and fires exactly one Locust request event per stream with the end-to-end time and a
categorized failure.
"""

from __future__ import annotations

import itertools
import json
import random
import secrets
import time

import orjson
from gevent import GreenletExit
from geventhttpclient.response import HTTPParseError
from geventhttpclient.url import URL
from locust import User, task

from ..analysis import glossary, servers
from ..analysis.outages import next_backoff, refused
from ..analysis.records import RequestRecord
from ..analysis.sse import (
    CONNECTION_ERROR,
    CUT_OFF,
    EMPTY_STREAM,
    INCOMPLETE_STREAM,
    NOT_SSE,
    TIMEOUT,
    ParsedStream,
    StreamParser,
)
from . import datasets
from . import options as options_mod
from .openloop import Slot
from .options import ENDPOINTS
from .stream_client import StreamClient

CONNECT_TIMEOUT_S = 30.0
_PLACEHOLDER = datasets.REQUEST_ID_PLACEHOLDER.encode("latin-1")
_user_numbers = itertools.count()  # users started by this process, for their seeds


class LLMRequestError(Exception):
    """A failed LLM request; str() is 'category: message', which is how Locust groups its failures."""

    def __init__(self, category: str, message: str) -> None:
        super().__init__(f"{category}: {message}")
        self.category = category
        self.message = message


def build_payload(options, model: str, prompt: str | list[dict] | None = None, max_tokens: int | None = None) -> dict:
    """The JSON body of one request, from the run's options (`prompt` replaces --prompt: text, or chat messages;
    `max_tokens` replaces --max-tokens). Vendor extensions only where the server's profile accepts them: a server
    that rejects unknown fields (OpenAI's API: HTTP 400) gets only what the OpenAI API defines."""
    prompt = options.prompt if prompt is None else prompt
    profile = servers.of_options(options)
    stream_options = {"include_usage": True}
    if profile.continuous_usage_stats and not options.no_continuous_usage:
        stream_options["continuous_usage_stats"] = True
    payload: dict = {
        "model": model,
        "max_tokens": options.max_tokens if max_tokens is None else max_tokens,
        "temperature": options.temperature,
        "stream": True,
        "stream_options": stream_options,
    }
    if isinstance(prompt, list):
        payload["messages"] = prompt  # a source's chat messages (only built for the chat endpoint)
    elif options.endpoint == "chat":
        payload["messages"] = [{"role": "user", "content": prompt}]
    else:
        payload["prompt"] = prompt
    if options.ignore_eos and profile.ignore_eos:  # refused before the run for a profile without it (options.py)
        payload["ignore_eos"] = True  # vLLM (and SGLang, llama.cpp) extension: exact output lengths
    return payload


def error_message_from_body(body: bytes) -> str:
    """The server's own message from an OpenAI-style error body, else the start of the body."""
    text = body.decode("utf-8", errors="replace")
    try:
        obj = json.loads(text)
    except ValueError:
        return " ".join(text.split())[:300] or "(empty body)"
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:300]
        if isinstance(err, str):
            return err[:300]
        if obj.get("message"):
            return str(obj["message"])[:300]
        if obj.get("detail"):
            return str(obj["detail"])[:300]
    return text[:300]


class OpenAIStreamingUser(User):
    """Closed loop: each user streams one completion after another, with no think time, but backs off after a
    refused connection. Open loop (--rates): each user waits for the next intended send time of its process's
    schedule, then streams one completion."""

    abstract = True
    _backoff_s = 0.0  # closed loop: the wait before the next request, after refusals (analysis.outages)

    def wait_time(self) -> float:
        """Closed loop: no wait, or the backoff after a refusal. Open loop: block until the next intended send time
        has come and keep its slot. Locust calls this with the user marked as waiting, so stopping the run stops a
        waiting or backing-off user at once, and its sleep is this user's greenlet's alone."""
        if self.open_loop:
            self._slot = self.run.tracker.plan.next_slot()
            return 0.0
        return self._backoff_s

    def on_start(self) -> None:
        env = self.environment
        opts = env.parsed_options
        self.run = env.vllm_loadtest
        # --rates, or a capacity search over rates: each probe is a rate step.
        self.open_loop = bool(getattr(opts, "rates", "")) or getattr(opts, "find_capacity", "") == "rate"
        self._slot: Slot | None = None
        self.model = self.run.model(self.host)
        self.endpoint = opts.endpoint
        base = URL(self.host)
        self.path = base.path.rstrip("/") + ENDPOINTS[opts.endpoint]
        headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            "Accept-Encoding": "identity",  # a compressed event stream cannot be stamped line by line
        }
        # Without --keep-alive, a fresh connection per request (StreamClient sends "Connection: close"). Reusing
        # one at once races uvicorn's keep-alive timer (uvicorn #824/#1637): a request that arrives before the
        # server has finished the previous response is closed 5 s later without an answer. Seen here 13 times in
        # one demo run; a loopback connect costs ~0.1 ms, and it is made before the send stamp.
        api_key = options_mod.api_key(opts)
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self.http = StreamClient(
            base,
            self.path,
            headers,
            connection_timeout=min(CONNECT_TIMEOUT_S, opts.read_timeout),
            network_timeout=opts.read_timeout,
            keep_alive=opts.keep_alive,
        )
        self._prepare_dataset(opts)
        # Request ids: a random per-user prefix and a counter (32 hex digits like a uuid4, without a getrandom
        # system call per request: 50 µs each under the profiler).
        self._ids = map(f"{secrets.token_hex(10)}{{:012x}}".format, itertools.count())

    def _prepare_dataset(self, opts) -> None:
        """The run's prompts (--dataset) and, unless max_tokens varies per request, their request bytes."""
        dataset = self.run.dataset(self.host, self.model)
        source = datasets.parse_dataset(opts.dataset)
        self.dataset_spec = dataset.spec
        self.items = dataset.items
        self.max_tokens = datasets.parse_max_tokens(opts.max_tokens_dist, opts.max_tokens, source)
        runner = self.environment.runner
        # Per user, its own draws (start and max_tokens), reproducible for the same --seed and user layout.
        self.rng = random.Random(f"{opts.seed}:{getattr(runner, 'worker_index', 0)}:{next(_user_numbers)}")
        # `fixed` starts every user at the first prompt, as before sources; the others spread the users out.
        self._next_body = 0 if isinstance(source, datasets.FixedSource) else self.rng.randrange(len(self.items))
        if self.max_tokens.varies:
            # A max_tokens per request: the body is serialized per request, before the send stamp.
            self.payloads = [build_payload(opts, self.model, item.prompt) for item in self.items]
            self.bodies = None
            return
        # Serialized once per process, HTTP head included: the request path then only hands prepared bytes to the
        # socket. Keyed by everything else that shapes the bytes (the same for all users of a run).
        key = (self.http.head, opts.max_tokens_dist, json.dumps(build_payload(opts, self.model, "")))
        if key not in dataset.prepared:
            limits = [self.max_tokens.draw(self.rng, item) for item in self.items]
            bodies = [
                self.http.prepare(json.dumps(build_payload(opts, self.model, item.prompt, n)).encode())
                for item, n in zip(self.items, limits)
            ]
            dataset.prepared[key] = (bodies, limits)
        self.bodies, self.body_max_tokens = dataset.prepared[key]

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
        if self.open_loop:
            slot, self._slot = self._slot, None
            if slot is not None:  # None on the first run of the task, before wait_time took a slot
                self.stream_completion(slot)  # never backed off: the schedule is the load the user asked for
            return
        record = self.stream_completion()
        # A refused (or reset before answering) connection is retried after a doubling wait, not at once: against a
        # dead server a tight loop sent 110,019 requests in 9 s, each a record. Any answer resets the wait.
        self._backoff_s = next_backoff(self._backoff_s, refused(record.error_type, record.http_status))

    def stream_completion(self, slot: Slot | None = None) -> RequestRecord:
        """Send one streaming request, stamp every read, parse its lines, then record and report it. With a slot
        (open loop), the record keeps the slot's intended send time and step."""
        if slot is None:
            step, users, warmup = self.run.tracker.current()
            intended = None
        else:
            step, users, warmup, intended = slot.step, slot.users, slot.warmup, slot.intended_wall
        record = RequestRecord(
            request_id=next(self._ids), worker=self.run.worker_name, step=step, users=users, warmup=warmup,
            start_time=0.0, endpoint=self.endpoint, model=self.model, intended_start_time=intended,
        )  # fmt: skip
        parser = StreamParser()
        http = self.http
        failure: LLMRequestError | None = None
        # The request bytes, all made before the send stamp (taken inside http.stream, after connecting).
        index = self._next_body % len(self.items)
        self._next_body += 1
        item = self.items[index]
        if self.bodies is not None:
            prepared = self.bodies[index]
            record.max_tokens = self.body_max_tokens[index]
        else:
            payload = self.payloads[index]
            payload["max_tokens"] = record.max_tokens = self.max_tokens.draw(self.rng, item)
            prepared = http.prepare(orjson.dumps(payload))
        if item.per_request:  # the prompt carries this request's id (same length: Content-Length holds)
            prepared = (prepared[0], prepared[1].replace(_PLACEHOLDER, record.request_id.encode("latin-1")))
        record.dataset = self.dataset_spec
        record.reference_output_tokens = item.reference_output_tokens
        try:
            http.stream(prepared, record.request_id, parser.feed)
            if http.status == 0:
                failure = LLMRequestError(CONNECTION_ERROR, "the server closed the connection before answering")
            elif http.status != 200:
                failure = LLMRequestError(f"http_{http.status}", error_message_from_body(http.error_body))
        except GreenletExit:
            if http.t0:  # stopped while connecting: nothing was sent, so there is no request to record
                cut = LLMRequestError(CUT_OFF, "the load generator stopped this user mid-request")
                self._finish(record, parser.result, cut, report=False)
            raise
        except TimeoutError as e:  # socket.timeout is TimeoutError since Python 3.10
            timeout = self.environment.parsed_options.read_timeout
            failure = LLMRequestError(TIMEOUT, f"no data for {timeout:g} s ({e or 'timed out'})")
        except (OSError, HTTPParseError) as e:
            failure = LLMRequestError(CONNECTION_ERROR, f"{type(e).__name__}: {e}")
        return self._finish(record, parser.result, failure)

    def _finish(
        self, record: RequestRecord, parsed: ParsedStream, failure: LLMRequestError | None, report: bool = True
    ) -> RequestRecord:
        """Fill the record's measurements from the parsed stream, hand it to listeners, report it to Locust."""
        http = self.http
        record.http_status = http.status or None
        if http.t0:  # the request was sent: times count from its send stamp
            record.start_time = http.start_time
            duration = time.perf_counter() - http.t0
        else:  # failed before the send (connecting): the attempt's time is the time spent connecting
            record.start_time = http.connect_time
            duration = time.perf_counter() - http.connect_t
        if record.intended_start_time is not None:
            record.schedule_lag_s = glossary.schedule_lag_s(record.start_time, record.intended_start_time)
        if failure is None:
            failure = _stream_outcome(parsed, http.content_type)
        ttft = glossary.ttft_s(parsed.token_offsets_s)
        e2e = glossary.e2e_s(parsed.token_offsets_s)
        output_tokens = parsed.output_tokens if parsed.token_offsets_s or parsed.usage_completion_tokens else None
        record.status = "ok" if failure is None else "error"
        record.error_type = None if failure is None else failure.category
        record.error = None if failure is None else failure.message
        record.ttft_s, record.e2e_s = ttft, e2e
        record.tpot_s = glossary.tpot_s(e2e, ttft, output_tokens)
        record.duration_s = duration
        record.output_tokens = output_tokens
        record.output_tokens_estimated = None if output_tokens is None else parsed.output_tokens_estimated
        record.prompt_tokens = parsed.prompt_tokens
        record.chunks = len(parsed.token_offsets_s)
        record.finish_reason = parsed.finish_reason
        record.chunk_offsets_s = parsed.token_offsets_s
        record.chunk_tokens = parsed.chunk_tokens
        self.environment.events.llm_request.fire(record=record)
        if report:
            self.environment.events.request.fire(
                request_type="POST",
                name=ENDPOINTS[self.endpoint],
                response_time=((e2e if failure is None else duration) or 0.0) * 1000.0,
                response_length=http.nbytes,
                response=None,
                context={"request_id": record.request_id},
                exception=failure,
            )
        return record


def _stream_outcome(parsed: ParsedStream, content_type: str) -> LLMRequestError | None:
    """The failure, if any, of a 200 response whose bytes were all read."""
    if parsed.error_type:
        return LLMRequestError(parsed.error_type, parsed.error or "")
    if parsed.events == 0 and not parsed.done and "event-stream" not in content_type.lower():
        return LLMRequestError(NOT_SSE, f"expected text/event-stream, got {content_type or 'no content type'!r}")
    if not parsed.done and parsed.finish_reason is None:
        return LLMRequestError(
            INCOMPLETE_STREAM, f"stream ended after {parsed.events} event(s) without [DONE] or a finish_reason"
        )
    if not parsed.token_offsets_s:
        return LLMRequestError(EMPTY_STREAM, "stream finished without any output token")
    return None
