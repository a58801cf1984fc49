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
import math
import random
import secrets
import time

import orjson
from gevent import GreenletExit
from geventhttpclient.response import HTTPParseError
from geventhttpclient.url import URL
from locust import User, task
from locust.exception import StopTest

from ..analysis import error_body, glossary, servers
from ..analysis.embedding_response import BAD_RESPONSE, EmbeddingAnswer, parse_embeddings
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
from . import datasets, images, request_options, trace_run
from . import options as options_mod
from .conversation import ConversationPlayer, is_conversation
from .exitcodes import EXIT_SETUP_ERROR
from .openloop import Slot
from .options import ENDPOINTS
from .stream_client import StreamClient

CONNECT_TIMEOUT_S = 30.0
# --endpoint embeddings: the batches' request bytes are serialized once per process when the batches before they
# repeat hold at most this much text (lcm(items, --batch-size) inputs); beyond, each body is serialized per request.
EMBED_PREPARED_BYTES = 64 << 20
_PLACEHOLDER = datasets.REQUEST_ID_PLACEHOLDER.encode("latin-1")


class LLMRequestError(Exception):
    """A failed LLM request; str() is 'category: message', which is how Locust groups its failures."""

    def __init__(self, category: str, message: str) -> None:
        super().__init__(f"{category}: {message}")
        self.category = category
        self.message = message


def build_payload(
    options,
    model: str,
    prompt: str | list[dict] | None = None,
    max_tokens: int | None = None,
    fields: request_options.RequestFields | None = None,
) -> dict:
    """The JSON body of one request, from the run's options (`prompt` replaces --prompt: text, or chat messages;
    `max_tokens` replaces --max-tokens). Vendor extensions only where the server's profile accepts them: a server
    that rejects unknown fields (OpenAI's API: HTTP 400) gets only what the OpenAI API defines. The request options
    (locustfiles/request_options.py) come last, --extra-body merged over everything. Every body goes through here:
    the prepared ones, a conversation's turns and a trace's rows. `fields`: the parsed request options (a user's,
    parsed once per run); parsed now without them."""
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
    if getattr(options, "images", "") and "messages" in payload:  # --images: chat only (options.check)
        # Placeholders for the data URLs, spliced in per request before the send stamp (locustfiles/images.py).
        payload["messages"] = images.attach(payload["messages"], images.spec_of(options).count)
    if options.ignore_eos and profile.ignore_eos:  # refused before the run for a profile without it (options.py)
        payload["ignore_eos"] = True  # vLLM (and SGLang, llama.cpp) extension: exact output lengths
    fields = request_options.fields(options) if fields is None else fields
    if fields.chat and options.endpoint == "chat":  # refused before the run for the completions endpoint
        payload.update(fields.chat)  # chat_template_kwargs, tools, tool_choice
        if fields.chat_template_kwargs is not None and not profile.chat_template_kwargs:
            del payload["chat_template_kwargs"]  # refused before the run for a profile without it (options.py)
    if fields.extra_body:  # last: the user's escape hatch, sent as asked
        request_options.merge(payload, fields.extra_body)
    return payload


def embeddings_payload(
    options, model: str, texts: list[str], fields: request_options.RequestFields | None = None
) -> dict:
    """The JSON body of one embeddings request: the batch's texts as `input` (always a list, as vLLM and OpenAI take
    a batch), --encoding-format, then --extra-body merged last (the user's escape hatch: dimensions,
    truncate_prompt_tokens, ...)."""
    payload: dict = {"model": model, "input": list(texts), "encoding_format": options.encoding_format}
    fields = request_options.fields(options) if fields is None else fields
    if fields.extra_body:
        request_options.merge(payload, fields.extra_body)
    return payload


def embedding_text(prompt: str | list[dict]) -> str:
    """An item's text as one embeddings input: a text prompt as it is; chat messages flattened to their contents,
    one per line (the text parts of a content list)."""
    if isinstance(prompt, str):
        return prompt
    lines = []
    for message in prompt:
        content = message.get("content")
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p)
        if content:
            lines.append(str(content))
    return "\n".join(lines)


