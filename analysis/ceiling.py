"""The efficiency ceiling: how fast one request could decode if reading the weights were all that took time.

Generating one token for one request reads every weight once from accelerator memory, so a single stream
cannot beat memory bandwidth / weight bytes tokens per second (Qwen3-8B in BF16: ~16.4 GB of weights; on an
H100 SXM's 3.35 TB/s that is ~204 tokens/s). Pure: no I/O.
"""

from __future__ import annotations

import math
import re

# Peak memory bandwidth, GB/s (10^9 bytes/s), from the vendors' data sheets.
GPU_BANDWIDTH_GBS = {
    "h200": 4800.0,
    "h100-sxm": 3350.0,
    "h100-pcie": 2000.0,
    "a100-80gb-sxm": 2039.0,
    "a100-80gb-pcie": 1935.0,
    "a100-40gb": 1555.0,
    "l40s": 864.0,
    "l4": 300.0,
    "a10g": 600.0,
    "a10": 600.0,
    "rtx-4090": 1008.0,
    "rtx-3090": 936.0,
    "mi300x": 5300.0,
    "b200": 8000.0,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}  # fmt: skip


def parse_bytes(text: str) -> float:
    """Bytes from '16GB', '15.3GiB', '16e9' or a plain number; ValueError with an example otherwise."""
    try:
        return float(text)
    except ValueError:
        pass
    m = _SIZE.match(text)
    if not m or (m.group(2) or "").lower() not in _UNITS:
        raise ValueError(f"--model-bytes {text!r} is not a size; e.g. --model-bytes 16GB or 15.3GiB")
    return float(m.group(1)) * _UNITS[(m.group(2) or "").lower()]


def bandwidth_gbs(gpu: str | None, memory_bandwidth_gbs: float | None) -> float | None:
    """The accelerator's memory bandwidth in GB/s: the explicit figure, else the preset; None when neither."""
    if memory_bandwidth_gbs:
        return float(memory_bandwidth_gbs)
    if gpu:
        key = gpu.strip().lower()
        if key not in GPU_BANDWIDTH_GBS:
            raise ValueError(f"--gpu {gpu!r} has no preset; use one of {', '.join(GPU_BANDWIDTH_GBS)} "
                             "or --memory-bandwidth-gbs")  # fmt: skip
        return GPU_BANDWIDTH_GBS[key]
    return None


def decode_ceiling_tok_s(bandwidth_gb_s: float, weight_bytes: float) -> float:
    """Single-request decode ceiling = memory bandwidth (bytes/s) / weight bytes read per token."""
    return bandwidth_gb_s * 1e9 / weight_bytes


def decode_efficiency(measured_tok_s: float, ceiling_tok_s: float) -> float:
    """Decode efficiency = measured single-request decode tok/s (1 / TPOT p50 at one user) / the ceiling."""
    return measured_tok_s / ceiling_tok_s


def ceiling_report(
    table_rows: list[dict], bandwidth_gb_s: float | None, weight_bytes: float | None, source: str
) -> dict | None:
    """The ceiling, the measured single-user decode rate and the efficiency, with the gap's usual causes.

    Measured at the step with the fewest users (one, in a sweep that starts at 1): decode rate = 1 / TPOT p50,
    which leaves out the prefill (TTFT) and the queue. None when bandwidth or weight bytes are unknown.
    """
    if not bandwidth_gb_s or not weight_bytes:
        return None
    ceiling = decode_ceiling_tok_s(bandwidth_gb_s, weight_bytes)
    rows = [r for r in table_rows if r.get("tpot_p50_s") is not None and not math.isnan(r["tpot_p50_s"])]
    lowest = min(rows, key=lambda r: r["users"]) if rows else None
    measured = None if lowest is None or lowest["tpot_p50_s"] <= 0 else 1.0 / lowest["tpot_p50_s"]
    efficiency = None if measured is None else decode_efficiency(measured, ceiling)
    text = [
        f"Decode ceiling for one request: {bandwidth_gb_s:g} GB/s / {weight_bytes / 1e9:.3g} GB of weights "
        f"= {ceiling:.1f} tokens/s ({source})."
    ]
    if measured is None:
        text.append("No step has a TPOT: the measured single-request decode rate is missing.")
    else:
        text.append(
            f"Measured at {lowest['users']} user(s): 1 / TPOT p50 = {measured:.1f} tokens/s, "
            f"{efficiency:.0%} of the ceiling."
            + ("" if lowest["users"] == 1 else " (The sweep has no 1-user step: more users share the weight reads.)")
        )
        text.append(
            "The gap: the KV cache is read too (it grows with the context), kernels do not reach peak bandwidth "
            "(70-90 % is typical), each step pays launch, scheduling and sampling time in the serving engine, and "
            "small models are dominated by that fixed per-step time. Several users share each weight read: "
            "aggregate tok/s can exceed this single-request ceiling."
        )
    return {
        "bandwidth_gb_s": bandwidth_gb_s,
        "weight_bytes": weight_bytes,
        "decode_ceiling_tok_s": ceiling,
        "measured_users": None if lowest is None else int(lowest["users"]),
        "measured_decode_tok_s": measured,
        "decode_efficiency": efficiency,
        "source": source,
        "text": text,
    }
