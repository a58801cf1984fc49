"""--images: the generated images (locustfiles/images.py), the chat body's content parts, the fake server's decoding,
summary.json's and the report's image settings, and every refusal of the request-kind options (check_request_kind)
as a run meets it: one line, nothing sent."""

from __future__ import annotations

import base64
import io
import json
import struct
import zlib
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image
from vllm_loadtest.analysis.run import images_info, images_text
from vllm_loadtest.locustfiles import images
from vllm_loadtest.locustfiles.openai_user import build_payload
from vllm_loadtest.locustfiles.options import ImageSpec, check_request_kind

from tests import fakeserver
from tests.helpers.badinput import first_error
from tests.helpers.inprocess import parse_options
from tests.helpers.servers import FakeServer

pytestmark = pytest.mark.unit


def decode(url: bytes) -> Image.Image:
    head, _, data = url.partition(b",")
    assert head in (b"data:image/png;base64", b"data:image/jpeg;base64"), head
    image = Image.open(io.BytesIO(base64.b64decode(data, validate=True)))
    image.load()
    return image


def pixels(url: bytes) -> bytes:
    return decode(url).convert("RGB").tobytes()


@pytest.mark.parametrize("fmt", ["png", "jpeg"])
@pytest.mark.parametrize("size", [(512, 512), (64, 48), (7, 3), (1, 1), (300, 200)])
def test_every_image_decodes_at_its_size_and_format(fmt, size):
    maker = images.ImageMaker(ImageSpec(3, *size), fmt, seed=1)
    for key in range(3):
        urls = maker.urls(key)
        assert len(urls) == 3
        for url in urls:
            image = decode(url)
            assert image.size == size and image.format == fmt.upper() and image.mode == "RGB"


def test_png_chunks_crcs_and_deflate_stream_are_valid_and_hold_the_base_below_the_band():
    # Pillow tolerates some damage; zlib.decompress checks the spliced stream's Adler-32 and the rows' count.
    maker = images.ImageMaker(ImageSpec(1, 40, 30), "png", seed=5)
    data = maker.encode("request", 0)
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    pos, kinds = 8, []
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]
        assert struct.unpack(">I", data[pos + 8 + n : pos + 12 + n])[0] == zlib.crc32(kind + body)
        if kind == b"IDAT":
            assert len(zlib.decompress(body)) == 30 * (40 * 3 + 1)
        kinds.append(kind)
        pos += 12 + n
    assert kinds == [b"IHDR", b"IDAT", b"IEND"]
    (base,) = maker._bases.values()
    got = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    assert (got[images.BAND_ROWS :] == base.pixels[images.BAND_ROWS :]).all()
    band = got[: images.BAND_ROWS].astype(int) - base.pixels[: images.BAND_ROWS]
    assert band.min() >= 0 and band.max() <= images.BAND_NOISE and band.any()


@pytest.mark.parametrize("fmt", ["png", "jpeg"])
def test_images_are_distinct_per_request_and_image_the_same_with_reuse_and_reproducible_by_seed(fmt):
    spec = ImageSpec(2, 96, 64)
    fresh = images.ImageMaker(spec, fmt, seed=7)
    seen = [pixels(url) for key in range(40) for url in fresh.urls(f"u:{key}")]
    assert len(set(seen)) == len(seen) == 80  # no two images alike, within or across requests
    again = images.ImageMaker(spec, fmt, seed=7)
    assert [pixels(u) for u in again.urls("u:3")] == seen[6:8]  # the same seed and key: the same pixels
    other = images.ImageMaker(spec, fmt, seed=8)
    assert not {pixels(u) for u in other.urls("u:3")} & set(seen)

    reused = images.ImageMaker(spec, fmt, seed=7, reuse=True)
    first = reused.urls("a")
    assert reused.urls("b") == first and len({pixels(u) for u in first}) == 2  # two images, the same each time
    assert images.ImageMaker(spec, fmt, seed=7, reuse=True).urls("z") == first  # every process sends that set