class OpenAIStreamingUser(User):
    """Closed loop: each user streams one completion after another, with no think time, but backs off after a
    refused connection. Open loop (--rates): each user waits for the next intended send time of its process's
    schedule, then streams one completion."""

    abstract = True
    _backoff_s = 0.0  # closed loop: the wait before the next request, after refusals (analysis.outages)
    conversation: ConversationPlayer | None = None  # --turns: this user's conversations

    def wait_time(self) -> float:
        """Closed loop: no wait, or the backoff after a refusal. Open loop: block until the next intended send time
        has come and keep its slot. Locust calls this with the user marked as waiting, so stopping the run stops a
        waiting or backing-off user at once, and its sleep is this user's greenlet's alone. In a conversation, the
        wait before its next turn is the think time (no slot: an open loop's schedule starts conversations)."""
        player = self.conversation
        if player is not None and player.in_conversation:
            return player.take_think_time()
        if self.open_loop:
            self._slot = self.run.tracker.plan.next_slot()
            return 0.0
        return self._backoff_s

    def _user_seed(self, opts) -> str:
        """This user's seed: reproducible for the same --seed and user layout (worker, order of start)."""
        return f"{opts.seed}:{getattr(self.environment.runner, 'worker_index', 0)}:{next(self.shared.user_numbers)}"

    def on_start(self) -> None:
        env = self.environment
        opts = env.parsed_options
        self.run = env.vllm_loadtest
        self.shared = self.run.resources  # the process's model, prompts, images and trace replay
        # --rates, or a capacity search over rates: each probe is a rate step; --trace: each row at its time.
        self.trace = trace_run.active(opts)
        self.open_loop = bool(getattr(opts, "rates", "")) or getattr(opts, "find_capacity", "") == "rate" or self.trace
        self._slot: Slot | None = None
        try:
            self.fields = self.shared.request_fields(opts)  # a worker reads its own copy of the --tools file
        except ValueError as e:
            env.process_exit_code = EXIT_SETUP_ERROR  # bad input, nothing sent
            raise StopTest(str(e)) from None
        self.model = self.shared.model(self.host)
        self.endpoint = opts.endpoint
        base = URL(self.host)
        self.path = base.path.rstrip("/") + ENDPOINTS[opts.endpoint]
        embeddings = opts.endpoint == "embeddings"
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json" if embeddings else "text/event-stream",
            # A compressed event stream cannot be stamped line by line; a compressed embeddings body would time the
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
        self.http = StreamClient(
            base,
            self.path,
            headers,
            connection_timeout=min(CONNECT_TIMEOUT_S, opts.read_timeout),
            network_timeout=opts.read_timeout,
            keep_alive=opts.keep_alive,
        )
        # --images: the process's image maker; each body's placeholders get the request's data URLs (_prepare).
        self.images = self.shared.image_maker(opts)
        self.image_count = None if self.images is None else self.images.spec.count
        self._image_requests = itertools.count()
        self._prepare = self.http.prepare if self.images is None else self._prepare_with_images
        if self.trace:
            # Per user, the seed of its images (the other requests draw theirs in _prepare_dataset).
            self._seed = self._user_seed(opts)
            # The trace's rows: their bodies built by the process's replay (locustfiles/trace_run.py), ahead.
            self.replay = self.shared.trace_replay(
                self.host, self.model, lambda prompt, n: build_payload(opts, self.model, prompt, n, self.fields)
            )
        elif embeddings:
            self._prepare_embeddings(opts)
        else:
            self._prepare_dataset(opts)
        # Request ids: a random per-user prefix and a counter (32 hex digits like a uuid4, without a getrandom
        # system call per request: 50 µs each under the profiler).
        prefix = secrets.token_hex(10)
        self._ids = map(f"{prefix}{{:012x}}".format, itertools.count())
        if is_conversation(getattr(opts, "turns", "1")):
            # Session ids: the same random prefix (unique across users and processes) and a counter.
            self.conversation = ConversationPlayer(
                self.shared.dataset(self.host, self.model), opts, self.endpoint, self._seed, prefix, self._next_body
            )

    def _prepare_dataset(self, opts) -> None:
        """The run's prompts (--dataset) and, unless max_tokens varies per request, their request bytes."""
        dataset = self.shared.dataset(self.host, self.model)
        source = datasets.parse_dataset(opts.dataset)
        self.dataset_spec = dataset.spec
        self.items = dataset.items
        self.max_tokens = datasets.parse_max_tokens(opts.max_tokens_dist, opts.max_tokens, source)
        # Per user, its own draws (start and max_tokens), reproducible for the same --seed and user layout.
        self._seed = self._user_seed(opts)
        self.rng = random.Random(self._seed)
        # `fixed` starts every user at the first prompt, as before sources; the others spread the users out.
        self._next_body = 0 if isinstance(source, datasets.FixedSource) else self.rng.randrange(len(self.items))
        if self.max_tokens.varies:
            # A max_tokens per request: the body is serialized per request, before the send stamp.
            self.payloads = [build_payload(opts, self.model, item.prompt, fields=self.fields) for item in self.items]
            self.bodies = None
            return
        # Serialized once per process, HTTP head included: the request path then only hands prepared bytes to the
        # socket. Keyed by everything else that shapes the bytes (the same for all users of a run): the body without
        # its prompt carries the request options too (the tools file's content, not only its path).
        key = (
            self.http.head,
            opts.max_tokens_dist,
            json.dumps(build_payload(opts, self.model, "", fields=self.fields)),
        )
        if key not in dataset.prepared:
            limits = [self.max_tokens.draw(self.rng, item) for item in self.items]
            bodies = [
                json.dumps(build_payload(opts, self.model, item.prompt, n, self.fields)).encode()
                for item, n in zip(self.items, limits)
            ]
            if self.images is None:  # with --images, prepared per request (_prepare_with_images)
                bodies = [self.http.prepare(body) for body in bodies]
            dataset.prepared[key] = (bodies, limits)
        self.bodies, self.body_max_tokens = dataset.prepared[key]

    def _prepare_embeddings(self, opts) -> None:
        """--endpoint embeddings: the dataset's texts (built as for completions: exact token lengths) in batches of
        --batch-size consecutive items, batch k holding items kB .. kB+B-1 (modulo the items); their request bytes
        serialized once per process and shared by its users, unless they are too many (EMBED_PREPARED_BYTES)."""
        dataset = self.shared.dataset(self.host, self.model)
        source = datasets.parse_dataset(opts.dataset)
        self.dataset_spec = dataset.spec
        self.items = dataset.items
        self.batch_size = batch = int(opts.batch_size)
        self.encoding_format = opts.encoding_format
        self._seed = self._user_seed(opts)
        self.rng = random.Random(self._seed)
        if "embedding_texts" not in dataset.prepared:  # once per process: the users share the strings
            dataset.prepared["embedding_texts"] = [embedding_text(item.prompt) for item in self.items]
        self._texts = dataset.prepared["embedding_texts"]
        # The batches before they repeat: lcm(items, batch) inputs in all.
        self._batches = len(self._texts) // math.gcd(len(self._texts), batch)
        self._next_body = 0 if isinstance(source, datasets.FixedSource) else self.rng.randrange(self._batches)
        self._embed_per_request = any(item.per_request for item in self.items)
        key = ("embeddings", self.http.head, batch, json.dumps(embeddings_payload(opts, self.model, [], self.fields)))
        if key not in dataset.prepared:
            text_bytes = sum(len(t.encode()) for t in self._texts) * (self._batches * batch // len(self._texts))
            bodies = None
            if text_bytes <= EMBED_PREPARED_BYTES:
                bodies = [self.http.prepare(orjson.dumps(self._embed_payload(k))) for k in range(self._batches)]
            dataset.prepared[key] = bodies
        self.bodies = dataset.prepared[key]

    def _embed_payload(self, k: int) -> dict:
        """Batch k's body (a dict): items kB .. kB+B-1, modulo the items."""
        texts, batch = self._texts, self.batch_size
        n = len(texts)
        chosen = [texts[(k * batch + j) % n] for j in range(batch)]
        return embeddings_payload(self.environment.parsed_options, self.model, chosen, self.fields)

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
        if self.endpoint == "embeddings":
            self._embed_task()
            return
        if self.conversation is not None:
            self._converse()
            return
        if self.open_loop:
            slot, self._slot = self._slot, None
            if slot is not None:  # None on the first run of the task, before wait_time took a slot
                self.stream_completion(slot)  # never backed off: the schedule is the load the user asked for
                if slot.position is not None:
                    self.run.tracker.plan.answer()  # a trace row answered: the replay ends with its last row
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
        # The request bytes, all made before the send stamp (taken inside http.stream, after connecting).
        if slot is not None and slot.position is not None:
            return self._stream_trace_row(record, parser, slot.position)
        index = self._next_body % len(self.items)
        self._next_body += 1
        item = self.items[index]
        if self.bodies is not None:
            prepared = self.bodies[index]
            if self.images is not None:
                prepared = self._prepare_with_images(prepared)
            record.max_tokens = self.body_max_tokens[index]
        else:
            payload = self.payloads[index]
            payload["max_tokens"] = record.max_tokens = self.max_tokens.draw(self.rng, item)
            prepared = self._prepare(orjson.dumps(payload))
        if item.per_request:  # the prompt carries this request's id (same length: Content-Length holds)
            prepared = (prepared[0], prepared[1].replace(_PLACEHOLDER, record.request_id.encode("latin-1")))
        record.dataset = self.dataset_spec
        record.reference_output_tokens = item.reference_output_tokens
        return self._send(record, prepared, parser)

    def _embed_task(self) -> None:
        """--endpoint embeddings: one request (in an open loop at its slot's time), then the closed loop's backoff."""
        if self.open_loop:
            slot, self._slot = self._slot, None
            if slot is not None:  # None on the first run of the task, before wait_time took a slot
                self.embed(slot)
            return
        record = self.embed()
        self._backoff_s = next_backoff(self._backoff_s, refused(record.error_type, record.http_status))

    def embed(self, slot: Slot | None = None) -> RequestRecord:
        """Send the next batch of inputs to /v1/embeddings (its bytes made before the send stamp), read the whole
        answer, check it, then record and report the request."""
        record = self._new_record(slot)
        record.inputs = self.batch_size
        k = self._next_body % self._batches
        self._next_body += 1
        if self.bodies is not None:
            prepared = self.bodies[k]
        else:
            prepared = self.http.prepare(orjson.dumps(self._embed_payload(k)))
        if self._embed_per_request:  # an input carries this request's id (same length: Content-Length holds)
            prepared = (prepared[0], prepared[1].replace(_PLACEHOLDER, record.request_id.encode("latin-1")))
        return self._fetch(record, prepared)

    def _fetch(self, record: RequestRecord, prepared: tuple[bytes, bytes]) -> RequestRecord:
        """Send prepared bytes, read the whole answer, parse and check it (analysis/embedding_response.py)."""
        http = self.http
        failure: LLMRequestError | None = None
        answer: EmbeddingAnswer | None = None
        done = 0.0
        try:
            body = http.fetch(prepared, record.request_id)
            done = time.perf_counter()
            if http.status == 0:
                failure = LLMRequestError(CONNECTION_ERROR, "the server closed the connection before answering")
            elif http.status != 200:
                failure = LLMRequestError(f"http_{http.status}", error_body.message_from_body(http.error_body))
            elif not http.complete:
                failure = LLMRequestError(
                    CONNECTION_ERROR, f"the connection closed after {http.nbytes} byte(s) of the body, before its end"
                )
            else:
                answer = parse_embeddings(body, record.inputs, self.encoding_format)
                if answer.error is not None:
                    failure = LLMRequestError(BAD_RESPONSE, answer.error)
        except GreenletExit:
            if http.t0:  # stopped while connecting: nothing was sent, so there is no request to record
                cut = LLMRequestError(CUT_OFF, "the load generator stopped this user mid-request")
                self._finish_embedding(record, None, cut, time.perf_counter(), report=False)
            raise
        except TimeoutError as e:
            timeout = self.environment.parsed_options.read_timeout
            failure = LLMRequestError(TIMEOUT, f"no data for {timeout:g} s ({e or 'timed out'})")
        except (OSError, HTTPParseError) as e:
            failure = LLMRequestError(CONNECTION_ERROR, f"{type(e).__name__}: {e}")
        return self._finish_embedding(record, answer, failure, done or time.perf_counter())

    def _finish_embedding(
        self,
        record: RequestRecord,
        answer: EmbeddingAnswer | None,
        failure: LLMRequestError | None,
        done: float,
        report: bool = True,
    ) -> RequestRecord:
        """An embeddings record: e2e_s is the arrival of the body's last byte (a complete 200 body), prompt_tokens
        the answer's usage; the streaming fields stay None (they do not apply). Then listeners and Locust."""
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
        e2e = http.last_offset_s if http.status == 200 and http.complete else None
        record.status = "ok" if failure is None else "error"
        record.error_type = None if failure is None else failure.category
        record.error = None if failure is None else failure.message
        record.e2e_s = e2e
        record.duration_s = duration
        record.prompt_tokens = None if answer is None else answer.prompt_tokens
        return self._report(record, e2e, duration, failure, report)

    def _new_record(self, slot: Slot | None) -> RequestRecord:
        """A conversation turn's record before its send: the slot's intended time and step (a conversation's first
        turn in an open loop), else the step in force now."""
        if slot is None:
            step, users, warmup = self.run.tracker.current()
            intended = None
        else:
            step, users, warmup, intended = slot.step, slot.users, slot.warmup, slot.intended_wall
        return RequestRecord(
            request_id=next(self._ids), worker=self.run.worker_name, step=step, users=users, warmup=warmup,
            start_time=0.0, endpoint=self.endpoint, model=self.model, intended_start_time=intended,
            dataset=self.dataset_spec,
        )  # fmt: skip

    def _converse(self) -> None:
        """--turns: the next turn of this user's conversation (after its think time), or a new conversation: in an
        open loop, at the next intended send time of the schedule."""
        player = self.conversation
        slot = None
        if self.open_loop and not player.in_conversation:
            slot, self._slot = self._slot, None
            if slot is None:  # the first run of the task, before wait_time took a slot
                return
        record = self._new_record(slot)
        prompt, turn, text = player.ask(record)
        # The body is serialized per turn (the prompt grows), before the send stamp.
        record.max_tokens = self.max_tokens.draw(self.rng, turn)
        record.reference_output_tokens = turn.reference_output_tokens
        payload = build_payload(self.environment.parsed_options, self.model, prompt, record.max_tokens, self.fields)
        parser = StreamParser(keep_text=True)
        record = self._send(record, self._prepare(orjson.dumps(payload)), parser)
        player.answered(record, turn, text, parser.text)
        if not self.open_loop:
            self._backoff_s = next_backoff(self._backoff_s, refused(record.error_type, record.http_status))

    def _stream_trace_row(self, record: RequestRecord, parser: StreamParser, position: int) -> RequestRecord:
        """A trace replay's row: its body (the synthesized prompt, max_tokens = its output length), then the send."""
        body, record.max_tokens = self.replay.body(position)
        record.trace_row = int(self.replay.trace.rows[position])
        return self._send(record, self._prepare(body), parser)

    def _prepare_with_images(self, body: bytes) -> tuple[bytes, bytes]:
        """--images: the body with this request's data URLs in place of its placeholders, prepared (before the
        send stamp). Each request's images are seeded by the user's seed and its request counter."""
        urls = self.images.urls(f"{self._seed}:{next(self._image_requests)}")
        return self.http.prepare(images.splice(body, urls))

    def _send(self, record: RequestRecord, prepared: tuple[bytes, bytes], parser: StreamParser) -> RequestRecord:
        """Send prepared bytes, parse the stream as it arrives, then record and report the request."""
        http = self.http
        failure: LLMRequestError | None = None
        record.images = self.image_count
        try:
            http.stream(prepared, record.request_id, parser.feed)
            if http.status == 0:
                failure = LLMRequestError(CONNECTION_ERROR, "the server closed the connection before answering")
            elif http.status != 200:
                failure = LLMRequestError(f"http_{http.status}", error_body.message_from_body(http.error_body))
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
        record.cached_prompt_tokens = parsed.cached_prompt_tokens
        record.chunks = len(parsed.token_offsets_s)
        record.finish_reason = parsed.finish_reason
        record.chunk_offsets_s = parsed.token_offsets_s
        record.chunk_tokens = parsed.chunk_tokens
        if parsed.token_offsets_s:  # the reasoning / answer / tool-call split (analysis/sse.py); None without tokens
            record.reasoning_tokens = parsed.reasoning_tokens
            record.ttfo_s = parsed.first_output_offset_s
            record.tool_call_chunks = parsed.tool_call_chunks
            record.answer_tpot_s = glossary.answer_tpot_s(e2e, record.ttfo_s, output_tokens, record.reasoning_tokens)
        return self._report(record, e2e, duration, failure, report)

    def _report(
        self, record: RequestRecord, e2e: float | None, duration: float, failure: LLMRequestError | None, report: bool
    ) -> RequestRecord:
        """Hand the finished record to the suite's listeners, then (unless cut off) report it to Locust, timed by its
        E2E when ok and by its duration when it failed."""
        self.environment.events.llm_request.fire(record=record)
        if report:
            self.environment.events.request.fire(
                request_type="POST",
                name=ENDPOINTS[self.endpoint],
                response_time=((e2e if failure is None else duration) or 0.0) * 1000.0,
                response_length=self.http.nbytes,
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
