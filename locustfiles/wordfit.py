"""Text of an exact token count from common words: `fit_words` searches the longest run of words within a target
against the server's tokenizer (about log2 of the bracket in /tokenize calls) and closes the gap with fillers."""

from __future__ import annotations

from collections.abc import Callable

from .tokenizer import DatasetError

# Short, common English words: with a real model's tokenizer most of them are one token after a space, which is
# what makes "N words" a fair estimate of N tokens without /tokenize.
WORDS = (
    "the of and to in is was he for it with as his on be at by had are but from or have an they which one you "
    "were all we her she there would their will when who him been has more if no out so said what up its about "
    "into than them can only other new some could time these two may then do first any my now such like our "
    "over man me even most made after also did many before must through back years where much your way well "
    "down should because each just those people how too little state good very make world still own see men "
    "work long get here between both life being under never day same another know while last might us great "
    "old year off come since against go came right used take three"
).split()
# Appended one at a time to close the last few tokens of a gap that the next word would overshoot.
FILLERS = (" a", ".", ",", " I", " x", "!", " 1", "-", " the")
QUESTIONS = (
    "Summarize the text above in one sentence.",
    "What is the main idea of the instructions above?",
    "List three keywords from the text above.",
    "Translate the first sentence above into French.",
    "Explain the text above to a ten-year-old.",
    "Which part of the text above is the most important, and why?",
    "Write a title for the text above.",
    "Rewrite the last sentence above more formally.",
)


def fit_words(
    words: list[str],
    target: int,
    count: Callable[[str], int],
    join: Callable[[list[str]], str] = " ".join,
    more: Callable[[int], list[str]] | None = None,
) -> tuple[str, int]:
    """The longest text `join(words[:k])` of at most `target` tokens, padded with FILLERS towards exactly
    `target`; returns (text, its token count). The count grows with k, so a search over k needs about log2 of the
    bracket in /tokenize calls; the first guess uses the tokens-per-word ratio to start close. `more(n)` gives n
    more words when all of them are still fewer than `target` tokens (a tokenizer with long tokens)."""
    cache: dict[int, int] = {}

    def f(k: int) -> int:
        if k not in cache:
            cache[k] = count(join(words[:k]))
        return cache[k]

    # No request for k = 0: vLLM rejects an empty prompt. 0 tokens is a lower bound, all the search needs there.
    cache[0] = 0
    words = list(words)
    while more is not None and f(len(words)) <= target and len(words) < 64 * target + 64:
        words += more(len(words))
    lo, hi = 0, len(words)
    if f(hi) <= target:
        lo = hi
    else:
        bisect = False
        while hi - lo > 1:
            if bisect:
                k = (lo + hi) // 2
            else:  # interpolate on the measured tokens per word; alternate with bisection so it always converges
                per_word = (f(hi) - f(lo)) / (hi - lo)
                k = min(hi - 1, max(lo + 1, lo + int((target - f(lo)) / per_word)))
            bisect = not bisect
            if f(k) <= target:
                lo = k
            else:
                hi = k
    text, n = join(words[:lo]), f(lo)
    attempts = 0
    while n < target and attempts < 3 * len(FILLERS):
        for filler in FILLERS:
            attempts += 1
            candidate = text + filler if text else filler.strip()  # no leading space at the very start
            m = count(candidate)
            if n < m <= target:
                text, n = candidate, m
                break
        else:
            break  # no filler fits the remaining gap
    if not text:
        raise DatasetError(
            f"{target} token(s) is shorter than any word with the server's tokenizer (special tokens and chat "
            "template included); ask for more tokens"
        )
    return text, n
