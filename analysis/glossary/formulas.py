"""Each metric's formula for one request, and the statistics every table shares (percentiles, means)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd


def ttft_s(token_offsets_s: Sequence[float]) -> float | None:
    """TTFT = arrival offset of the first token-carrying chunk."""
    return token_offsets_s[0] if token_offsets_s else None


def e2e_s(token_offsets_s: Sequence[float]) -> float | None:
    """E2E = arrival offset of the last token-carrying chunk."""
    return token_offsets_s[-1] if token_offsets_s else None


def tpot_s(e2e: float | None, ttft: float | None, output_tokens: int | None) -> float | None:
    """TPOT = (E2E - TTFT) / (output_tokens - 1); None when output_tokens <= 1."""
    if e2e is None or ttft is None or output_tokens is None or output_tokens <= 1:
        return None
    return (e2e - ttft) / (output_tokens - 1)


def itl_samples_s(token_offsets_s: Sequence[float], chunk_tokens: Sequence[int]) -> list[float]:
    """ITL samples: chunk i (i >= 1) with k tokens after gap g = t[i] - t[i-1] gives k samples of g / k."""
    out: list[float] = []
    for i in range(1, len(token_offsets_s)):
        k = chunk_tokens[i]
        if k <= 0:
            continue
        gap = token_offsets_s[i] - token_offsets_s[i - 1]
        out.extend([gap / k] * k)
    return out


def per_request_tok_s(output_tokens: int | None, e2e: float | None) -> float | None:
    """Per-request tok/s = output_tokens / E2E."""
    if output_tokens is None or e2e is None or e2e <= 0:
        return None
    return output_tokens / e2e


def aggregate_tok_s(output_tokens_in_window: int, window_s: float) -> float | None:
    """Aggregate tok/s = output tokens of requests completed in the window / window length."""
    if window_s is None or not math.isfinite(window_s) or window_s <= 0:
        return None
    return output_tokens_in_window / window_s


def schedule_lag_s(start_time: float, intended_start_time: float | None) -> float | None:
    """Schedule lag = start_time - intended_start_time; None in a closed loop (no intended time)."""
    if intended_start_time is None:
        return None
    return start_time - intended_start_time


def intended_s(latency_s: float | None, lag_s: float | None) -> float | None:
    """Latency from the intended send time = latency_s + schedule_lag_s; None when either is missing."""
    if latency_s is None or lag_s is None:
        return None
    return latency_s + lag_s


def reasoning_time_s(ttft: float | None, ttfo: float | None) -> float | None:
    """Reasoning time = TTFO - TTFT; None without an answer token (or without a first token)."""
    if ttft is None or ttfo is None:
        return None
    return ttfo - ttft


def answer_tokens(output_tokens: int | None, reasoning_tokens: int | None) -> int | None:
    """Answer tokens = output_tokens - reasoning_tokens (tool-call tokens included); None when either is missing."""
    if output_tokens is None or reasoning_tokens is None:
        return None
    return output_tokens - reasoning_tokens


def answer_tpot_s(
    e2e: float | None, ttfo: float | None, output_tokens: int | None, reasoning_tokens: int | None
) -> float | None:
    """Answer TPOT = (E2E - TTFO) / (output_tokens - reasoning_tokens - 1); None when the answer has <= 1 token."""
    answer = answer_tokens(output_tokens, reasoning_tokens)
    if e2e is None or ttfo is None or answer is None or answer <= 1:
        return None
    return (e2e - ttfo) / (answer - 1)


def tokens_per_chunk(output_tokens: int | None, chunks: int, estimated: bool | None) -> float | None:
    """Tokens per chunk = output_tokens / chunks; None without chunks or when the tokens were counted from the chunks
    (no usage: each chunk counted as one token, so the ratio would be 1 by construction)."""
    if output_tokens is None or not chunks or estimated is not False:
        return None
    return output_tokens / chunks


def reasoning_share(
    reasoning_tokens: Sequence[float] | np.ndarray, output_tokens: Sequence[float] | np.ndarray
) -> float:
    """Reasoning share = sum(reasoning_tokens) / sum(output_tokens) over the requests with both; NaN without output."""
    r = np.asarray(reasoning_tokens, dtype=float)
    o = np.asarray(output_tokens, dtype=float)
    both = ~np.isnan(r) & ~np.isnan(o)
    total = float(o[both].sum())
    return float(r[both].sum()) / total if total > 0 else math.nan


def ttfo_values(requests: pd.DataFrame) -> np.ndarray:
    """Per request, ttfo_s for the TTFO statistics: +inf (never answered) where tokens came but no answer token
    (reasoning_tokens known, ttfo_s missing); NaN where unknown (records written before TTFO existed)."""
    ttfo = numeric_column(requests, "ttfo_s")
    never = np.isnan(ttfo) & ~np.isnan(numeric_column(requests, "reasoning_tokens"))
    ttfo[never] = math.inf
    return ttfo


def numeric_column(frame: pd.DataFrame, column: str) -> np.ndarray:
    """A column as floats (None and absent: NaN), a copy."""
    if column not in frame.columns:
        return np.full(len(frame), math.nan)
    return pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=float, copy=True)


# --- statistics shared by every table ------------------------------------------------------------------------


def percentile(values: Sequence[float] | np.ndarray | pd.Series, q: float) -> float:
    """q-th percentile (0-100) of the raw values, linear interpolation = numpy's default; NaN when there are none."""
    arr = np.asarray(values, dtype=float)
    arr = arr[~np.isnan(arr)]
    if arr.size == 0:
        return math.nan
    return float(np.percentile(arr, q))


def percentile_never(values: Sequence[float] | np.ndarray | pd.Series, q: float) -> float:
    """percentile() where +inf (never) ranks above every finite value: with h = (n - 1) q / 100, x_(floor h) +
    frac(h) (x_(floor h + 1) - x_(floor h)) over the sorted values, inf once it reaches an inf; NaN when none."""
    arr = np.asarray(values, dtype=float)
    arr = arr[~np.isnan(arr)]
    never = np.isposinf(arr)
    if not never.any():
        return percentile(arr, q)
    finite = np.sort(arr[~never])
    h = (arr.size - 1) * q / 100
    lo = math.floor(h)
    frac = h - lo
    if lo >= finite.size or (frac > 0 and lo + 1 >= finite.size):
        return math.inf
    return float(finite[lo] + frac * (finite[lo + 1] - finite[lo])) if frac > 0 else float(finite[lo])


def mean(values: Sequence[float] | np.ndarray | pd.Series) -> float:
    """Mean = sum / count of the values that are not missing; NaN when there are none."""
    values = pd.Series(values, dtype=float).dropna()
    return float(values.mean()) if len(values) else math.nan


def flagged(value: object) -> bool:
    """Flagged = the verdict is true; False, None and NaN (not measured) are not flagged."""
    return value is not None and not pd.isna(value) and bool(value)


def as_nan(value: float | None) -> float:
    return math.nan if value is None else value
