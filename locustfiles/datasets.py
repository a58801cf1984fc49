"""Prompt sources (`--dataset`) and per-request `max_tokens` (`--max-tokens-dist`).

Every source is one small class behind one interface: `parse` validates its argument (`synthetic:128` -> 128),
`check` validates what can be checked without a server (a file), and `build` returns the source's items, each a
prompt (text, or chat messages) and the reference output length when the source has one. A user then walks the
items in turn and draws each request's max_tokens from a `MaxTokens` sampler.

    fixed             --prompt, or the prompts of --prompt-file in turn (the default; the behaviour before sources)
    synthetic:N       prompts of exactly N prompt tokens (the server's count), of random common words
    sharegpt:PATH     a ShareGPT JSON file: first human turn -> prompt, the next gpt turn's length -> reference
    shared-prefix:L   one system prompt of L tokens shared by every request, then a suffix unique to the request

Exact token lengths come from the server's own tokenizer: vLLM's `POST /tokenize` ({"model", "prompt"} or
{"model", "messages"} -> {"count", "max_model_len", "tokens"}). A server without it gets an estimate (one common
word per token, 4 characters per token for reference lengths), a one-line warning, and records that still hold
the server's usage.prompt_tokens.

Every process builds the same items from the same options (`--seed`): the workers of a distributed run send the
same prompts, and two runs with the same options send the same prompts.
"""

from __future__ import annotations

import json
import logging
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from ..analysis import conversation
from ..analysis.conversation import Turn
from .declare import option
from .max_tokens import MaxTokens, parse_max_tokens  # noqa: F401  re-exported
from .tokenizer import DEFAULT_TOKENIZER, DatasetError, Tokenizer, server_tokenizer  # noqa: F401  re-exported
from .wordfit import FILLERS, QUESTIONS, WORDS, fit_words  # noqa: F401  re-exported

if TYPE_CHECKING:
    from .settings import SuiteOptions

logger = logging.getLogger("vllm_loadtest.datasets")


# Replaced by each request's X-Request-Id (always 32 hex digits, see OpenAIStreamingUser) in the serialized body
# just before the request is sent: the same length, so the prepared Content-Length stays right, and no JSON
# escaping can touch it. It makes every shared-prefix request unique right after the shared part.
DEFAULT_PROMPT = "Explica en detalle cómo funciona la fotosíntesis."


@dataclass(frozen=True)
class DatasetOptions:
    """Where the prompts come from and how long the answers may be."""

    GROUP: ClassVar[str] = "Workload"

    prompt: str = option(
        "--prompt",
        DEFAULT_PROMPT,
        "Prompt text sent with every request",
    )
    prompt_file: str = option("--prompt-file", "", "JSON list of prompt strings used in turn instead of --prompt")
    dataset: str = option(
        "--dataset",
        "fixed",
        "Prompt source: fixed (--prompt / --prompt-file), synthetic:N (prompts of N tokens), sharegpt:PATH (a"
        " ShareGPT JSON file), shared-prefix:L (a system prompt of L tokens shared by every request)",
    )
    num_prompts: int = option(
        "--num-prompts",
        100,
        "Distinct prompts built by synthetic and shared-prefix, conversations drawn by sharegpt",
    )
    max_tokens_dist: str = option(
        "--max-tokens-dist",
        "",
        "Per-request max_tokens: fixed (--max-tokens), reference (the dataset's answer lengths), "
        "uniform:LOW:HIGH or normal:MEAN:SD. Default: reference for sharegpt, else fixed",
    )
    seed: int = option(
        "--seed",
        0,
        "Seed of the generated and sampled prompts, of --max-tokens-dist and of --arrival poisson's and "
        "gamma's times (the same seed gives the same prompts and schedule, in every worker)",
    )


REQUEST_ID_PLACEHOLDER = "%" * 14 + "REQUEST_ID" + "%" * 8
assert len(REQUEST_ID_PLACEHOLDER) == 32


@dataclass(frozen=True, slots=True)
class Item:
    """One prompt: text (sent as `prompt`, or as one user message on the chat endpoint) or chat messages."""

    prompt: str | list[dict]
    reference_output_tokens: int | None = None  # the length of the dataset's own answer, when it has one
    per_request: bool = False  # the prompt holds REQUEST_ID_PLACEHOLDER, replaced by each request's id


