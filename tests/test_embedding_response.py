"""analysis/embedding_response.py: an embeddings body is checked (one vector per input, one length for all, numbers
or float32 base64, the indices, usage.prompt_tokens), and each broken rule is a one-line error, never an exception."""

from __future__ import annotations

import base64
import struct

import orjson
import pytest
from vllm_loadtest.analysis.embedding_response import parse_embeddings

pytestmark = pytest.mark.unit


def body(vectors: list, usage: object = "default", **extra) -> bytes:
    """A body shaped as vLLM 0.32 dumps EmbeddingResponse (vllm/entrypoints/pooling/embed/protocol.py)."""
    obj = {
        "id": "embd-1", "object": "list", "created": 1, "model": "m",
        "data": [{"index": i, "object": "embedding", "embedding": v} for i, v in enumerate(vectors)],
        "usage": {"prompt_tokens": 12, "total_tokens": 12, "completion_tokens": 0, "prompt_tokens_details": None},
        **extra,
    }  # fmt: skip
    if usage != "default":
        obj["usage"] = usage
    return orjson.dumps(obj)


def b64(values: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()


def test_a_float_batch_gives_its_vectors_dims_and_prompt_tokens():
    answer = parse_embeddings(body([[0.1, -2, 3.5], [0.0, 1, 1e-9]]), 2)
    assert (answer.vectors, answer.dims, answer.prompt_tokens, answer.error) == (2, 3, 12, None)


def test_a_base64_batch_is_counted_in_float32s():
    answer = parse_embeddings(body([b64([1.0] * 5), b64([0.5] * 5), b64([2.0] * 5)]), 3, "base64")
    assert (answer.vectors, answer.dims, answer.error) == (3, 5, None)


def test_a_bytearray_body_is_read_as_is():
    assert parse_embeddings(bytearray(body([[1.0]])), 1).error is None


@pytest.mark.parametrize(
    ("raw", "inputs", "fmt", "message"),
    [
        (b"<html>502 Bad Gateway</html>", 1, "float", "not JSON"),
        (b"[1, 2]", 1, "float", "JSON list, not an object"),
        (orjson.dumps({"object": "list"}), 1, "float", "no data list"),
        (orjson.dumps({"error": {"message": "engine dead"}}), 1, "float", "an error with HTTP 200: engine dead"),
        (body([[1.0], [2.0]]), 3, "float", "2 embedding(s) for 3 input(s)"),
        (body([[1.0, 2.0], [2.0]]), 2, "float", "data[1] has 1 values, data[0] 2"),
        (body([[1.0, "2"]]), 1, "float", "not a number"),
        (body([[1.0, True]]), 1, "float", "not a number"),
        (body([[1.0, [2.0]]]), 1, "float", "not a number"),
        (body([[1.0, None]]), 1, "float", "not a number"),
        (body([[]]), 1, "float", "is empty"),
        (body([b64([1.0])]), 1, "float", "not a list of numbers"),
        (body([[1.0]]), 1, "base64", "not a base64 string"),
        (body(["AAAA!AAA"]), 1, "base64", "not valid base64"),
        (body(["AAA"]), 1, "base64", "not valid base64"),  # bad padding
        (body([base64.b64encode(b"\0" * 6).decode()]), 1, "base64", "6 bytes, not a whole number of float32s"),
        (body([b64([1.0, 2.0]), b64([1.0])]), 2, "base64", "data[1] has 1 values, data[0] 2"),
        (body([[1.0]], usage=None), 1, "float", "no usage.prompt_tokens"),
        (body([[1.0]], usage={"total_tokens": 3}), 1, "float", "no usage.prompt_tokens"),
        (body([[1.0]], usage={"prompt_tokens": -1}), 1, "float", "no usage.prompt_tokens"),
        (body([[1.0]], usage={"prompt_tokens": "3"}), 1, "float", "no usage.prompt_tokens"),
    ],
)
def test_each_broken_rule_is_one_line(raw, inputs, fmt, message):
    answer = parse_embeddings(raw, inputs, fmt)
    assert answer.error is not None and message in answer.error, answer
    assert "\n" not in answer.error


def test_the_indices_map_each_vector_to_one_input():
    reordered = orjson.loads(body([[1.0], [2.0], [3.0]]))
    reordered["data"].reverse()  # indices 2, 1, 0: a server may answer in any order
    assert parse_embeddings(orjson.dumps(reordered), 3).error is None
    reordered["data"][0]["index"] = 1  # 1, 1, 0: input 2 has no vector
    assert "indices" in parse_embeddings(orjson.dumps(reordered), 3).error
    reordered["data"][0]["index"] = "2"
    assert "indices" in parse_embeddings(orjson.dumps(reordered), 3).error


def test_a_usage_without_prompt_tokens_keeps_the_vectors_count():
    answer = parse_embeddings(body([[1.0], [2.0]], usage=None), 2)
    assert (answer.vectors, answer.dims, answer.prompt_tokens) == (2, 1, None)
