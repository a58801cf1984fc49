"""--endpoint embeddings: /v1/embeddings, not streamed. Each request posts --batch-size of the dataset's texts as
`input` (fetched.BatchRequester); the answer is checked (analysis/embedding_response.py: one vector per input, of the
asked encoding) and its usage kept."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...analysis import kinds
from ...analysis.embedding_response import parse_embeddings
from ...analysis.records import RequestRecord
from .. import request_options
from ..declare import option
from .fetched import BatchRequester, with_extra_body


@dataclass(frozen=True)
class EmbeddingsOptions:
    """--endpoint embeddings: the batch and the vectors' encoding."""

    GROUP: ClassVar[str] = "Request"

    batch_size: int = option(
        "--batch-size",
        1,
        "--endpoint embeddings: inputs per request, taken in turn from --dataset",
    )
    encoding_format: str = option(
        "--encoding-format",
        "float",
        "--endpoint embeddings: the vectors as JSON floats or base64 (little-endian float32)",
        choices=["float", "base64"],
    )


def embeddings_payload(
    options, model: str, texts: list[str], fields: request_options.RequestFields | None = None
) -> dict:
    """The JSON body of one embeddings request: the batch's texts as `input` (always a list, as vLLM and OpenAI take
    a batch), --encoding-format, then --extra-body merged last (the user's escape hatch: dimensions,
    truncate_prompt_tokens, ...)."""
    payload: dict = {"model": model, "input": list(texts), "encoding_format": options.encoding_format}
    return with_extra_body(payload, options, fields)


class EmbeddingsRequester(BatchRequester):
    kind = kinds.EMBEDDINGS
    answer_noun = "an embeddings list"
    serve_hint = "serve an embedding model (vLLM: vllm serve MODEL --runner pooling)"

    def __init__(self, user, opts) -> None:
        self.encoding_format = opts.encoding_format
        super().__init__(user, opts)

    def group(self, opts) -> int:
        return int(opts.batch_size)

    def count(self) -> int:
        return self.size

    def body(self, texts: list[str]) -> dict:
        user = self.user
        return embeddings_payload(user.options, self.model, texts, user.fields)

    def check(self, body: bytes, record: RequestRecord) -> str | None:
        """One vector per input, of the asked encoding; prompt_tokens from the answer's usage."""
        answer = parse_embeddings(body, record.inputs, self.encoding_format)
        record.prompt_tokens = answer.prompt_tokens
        return answer.error

    @classmethod
    def probe(cls, options, model: str) -> tuple[dict, object]:
        """The preflight's request (one short input) and the check of its answer (None: it holds)."""
        payload = embeddings_payload(options, model, ["hello"])
        return payload, lambda body: parse_embeddings(body, 1, options.encoding_format).error
