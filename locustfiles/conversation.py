"""Conversations (--turns, --history, --think-time): their validation and each user's conversation in progress.

A user holds one conversation at a time (`ConversationPlayer`). Turn k sends the system prompt (shared-prefix:L's),
every earlier user turn with its answer, and the next user turn: chat messages on the chat endpoint, the text
format of analysis/conversation.py on completions. The answer resent is the one the server streamed (--history
generated) or the dataset's own (reference, sharegpt). Between two turns the user thinks (--think-time): Locust's
wait_time, so the wait is before the send stamp (never in a latency) and a stopped user stops at once. A turn that
fails (an error, cut off) ends its conversation; the next request begins a new one, as does the end of the last
turn.

The user texts come from the run's dataset: sharegpt's conversations in order (`Dataset.conversations`), the other
sources' items in turn (synthetic:N: each turn is the next item, N new tokens; shared-prefix:L: the shared system
prompt once, then each turn the next item's unique suffix, holding that turn's request id; fixed: the --prompt, or
the prompts of --prompt-file in turn, as every user turn).
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from ..analysis.conversation import (
    ConversationError,
    Turn,
    chat_messages,
    completion_text,
    is_conversation,
    parse_turns,
    reference_answer,
)
from ..analysis.records import RequestRecord
from . import datasets
from .declare import option
from .options import parse_duration


@dataclass(frozen=True)
class ConversationOptions:
    """--turns: multi-turn conversations, their history and think time."""

    GROUP: ClassVar[str] = "Workload"

    turns: str = option(
        "--turns",
        "1",
        "Conversations: each user holds conversations of N turns (chat endpoint: every turn resends the whole"
        " history; completions: the history as text); all: each sharegpt conversation's own human turns",
    )
    history: str = option(
        "--history",
        "generated",
        "With --turns: the answers resent as history: generated (what the server streamed) or reference (the "
        "dataset's own answers, sharegpt)",
        choices=["generated", "reference"],
    )
    think_time: str = option(
        "--think-time",
        "0",
        "With --turns: the wait between a turn's answer and the next turn, excluded from latency: 0, "
        "constant:2s, exponential:5s (mean) or uniform:1s:4s",
    )


HISTORY = ("generated", "reference")
THINK_EXAMPLE = "use 0, constant:2s, exponential:5s (mean) or uniform:1s:4s"


def _think_duration(text: str, flag: str) -> float:
    """A duration as --step-duration takes it (30s, 2m, 1m30s, plain seconds), plus 500ms and 1.5s."""
    text = text.strip().lower()
    for suffix, scale in (("ms", 1e-3), ("s", 1.0)):
        number = text.removesuffix(suffix)
        if number != text:
            try:
                value = float(number) * scale
            except ValueError:
                break
            if value < 0 or not math.isfinite(value):
                break
            return value
    try:
        return parse_duration(text, flag, allow_zero=True)
    except ValueError:
        raise ConversationError(f"{flag} has {text!r}, not a duration; {THINK_EXAMPLE}") from None


class ThinkTime:
    """The wait between a turn's answer and the next turn: 0, constant:D, exponential:MEAN or uniform:LOW:HIGH."""

    def __init__(self, kind: str, a: float = 0.0, b: float = 0.0) -> None:
        self.kind, self.a, self.b = kind, a, b

    def draw(self, rng: random.Random) -> float:
        """constant: a; exponential: Exp(mean a); uniform: U(a, b); none: 0."""
        if self.kind == "exponential":
            return rng.expovariate(1.0 / self.a) if self.a > 0 else 0.0
        if self.kind == "uniform":
            return rng.uniform(self.a, self.b)
        return self.a if self.kind == "constant" else 0.0


def parse_think_time(text: object) -> ThinkTime:
    """--think-time: '0', 'constant:2s', 'exponential:5s' (mean), 'uniform:1s:4s'; raises ConversationError."""
    flag = f"--think-time {text}"
    value = str(text if text is not None else "0").strip().lower()
    if value in ("", "0", "none"):
        return ThinkTime("none")
    kind, _, rest = value.partition(":")
    args = rest.split(":") if rest else []
    if kind in ("constant", "exponential") and len(args) == 1:
        return ThinkTime(kind, _think_duration(args[0], flag))
    if kind == "uniform" and len(args) == 2:
        low, high = (_think_duration(a, flag) for a in args)
        if low > high:
            raise ConversationError(f"{flag}: LOW is above HIGH; use e.g. --think-time uniform:1s:4s")
        return ThinkTime(kind, low, high)
    raise ConversationError(f"--think-time {text!r} is not a think time; {THINK_EXAMPLE}")


def check(options) -> None:
    """--turns, --history and --think-time, alone and with --dataset and --trace; raises ValueError (one line)."""
    turns_text = options.turns
    turns = parse_turns(turns_text)
    history = str(options.history or "generated").strip().lower()
    think_text = options.think_time
    parse_think_time(think_text)
    if history not in HISTORY:  # the web UI's form hands back free text
        raise ConversationError(f"--history {history!r} is not one of generated, reference")
    if turns == 1:
        # Options of a conversation in a single-turn run would silently do nothing.
        if history != "generated":
            raise ConversationError(f"--history {history} only applies to conversations; add --turns N (e.g. 3)")
        if parse_think_time(think_text).kind != "none":
            raise ConversationError(f"--think-time {think_text} only applies to conversations; add --turns N (e.g. 3)")
        return
    if options.trace:
        raise ConversationError(
            f"--turns {turns_text} and --trace are alternatives (a trace's rows are single requests); drop --turns"
        )
    source = datasets.parse_dataset(options.dataset)
    if turns is None and not isinstance(source, datasets.ShareGPTSource):
        raise ConversationError(
            f"--turns all plays each sharegpt conversation's own turns, and --dataset {source.spec} has none; "
            "use --dataset sharegpt:PATH or --turns N (e.g. --turns 3)"
        )
    if history == "reference" and not source.has_reference:
        raise ConversationError(
            f"--history reference resends the dataset's own answers, and --dataset {source.spec} has none; use "
            "--dataset sharegpt:PATH or --history generated"
        )


