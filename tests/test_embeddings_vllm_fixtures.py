"""The captured answers of vLLM 0.32's pooling runner (tests/fixtures/vllm-0.32-cpu-embed/, recorded from
`python -m embedded_vllm serve --embed`): what the embeddings client and the integrity check are written against."""

from __future__ import annotations

import base64
import json
import struct

import pytest
from vllm_loadtest.analysis.server_metrics import GENERATION_TOKENS, SUCCESS, counter_total, parse_samples

from tests.helpers.paths import FIXTURES

pytestmark = pytest.mark.unit

EMBED = FIXTURES / "vllm-0.32-cpu-embed"


def load(name: str) -> dict:
    return json.loads((EMBED / name).read_text())


@pytest.mark.parametrize("name, inputs", [("float1.json", 1), ("float4.json", 4)])
def test_a_float_answer_has_one_vector_per_input_all_of_one_length(name, inputs):
    answer = load(name)
    assert answer["object"] == "list" and answer["model"] == "tiny"
    assert [d["index"] for d in answer["data"]] == list(range(inputs))
    assert {d["object"] for d in answer["data"]} == {"embedding"}
    assert {len(d["embedding"]) for d in answer["data"]} == {128}
    # The pooler normalizes: every vector has unit length.
    for d in answer["data"]:
        assert sum(x * x for x in d["embedding"]) == pytest.approx(1.0, abs=1e-5)
    usage = answer["usage"]
    assert usage["prompt_tokens"] == usage["total_tokens"] > 0 and usage["completion_tokens"] == 0


@pytest.mark.parametrize("inputs", [1, 4])
def test_base64_is_little_endian_float32_of_the_same_vectors(inputs):
    floats, packed = load(f"float{inputs}.json"), load(f"base64_{inputs}.json")
    assert packed["usage"]["prompt_tokens"] == floats["usage"]["prompt_tokens"]
    for f, b in zip(floats["data"], packed["data"], strict=True):
        raw = base64.b64decode(b["embedding"])
        assert len(raw) == 4 * 128
        assert struct.unpack(f"<{len(raw) // 4}f", raw) == pytest.approx(f["embedding"], abs=1e-7)


@pytest.mark.parametrize(
    "name, fragment",
    [
        ("error_400_too_long.json", "maximum context length is 512 tokens"),
        ("error_404_model.json", "The model `nope` does not exist."),
        ("error_400_empty_input.json", "You must pass at least one prompt"),
        ("error_400_bad_encoding_format.json", "encoding_format"),
    ],
)
def test_error_bodies_carry_the_message_under_error(name, fragment):
    error = load(name)["error"]
    assert fragment in error["message"] and error["code"] == int(name.split("_")[1])


def test_the_generation_endpoints_are_not_served():
    assert load("error_404_completions_on_pooling.json") == {"detail": "Not Found"}


def test_vllm_counts_each_input_as_one_finished_request():
    """4 HTTP requests (batches of 1, 4, 1, 4) finished 10 engine requests: the counter counts inputs."""
    samples = parse_samples((EMBED / "metrics_after_10_inputs.txt").read_text())
    by_reason = {labels["finished_reason"]: v for name, labels, v in samples if name == SUCCESS}
    assert by_reason["stop"] == 10 and sum(by_reason.values()) == 10
    assert counter_total(samples, "vllm:prompt_tokens_total") == 12 + 60 + 12 + 60  # the four usages
    assert counter_total(samples, GENERATION_TOKENS) == 0
