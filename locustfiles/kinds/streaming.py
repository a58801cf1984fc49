"""The streamed kinds' shared requester (completions, chat): each request's bytes made before the send stamp, every
read stamped and its lines parsed as they arrive (analysis/sse.py), then one record per stream. A kind adds its own
prompt fields to the body (`add_prompt`): `prompt` (completions) or `messages` (chat, with images and chat fields).
Conversations (--turns) and trace rows (--trace) are bodies of the same requests."""

from __future__ import annotations

import json
import random
import time

import orjson
from gevent import GreenletExit
from geventhttpclient.response import HTTPParseError

from ...analysis import error_body, glossary, kinds, servers
from ...analysis.conversation import is_conversation
from ...analysis.records import RequestRecord
from ...analysis.sse import (
    CONNECTION_ERROR,
    CUT_OFF,
    EMPTY_STREAM,
    INCOMPLETE_STREAM,
    NOT_SSE,
    TIMEOUT,
    ParsedStream,
    StreamParser,
)
from .. import datasets, request_options
from ..conversation import ConversationPlayer
from ..openloop import Slot
from .base import LLMRequestError, Requester

_PLACEHOLDER = datasets.REQUEST_ID_PLACEHOLDER.encode("latin-1")


class StreamingRequester(Requester):
    """Closed loop: one stream after another; open loop: one per slot of the schedule; a conversation's next turn
    after its think time; a trace's row at its time."""

    accept = "text/event-stream"
    kind: kinds.RequestKind = kinds.COMPLETIONS

    @classmethod
    def add_prompt(cls, payload: dict, prompt, options) -> None:
        """The kind's prompt fields of one body (completions: `prompt`)."""
        payload["prompt"] = prompt

    @classmethod
    def add_fields(cls, payload: dict, fields: request_options.RequestFields, profile) -> None:
        """The kind's own request options (chat: chat_template_kwargs, tools, tool_choice)."""

    @classmethod
    def payload(
        cls,
        options,
        model: str,
        prompt: str | list[dict] | None = None,
        max_tokens: int | None = None,
        fields: request_options.RequestFields | None = None,
    ) -> dict:
        """The JSON body of one request, from the run's options (`prompt` replaces --prompt: text, or chat
        messages; `max_tokens` replaces --max-tokens). Vendor extensions only where the server's profile accepts
        them: a server that rejects unknown fields (OpenAI's API: HTTP 400) gets only what the OpenAI API defines.
        The request options (locustfiles/request_options.py) come last, --extra-body merged over everything. Every
        body goes through here: the prepared ones, a conversation's turns and a trace's rows. `fields`: the parsed
        request options (a user's, parsed once per run); parsed now without them."""
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
        cls.add_prompt(payload, prompt, options)
        if options.ignore_eos and profile.ignore_eos:  # refused before the run for a profile without it (options.py)
            payload["ignore_eos"] = True  # vLLM (and SGLang, llama.cpp) extension: exact output lengths
        fields = request_options.fields(options) if fields is None else fields
        cls.add_fields(payload, fields, profile)
        if fields.extra_body:  # last: the user's escape hatch, sent as asked
            request_options.merge(payload, fields.extra_body)
        return payload

    def __init__(self, user, opts) -> None:
        super().__init__(user, opts)
        self.prepare = user.http.prepare  # prepared bytes of a body (chat with --images: its data URLs spliced)
        self.conversation: ConversationPlayer | None = None  # --turns: this user's conversations
        self.mix = None  # --lora-mix: each request's model drawn from it (locustfiles/lora.py)
        if user.trace:
            # Per user, the seed of its images (the other requests draw theirs in _prepare_dataset).
            user._seed = user.user_seed(opts)
            # The trace's rows: their bodies built by the process's replay (locustfiles/trace_run.py), ahead.
            self.replay = user.shared.trace_replay(
                user.host, user.model, lambda prompt, n: self.payload(opts, user.model, prompt, n, user.fields)
            )
            return
        self._prepare_dataset(opts)
        if is_conversation(opts.turns):
            # Session ids: the same random prefix as the request ids (unique across users and processes), a counter.
            dataset = user.shared.dataset(user.host, user.model)
            self.conversation = ConversationPlayer(
                dataset, opts, self.kind.name, user._seed, user.id_prefix, self._next_body
            )

    def _prepare_dataset(self, opts) -> None:
        """The run's prompts (--dataset) and, unless max_tokens varies per request, their request bytes."""
        user = self.user
        dataset = user.shared.dataset(user.host, user.model)
        source = datasets.parse_dataset(opts.dataset)
        user.dataset_spec = dataset.spec
        self.items = dataset.items
        self.max_tokens = datasets.parse_max_tokens(opts.max_tokens_dist, opts.max_tokens, source)
        # Per user, its own draws (start and max_tokens), reproducible for the same --seed and user layout.
        user._seed = user.user_seed(opts)
        self.rng = random.Random(user._seed)
        # `fixed` starts every user at the first prompt, as before sources; the others spread the users out.
        self._next_body = 0 if isinstance(source, datasets.FixedSource) else self.rng.randrange(len(self.items))
        # --lora-mix (locustfiles/lora.py): models drawn from a stream of their own; the prompts' draws unchanged
        drawn = user.run.features["lora"].for_user(user, opts)
        if drawn is not None:
            self.mix, self.model_rng = drawn
        fields = user.fields
        models = self.mix.names if self.mix is not None else (user.model,)
        if self.max_tokens.varies:
            # A max_tokens per request: the body is serialized per request, before the send stamp.
            self.payloads = [self.payload(opts, models[0], item.prompt, fields=fields) for item in self.items]
            self.bodies = None
            return
        # Serialized once per process, HTTP head included: the request path then only hands prepared bytes to the
        # socket. Keyed by everything else that shapes the bytes (the same for all users of a run): the body without
        # its prompt carries the request options too (the tools file's content, not only its path). With a mix, one
        # set per model, the same max_tokens for each.
        limits = None
        self.bodies_of: dict[str, list] = {}
        for model in models:
            bodies, limits = self._prepared(dataset, opts, model, limits)
            self.bodies_of[model] = bodies
        self.bodies, self.body_max_tokens = self.bodies_of[models[0]], limits

    def _prepared(self, dataset, opts, model: str, limits: list[int] | None) -> tuple[list, list[int]]:
        """The process's prepared bodies of every item for one model (built by its first user), and their
        max_tokens (drawn now unless given)."""
        user, fields = self.user, self.user.fields
        key = (user.http.head, opts.max_tokens_dist, json.dumps(self.payload(opts, model, "", fields=fields)))
        if key not in dataset.prepared:
            if limits is None:
                limits = [self.max_tokens.draw(self.rng, item) for item in self.items]
            bodies = [
                json.dumps(self.payload(opts, model, item.prompt, n, fields)).encode()
                for item, n in zip(self.items, limits)
            ]
            if self.prepared_once:
                bodies = [user.http.prepare(body) for body in bodies]
            dataset.prepared[key] = (bodies, limits)
        return dataset.prepared[key]

    @property
    def prepared_once(self) -> bool:
        """The bodies' bytes are prepared once per process (with --images, per request: `prepare`)."""
        return True

    def task(self) -> None:
        if self.conversation is not None:
            self._converse()
            return
        super().task()

    def request(self, slot: Slot | None = None) -> RequestRecord:
        """Send one streaming request, stamp every read, parse its lines, then record and report it. With a slot
        (open loop), the record keeps the slot's intended send time and step."""
        user = self.user
        record = user.new_record(slot, dataset=False)
        parser = StreamParser()
        # The request bytes, all made before the send stamp (taken inside http.stream, after connecting).
        if slot is not None and slot.position is not None:
            return self._stream_trace_row(record, parser, slot.position)
        index = self._next_body % len(self.items)
        self._next_body += 1
        item = self.items[index]
        bodies = self.bodies
        if self.mix is not None:
            record.model = self.mix.draw(self.model_rng)
            bodies = bodies if bodies is None else self.bodies_of[record.model]
        if bodies is not None:
            prepared = bodies[index]
            if not self.prepared_once:
                prepared = self.prepare(prepared)
            record.max_tokens = self.body_max_tokens[index]
        else:
            payload = self.payloads[index]
            payload["max_tokens"] = record.max_tokens = self.max_tokens.draw(self.rng, item)
            payload["model"] = record.model
            prepared = self.prepare(orjson.dumps(payload))
        if item.per_request:  # the prompt carries this request's id (same length: Content-Length holds)
            prepared = (prepared[0], prepared[1].replace(_PLACEHOLDER, record.request_id.encode("latin-1")))
        record.dataset = user.dataset_spec
        record.reference_output_tokens = item.reference_output_tokens
        return self._send(record, prepared, parser)

    def _converse(self) -> None:
        """--turns: the next turn of this user's conversation (after its think time), or a new conversation: in an
        open loop, at the next intended send time of the schedule."""
        user, player = self.user, self.conversation
        slot = None
        if user.open_loop and not player.in_conversation:
            slot, user._slot = user._slot, None
            if slot is None:  # the first run of the task, before wait_time took a slot
                return
        record = user.new_record(slot)
        prompt, turn, text = player.ask(record)
        # The body is serialized per turn (the prompt grows), before the send stamp.
        record.max_tokens = self.max_tokens.draw(self.rng, turn)
        record.reference_output_tokens = turn.reference_output_tokens
        if self.mix is not None:
            record.model = self.mix.draw(self.model_rng)
        payload = self.payload(user.options, record.model, prompt, record.max_tokens, user.fields)
        parser = StreamParser(keep_text=True)
        record = self._send(record, self.prepare(orjson.dumps(payload)), parser)
        player.answered(record, turn, text, parser.text)
        if not user.open_loop:
            user.back_off(record)

    def _stream_trace_row(self, record: RequestRecord, parser: StreamParser, position: int) -> RequestRecord:
        """A trace replay's row: its body (the synthesized prompt, max_tokens = its output length), then the send."""
        body, record.max_tokens = self.replay.body(position)
        record.trace_row = int(self.replay.trace.rows[position])
        return self._send(record, self.prepare(body), parser)

    def _send(self, record: RequestRecord, prepared: tuple[bytes, bytes], parser: StreamParser) -> RequestRecord:
        """Send prepared bytes, parse the stream as it arrives, then record and report the request."""
        user = self.user
        http = user.http
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
            timeout = user.options.read_timeout
            failure = LLMRequestError(TIMEOUT, f"no data for {timeout:g} s ({e or 'timed out'})")
        except (OSError, HTTPParseError) as e:
            failure = LLMRequestError(CONNECTION_ERROR, f"{type(e).__name__}: {e}")
        return self._finish(record, parser.result, failure)

    image_count: int | None = None  # images per request (chat with --images)

    def _finish(
        self, record: RequestRecord, parsed: ParsedStream, failure: LLMRequestError | None, report: bool = True
    ) -> RequestRecord:
        """Fill the record's measurements from the parsed stream, hand it to listeners, report it to Locust."""
        user = self.user
        duration = user.stamp_send(record, time.perf_counter())
        if failure is None:
            failure = _stream_outcome(parsed, user.http.content_type)
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
        estimated = parsed.output_tokens_estimated
        record.tokens_per_chunk = glossary.tokens_per_chunk(output_tokens, record.chunks, estimated)
        if parsed.token_offsets_s:  # the reasoning / answer / tool-call split (analysis/sse.py); None without tokens
            record.reasoning_tokens = parsed.reasoning_tokens
            record.ttfo_s = parsed.first_output_offset_s
            record.tool_call_chunks = parsed.tool_call_chunks
            record.answer_tpot_s = glossary.answer_tpot_s(e2e, record.ttfo_s, output_tokens, record.reasoning_tokens)
        return user.report(record, e2e, duration, failure, report)


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
