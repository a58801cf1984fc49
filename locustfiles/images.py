"""--images N:WIDTHxHEIGHT: generated images added to every chat request as image_url parts with data URLs.

Each image looks like a photo to an encoder (a smooth low-resolution random field upscaled, with mid-frequency
detail blended in: compressible like a photo, not white noise) and is seeded: the same --seed, user and request
counter give the same bytes. Without --image-reuse every request gets images no earlier request had, so the
server's image cache (vLLM hashes the decoded pixels) never hits; with it, every request of every process sends
the same set.

Generating and PNG-encoding a 512x512 image whole costs ~17 ms of CPU (zlib), too much per request in a load process:
each process keeps a small pool of base images encoded once, and a request's image is a base whose top band
(BAND_ROWS rows) gets the request's own noise. PNG: the rows are Sub-filtered (each row independent of the
others), the base's rows below the band are deflated once, and a request deflates only its band, ended by a full
flush, then appends the base's deflate stream (byte-aligned, no back references across the flush) and the
combined Adler-32: a valid PNG whose decoded pixels differ from every other request's, at ~0.4 ms. JPEG: the band
is pasted into a copy of the base and encoded (~0.7 ms). tests/benchmarks/bench_images.py measures both.

The request body is built with a placeholder for each image's URL (`PLACEHOLDER`, in build_payload), serialized,
then `splice` puts the request's data URLs in: all before the send stamp, and the serialized bodies of the
dataset stay small (shared by the users of a process) instead of holding megabytes of base64 per prompt.
"""

from __future__ import annotations

import base64
import io
import random
import struct
import zlib
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from PIL import Image

from .declare import option
from .options import ImageSpec, parse_images


@dataclass(frozen=True)
class ImageOptions:
    """--images: generated images added to every chat request."""

    GROUP: ClassVar[str] = "Workload"

    images: str = option(
        "--images",
        "",
        "--endpoint chat: N:WIDTHxHEIGHT, N generated images (seeded by --seed) added to every request as "
        "image_url parts with base64 data URLs, e.g. 2:512x512; distinct per request unless --image-reuse",
    )
    image_reuse: bool = option(
        "--image-reuse",
        False,
        "With --images: every request sends the same images (to measure the server's image cache)",
    )
    image_format: str = option("--image-format", "png", "With --images: the images' encoding", choices=["png", "jpeg"])


PLACEHOLDER = "%%%%VLLM_LOADTEST_IMAGE_URL%%%%"  # JSON-safe: serialized as is, found as bytes by splice
_PLACEHOLDER_BYTES = PLACEHOLDER.encode("ascii")
BAND_ROWS = 8  # rows of per-request noise at the top of each image
BAND_NOISE = 24  # the noise's amplitude (0..BAND_NOISE added to the base's values): visible, not a new picture
LOW_RES = 6  # the random field's cells per side, upscaled bicubic: the picture's large shapes
DETAIL_CELL = 16  # pixels per cell of the mid-frequency detail layer
DETAIL_WEIGHT = 0.25
POOL_BYTES = 64 << 20  # raw pixels kept per process for the base pool (caps the pool for large images)
MAX_POOL = 16
PNG_LEVEL = 1  # zlib level: 6 (Pillow's default) is 4x slower for ~10 % fewer bytes on these images
JPEG_QUALITY = 85
_MIME = {"png": "image/png", "jpeg": "image/jpeg"}
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_ADLER_BASE = 65521


def content(prompt: str | list, count: int) -> list[dict]:
    """A user message's content with `count` image parts after its text (OpenAI's content-part list)."""
    parts = [{"type": "text", "text": prompt}] if isinstance(prompt, str) else list(prompt)
    return parts + [{"type": "image_url", "image_url": {"url": PLACEHOLDER}} for _ in range(count)]


def attach(messages: list[dict], count: int) -> list[dict]:
    """The messages with `count` image placeholders on the last user message (copied: a dataset's items are shared
    by every user); earlier turns of a conversation stay text."""
    out = list(messages)
    for i in range(len(out) - 1, -1, -1):
        if out[i].get("role") == "user":
            out[i] = {**out[i], "content": content(out[i].get("content") or "", count)}
            return out
    return [*out, {"role": "user", "content": content("", count)}]


