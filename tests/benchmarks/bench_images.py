"""CPU cost of --images: generating a request's images (PNG and JPEG, 512x512 and others), in ms per image and bytes,
against the plain way (every image generated and encoded whole by Pillow). Run on demand, prints figures.

.venv/bin/python -m tests.benchmarks.bench_images
"""

from __future__ import annotations

import base64
import io
import json
import time

from PIL import Image
from vllm_loadtest.locustfiles import images
from vllm_loadtest.locustfiles.options import ImageSpec

REQUESTS = 300  # per case, after the process's base pool is built


def per_request(fmt: str, width: int, height: int, reuse: bool = False) -> dict:
    """A process's steady state: ms of CPU per image (data URL included), the pool's one-off cost, the bytes."""
    maker = images.ImageMaker(ImageSpec(1, width, height), fmt, seed=1, reuse=reuse)
    t = time.process_time()
    for j in range(maker.pool_size):  # every base of the pool, built once per process
        maker._base(j)
    pool_ms = (time.process_time() - t) * 1e3
    maker.urls("warm")
    t = time.process_time()
    sizes = [len(maker.urls(k)[0]) for k in range(REQUESTS)]
    ms = (time.process_time() - t) * 1e3 / REQUESTS
    url = maker.urls(0)[0]
    return {"ms": ms, "pool_ms": pool_ms, "bytes": len(base64.b64decode(url.partition(b",")[2])),
            "url_bytes": sum(sizes) / len(sizes)}  # fmt: skip


def whole(fmt: str, width: int, height: int, n: int = 30) -> float:
    """ms per image when each is generated and encoded whole (Pillow's save, zlib level 1 for PNG)."""
    t = time.process_time()
    for k in range(n):
        pixels = images.natural_pixels(images._rng(1, "whole", k), width, height)
        out = io.BytesIO()
        Image.fromarray(pixels, "RGB").save(out, fmt.upper(), **({"compress_level": 1} if fmt == "png" else {}))
        base64.b64encode(out.getvalue())
    return (time.process_time() - t) * 1e3 / n


def main() -> None:
    rows = []
    for fmt in ("png", "jpeg"):
        for w, h in ((512, 512), (1024, 1024), (224, 224)):
            r = per_request(fmt, w, h)
            r.update(format=fmt, size=f"{w}x{h}", whole_ms=whole(fmt, w, h, 10 if w > 512 else 30))
            rows.append(r)
            print(
                f"{fmt:4} {w}x{h}: {r['ms']:.2f} ms per image (whole, by Pillow: {r['whole_ms']:.1f} ms), "
                f"{r['bytes'] / 1e3:.0f} kB ({r['url_bytes'] / 1e3:.0f} kB as a data URL); the pool of "
                f"{images.ImageMaker(ImageSpec(1, w, h)).pool_size} bases once per process: {r['pool_ms']:.0f} ms"
            )
    reused = per_request("png", 512, 512, reuse=True)
    print(f"--image-reuse (png 512x512): {reused['ms'] * 1e3:.1f} µs per request")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