@dataclass
class Dataset:
    """A built source: its items, and how it was built (for run.json and the log)."""

    spec: str
    items: list[Item]
    info: dict = field(default_factory=dict)
    # Serialized request bodies shared by the users of a process, keyed by what else shapes them (see
    # OpenAIStreamingUser): one copy per process instead of one per user.
    prepared: dict = field(default_factory=dict, repr=False)
    # --turns with sharegpt: each conversation's turns in order (None otherwise: the items are the turns' texts).
    conversations: list[list[Turn]] | None = None


@dataclass
class BuildContext:
    """What a source may use to build its items."""

    endpoint: str  # completions or chat
    seed: int
    num_prompts: int
    options: SuiteOptions  # the run's typed options (fixed reads --prompt / --prompt-file)
    tokenizer: Tokenizer | None = None  # None: the server has no /tokenize; lengths are estimates
    notes: list[str] = field(default_factory=list)  # one-line remarks for the log and run.json


# --- the sources ---------------------------------------------------------------------------------------------
class Source:
    """One prompt source: `Source.parse(argument)`, then `check()` (no server), then `build(ctx)`."""

    name: ClassVar[str]
    takes: ClassVar[str] = ""  # what the argument after "name:" is, for messages; "" when it takes none
    has_reference: ClassVar[bool] = False  # items carry reference output lengths

    def __init__(self, argument: str) -> None:
        self.argument = argument

    @classmethod
    def parse(cls, argument: str) -> Source:
        return cls(argument)

    @property
    def spec(self) -> str:
        return f"{self.name}:{self.argument}" if self.takes else self.name

    def check(self) -> None:
        """Validate what can be validated without a server; raises DatasetError."""

    def build(self, ctx: BuildContext) -> list[Item]:
        raise NotImplementedError


def _positive_int(source: type[Source], argument: str) -> int:
    try:
        value = int(argument)
    except ValueError:
        value = 0
    if value < 1:
        raise DatasetError(
            f"--dataset {source.name}:{argument}: {source.takes} must be a positive integer; "
            f"use e.g. --dataset {source.name}:128"
        )
    return value


class FixedSource(Source):
    """--prompt, or every prompt of --prompt-file in turn: the behaviour before prompt sources existed."""

    name = "fixed"

    def check(self) -> None:
        if self.argument:
            raise DatasetError(f"--dataset fixed takes no argument (got {self.argument!r}); use --prompt-file")

    def build(self, ctx: BuildContext) -> list[Item]:
        path = ctx.options.prompt_file
        prompts = load_prompts(path) if path else [ctx.options.prompt]
        return [Item(p) for p in prompts]


class SyntheticSource(Source):
    """--num-prompts distinct prompts of random common words, each exactly N prompt tokens by the server's
    /tokenize (special tokens and, on the chat endpoint, the chat template included: usage.prompt_tokens == N)."""

    name = "synthetic"
    takes = "N (prompt tokens)"

    def __init__(self, argument: str) -> None:
        super().__init__(argument)
        self.tokens = _positive_int(type(self), argument)

    def build(self, ctx: BuildContext) -> list[Item]:
        rng = random.Random(f"synthetic:{self.tokens}:{ctx.seed}")
        items, misses = [], []
        for _ in range(ctx.num_prompts):
            if ctx.tokenizer is None:
                # ~1 token per common word after a space in real tokenizers: the estimate the warning announces.
                items.append(Item(_as_prompt(" ".join(rng.choices(WORDS, k=self.tokens)), ctx.endpoint)))
                continue
            words = rng.choices(WORDS, k=self.tokens + 8)
            text, n = fit_words(words, self.tokens, _prompt_counter(ctx), more=lambda k: rng.choices(WORDS, k=k))
            if n != self.tokens:
                misses.append(n)
            items.append(Item(_as_prompt(text, ctx.endpoint)))
        if misses:
            ctx.notes.append(
                f"{len(misses)} of {len(items)} synthetic prompts could not be cut to exactly {self.tokens} tokens "
                f"(shortest {min(misses)})"
            )
        return items


