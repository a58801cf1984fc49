"""A Locust user that streams completions from an OpenAI-compatible server and records every chunk's arrival.

Why not HttpUser/FastHttpUser: for a streamed response their Locust entry carries the time to the headers,
`catch_response` loses exceptions that are not ResponseErrors (a reset mid-stream would vanish), and their
line iterators read 1 KiB blocks, which delays and bunches token arrivals. This user owns one
geventhttpclient connection, stamps each SSE line right after it is read, parses after the stream ends, and
fires exactly one Locust request event per stream with the end-to-end time and a categorized failure.
"""

from __future__ import annotations

import json
import time
import uuid

from gevent import GreenletExit
from geventhttpclient import HTTPClient
from geventhttpclient.response import HTTPParseError
from geventhttpclient.url import URL
from locust import User, constant, task

from analysis import glossary
from analysis.records import RequestRecord
from analysis.sse import (
    CONNECTION_ERROR,
    CUT_OFF,
    EMPTY_STREAM,
    INCOMPLETE_STREAM,
    NOT_SSE,
    TIMEOUT,
    ParsedStream,
    StreamParser,
)
from locustfiles import options as options_mod
from locustfiles.options import ENDPOINTS

MAX_ERROR_BODY = 64 * 1024  # bytes of a non-200 body kept to extract the server's message
CONNECT_TIMEOUT_S = 30.0


class LLMRequestError(Exception):
    """A failed LLM request; str() is 'category: message', which is how Locust groups its failures."""

    def __init__(self, category: str, message: str) -> None:
        super().__init__(f"{category}: {message}")
        self.category = category
        self.message = message


def build_payload(options, model: str, prompt: str | None = None) -> dict:
    """The JSON body of one request, from the run's options (`prompt` replaces --prompt)."""
    prompt = options.prompt if prompt is None else prompt
    stream_options = {"include_usage": True}
    if not options.no_continuous_usage:
        stream_options["continuous_usage_stats"] = True
    payload: dict = {
        "model": model,
        "max_tokens": options.max_tokens,
        "temperature": options.temperature,
        "stream": True,
        "stream_options": stream_options,
    }
    if options.endpoint == "chat":
        payload["messages"] = [{"role": "user", "content": prompt}]
    else:
        payload["prompt"] = prompt
    if options.ignore_eos:
        payload["ignore_eos"] = True  # vLLM extension: exact output lengths
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
    """Closed loop: each user streams one completion after another, with no think time."""

    abstract = True
    wait_time = constant(0)

    def on_start(self) -> None:
        env = self.environment
        opts = env.parsed_options
        self.run = env.vllm_loadtest
        self.model = self.run.model(self.host)
        self.endpoint = opts.endpoint
        base = URL(self.host)
        self.path = base.path.rstrip("/") + ENDPOINTS[opts.endpoint]
        prompts = options_mod.load_prompts(opts.prompt_file) if getattr(opts, "prompt_file", "") else [None]
        # Serialized once: the request path then only hands prepared bytes to the socket.
        self.bodies = [json.dumps(build_payload(opts, self.model, p)).encode() for p in prompts]
        self.body = self.bodies[0]
        self._next_body = 0
        self.headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            "Accept-Encoding": "identity",  # a compressed event stream cannot be stamped line by line
        }
        if not opts.keep_alive:
            # A fresh connection per request. Reusing one at once races uvicorn's keep-alive timer (uvicorn
            # #824/#1637): a request that arrives before the server has finished the previous response is closed
            # 5 s later without an answer. Seen here 13 times in one demo run; a loopback connect costs ~0.1 ms.
            self.headers["Connection"] = "close"
        api_key = options_mod.api_key(opts)
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.http = HTTPClient.from_url(
            base,
            concurrency=1,
            connection_timeout=min(CONNECT_TIMEOUT_S, opts.read_timeout),
            network_timeout=opts.read_timeout,
        )

    def on_stop(self) -> None:
        http = getattr(self, "http", None)
        if http is not None:
            http.close()

    @task
    def completion(self) -> None:
        self.stream_completion()

    def stream_completion(self) -> RequestRecord:
        """Send one streaming request, stamp every line, then parse, record and report it."""
        step, users, warmup = self.run.tracker.current()
        record = RequestRecord(
            request_id=uuid.uuid4().hex, worker=self.run.worker_name, step=step, users=users, warmup=warmup,
            start_time=0.0, endpoint=self.endpoint, model=self.model,
        )  # fmt: skip
        headers = {**self.headers, "X-Request-Id": record.request_id}
        parser = StreamParser()
        clock = time.perf_counter
        failure: LLMRequestError | None = None
        content_type = ""
        nbytes = 0
        body = self.bodies[self._next_body % len(self.bodies)]
        self._next_body += 1
        record.start_time = time.time()
        t0 = clock()
        try:
            response = self.http.request("POST", self.path, body=body, headers=headers)
            record.http_status = response.status_code
            if record.http_status != 200:
                body = response.read(MAX_ERROR_BODY)
                failure = LLMRequestError(f"http_{record.http_status}", error_message_from_body(body))
            else:
                content_type = str(response.get("content-type") or "")
                readline = response.readline
                feed = parser.feed
                # Hot loop: read a line, stamp it, then parse it (a few µs). Parsing per line rather than after
                # the stream spreads the CPU: a 256-token stream parsed at its end blocked the other users'
                # greenlets for about 1 ms, delaying their timestamps (tests/benchmarks/bench_parse.py).
                while True:
                    line = readline(b"\n")
                    t = clock()
                    if not line:
                        break
                    feed(t - t0, line)
                    nbytes += len(line)
        except GreenletExit:
            cut = LLMRequestError(CUT_OFF, "the load generator stopped this user mid-request")
            self._finish(record, clock() - t0, parser.result, cut, content_type, nbytes, report=False)
            raise
        except TimeoutError as e:  # socket.timeout is TimeoutError since Python 3.10
            timeout = self.environment.parsed_options.read_timeout
            failure = LLMRequestError(TIMEOUT, f"no data for {timeout:g} s ({e or 'timed out'})")
        except (OSError, HTTPParseError) as e:
            failure = LLMRequestError(CONNECTION_ERROR, f"{type(e).__name__}: {e}")
        return self._finish(record, clock() - t0, parser.result, failure, content_type, nbytes)

    def _finish(
        self,
        record: RequestRecord,
        duration: float,
        parsed: ParsedStream,
        failure: LLMRequestError | None,
        content_type: str,
        nbytes: int,
        report: bool = True,
    ) -> RequestRecord:
        """Fill the record's measurements from the parsed stream, hand it to listeners, report it to Locust."""
        if failure is None:
            failure = _stream_outcome(parsed, content_type)
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
                response_length=nbytes,
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
