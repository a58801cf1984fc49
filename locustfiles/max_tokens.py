"""Each request's max_tokens (--max-tokens-dist): fixed, the dataset item's reference length, or drawn."""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING

from .tokenizer import DatasetError

if TYPE_CHECKING:
    from .datasets import Item, Source


# --- max_tokens per request ----------------------------------------------------------------------------------
class MaxTokens:
    """Each request's max_tokens: `fixed` (--max-tokens), `reference` (the item's reference output length, else
    --max-tokens), `uniform:LOW:HIGH` (integers, both included) or `normal:MEAN:SD` (rounded, at least 1)."""

    def __init__(self, kind: str, default: int, low: float = 0, high: float = 0) -> None:
        self.kind, self.default, self.low, self.high = kind, default, low, high

    @property
    def varies(self) -> bool:
        """Whether two requests for the same item may get different values (bodies are then made per request)."""
        return self.kind in ("uniform", "normal")

    def draw(self, rng: random.Random, item: Item) -> int:
        if self.kind == "uniform":
            return rng.randint(int(self.low), int(self.high))
        if self.kind == "normal":
            return max(1, round(rng.gauss(self.low, self.high)))
        if self.kind == "reference" and item.reference_output_tokens:
            return item.reference_output_tokens
        return self.default


def parse_max_tokens(text: str, max_tokens: int, source: Source | None = None) -> MaxTokens:
    """--max-tokens-dist: '' (auto: `reference` for a source with reference lengths, else `fixed`), 'fixed',
    'reference', 'uniform:64:512', 'normal:256:64'; raises DatasetError with a one-line fix."""
    text = (text or "").strip().lower()
    if not text:
        text = "reference" if source is not None and source.has_reference else "fixed"
    kind, _, rest = text.partition(":")
    example = "use e.g. --max-tokens-dist uniform:64:512 or normal:256:64"
    if kind in ("fixed", "reference") and not rest:
        return MaxTokens(kind, max_tokens)
    if kind not in ("uniform", "normal"):
        raise DatasetError(f"--max-tokens-dist {text!r} is not a distribution; {example}")
    try:
        a, b = (float(x) for x in rest.split(":"))
    except ValueError:
        raise DatasetError(f"--max-tokens-dist {text!r} needs two numbers after {kind}:; {example}") from None
    if kind == "uniform" and not (1 <= a <= b and a == int(a) and b == int(b)):
        raise DatasetError(f"--max-tokens-dist {text!r} needs integers 1 <= LOW <= HIGH; {example}")
    if kind == "normal" and not (a >= 1 and b >= 0 and math.isfinite(a) and math.isfinite(b)):
        raise DatasetError(f"--max-tokens-dist {text!r} needs MEAN >= 1 and SD >= 0; {example}")
    return MaxTokens(kind, max_tokens, a, b)