class ShareGPTSource(Source):
    """A ShareGPT JSON file: a list of {"conversations": [{"from": "human", "value": ...}, {"from": "gpt", ...}]}.
    Each conversation's first human turn is a prompt; the gpt turn right after it is the reference answer, whose
    token length becomes the item's reference output length. --num-prompts conversations are drawn (seeded)."""

    name = "sharegpt"
    takes = "PATH"
    has_reference = True
    HUMAN = ("human", "user")
    GPT = ("gpt", "chatgpt", "assistant")
    _cache: ClassVar[dict[tuple, list[list[tuple[str, str]]]]] = {}

    def __init__(self, argument: str) -> None:
        super().__init__(argument)
        if not argument:
            raise DatasetError("--dataset sharegpt needs a file; use e.g. --dataset sharegpt:ShareGPT_V3.json")

    def pairs(self) -> list[tuple[str, str]]:
        """(prompt, reference answer) of every usable conversation: its first human turn and the gpt turn after it."""
        return [conversation[0] for conversation in self.conversations()]

    def conversations(self) -> list[list[tuple[str, str]]]:
        """Every usable conversation as its (human turn, gpt answer) pairs in order, parsed once per file version:
        from its first human turn, as long as a human turn is followed by a gpt turn (a conversation ends at the
        first turn that breaks the alternation, or at a last human turn without an answer)."""
        path = self.argument
        where = f"--dataset sharegpt:{path}"
        try:
            stat = os.stat(path)
            key = (os.path.abspath(path), stat.st_mtime_ns, stat.st_size)
            if key in self._cache:
                return self._cache[key]
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except OSError as e:
            raise DatasetError(f"{where}: {e.strerror}; pass a readable ShareGPT JSON file") from None
        except ValueError as e:
            raise DatasetError(f"{where} is not JSON ({e}); it must be a ShareGPT list of conversations") from None
        if not isinstance(data, list):
            raise DatasetError(f'{where} must be a JSON list of {{"conversations": [...]}} objects')
        conversations = []
        for entry in data:
            turns = entry.get("conversations") if isinstance(entry, dict) else None
            if not isinstance(turns, list):
                continue
            first = next((i for i, turn in enumerate(turns[:-1]) if _turn(turn, self.HUMAN)), None)
            if first is None:
                continue
            pairs = []
            for i in range(first, len(turns) - 1, 2):
                if not (_turn(turns[i], self.HUMAN) and _turn(turns[i + 1], self.GPT)):
                    break
                pairs.append((turns[i]["value"], turns[i + 1]["value"]))
            if pairs:
                conversations.append(pairs)
        if not conversations:
            raise DatasetError(
                f"{where} has no conversation with a human turn followed by a gpt turn "
                '(expected [{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", "value": ...}]}])'
            )
        self._cache[key] = conversations
        return conversations

    def check(self) -> None:
        self.pairs()

    def build(self, ctx: BuildContext) -> list[Item]:
        pairs = list(self.pairs())
        random.Random(f"sharegpt:{ctx.seed}").shuffle(pairs)
        tok = ctx.tokenizer
        limit = tok.max_model_len if tok is not None else None
        items, too_long = [], 0
        for prompt, answer in pairs:
            if len(items) == ctx.num_prompts:
                break
            item_prompt = _as_prompt(prompt, ctx.endpoint)
            if tok is None:
                reference = max(1, round(len(answer) / 4))  # ~4 characters per token in English text
            else:
                reference = max(1, tok.count(answer, special=False))
                # A prompt and answer the server cannot hold would only fail with HTTP 400: skip it, as vLLM's
                # own benchmark does, and say how many were skipped.
                if limit is not None and tok.count(item_prompt) + reference > limit:
                    too_long += 1
                    continue
            items.append(Item(item_prompt, reference_output_tokens=reference))
        if too_long:
            ctx.notes.append(
                f"skipped {too_long} conversation(s) whose prompt plus reference answer exceed the server's "
                f"max_model_len {limit}"
            )
        if not items:
            raise DatasetError(
                f"--dataset {self.spec}: no conversation fits the server's max_model_len {limit}; "
                "use a server with a longer context or another file"
            )
        return items

    def build_conversations(self, ctx: BuildContext, turns: int | None) -> list[list[Turn]]:
        """--turns: --num-prompts whole conversations (drawn as build draws its prompts), each cut to its first
        `turns` human turns (None: all of them), each turn with its reference answer and that answer's length. A
        conversation longer than the server's max_model_len (its last prompt plus its reference answer) loses its
        last turns until it fits."""
        conversations = list(self.conversations())
        random.Random(f"sharegpt:{ctx.seed}").shuffle(conversations)
        tok = ctx.tokenizer
        limit = tok.max_model_len if tok is not None else None
        out: list[list[Turn]] = []
        shortened = too_long = 0
        for pairs in conversations:
            if len(out) == ctx.num_prompts:
                break
            pairs = pairs[:turns] if turns is not None else pairs
            if tok is None:
                script = [Turn(u, a, max(1, round(len(a) / 4))) for u, a in pairs]
            else:
                script = [Turn(u, a, max(1, tok.count(a, special=False))) for u, a in pairs]
                kept = len(script)
                while kept and limit is not None and _conversation_tokens(tok, ctx.endpoint, script[:kept]) > limit:
                    kept -= 1
                if kept < len(script):
                    shortened += kept > 0
                    too_long += kept == 0
                    script = script[:kept]
            if script:
                out.append(script)
        if shortened or too_long:
            ctx.notes.append(
                f"{shortened} conversation(s) lost their last turns and {too_long} were skipped: longer than the "
                f"server's max_model_len {limit} (the last prompt plus its reference answer)"
            )
        if not out:
            raise DatasetError(
                f"--dataset {self.spec}: no conversation fits the server's max_model_len {limit}; "
                "use a server with a longer context or another file"
            )
        return out


