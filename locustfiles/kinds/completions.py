"""--endpoint completions: /v1/completions, streamed; the body's `prompt` is the dataset's text."""

from __future__ import annotations

from ...analysis import kinds
from .streaming import StreamingRequester


class CompletionsRequester(StreamingRequester):
    kind = kinds.COMPLETIONS
