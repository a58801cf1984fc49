"""The request kinds' requesters, one module each, found by --endpoint's value (as vLLM's `ASYNC_REQUEST_FUNCS`):
adding a kind is a module here, its declaration in analysis/kinds.py and one line below."""

from __future__ import annotations

from .base import LLMRequestError, Requester
from .chat import ChatRequester
from .completions import CompletionsRequester
from .embeddings import EmbeddingsRequester
from .rerank import RerankRequester
from .streaming import StreamingRequester

REQUESTERS: dict[str, type[Requester]] = {
    r.kind.name: r for r in (CompletionsRequester, ChatRequester, EmbeddingsRequester, RerankRequester)
}


def requester(endpoint: str) -> type[Requester]:
    return REQUESTERS[endpoint]


def build_payload(options, model: str, prompt=None, max_tokens: int | None = None, fields=None) -> dict:
    """The JSON body of one streamed request of the run's kind (StreamingRequester.payload)."""
    kind = REQUESTERS[options.endpoint]
    assert issubclass(kind, StreamingRequester), f"--endpoint {options.endpoint} does not stream"
    return kind.payload(options, model, prompt, max_tokens, fields)


__all__ = ["REQUESTERS", "LLMRequestError", "Requester", "build_payload", "requester"]
