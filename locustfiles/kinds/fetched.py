"""The kinds whose answer does not stream (e.g. embeddings): the prepared bytes sent, the whole answer read and
stamped by the read that brought its last byte, then parsed and checked by the kind (`check`).

`BatchRequester`: a request carries a group of the dataset's texts (built as for completions: exact token lengths),
group k holding items kG .. kG+G-1 (modulo the items); the groups' request bytes are serialized once per process and
shared by its users, unless they are too many (PREPARED_BYTES)."""

from __future__ import annotations

import json
import math
import random
import time

import orjson
from gevent import GreenletExit
from geventhttpclient.response import HTTPParseError

from ...analysis import error_body
from ...analysis.embedding_response import BAD_RESPONSE
from ...analysis.records import RequestRecord
from ...analysis.sse import CONNECTION_ERROR, CUT_OFF, TIMEOUT
from .. import datasets, request_options
from ..openloop import Slot
from .base import LLMRequestError, Requester

# The groups' request bytes are serialized once per process when the groups before they repeat hold at most this
# much text (lcm(items, group) texts); beyond, each body is serialized per request.
PREPARED_BYTES = 64 << 20
_PLACEHOLDER = datasets.REQUEST_ID_PLACEHOLDER.encode("latin-1")


def with_extra_body(payload: dict, options, fields: request_options.RequestFields | None = None) -> dict:
    """A body with --extra-body merged last (the user's escape hatch), the request options parsed now unless given."""
    fields = request_options.fields(options) if fields is None else fields
    if fields.extra_body:
        request_options.merge(payload, fields.extra_body)
    return payload


def item_text(prompt: str | list[dict]) -> str:
    """An item's text as one input: a text prompt as it is; chat messages flattened to their contents, one per line
    (the text parts of a content list)."""
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


class FetchRequester(Requester):
    """One request, one whole answer. A kind fills the record from its parsed answer in `check`, which returns the
    contract's breach (None when the answer holds). The preflight sends its `probe` once before any load."""

    answer_noun = "an answer"  # what a body that keeps the contract is, in the preflight's line
    serve_hint = "serve a model of this kind"  # the fix when the server has no such endpoint

    @classmethod
    def probe(cls, options, model: str) -> tuple[dict, object]:
        """One small request's body and the check of its answer (a callable: body -> breach or None)."""
        raise NotImplementedError

    def check(self, body: bytes, record: RequestRecord) -> str | None:
        raise NotImplementedError

    def fetch(self, record: RequestRecord, prepared: tuple[bytes, bytes]) -> RequestRecord:
        """Send prepared bytes, read the whole answer, parse and check it, then record and report the request."""
        user = self.user
        http = user.http
        failure: LLMRequestError | None = None
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
                breach = self.check(body, record)
                if breach is not None:
                    failure = LLMRequestError(BAD_RESPONSE, breach)
        except GreenletExit:
            if http.t0:  # stopped while connecting: nothing was sent, so there is no request to record
                cut = LLMRequestError(CUT_OFF, "the load generator stopped this user mid-request")
                self._finish(record, cut, time.perf_counter(), report=False)
            raise
        except TimeoutError as e:
            timeout = user.options.read_timeout
            failure = LLMRequestError(TIMEOUT, f"no data for {timeout:g} s ({e or 'timed out'})")
        except (OSError, HTTPParseError) as e:
            failure = LLMRequestError(CONNECTION_ERROR, f"{type(e).__name__}: {e}")
        return self._finish(record, failure, done or time.perf_counter())

    def _finish(
        self, record: RequestRecord, failure: LLMRequestError | None, done: float, report: bool = True
    ) -> RequestRecord:
        """e2e_s is the arrival of the body's last byte (a complete 200 body); the streaming fields stay None (they
        do not apply). Then listeners and Locust."""
        user = self.user
        http = user.http
        duration = user.stamp_send(record, done)
        e2e = http.last_offset_s if http.status == 200 and http.complete else None
        record.status = "ok" if failure is None else "error"
        record.error_type = None if failure is None else failure.category
        record.error = None if failure is None else failure.message
        record.e2e_s = e2e
        record.duration_s = duration
        return user.report(record, e2e, duration, failure, report)


