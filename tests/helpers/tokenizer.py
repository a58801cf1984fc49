"""A stand-in for locustfiles.datasets.Tokenizer without a server, counting as tests/fakeserver.py does."""

from __future__ import annotations

from tests.fakeserver import count_tokens


class FakeTokenizer:
    """Stands in for datasets.Tokenizer without a server: tests/fakeserver.py's counting rule."""

    max_model_len: int | None = 4096

    def __init__(self) -> None:
        self.calls = 0

    def count(self, prompt: str | list[dict], special: bool = True) -> int:
        self.calls += 1
        if isinstance(prompt, list):
            return count_tokens(messages=prompt)
        return count_tokens(prompt, special=special)