def splice(body: bytes, urls: list[bytes]) -> bytes:
    """The serialized body with each PLACEHOLDER replaced by the next data URL."""
    pieces = body.split(_PLACEHOLDER_BYTES)
    if len(pieces) != len(urls) + 1:
        raise ValueError(f"the request body has {len(pieces) - 1} image placeholders for {len(urls)} images")
    out = [pieces[0]]
    for url, piece in zip(urls, pieces[1:]):
        out += (url, piece)
    return b"".join(out)


def _rng(*key: object) -> np.random.Generator:
    """A numpy generator seeded from a key's text (stable across processes and Python runs, unlike hash())."""
    return np.random.default_rng(random.Random(":".join(map(str, key))).getrandbits(64))


def natural_pixels(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    """height x width x 3 uint8: a LOW_RES-cell random field upscaled bicubic, blended with a DETAIL_CELL-pixel
    field upscaled bilinear at DETAIL_WEIGHT."""
    low = Image.fromarray(rng.integers(0, 256, (LOW_RES, LOW_RES, 3), dtype=np.uint8), "RGB")
    image = low.resize((width, height), Image.Resampling.BICUBIC)
    cells = (height // DETAIL_CELL + 2, width // DETAIL_CELL + 2, 3)
    detail = Image.fromarray(rng.integers(0, 256, cells, dtype=np.uint8), "RGB")
    image = Image.blend(image, detail.resize((width, height), Image.Resampling.BILINEAR), DETAIL_WEIGHT)
    return np.asarray(image)


def _sub_filtered(rows: np.ndarray) -> bytes:
    """PNG scanlines with filter 1 (Sub: each byte minus the byte one pixel to its left, mod 256)."""
    h, w, _ = rows.shape
    flat = rows.reshape(h, w * 3)
    out = np.empty((h, w * 3 + 1), dtype=np.uint8)
    out[:, 0] = 1
    out[:, 1:4] = flat[:, :3]
    np.subtract(flat[:, 3:], flat[:, :-3], out=out[:, 4:], dtype=np.uint8, casting="unsafe")
    return out.tobytes()


def _adler_combine(a1: int, a2: int, len2: int) -> int:
    """Adler-32 of A + B from adler32(A), adler32(B) and len(B) (zlib's adler32_combine)."""
    rem = len2 % _ADLER_BASE
    s1 = a1 & 0xFFFF
    s2 = (rem * s1) % _ADLER_BASE
    s1 = (s1 + (a2 & 0xFFFF) + _ADLER_BASE - 1) % _ADLER_BASE
    s2 = (s2 + (a1 >> 16) + (a2 >> 16) + _ADLER_BASE - rem) % _ADLER_BASE
    return (s2 << 16) | s1


def _chunk(kind: bytes, data: bytes) -> bytes:
    """A PNG chunk: length, type, data, CRC-32 of type + data."""
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(data, zlib.crc32(kind)))


@dataclass
class _Base:
    """One base picture: its pixels and, for PNG, the rows below the band deflated once."""

    pixels: np.ndarray
    tail_deflate: bytes = b""  # raw deflate of the Sub-filtered rows below the band, finished
    tail_adler: int = 1
    tail_len: int = 0


class ImageMaker:
    """The data URLs of one request's images, per process; seeded by --seed, the user and the request counter."""

    def __init__(self, spec: ImageSpec, fmt: str = "png", seed: object = 0, reuse: bool = False) -> None:
        if fmt not in _MIME:
            raise ValueError(f"--image-format {fmt!r} is not png or jpeg")
        self.spec, self.fmt, self.seed, self.reuse = spec, fmt, seed, reuse
        self.band = min(BAND_ROWS, spec.height)
        self.pool_size = max(1, min(MAX_POOL, POOL_BYTES // (spec.width * spec.height * 3)))
        self._bases: dict[int, _Base] = {}
        self._prefix = f"data:{_MIME[fmt]};base64,".encode("ascii")
        self._reused: list[bytes] | None = None
        w, h = spec.width, spec.height
        self._ihdr = _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))  # 8-bit RGB, no interlace
        self._iend = _chunk(b"IEND", b"")

    def warm(self) -> ImageMaker:
        """Build the base pool (or the reused set) now: ~170 ms for 16 PNG bases of 512x512, once per process, rather
        than spread over the first requests, each a stall of every user's event loop inside a measured step."""
        if self.reuse:
            self.urls()
        else:
            for j in range(self.pool_size):
                self._base(j)
        return self

    def urls(self, key: object = "") -> list[bytes]:
        """The request's images as data URLs (ASCII bytes); `key` tells requests apart (ignored with reuse)."""
        if self.reuse:
            if self._reused is None:
                self._reused = [self._url(self.encode("reuse", i)) for i in range(self.spec.count)]
            return self._reused
        return [self._url(self.encode(key, i)) for i in range(self.spec.count)]

    def _url(self, data: bytes) -> bytes:
        return self._prefix + base64.b64encode(data)

    def encode(self, key: object, index: int) -> bytes:
        """Image `index` of request `key`: a base from the pool with the request's noise in its top band."""
        rng = _rng(self.seed, key, index)
        base = self._base(int(rng.integers(self.pool_size)))
        top = base.pixels[: self.band].astype(np.int16)
        band = np.clip(top + rng.integers(0, BAND_NOISE + 1, top.shape, dtype=np.int16), 0, 255).astype(np.uint8)
        if self.fmt == "jpeg":
            pixels = base.pixels.copy()
            pixels[: self.band] = band
            out = io.BytesIO()
            Image.fromarray(pixels, "RGB").save(out, "JPEG", quality=JPEG_QUALITY)
            return out.getvalue()
        head = _sub_filtered(band)
        compressor = zlib.compressobj(PNG_LEVEL, zlib.DEFLATED, -15)
        deflate = compressor.compress(head) + compressor.flush(zlib.Z_FULL_FLUSH)
        adler = _adler_combine(zlib.adler32(head), base.tail_adler, base.tail_len)
        idat = b"\x78\x01" + deflate + base.tail_deflate + struct.pack(">I", adler)
        return _PNG_SIGNATURE + self._ihdr + _chunk(b"IDAT", idat) + self._iend

    def _base(self, j: int) -> _Base:
        base = self._bases.get(j)
        if base is None:
            w, h = self.spec.width, self.spec.height
            pixels = natural_pixels(_rng(self.seed, "base", w, h, j), w, h)
            base = _Base(pixels)
            if self.fmt == "png":
                tail = _sub_filtered(pixels[self.band :]) if self.band < self.spec.height else b""
                compressor = zlib.compressobj(PNG_LEVEL, zlib.DEFLATED, -15)
                base.tail_deflate = compressor.compress(tail) + compressor.flush(zlib.Z_FINISH)
                base.tail_adler, base.tail_len = zlib.adler32(tail), len(tail)
            self._bases[j] = base
        return base


def spec_of(options) -> ImageSpec | None:
    """The run's --images (checked before the run), or None."""
    return parse_images(options.images or "")


def maker_key(options) -> tuple | None:
    """What an ImageMaker depends on; None without --images."""
    spec = spec_of(options)
    return None if spec is None else (spec, options.image_format, options.seed, bool(options.image_reuse))


def build_maker(options) -> ImageMaker | None:
    """An ImageMaker for the run's options, its base pool built (resources.ProcessResources keeps one per process,
    shared by its users), or None without --images."""
    key = maker_key(options)
    return None if key is None else ImageMaker(key[0], *key[1:]).warm()


def register(environment, ctx) -> None:
    """--images: each load process builds its base pool as the run starts (~170 ms for 512x512 PNG), not in the
    first request's time."""
    if not ctx.generates_load:
        return

    def on_started(options, **_kw) -> None:
        if options.images:
            try:
                ctx.resources.image_maker(options)
            except ValueError:
                pass  # refused before the run by check_options; the web UI's form says it again at the start

    ctx.run_events.started.add_listener(on_started)