class BatchRequester(FetchRequester):
    """A kind whose request carries `group(opts)` of the dataset's texts; `body` makes one request's JSON body of
    them and `count` is what the record's items field says (analysis/kinds.py: e.g. inputs)."""

    def group(self, opts) -> int:
        raise NotImplementedError

    def body(self, texts: list[str]) -> dict:
        raise NotImplementedError

    def count(self) -> int:
        raise NotImplementedError

    def __init__(self, user, opts) -> None:
        super().__init__(user, opts)
        dataset = user.shared.dataset(user.host, user.model)
        source = datasets.parse_dataset(opts.dataset)
        user.dataset_spec = dataset.spec
        items = dataset.items
        self.size = size = self.group(opts)
        user._seed = user.user_seed(opts)
        self.rng = random.Random(user._seed)
        if "item_texts" not in dataset.prepared:  # once per process: the users share the strings
            dataset.prepared["item_texts"] = [item_text(item.prompt) for item in items]
        self._texts = dataset.prepared["item_texts"]
        # The groups before they repeat: lcm(items, size) texts in all.
        self._groups = len(self._texts) // math.gcd(len(self._texts), size)
        self._next_body = 0 if isinstance(source, datasets.FixedSource) else self.rng.randrange(self._groups)
        self._per_request = any(item.per_request for item in items)
        self.mix = None  # --lora-mix (locustfiles/lora.py): each request's model drawn from it
        drawn = user.run.features["lora"].for_user(user, opts)
        if drawn is not None:
            self.mix, self.model_rng = drawn
        # The groups' bodies of each model (one set without a mix): the model each body names is self.model.
        self.bodies_of = {m: self._prepared(dataset, m) for m in (self.mix.names if self.mix else (user.model,))}
        self.model = self.mix.names[0] if self.mix else user.model
        self.bodies = self.bodies_of[self.model]

    def _prepared(self, dataset, model: str) -> list | None:
        """The process's prepared bodies of every group for one model (built by its first user); None when the
        groups are too many (each body is then serialized per request)."""
        self.model, http, size = model, self.user.http, self.size
        key = (self.kind.name, http.head, size, json.dumps(self.body([])))
        if key not in dataset.prepared:
            text_bytes = sum(len(t.encode()) for t in self._texts) * (self._groups * size // len(self._texts))
            bodies = None
            if text_bytes <= PREPARED_BYTES:
                bodies = [http.prepare(orjson.dumps(self._payload(k))) for k in range(self._groups)]
            dataset.prepared[key] = bodies
        return dataset.prepared[key]

    def _payload(self, k: int) -> dict:
        """Group k's body (a dict): items kG .. kG+G-1, modulo the items."""
        texts, size = self._texts, self.size
        n = len(texts)
        return self.body([texts[(k * size + j) % n] for j in range(size)])

    def request(self, slot: Slot | None = None) -> RequestRecord:
        """Send the next group (its bytes made before the send stamp), read the whole answer, check it, then record
        and report the request."""
        record = self.user.new_record(slot)
        setattr(record, str(self.kind.items), self.count())
        k = self._next_body % self._groups
        self._next_body += 1
        if self.mix is not None:
            self.model = record.model = self.mix.draw(self.model_rng)
            self.bodies = self.bodies_of[self.model]
        if self.bodies is not None:
            prepared = self.bodies[k]
        else:
            prepared = self.user.http.prepare(orjson.dumps(self._payload(k)))
        if self._per_request:  # a text carries this request's id (same length: Content-Length holds)
            prepared = (prepared[0], prepared[1].replace(_PLACEHOLDER, record.request_id.encode("latin-1")))
        return self.fetch(record, prepared)
