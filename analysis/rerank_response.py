"""A rerank answer (vLLM's /v1/rerank, /rerank and /v2/rerank; Jina's and Cohere's shape), parsed and checked.

Pure (no network). The body is vLLM's RerankResponse (vllm/entrypoints/pooling/score/protocol.py):
`{"id", "model", "usage": {"prompt_tokens": P, "total_tokens": P}, "results": [{"index": i, "document": {"text"},
"relevance_score": s}, ...]}`, the results sorted by score, `top_n` of them when the request asked for fewer than
its documents (0 or none: all). The contract checked: one result per document (or per top_n), each index a document
of the request once, each score a finite number. A body that breaks it is a `bad_response`, as an embeddings answer
with the wrong number of vectors is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import error_body

_NUMBERS = (float, int)


@dataclass(frozen=True, slots=True)
class RerankAnswer:
    """What a rerank body says; `error` is None for a body that keeps the contract, else one line."""

    results: int | None = None  # the number of results
    prompt_tokens: int | None = None  # usage.prompt_tokens (usage.total_tokens from a server without it)
    error: str | None = None


def expected_results(documents: int, top_n: int) -> int:
    """The results a request of `documents` documents asking `top_n` gets: top_n when it is fewer, else all."""
    return top_n if 0 < top_n < documents else documents


def _prompt_tokens(obj: dict) -> int | None:
    usage = obj.get("usage")
    if not isinstance(usage, dict):
        return None
    for name in ("prompt_tokens", "total_tokens"):  # a rerank generates nothing: its total is its prompt
        value = usage.get(name)
        if type(value) is int and value >= 0:
            return value
    return None


def parse_rerank(body: bytes | bytearray, documents: int, top_n: int = 0) -> RerankAnswer:
    """Parse a rerank body sent for `documents` documents asking `top_n`; the first broken rule is the error."""
    obj, why = error_body.json_object(body)
    if obj is None:
        return RerankAnswer(error=why)
    prompt_tokens = _prompt_tokens(obj)
    results = obj.get("results")
    if not isinstance(results, list):
        return RerankAnswer(prompt_tokens=prompt_tokens, error=error_body.error_with_200(obj, "results list"))
    n, expected = len(results), expected_results(documents, top_n)
    if n != expected:
        asked = f" (top_n {top_n})" if expected < documents else ""
        return RerankAnswer(n, prompt_tokens, f"{n} result(s) for {documents} document(s){asked}")
    seen: set[int] = set()
    for i, item in enumerate(results):
        if not isinstance(item, dict):
            return RerankAnswer(n, prompt_tokens, f"results[{i}] is not an object")
        index, score = item.get("index"), item.get("relevance_score")
        if type(index) is not int or not 0 <= index < documents or index in seen:
            return RerankAnswer(n, prompt_tokens, f"results[{i}].index {index!r} is not one of 0..{documents - 1} once")
        seen.add(index)
        if type(score) not in _NUMBERS or not math.isfinite(score):
            return RerankAnswer(n, prompt_tokens, f"results[{i}].relevance_score {score!r} is not a finite number")
    return RerankAnswer(n, prompt_tokens)
