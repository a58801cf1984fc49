"""--endpoint rerank: vLLM's /v1/rerank (--rerank-path /rerank or the Cohere-style /v2/rerank), not streamed. Each
request posts a query and --documents documents, consecutive texts of the dataset (fetched.BatchRequester: the first
is the query), with --top-n when given; the answer is checked (analysis/rerank_response.py: one result per document
or per top_n, indices in range, scores numeric) and its usage kept."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...analysis import kinds
from ...analysis.records import RequestRecord
from ...analysis.rerank_response import parse_rerank
from .. import request_options
from ..declare import option
from .fetched import BatchRequester, with_extra_body


@dataclass(frozen=True)
class RerankOptions:
    """--endpoint rerank: the documents per request, top_n and the API's path."""

    GROUP: ClassVar[str] = "Request"

    documents_per_request: int = option(
        "--documents",
        8,
        "--endpoint rerank: documents ranked per request against its query (query and documents are "
        "consecutive texts of --dataset)",
    )
    top_n: int = option(
        "--top-n",
        0,
        "--endpoint rerank: the results asked per request (top_n); 0: every document ranked, top_n not sent",
    )
    rerank_path: str = option(
        "--rerank-path",
        "",
        "--endpoint rerank: the API's path (vLLM serves all three; /v2/rerank is the Cohere-style one). "
        "Default: /v1/rerank",
        choices=["", "/v1/rerank", "/rerank", "/v2/rerank"],
    )


def rerank_payload(
    options, model: str, query: str, documents: list[str], fields: request_options.RequestFields | None = None
) -> dict:
    """The JSON body of one rerank request: the query, the documents, --top-n when given (none: every document
    ranked), then --extra-body merged last (truncate_prompt_tokens, ...)."""
    payload: dict = {"model": model, "query": query, "documents": list(documents)}
    top_n = int(options.top_n or 0)
    if top_n:
        payload["top_n"] = top_n
    return with_extra_body(payload, options, fields)


class RerankRequester(BatchRequester):
    kind = kinds.RERANK
    answer_noun = "a rerank answer"
    serve_hint = "serve a cross-encoder or reranker model (vLLM: vllm serve BAAI/bge-reranker-base)"

    def __init__(self, user, opts) -> None:
        self.documents = int(opts.documents_per_request)
        self.top_n = int(opts.top_n or 0)
        super().__init__(user, opts)

    def group(self, opts) -> int:
        return self.documents + 1  # the query, then its documents

    def count(self) -> int:
        return self.documents

    def body(self, texts: list[str]) -> dict:
        user = self.user
        query, documents = (texts[0], texts[1:]) if texts else ("", [])
        return rerank_payload(user.options, self.model, query, documents, user.fields)

    def check(self, body: bytes, record: RequestRecord) -> str | None:
        answer = parse_rerank(body, self.documents, self.top_n)
        record.prompt_tokens = answer.prompt_tokens
        return answer.error

    @classmethod
    def probe(cls, options, model: str) -> tuple[dict, object]:
        """The preflight's request (one query, two documents) and the check of its answer (None: it holds)."""
        top_n = int(options.top_n or 0)
        payload = rerank_payload(options, model, "hello", ["hello world", "goodbye"])
        return payload, lambda body: parse_rerank(body, 2, top_n).error
