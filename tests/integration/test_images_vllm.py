"""Chat with images against the real vLLM: the embedded server with `serve --vision`, a tiny random-weight BLIP-2
(embedded_vllm/tiny_vision_model.py; the session's `vision_vllm`, tests/helpers/fleet.py).

vLLM 0.32 turns each image into the Q-Former's 32 query tokens whatever its size (the server still decodes and
resizes every image: that cost is real), accepts one image per prompt for BLIP-2, and counts the image tokens in
usage.prompt_tokens and vllm:prompt_tokens_total. With --image-reuse the same image hits vLLM's multimodal cache
(vllm:mm_cache_hits_total).

Select with `-m vllm`."""

from __future__ import annotations

import base64
import io
import json
import urllib.error
import urllib.request

import pytest
from vllm_loadtest.analysis.records import load_records

from tests.helpers.runs import locust
from tests.helpers.vllm import finished_counts, scrape

pytestmark = [pytest.mark.vllm, pytest.mark.contract]

IMAGE_TOKENS = 32  # tiny_vision_model.NUM_QUERY_TOKENS
TEXT = 40  # --dataset synthetic:40 (a chat run without images: prompt_tokens 40 on this server)


def png_url(size: int, colour: tuple[int, int, int]) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def chat(server, images: list[str]) -> tuple[int, dict]:
    content = [{"type": "text", "text": "Describe the image."}]
    content += [{"type": "image_url", "image_url": {"url": url}} for url in images]
    body = {"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 4, "ignore_eos": True}
    request = urllib.request.Request(
        server.url + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_an_image_adds_its_query_tokens_to_the_prompt_whatever_its_size(vision_vllm):
    status, plain = chat(vision_vllm, [])
    assert status == 200
    for size in (16, 64, 512):
        status, answer = chat(vision_vllm, [png_url(size, (size % 256, 40, 200))])
        assert status == 200, answer
        assert answer["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"] + IMAGE_TOKENS
    status, refused = chat(vision_vllm, [png_url(64, (1, 2, 3)), png_url(64, (4, 5, 6))])
    assert status == 400 and "At most 1 image(s) may be provided in one prompt" in refused["error"]["message"]


def test_a_run_with_images_sends_them_and_the_server_counts_their_tokens(vision_vllm, tmp_path):
    run_dir = tmp_path / "run"
    before = finished_counts(vision_vllm.url)
    proc = locust(
        "--host", vision_vllm.url, "--endpoint", "chat", "--images", "1:64x64", "--dataset", f"synthetic:{TEXT}",
        "--max-tokens", "8", "--ignore-eos",
        "--steps", "2", "--step-duration", "6s", "--step-warmup", "0s", "--run-dir", str(run_dir),
        timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    after = finished_counts(vision_vllm.url)
    records = load_records(run_dir)
    ok = records[records["status"] == "ok"]
    cut = records[records["error_type"] == "cut_off"]  # streams in flight at the stop (vLLM aborts them)
    # A busy machine's slowed server may finish one request in 6 s (seen: 2, both in a 2 s warm-up, so none measured
    # and exit 1: the whole step is measured).
    assert len(ok) >= 1 and len(ok) + len(cut) == len(records), records["error"].dropna().unique()
    assert (ok["images"] == 1).all()
    # A stream cut off at the stop may have been finished by vLLM already (seen: 13 finished, 12 ok, 1 cut off).
    assert len(ok) <= after[0] - before[0] <= len(ok) + len(cut)
    # A stream cut off at the stop had some tokens generated (and counted by the server) before vLLM aborted it: at
    # most its max_tokens (8) each (seen: one cut-off stream, 3 tokens).
    assert ok["output_tokens"].sum() <= after[1] - before[1] <= ok["output_tokens"].sum() + 8 * len(cut)
    # The dataset cut each chat prompt to TEXT tokens with the server's /tokenize (text only); vLLM puts the
    # image's query tokens before it (BLIP-2 has no placeholder in the text).
    assert (ok["prompt_tokens"] == TEXT + IMAGE_TOKENS).all()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert not summary["integrity"]["mismatch"], summary["integrity"]["text"]


def test_reused_images_hit_the_servers_multimodal_cache(vision_vllm, tmp_path):
    def hits() -> float:
        return sum(v for name, _, v in scrape(vision_vllm.url) if name == "vllm:mm_cache_hits_total")

    before = hits()
    proc = locust(
        "--host", vision_vllm.url, "--endpoint", "chat", "--images", "1:64x64", "--image-reuse", "--max-tokens", "4",
        "--steps", "1", "--step-duration", "8s", "--step-warmup", "0s", "--stop-timeout", "60",
        "--run-dir", str(tmp_path / "run"),
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = load_records(tmp_path / "run")
    ok = records[records["status"] == "ok"]
    assert len(ok) >= 2  # one user, one request after another: 1 in 3 s from a server slowed by a busy machine
    assert hits() - before >= len(ok) - 1  # every request after the first finds the image cached