def _item_turn(item: datasets.Item, endpoint: str) -> tuple[str | None, Turn]:
    """An item as (system prompt, user turn): chat messages give their system and last user message; a
    shared-prefix completions prompt is 'PREFIX\\nSUFFIX' (the prefix has no newline: datasets.fit_words)."""
    prompt = item.prompt
    system = None
    if isinstance(prompt, list):
        system = next((m["content"] for m in prompt if m.get("role") == "system"), None)
        text = next((m["content"] for m in reversed(prompt) if m.get("role") == "user"), "")
    elif item.per_request and endpoint != "chat":
        system, _, text = prompt.partition("\n")
    else:
        text = prompt
    return system, Turn(text, None, item.reference_output_tokens, item.per_request)


class Conversation:
    """One conversation in progress: its script of user turns, the turns asked and answered so far."""

    __slots__ = ("endpoint", "history", "last_tokens", "script", "session_id", "system", "turn")

    def __init__(self, session_id: str, system: str | None, script: list[Turn], endpoint: str) -> None:
        self.session_id = session_id
        self.system = system
        self.script = script
        self.endpoint = endpoint
        self.turn = 0  # turns asked so far; the next one is turn + 1 (1-based)
        self.history: list[tuple[str, str]] = []  # (user text as sent, answer as resent) of every answered turn
        self.last_tokens: int | None = 0  # history_tokens of the next turn: 0 before the first

    @property
    def finished(self) -> bool:
        return self.turn >= len(self.script)

    def ask(self, request_id: str) -> tuple[str | list[dict], Turn, str]:
        """The next turn's prompt (chat messages or completions text), its script entry and its user text (with the
        request id in place of the placeholder, kept as sent for the later turns' history)."""
        turn = self.script[self.turn]
        self.turn += 1
        text = turn.text.replace(datasets.REQUEST_ID_PLACEHOLDER, request_id) if turn.per_request else turn.text
        build = chat_messages if self.endpoint == "chat" else completion_text
        return build(self.system, self.history, text), turn, text


class ConversationPlayer:
    """A user's conversations, one after another: the next turn of the current one, or a new one."""

    def __init__(
        self, dataset: datasets.Dataset, options, endpoint: str, seed: str, id_prefix: str, start: int
    ) -> None:  # fmt: skip
        self.endpoint = endpoint
        self.turns = parse_turns(options.turns)
        self.reference = str(options.history).strip().lower() == "reference"
        self.think = parse_think_time(options.think_time)
        # Its own stream, so a think time drawn or not never shifts the user's other draws (max_tokens).
        self.think_rng = random.Random(f"think:{seed}")
        self.scripts = dataset.conversations
        self.system: str | None = None
        self.pool: list[Turn] = []
        if self.scripts is None:
            for item in dataset.items:
                system, turn = _item_turn(item, endpoint)
                self.system = system if system is not None else self.system
                self.pool.append(turn)
        self._next = start  # the next script (sharegpt) or pool item (the others) this user takes
        self._sessions = map(f"{id_prefix}-{{}}".format, itertools.count(1))
        self.current: Conversation | None = None
        self.think_s: float | None = None  # set after an answered turn that has a next one: wait this long

    @property
    def in_conversation(self) -> bool:
        """A conversation has a next turn to ask (after its think time)."""
        return self.current is not None and not self.current.finished

    def next_script(self) -> list[Turn]:
        """A new conversation's turns: the next sharegpt conversation (its first --turns), or --turns pool items."""
        n = self._next
        if self.scripts is not None:
            self._next += 1
            return self.scripts[n % len(self.scripts)]
        assert self.turns is not None  # --turns all is refused without sharegpt (check)
        self._next += self.turns
        return [self.pool[(n + i) % len(self.pool)] for i in range(self.turns)]

    def ask(self, record: RequestRecord) -> tuple[str | list[dict], Turn, str]:
        """The prompt of the next turn (of a new conversation if none is in progress); fills the record's
        session_id, turn and history_tokens."""
        if not self.in_conversation:
            self.current = Conversation(next(self._sessions), self.system, self.next_script(), self.endpoint)
        conversation = self.current
        prompt, turn, text = conversation.ask(record.request_id)
        record.session_id = conversation.session_id
        record.turn = conversation.turn
        record.history_tokens = conversation.last_tokens
        return prompt, turn, text

    def answered(self, record: RequestRecord, turn: Turn, text: str, answer: Callable[[], str]) -> None:
        """A turn ended: a failed one ends its conversation; an answered one joins the history, and the think time
        before the next turn is drawn."""
        self.think_s = None
        conversation = self.current
        if conversation is None:
            return
        if record.status != "ok":
            self.current = None  # the next request starts a new conversation
            return
        said = reference_answer(turn.reference or "", self.endpoint) if self.reference else answer()
        conversation.history.append((text, said))
        known = record.prompt_tokens is not None and record.output_tokens is not None
        conversation.last_tokens = record.prompt_tokens + record.output_tokens if known else None
        if conversation.finished:
            self.current = None
        else:
            self.think_s = self.think.draw(self.think_rng)

    def take_think_time(self) -> float:
        """The wait before the next turn (once): the drawn think time, 0 if none is due."""
        wait, self.think_s = self.think_s, None
        return wait or 0.0


__all__ = ["ConversationPlayer", "ThinkTime", "check", "is_conversation", "parse_think_time"]