class SharedPrefixSource(Source):
    """One system prompt of L tokens shared by every request (built from the seed), then a suffix unique to each
    request (its request id and a question). With prefix caching the server computes the shared part once; the
    report shows its prefix-cache hit rate. On the completions endpoint the prompt's first L tokens (special tokens
    included) are the shared part; on the chat endpoint the system message's content is L tokens (the chat template
    adds its own) and the suffix is the user message."""

    name = "shared-prefix"
    takes = "L (shared prefix tokens)"

    def __init__(self, argument: str) -> None:
        super().__init__(argument)
        self.tokens = _positive_int(type(self), argument)

    def build(self, ctx: BuildContext) -> list[Item]:
        rng = random.Random(f"shared-prefix:{self.tokens}:{ctx.seed}")
        chat = ctx.endpoint == "chat"
        if ctx.tokenizer is None:
            prefix = " ".join(rng.choices(WORDS, k=self.tokens))
        else:
            words = rng.choices(WORDS, k=self.tokens + 8)
            tok = ctx.tokenizer
            # A newline ends the prefix: byte-level and SentencePiece tokenizers do not merge across it, so the
            # suffix cannot change the prefix's last token.
            prefix, n = fit_words(
                words,
                self.tokens,
                lambda text: tok.count(text if chat else text + "\n", special=not chat),
                more=lambda k: rng.choices(WORDS, k=k),
            )
            if n != self.tokens:
                ctx.notes.append(f"the shared prefix is {n} tokens, not {self.tokens}: no word fits the last gap")
        items = []
        for i in range(max(1, ctx.num_prompts)):
            suffix = f"Request {REQUEST_ID_PLACEHOLDER}. {QUESTIONS[i % len(QUESTIONS)]}"
            if chat:
                prompt: str | list[dict] = [
                    {"role": "system", "content": prefix},
                    {"role": "user", "content": suffix},
                ]
            else:
                prompt = f"{prefix}\n{suffix}"
            items.append(Item(prompt, per_request=True))
        return items


SOURCES: dict[str, type[Source]] = {
    s.name: s for s in (FixedSource, SyntheticSource, ShareGPTSource, SharedPrefixSource)
}


def _turn(turn: object, roles: tuple[str, ...]) -> bool:
    return (
        isinstance(turn, dict)
        and turn.get("from") in roles
        and isinstance(turn.get("value"), str)
        and bool(turn["value"])
    )


def _conversation_tokens(tok: Tokenizer, endpoint: str, script: list[Turn]) -> int:
    """A conversation's last prompt (its earlier turns with their reference answers) plus its last reference answer."""
    history = [(t.text, conversation.reference_answer(t.reference or "", endpoint)) for t in script[:-1]]
    last = script[-1]
    if endpoint == "chat":
        prompt: str | list[dict] = conversation.chat_messages(None, history, last.text)
    else:
        prompt = conversation.completion_text(None, history, last.text)
    return tok.count(prompt) + (last.reference_output_tokens or 0)


def _as_prompt(text: str, endpoint: str) -> str | list[dict]:
    """Text as sent: the chat endpoint gets one user message (as --prompt always did)."""
    return [{"role": "user", "content": text}] if endpoint == "chat" else text


