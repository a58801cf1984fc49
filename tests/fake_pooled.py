"""The fake server's pooling endpoints: /v1/embeddings and rerank, each one JSON body (tests/fakeserver.py)."""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import random
import socket
import struct
import time

from tests.fake_state import Config, State
from tests.fake_text import count_tokens


class PooledEndpoints:
    """The Handler's /v1/embeddings and /v1/rerank (also /rerank and /v2/rerank)."""

    @staticmethod
    def _unknown(req: dict, known: tuple[str, ...]) -> list[str]:
        return sorted(k for k in req if k not in known)

    def _refuse_unknown(self, req: dict, known: tuple[str, ...]) -> bool:
        """As OpenAI's API (--strict): a request field it does not know is a 400."""
        message = f"Unrecognized request argument supplied: {', '.join(self._unknown(req, known))}"
        return self.send_json(400, {"error": {"message": message, "type": "invalid_request_error"}})

    # --- /v1/embeddings ----------------------------------------------------------------------------------
    def embeddings(self, headers: dict, req: dict, t_recv: float) -> bool:
        """POST /v1/embeddings as vLLM 0.32 answers it (vllm/entrypoints/pooling/embed: EmbeddingResponse dumped
        whole, compact JSON, one body with its content-length): one vector per input, --embed-dim values each, the
        answer sent --embed-ms (+ --embed-per-input-ms per input) after receipt, or after its slot with
        --max-running. Its prompt_tokens are the fake tokenizer's (count_tokens, BOS included: /tokenize's count)."""
        cfg: Config = self.server.config
        state: State = self.server.state
        inputs = req.get("input")
        if isinstance(inputs, str) or (isinstance(inputs, list) and inputs and all(type(x) is int for x in inputs)):
            inputs = [inputs]  # one text, or one prompt of token ids
        if not isinstance(inputs, list) or not inputs:
            return self.send_json(400, {"error": {"message": "input must be a non-empty string or list", "code": 400}})
        fmt = req.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            return self.send_json(400, {"error": {"message": f"unsupported encoding_format {fmt!r}", "code": 400}})
        known = ("model", "input", "encoding_format", "dimensions", "user")
        if cfg.strict and self._unknown(req, known):
            return self._refuse_unknown(req, known)
        _, fault = state.next_request(cfg.faults)
        request_id = headers.get("x-request-id", "")
        with state.lock:
            if not self.embedded:
                self.embedded = True
                state.embed_connections += 1
            state.received.append(request_id)
            state.prompts.append({"input": inputs, "request_id": request_id,
                                  "body": {k: v for k, v in req.items() if k != "input"}})  # fmt: skip
        if fault and fault.startswith("http_"):
            code = int(fault[5:])
            return self.send_json(code, {"error": {"message": f"injected {fault}", "type": "Injected", "code": code}})
        return self._in_slot(lambda t_admit: self._embed(request_id, inputs, fmt, fault, t_recv, t_admit), t_recv)

    def _in_slot(self, answer, t_recv: float) -> bool:
        """Run `answer(t_admit)` holding one of --max-running slots (waiting for one first), as a batch limit does."""
        cfg: Config = self.server.config
        state: State = self.server.state
        limit = cfg.max_running
        with state.lock:
            if limit:
                state.waiting += 1
                while state.running >= limit:
                    state.slot_free.wait()
                state.waiting -= 1
            state.running += 1
        try:
            return answer(time.perf_counter() if limit else t_recv)
        finally:
            with state.lock:
                state.running -= 1
                state.slot_free.notify()

    def _embed(self, request_id: str, inputs: list, fmt: str, fault: str | None, t_recv: float, t_admit: float) -> bool:
        cfg: Config = self.server.config
        counts = [len(x) if isinstance(x, list) else count_tokens(x) for x in inputs]
        prompt_tokens = sum(counts)
        dim = cfg.embed_dim
        items = []
        for i, text in enumerate(inputs):
            n = dim - 1 if (fault == "ragged" and i == len(inputs) - 1) else dim
            value = embedding_json(json.dumps(text), n if n > 0 else dim + 1, fmt)
            items.append(f'{{"index":{i},"object":"embedding","embedding":{value}}}')
        if fault == "wrong_count":
            items.pop()
        usage = json.dumps(
            {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens, "completion_tokens": 0,
             "prompt_tokens_details": None}, separators=(",", ":"),
        )  # fmt: skip
        # EmbeddingResponse's fields in their order, compact as vLLM's JSON response (the vectors made once per text:
        # a fake that spent a millisecond of its GIL per request would delay its own receipt of the next one).
        page = (
            f'{{"id":"embd-{request_id}","object":"list","created":{int(time.time())},"model":{json.dumps(cfg.model)},'
            f'"data":[{",".join(items)}]' + ("" if fault == "no_usage" else f',"usage":{usage}') + "}"
        ).encode()
        truth = {
            "endpoint": "embeddings", "inputs": len(inputs), "input_tokens": counts,
            "input_hashes": [hashlib.sha1(json.dumps(x).encode()).hexdigest()[:12] for x in inputs],
            "prompt_tokens": prompt_tokens, "encoding_format": fmt, "dim": dim,
        }  # fmt: skip
        return self._send_pooled(request_id, page, len(inputs), prompt_tokens, fault, t_recv, t_admit, truth)

    # --- /v1/rerank -------------------------------------------------------------------------------------
    def rerank(self, path: str, headers: dict, req: dict, t_recv: float) -> bool:
        """POST /v1/rerank (also /rerank, /v2/rerank) as vLLM answers it (RerankResponse: id, model, usage, results
        sorted by relevance_score, top_n of them when 0 < top_n < documents), timed as an embeddings answer with one
        item per document. The score of a document is the share of its words found in the query (a stand-in for a
        cross-encoder, exact and repeatable); prompt_tokens are the pairs' tokens (query + document each)."""
        cfg: Config = self.server.config
        state: State = self.server.state
        query, documents, top_n = req.get("query"), req.get("documents"), req.get("top_n", 0)
        if not isinstance(query, str) or not isinstance(documents, list) or not documents:
            return self.send_json(400, {"error": {"message": "query and a non-empty documents list", "code": 400}})
        known = ("model", "query", "documents", "top_n", "truncate_prompt_tokens", "user")
        if cfg.strict and self._unknown(req, known):
            return self._refuse_unknown(req, known)
        _, fault = state.next_request(cfg.faults)
        request_id = headers.get("x-request-id", "")
        with state.lock:
            state.received.append(request_id)
            body = {k: v for k, v in req.items() if k not in ("query", "documents")}
            state.prompts.append(
                {"query": query, "documents": documents, "request_id": request_id, "path": path, "body": body}
            )
        if fault and fault.startswith("http_"):
            code = int(fault[5:])
            return self.send_json(code, {"error": {"message": f"injected {fault}", "type": "Injected", "code": code}})
        return self._in_slot(
            lambda t_admit: self._rank(request_id, query, documents, int(top_n or 0), fault, t_recv, t_admit), t_recv
        )

    def _rank(
        self, request_id: str, query: str, documents: list, top_n: int, fault: str | None, t_recv: float,
        t_admit: float,
    ) -> bool:  # fmt: skip
        cfg: Config = self.server.config
        words = set(query.lower().split())
        scores = []
        for doc in documents:
            text = str(doc.get("text", "") if isinstance(doc, dict) else doc)
            terms = text.lower().split()
            scores.append(sum(t in words for t in terms) / len(terms) if terms else 0.0)
        order = sorted(range(len(documents)), key=lambda i: (-scores[i], i))
        if 0 < top_n < len(documents):
            order = order[:top_n]
        if fault == "wrong_count":
            order = order[:-1]
        results = [{"index": i, "document": {"text": documents[i] if isinstance(documents[i], str) else None},
                    "relevance_score": scores[i]} for i in order]  # fmt: skip
        if fault == "bad_index" and results:
            results[-1]["index"] = len(documents)
        pair_tokens = [count_tokens(query) + count_tokens(str(d)) for d in documents]
        prompt_tokens = sum(pair_tokens)
        answer = {"id": f"rerank-{request_id}", "model": cfg.model, "results": results}
        if fault != "no_usage":
            answer["usage"] = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
        page = json.dumps(answer, separators=(",", ":")).encode()
        truth = {
            "endpoint": "rerank", "documents": len(documents), "top_n": top_n, "results": len(results),
            "prompt_tokens": prompt_tokens, "scores": scores,
        }  # fmt: skip
        return self._send_pooled(request_id, page, len(documents), prompt_tokens, fault, t_recv, t_admit, truth)

    def _send_pooled(
        self, request_id: str, page: bytes, items: int, prompt_tokens: int, fault: str | None, t_recv: float,
        t_admit: float, truth: dict,
    ) -> bool:  # fmt: skip
        """A pooling answer (embeddings, rerank): sent --embed-ms (+ --embed-per-input-ms per item) after its
        admission, whole with its content-length, the faults applied; counted as vLLM counts it (each item one
        finished engine request, its prompt tokens)."""
        cfg: Config = self.server.config
        state: State = self.server.state
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(page)
        queued = cfg.queue_s if fault == "queue" else 0.0
        delay = t_admit + queued + cfg.embed_s + cfg.embed_per_input_s * items - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        try:
            if fault == "html":  # a proxy's page with HTTP 200
                page = b"<html><body><h1>502 Bad Gateway</h1></body></html>\n"
                head = b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: %d\r\n\r\n" % len(page)
            elif fault in ("truncate", "reset"):  # the connection ends halfway through the body
                self.wfile.write(head + page[: len(page) // 2])
                if fault == "reset":
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return False
            elif fault == "stall":
                time.sleep(cfg.stall_s)
                return False
            # The stamp just before the write is the send's: the thread may lose the CPU (or the GIL) once the
            # bytes are with the kernel, and a stamp after the write then reads late by that much (seen: 3.7 ms).
            sending = time.perf_counter() - t_recv
            self.wfile.write(head + page)  # unbuffered: one sendall
            written = time.perf_counter() - t_recv
        except (BrokenPipeError, ConnectionResetError):
            return False
        if fault == "html":  # not the server's answer: not counted as one
            return True
        with state.lock:
            state.ok += 1
            state.embed_ok += 1
            state.inputs += items
            if truth["endpoint"] == "rerank":
                state.rerank_ok += 1
                state.documents += items
            state.prompt_tokens += prompt_tokens
            state.truth[request_id] = {
                **truth,
                "body_bytes": len(page),
                "fault": fault,
                "admitted_s": t_admit - t_recv,
                "e2e_s": sending,  # receipt to the send of the body (its bytes handed to the kernel at once)
                "recv_wall": self.wall_recv,
                "last_sent_wall": self.wall_recv + sending,
                "written_s": written,  # when the write returned, for a body too big for the socket's buffer
            }
        return True


@functools.lru_cache(maxsize=4096)
def embedding_json(text_json: str, n: int, fmt: str) -> str:
    """One input's embedding as JSON: n values seeded by the input (the same text, the same vector), floats or
    base64 of little-endian float32s (vLLM's default, "native", on x86 and arm)."""
    rng = random.Random(hashlib.sha1(text_json.encode()).digest())
    vector = [rng.uniform(-1, 1) for _ in range(n)]
    if fmt == "base64":
        return json.dumps(base64.b64encode(struct.pack(f"<{n}f", *vector)).decode("ascii"))
    return json.dumps(vector, separators=(",", ":"))
