"""An OpenAI-compatible /v1/embeddings answer, parsed and checked: one vector per input, all of one length.

Pure (no network). The body is vLLM's EmbeddingResponse (vllm/entrypoints/pooling/embed/protocol.py, 0.32):
`{"id", "object": "list", "created", "model", "data": [{"index": i, "object": "embedding", "embedding": [floats]
| "base64 of float32s"}, ...], "usage": {"prompt_tokens": P, "total_tokens": P, ...}}`. A body that breaks the
contract is an error of its own category, `bad_response`: a client that only counted bytes would report a server
that answers the wrong number of vectors as a fast one.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from . import error_body

BAD_RESPONSE = "bad_response"  # a 200 embeddings body that breaks the contract (records' error_type)
_NUMBERS = frozenset((float, int))  # JSON numbers as orjson parses them (bool is its own type: not a number)
FLOAT32_BYTES = 4


@dataclass(frozen=True, slots=True)
class EmbeddingAnswer:
    """What an embeddings body says; `error` is None for a body that keeps the contract, else one line."""

    vectors: int | None = None  # the number of embeddings in `data`
    dims: int | None = None  # the length of each vector (float32 values of a base64 vector)
    prompt_tokens: int | None = None  # usage.prompt_tokens
    error: str | None = None


def _vector_length(value: object, encoding_format: str) -> int | str:
    """The number of values of one `embedding` (len(list) for float, decoded bytes / 4 for base64), or what is
    wrong with it."""
    if encoding_format == "base64":
        if not isinstance(value, str):
            return f"is {type(value).__name__}, not a base64 string (asked encoding_format base64)"
        try:
            raw = base64.b64decode(value, validate=True)  # validate: no character outside the alphabet
        except (binascii.Error, ValueError) as e:
            return f"is not valid base64 ({e})"
        if not raw or len(raw) % FLOAT32_BYTES:
            return f"decodes to {len(raw)} bytes, not a whole number of float32s"
        return len(raw) // FLOAT32_BYTES
    if not isinstance(value, list):
        return f"is {type(value).__name__}, not a list of numbers (asked encoding_format float)"
    if not value:
        return "is empty"
    # One pass in C over the element types: ~15 ns a value, where a Python loop is ~60 (a batch of 64 vectors of
    # 4096 values is 262 k of them, blocking every other user of the process meanwhile).
    if not {*map(type, value)} <= _NUMBERS:
        return "holds something that is not a number"
    return len(value)


def parse_embeddings(body: bytes | bytearray, inputs: int, encoding_format: str = "float") -> EmbeddingAnswer:
    """Parse an embeddings body sent for `inputs` inputs: vectors = len(data) == inputs, dims = the common length,
    prompt_tokens = usage.prompt_tokens; the first broken rule found is the error."""
    obj, why = error_body.json_object(body)
    if obj is None:
        return EmbeddingAnswer(error=why)
    usage = obj.get("usage")
    prompt_tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    if type(prompt_tokens) is not int or prompt_tokens < 0:
        prompt_tokens = None
    data = obj.get("data")
    if not isinstance(data, list):
        return EmbeddingAnswer(prompt_tokens=prompt_tokens, error=error_body.error_with_200(obj, "data list"))
    vectors = len(data)
    if vectors != inputs:
        return EmbeddingAnswer(vectors, None, prompt_tokens, f"{vectors} embedding(s) for {inputs} input(s)")
    dims = None
    indices = []
    for i, item in enumerate(data):
        if not isinstance(item, dict) or "embedding" not in item:
            return EmbeddingAnswer(vectors, None, prompt_tokens, f"data[{i}] has no embedding")
        length = _vector_length(item["embedding"], encoding_format)
        if isinstance(length, str):
            return EmbeddingAnswer(vectors, None, prompt_tokens, f"data[{i}].embedding {length}")
        if dims is None:
            dims = length
        elif length != dims:
            return EmbeddingAnswer(vectors, None, prompt_tokens, f"data[{i}] has {length} values, data[0] {dims}")
        indices.append(item.get("index", i))
    # Each input's vector once: the index is what maps a vector to its input (a server may reorder them).
    if any(type(x) is not int for x in indices) or sorted(indices) != list(range(vectors)):
        return EmbeddingAnswer(vectors, dims, prompt_tokens, f"the indices {indices[:8]} are not 0..{vectors - 1}")
    if prompt_tokens is None:
        return EmbeddingAnswer(vectors, dims, None, "the body has no usage.prompt_tokens")
    return EmbeddingAnswer(vectors, dims, prompt_tokens)