def _prompt_counter(ctx: BuildContext) -> Callable[[str], int]:
    tok = ctx.tokenizer
    assert tok is not None
    if ctx.endpoint == "chat":
        return lambda text: tok.count([{"role": "user", "content": text}])
    if conversation.is_conversation(ctx.options.turns):
        # A conversation's first turn on completions is framed ("User: ...\nAssistant:"): N tokens with the frame.
        return lambda text: tok.count(conversation.completion_text(None, (), text))
    return tok.count


def parse_dataset(spec: str) -> Source:
    """'synthetic:128' -> a SyntheticSource; raises DatasetError with a one-line fix."""
    spec = (spec or "fixed").strip()
    name, _, argument = spec.partition(":")
    source = SOURCES.get(name.strip().lower())
    if source is None:
        raise DatasetError(
            f"--dataset {spec!r} is not a prompt source; use one of fixed, synthetic:N, sharegpt:PATH, shared-prefix:L"
        )
    if source.takes and not argument:
        raise DatasetError(f"--dataset {name} needs {source.takes}; use e.g. --dataset {name}:128")
    return source.parse(argument)


def build_dataset(spec: str, options, host: str, model: str, api_key: str | None = None) -> Dataset:
    """The items of --dataset for this run, built the same way in every process (seeded)."""
    source = parse_dataset(spec)
    source.check()
    ctx = BuildContext(
        endpoint=options.endpoint,
        seed=int(options.seed or 0),
        num_prompts=int(options.num_prompts or 100),
        options=options,
    )
    info: dict = {"spec": source.spec, "tokenizer": None}
    tokenizer = None
    if not isinstance(source, FixedSource):
        tokenizer = server_tokenizer(host, model, api_key, options)
        why = tokenizer.probe()
        if why is None:
            ctx.tokenizer = tokenizer
            info["tokenizer"] = "/tokenize"
        else:
            tokenizer.close()
            tokenizer = None
            info["tokenizer"] = f"none ({why}): token lengths are estimates"
            logger.warning(
                "--dataset %s: the server has no usable /tokenize (%s); token lengths are approximate (one common "
                "word per token, 4 characters per token for reference answers); records keep the server's "
                "prompt_tokens",
                source.spec,
                why,
            )
    conversations = None
    try:
        turns = options.turns
        if isinstance(source, ShareGPTSource) and conversation.is_conversation(turns):
            # Whole conversations; the items (for the single-request machinery) are their first turns.
            conversations = source.build_conversations(ctx, conversation.parse_turns(turns))
            items = [
                Item(_as_prompt(c[0].text, ctx.endpoint), reference_output_tokens=c[0].reference_output_tokens)
                for c in conversations
            ]
            info["conversation_turns"] = sum(len(c) for c in conversations)
        else:
            items = source.build(ctx)
    except DatasetError as e:
        if str(e).startswith("--dataset"):
            raise
        raise DatasetError(f"--dataset {source.spec}: {e}") from None
    finally:
        if tokenizer is not None:
            info["tokenize_calls"] = tokenizer.calls
            tokenizer.close()
    info["items"] = len(items)
    if ctx.notes:
        info["notes"] = ctx.notes
        for note in ctx.notes:
            logger.warning("--dataset %s: %s", source.spec, note)
    return Dataset(source.spec, items, info, conversations=conversations)


def load_prompts(path: str) -> list[str]:
    """The prompts of a --prompt-file: a JSON list of strings; raises ValueError with a one-line fix."""
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as e:
        raise ValueError(f"--prompt-file {path}: {e.strerror}; pass a readable JSON file") from None
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ValueError(
            f'--prompt-file {path} is not JSON ({e}); it must be a list of prompt strings, e.g. ["Hello"]'
        ) from None
    if not isinstance(data, list) or not data or not all(isinstance(p, str) and p for p in data):
        raise ValueError(f'--prompt-file {path} must be a non-empty JSON list of non-empty strings, e.g. ["Hello"]')
    return data


def check_dataset(options) -> None:
    """--dataset, --prompt-file, --num-prompts and --max-tokens-dist (a ShareGPT or prompt file is read here,
    before any load); raises ValueError with a one-line fix."""
    if options.prompt_file:
        load_prompts(options.prompt_file)
    source = parse_dataset(options.dataset)
    source.check()
    if options.prompt_file and not isinstance(source, FixedSource):
        raise ValueError(f"--prompt-file applies to --dataset fixed only, not --dataset {source.spec}")
    if options.num_prompts < 1:
        raise ValueError(f"--num-prompts {options.num_prompts} must be at least 1")
    parse_max_tokens(options.max_tokens_dist, options.max_tokens, source)