def test_images_look_like_photos_not_noise():
    # A photo-like picture compresses; white noise does not (a 512x512 PNG of noise is ~790 kB, the raw size).
    maker = images.ImageMaker(ImageSpec(1, 512, 512), "png", seed=3)
    png = base64.b64decode(maker.urls(0)[0].partition(b",")[2])
    jpeg = base64.b64decode(images.ImageMaker(ImageSpec(1, 512, 512), "jpeg", seed=3).urls(0)[0].partition(b",")[2])
    raw = 512 * 512 * 3
    assert len(png) < raw / 2 and len(jpeg) < raw / 10
    p = np.asarray(decode(maker.urls(0)[0]).convert("L"), dtype=float)
    # Neighbouring pixels are close (smooth shapes), yet the picture spans a range of values (not a flat colour).
    assert np.abs(np.diff(p, axis=1)).mean() < 8 and p.std() > 15


def test_the_pool_is_bounded_for_large_images():
    assert images.ImageMaker(ImageSpec(1, 512, 512)).pool_size == images.MAX_POOL
    assert images.ImageMaker(ImageSpec(1, 8192, 8192)).pool_size == 1


def opts(**kw) -> SimpleNamespace:
    base = parse_options("--endpoint", "chat")
    return SimpleNamespace(**{**vars(base), **kw})


def test_the_chat_body_carries_a_text_part_then_one_image_url_part_per_image():
    o = opts(images="2:32x32")
    payload = build_payload(o, "m", "describe")
    content = payload["messages"][0]["content"]
    assert content[0] == {"type": "text", "text": "describe"}
    assert [p["type"] for p in content[1:]] == ["image_url", "image_url"]
    body = json.dumps(payload).encode()
    maker = images.ImageMaker(ImageSpec(2, 32, 32), "jpeg", seed=0)
    sent = json.loads(images.splice(body, maker.urls(1)))
    urls = [p["image_url"]["url"].encode() for p in sent["messages"][0]["content"][1:]]
    assert urls == maker.urls(1) and all(u.startswith(b"data:image/jpeg;base64,") for u in urls)
    with pytest.raises(ValueError, match="placeholders"):
        images.splice(body, maker.urls(1)[:1])
    assert "messages" not in build_payload(opts(images="", endpoint="completions"), "m", "x")


def test_images_go_on_the_last_user_message_and_the_dataset_item_is_not_changed():
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "second"},
    ]
    kept = json.dumps(messages)
    payload = build_payload(opts(images="1:8x8"), "m", messages)
    assert json.dumps(messages) == kept  # shared by every user of the process
    sent = payload["messages"]
    assert sent[1]["content"] == "first" and sent[3]["content"][0] == {"type": "text", "text": "second"}
    assert sent[3]["content"][1]["type"] == "image_url"


def test_summary_and_report_settings_from_run_json():
    run = {"options": {"images": "2:512x384", "image_format": "jpeg", "image_reuse": True}}
    info = images_info(run)
    assert info == {"count": 2, "width": 512, "height": 384, "format": "jpeg", "reuse": True}
    assert "2 per request, 512x384 JPEG" in images_text(info) and "--image-reuse" in images_text(info)
    assert images_info({"options": {"images": ""}}) is None and images_info({}) is None
    assert "distinct per request" in images_text(images_info({"options": {"images": "1:8x8"}}))


