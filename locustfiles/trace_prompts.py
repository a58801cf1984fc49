"""The prompts of a trace's rows (`--trace`): synthesized to each row's exact input length, with shared blocks.

A trace gives lengths, not text (Mooncake adds `hash_ids`: one id per 512-token block of the prompt, equal ids =
equal blocks). Each row's prompt is built from words that are exactly one token each after a space (the
"vocabulary", found once with a few /tokenize calls), so a text of k such words is exactly `overhead + k` tokens,
`overhead` being what the server adds around the text (BOS; on the chat endpoint the chat template). A row of
`input_tokens` tokens therefore gets `input_tokens - overhead` words:

    blocks    the words of its hash_ids' blocks in order, each block `block_tokens` words that depend on the seed
              and the hash_id only (a tag of a few words spelling the id, then a slice of one seeded word pool at
              an offset drawn from the id): the same bytes in every row and every process, so the server's prefix
              cache hits where the trace's blocks repeat, and blocks of different ids part within their first
              words; the last block cut to the words still needed (Mooncake's last block may be partial)
    padding   the same kind of words, from the seed and the row's trace_row, when the blocks hold fewer words than
              needed (every row of an Azure trace or of a generic jsonl trace with input_length: nothing shared)

Rows that give their prompt text (generic jsonl `prompt`) are sent as given. Without a tokenizer the vocabulary is
datasets.WORDS (one common word per token, an estimate, with a warning in the notes). A prompt is joined when it is
asked for (whole block strings and one slice: ~70 us for 12,000 tokens); blocks are cached by hash_id, bounded
(LRU), so memory stays bounded whatever the trace.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from ..analysis.trace import Trace, TraceError, check_block_tokens
from .datasets import WORDS, DatasetError, Tokenizer

# Blocks kept ready (each one string of block_tokens words, ~3 KB at 512): enough for a trace's working set of
# shared prefixes, bounded whatever the trace's number of distinct hash_ids.
BLOCK_CACHE = 4096
CHECKS = 3  # built prompts verified against /tokenize once calibrated
# Enough words that two distinct blocks never agree on their first tokens by chance (64^-16); each one token.
VOCAB_TARGET = 64
VOCAB_CHUNK = 16
POOL_WORDS = 1 << 18  # the seeded text blocks are sliced from (~1.3 MB)

_G = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GI, _M1I, _M2I, _MASK = int(_G), int(_M1), int(_M2), (1 << 64) - 1


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, elementwise on uint64 (wrapping): a fast counter-based stream of random words."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def _key(seed: int, domain: str) -> int:
    digest = hashlib.blake2b(f"trace-prompts:{domain}:{seed}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


class TracePrompts:
    """Each trace row's prompt (text on completions, one user message on chat) of exactly its input length."""

    def __init__(
        self,
        trace: Trace,
        endpoint: str,
        block_tokens: int,
        seed: int,
        tokenizer: Tokenizer | None,
        notes: list[str],
    ) -> None:
        check_block_tokens(block_tokens)
        self.trace = trace
        self.chat = endpoint == "chat"
        self.block_tokens = block_tokens
        self.seed = int(seed)
        self.notes = notes
        self.tokenizer = tokenizer
        self._block_key = _key(self.seed, "block")
        self._row_key = _key(self.seed, "row")
        self._blocks: OrderedDict[int, str] = OrderedDict()
        self.info: dict = {"block_tokens": block_tokens}
        calls = getattr(tokenizer, "calls", 0)
        if tokenizer is None:
            self.vocab = [" " + w for w in dict.fromkeys(WORDS)]
            self.overhead = 0
            self.info["tokenizer"] = "none: prompt lengths are estimates"
            notes.append(
                f"--trace {trace.path}: no usable tokenizer; prompt lengths are estimates (one common word per "
                "token); records keep the server's prompt_tokens"
            )
        else:
            try:
                self._calibrate(tokenizer)
            except DatasetError as e:  # its message is about --dataset; this one names the trace
                why = str(e).split(" while building the dataset")[0]
                raise TraceError(
                    f"--trace {trace.path}: calibrating the prompts' lengths failed: {why}; fix the server or "
                    "replay without its tokenizer (--server-type openai)"
                ) from None
            self.info["tokenizer"] = "/tokenize"
        self._vocab_len = np.array([len(w) for w in self.vocab], dtype=np.int64)
        self._build_pool()
        if tokenizer is not None:
            self._check(tokenizer)
            self.info["tokenize_calls"] = getattr(tokenizer, "calls", 0) - calls
        self.info["vocabulary"] = len(self.vocab)
        self.info["overhead_tokens"] = self.overhead
        self._short_rows()
        self._long_rows(getattr(tokenizer, "max_model_len", None))

    # --- calibration --------------------------------------------------------------------------------------
    def _counter(self, tokenizer: Tokenizer) -> Callable[[str], int]:
        if self.chat:
            return lambda text: tokenizer.count([{"role": "user", "content": text}])
        return tokenizer.count

    def _calibrate(self, tokenizer: Tokenizer) -> None:
        """Finds the overhead (tokens around the text) and the words that are one token after a space: with
        pre-tokenized BPE a text's count is overhead + the sum of its words' counts, so count(" w w") - count(" w")
        is w's tokens and a group of g words counting overhead + g are all one token each."""
        count = self._counter(tokenizer)
        candidates = [" " + w for w in dict.fromkeys(WORDS)]
        overhead = None
        for word in candidates[:16]:
            one, two = count(word), count(word + word)
            if two - one == 1:
                overhead = one - 1
                break
        if overhead is None:
            raise TraceError(
                f"--trace {self.trace.path}: the server's tokenizer makes none of the common words one token; "
                "prompt lengths cannot be matched (use a server whose /tokenize answers for a text model)"
            )
        self.overhead = overhead
        vocab: list[str] = []

        def test(group: list[str]) -> None:
            extra = count("".join(group)) - overhead - len(group)  # at least one per word of 2+ tokens
            if extra == 0:
                vocab.extend(group)
            elif len(group) == 1:
                return
            elif 2 * extra >= len(group):  # mostly long words: one call each is cheaper than halving
                for word in group:
                    test([word])
            else:
                test(group[: len(group) // 2])
                test(group[len(group) // 2 :])

        # Chunks in WORDS' order (most common first), until the vocabulary is large enough.
        for at in range(0, len(candidates), VOCAB_CHUNK):
            test(candidates[at : at + VOCAB_CHUNK])
            if len(vocab) >= VOCAB_TARGET:
                break
        vocab.sort(key=candidates.index)
        if len(vocab) < 2:
            raise TraceError(
                f"--trace {self.trace.path}: fewer than 2 common words are one token with the server's tokenizer; "
                "distinct blocks could not be told apart"
            )
        if len(vocab) < 8:
            self.notes.append(
                f"--trace {self.trace.path}: only {len(vocab)} common words are one token with the server's "
                "tokenizer; prompts use just these"
            )
        self.vocab = vocab

    def _check(self, tokenizer: Tokenizer) -> None:
        """Counts a few built prompts with the server's tokenizer; a mismatch goes to the notes."""
        count = self._counter(tokenizer)
        limit = getattr(tokenizer, "max_model_len", None)
        lengths = self.trace.input_tokens
        fits = (lengths > self.overhead) & ((lengths <= limit) if limit else True)
        candidates = np.flatnonzero(fits)
        if not len(candidates):
            return
        # The shortest, the median and the longest prompt the server can hold (by input length).
        ranked = candidates[np.argsort(lengths[candidates], kind="stable")].tolist()
        picks = sorted({ranked[0], ranked[len(ranked) // 2], ranked[-1]})[:CHECKS]
        misses = []
        for i in picks:
            try:
                n = count(self._text(i))
            except DatasetError as e:
                self.notes.append(f"--trace {self.trace.path}: could not verify a prompt's length ({e})")
                return
            if n != int(lengths[i]):
                misses.append(n - int(lengths[i]))
        self.info["checked"] = len(picks)
        if misses:
            worst = max(misses, key=abs)
            self.info["check_mismatch_tokens"] = worst
            self.notes.append(
                f"--trace {self.trace.path}: {len(misses)} of {len(picks)} checked prompts differ from their "
                f"input length (by up to {worst:+d} tokens by the server's tokenizer)"
            )

    def _short_rows(self) -> None:
        lengths = self.trace.input_tokens
        short = int(np.count_nonzero((lengths >= 0) & (lengths <= self.overhead)))
        if short:
            self.notes.append(
                f"--trace {self.trace.path}: {short} row(s) ask for at most {self.overhead} input tokens, what the "
                f"server adds to any prompt; they are sent {self.overhead + 1} tokens"
            )
        self.info["short_rows"] = short

    def _long_rows(self, limit: int | None) -> None:
        """Rows the server cannot hold (prompt and output beyond its max_model_len) are still sent, as the trace
        has them; the notes say how many will be refused."""
        if not limit:
            return
        lengths = self.trace.input_tokens
        long = int(np.count_nonzero((lengths >= 0) & (lengths + self.trace.output_tokens > limit)))
        self.info["too_long_rows"] = long
        if long:
            self.notes.append(
                f"--trace {self.trace.path}: {long} of {len(lengths)} row(s) need more than the server's "
                f"max_model_len {limit} (input + output tokens); the server will refuse them"
            )

    # --- building ---------------------------------------------------------------------------------------------
    @staticmethod
    def _stream(domain: int, n: int) -> int:
        """The key of stream n of a domain: splitmix64 on Python ints (a scalar numpy op costs ~5 us)."""
        x = (((n * _GI) & _MASK) ^ domain) & _MASK
        x = ((x ^ (x >> 30)) * _M1I) & _MASK
        x = ((x ^ (x >> 27)) * _M2I) & _MASK
        return x ^ (x >> 31)

    def _words(self, key: int, n: int) -> np.ndarray:
        """n word indices of the stream `key` (the same key gives the same words in every process)."""
        counters = np.arange(1, n + 1, dtype=np.uint64) * _G + np.uint64(key)
        return (_mix(counters) % np.uint64(len(self.vocab))).astype(np.int64)

    def _build_pool(self) -> None:
        """One long seeded text of vocabulary words, sliced into blocks: a block costs a slice, not a join."""
        size = POOL_WORDS + self.block_tokens
        words = self._words(_key(self.seed, "pool"), size)
        self._pool = "".join([self.vocab[i] for i in words.tolist()])
        # _starts[k] = character offset of pool word k (one extra entry: the end of the pool).
        self._starts = np.zeros(size + 1, dtype=np.int64)
        np.cumsum(self._vocab_len[words], out=self._starts[1:])
        # A tag of `digits` words (the id in base len(vocab)) opens every block: two different ids never share a
        # block's first tokens, so the server's cache sees a shared prefix only where the trace has one.
        ids = self.trace.hash_ids or ()
        top = max((max(h, default=0) for h in ids), default=0)
        top = max(2 * top, 2 * int(self.trace.rows.max(initial=0)) + 1)
        digits, v = 1, len(self.vocab)
        while v**digits <= top:
            digits += 1
        self._digits = digits

    def _segment(self, domain: int, tag: int, n: int) -> str:
        """The first n words of the block of `tag`: its tag words, then pool words from a seeded start."""
        v, vocab, digits = len(self.vocab), self.vocab, self._digits
        head, left = [], tag
        for _ in range(min(digits, n)):
            left, digit = divmod(left, v)
            head.append(vocab[digit])
        rest = n - len(head)
        if rest <= 0:
            return "".join(head)
        start = self._stream(domain, tag) % POOL_WORDS
        starts = self._starts
        return "".join(head) + self._pool[starts[start] : starts[start + rest]]

    def block(self, hash_id: int) -> str:
        """The text of one hash_id's block (cached, least recently used dropped)."""
        text = self._blocks.get(hash_id)
        if text is not None:
            self._blocks.move_to_end(hash_id)
            return text
        text = self._segment(self._block_key, 2 * hash_id, self.block_tokens)
        self._blocks[hash_id] = text
        if len(self._blocks) > BLOCK_CACHE:
            self._blocks.popitem(last=False)
        return text

    def _text(self, position: int) -> str:
        need = max(1, int(self.trace.input_tokens[position]) - self.overhead)
        parts: list[str] = []
        ids = self.trace.hash_ids[position] if self.trace.hash_ids is not None else ()
        for hash_id in ids:
            if need >= self.block_tokens:
                parts.append(self.block(hash_id))
                need -= self.block_tokens
            else:
                if need > 0:  # the row's last block is partial: the start of the same block's text
                    parts.append(self._segment(self._block_key, 2 * hash_id, need))
                    need = 0
                break
        if need > 0:  # more words than the blocks hold: words of this row only
            parts.append(self._segment(self._row_key, 2 * int(self.trace.rows[position]) + 1, need))
        return "".join(parts)

    def prompt(self, position: int) -> str | list[dict]:
        """The prompt of trace row `position` (an index into the trace's arrays), as the endpoint takes it."""
        given = self.trace.prompts[position] if self.trace.prompts is not None else None
        text = given if given is not None else self._text(position)
        return [{"role": "user", "content": text}] if self.chat else text
