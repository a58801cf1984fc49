"""The captured answers of vLLM 0.32 serving the tiny BLIP-2 (`python -m embedded_vllm serve --vision`,
tests/fixtures/vllm-0.32-cpu-vision/): an image's 32 query tokens are in the prompt count the client reads."""

from __future__ import annotations

import json

import pytest
from vllm_loadtest.analysis.server_metrics import SUCCESS, parse_samples
from vllm_loadtest.analysis.sse import parse_stream

from tests.helpers.paths import FIXTURES

pytestmark = pytest.mark.unit

VISION = FIXTURES / "vllm-0.32-cpu-vision"
TEXT_TOKENS = 15  # "Describe the image." in the tiny chat template, as vLLM counts it without an image
IMAGE_TOKENS = 32


def test_a_streamed_answer_with_an_image_counts_its_tokens_in_the_prompt():
    lines = [
        (0.01 * i, line.encode())
        for i, line in enumerate(VISION.joinpath("chat_one_image.sse").read_text().splitlines())
    ]
    parsed = parse_stream(lines)
    assert parsed.prompt_tokens == TEXT_TOKENS + IMAGE_TOKENS
    assert parsed.output_tokens == 4


def test_a_whole_answer_and_the_refusals():
    answer = json.loads(VISION.joinpath("chat_one_image.json").read_text())
    assert answer["usage"]["prompt_tokens"] == TEXT_TOKENS + IMAGE_TOKENS
    two = json.loads(VISION.joinpath("error_400_two_images.json").read_text())["error"]
    assert two["code"] == 400 and "At most 1 image(s) may be provided in one prompt" in two["message"]
    bad = json.loads(VISION.joinpath("error_400_undecodable_image.json").read_text())["error"]
    assert bad["code"] == 400 and bad["message"].startswith("Failed to load image")


def test_the_metrics_count_the_multimodal_cache():
    samples = parse_samples(VISION.joinpath("metrics.txt").read_text())
    values = {name: v for name, labels, v in samples if name.startswith("vllm:mm_cache")}
    # 3 distinct images, one image 3 times, the streamed one (the refused requests never reach the cache): 7 lookups,
    # 2 hits.
    assert values == {"vllm:mm_cache_queries_total": 7.0, "vllm:mm_cache_hits_total": 2.0}
    assert sum(v for name, labels, v in samples if name == SUCCESS) > 0