def test_the_fake_server_decodes_counts_and_refuses_images():
    url = images.ImageMaker(ImageSpec(1, 60, 30), "png", seed=0).urls(0)[0].decode()
    facts = fakeserver.decode_image(url)
    assert (facts["width"], facts["height"], facts["format"], facts["mime"]) == (60, 30, "png", "image/png")
    assert fakeserver.image_tokens([facts, facts]) == 2 * 3 * 2  # ceil(60/28) x ceil(30/28) patches each
    messages = [{"role": "user", "content": [{"type": "text", "text": "abcd efgh"}, {"type": "image_url",
                "image_url": {"url": url}}]}]  # fmt: skip
    assert fakeserver.count_tokens(messages=messages) == 1 + 3 + 2 + 1  # the text's words only
    assert fakeserver.image_urls(messages) == [url]
    assert fakeserver.without_images(messages)[0]["content"][1]["image_url"]["url"] == f"<{len(url)} chars>"
    for bad in ("data:image/png;base64,AAAA", "https://example.com/x.png", "data:image/png;base64,@@"):
        with pytest.raises(ValueError):
            fakeserver.decode_image(bad)


def kind(**kw) -> SimpleNamespace:
    return SimpleNamespace(**{**vars(parse_options()), **kw})


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"batch_size": 0}, "--batch-size 0 must be at least 1"),
        ({"batch_size": 4}, "--batch-size 4 only applies to --endpoint embeddings"),
        ({"encoding_format": "base64"}, "--encoding-format only applies to --endpoint embeddings"),
        ({"images": "2:512", "endpoint": "chat"}, "--images '2:512' is not N:WIDTHxHEIGHT"),
        ({"images": "0:8x8", "endpoint": "chat"}, "the number of images must be at least 1"),
        ({"images": "1:0x8", "endpoint": "chat"}, "each side must be 1 to"),
        ({"images": "1:8x8"}, "--images only applies to --endpoint chat"),
        ({"image_reuse": True, "endpoint": "chat"}, "--image-reuse only applies with --images"),
        ({"image_format": "jpeg", "endpoint": "chat"}, "--image-format only applies with --images"),
        ({"endpoint": "embeddings", "images": "1:8x8"}, "--images does not apply to --endpoint embeddings"),
        ({"endpoint": "embeddings", "ignore_eos": True}, "--ignore-eos does not apply"),
        ({"endpoint": "embeddings", "max_tokens_dist": "uniform:1:8"}, "--max-tokens-dist does not apply"),
        ({"endpoint": "embeddings", "turns": "3"}, "--turns does not apply"),
        ({"endpoint": "embeddings", "trace": "t.jsonl"}, "--trace does not apply"),
        ({"endpoint": "embeddings", "chat_template_kwargs": "{}"}, "--chat-template-kwargs does not apply"),
        ({"endpoint": "embeddings", "tools": "tools.json"}, "--tools does not apply"),
        ({"endpoint": "embeddings", "tool_choice": "auto"}, "--tool-choice does not apply"),
        ({"endpoint": "embeddings", "step_duration": "auto"}, "--step-duration auto does not apply"),
        ({"endpoint": "embeddings", "find_capacity": "users"}, "--find-capacity does not apply"),
    ],
)
def test_each_refusal_of_the_request_kind_options(given, expected):
    with pytest.raises(ValueError) as e:
        check_request_kind(kind(**given))
    assert expected in str(e.value) and "\n" not in str(e.value)


def test_the_request_kind_options_that_apply_pass():
    check_request_kind(kind(endpoint="chat", images="2:512x512", image_reuse=True, image_format="jpeg"))
    check_request_kind(kind(endpoint="embeddings", batch_size=8, encoding_format="base64"))
    check_request_kind(kind())


@pytest.fixture(scope="module")
def server():
    server = FakeServer([])
    yield server
    server.stop()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--endpoint", "embeddings", "--batch-size", "0"], "--batch-size 0 must be at least 1"),
        (["--endpoint", "chat", "--images", "2:512"], "is not N:WIDTHxHEIGHT"),
        (["--images", "2:512x512"], "--images only applies to --endpoint chat"),
    ],
    ids=["batch-size-0", "size-not-WxH", "images-on-completions"],
)
def test_the_issues_bad_inputs_stop_before_any_request(server, tmp_path, args, expected):
    line = first_error("--host", server.url, "--steps", "1", "--run-dir", str(tmp_path / "r"), *args)
    assert expected in line
    assert server.get("/stats")["requests"] == 0
