"""Conversations (--turns): the turn count, a turn of a dataset's script, and the completions endpoint's text format.

Pure: no Locust, no network. The Locust side (locustfiles/conversation.py) holds each user's conversation in
progress; the datasets (locustfiles/datasets.py) build the turns' texts and count them with this same format.

The completions endpoint has no messages, so a conversation is sent as one text (the answers exactly as streamed,
so turn k + 1's prompt begins with turn k's prompt and its answer, byte for byte, which is what a prefix cache
needs):

    [SYSTEM "\\n"]                              shared-prefix:L only: its shared system prompt, once
    "User: " U1 "\\nAssistant:" A1 "\\n"
    ...
    "User: " Uk "\\nAssistant:"                 the turn being asked; the server continues after "Assistant:"

A reference answer (--history reference) is resent with one space before it, as a model would have begun it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

ALL = "all"  # --turns all: each sharegpt conversation's own human turns
USER_LABEL = "User: "
ASSISTANT_LABEL = "\nAssistant:"
TURN_END = "\n"


class ConversationError(ValueError):
    """Bad --turns/--history/--think-time input; the message is one line naming the flag and the fix."""


@dataclass(frozen=True, slots=True)
class Turn:
    """One user turn of a conversation's script: the user's text and, when the dataset has one, its own answer."""

    text: str
    reference: str | None = None  # the dataset's own answer to this turn (sharegpt)
    reference_output_tokens: int | None = None  # its length in tokens (for --max-tokens-dist reference)
    per_request: bool = False  # the text holds datasets.REQUEST_ID_PLACEHOLDER, replaced by the turn's request id


def parse_turns(text: object) -> int | None:
    """--turns: a positive integer, or None for `all`; raises ConversationError with a one-line fix."""
    value = str(text if text is not None else "1").strip().lower()
    if value == ALL:
        return None
    try:
        turns = int(value)
    except ValueError:
        turns = 0
    if turns < 1:
        raise ConversationError(
            f"--turns {text!r} is not a number of turns; use a positive integer (e.g. --turns 3) or --turns all "
            "with --dataset sharegpt:PATH"
        )
    return turns


def is_conversation(text: object) -> bool:
    """Whether --turns asks for conversations (anything but 1): the single-turn path stays as it was."""
    return parse_turns(text) != 1


def completion_text(system: str | None, history: Sequence[tuple[str, str]], user: str) -> str:
    """The completions endpoint's prompt: [system "\\n"] + ("User: " u "\\nAssistant:" a "\\n") per earlier turn +
    "User: " user "\\nAssistant:"."""
    parts = [system, "\n"] if system else []
    for u, a in history:
        parts += (USER_LABEL, u, ASSISTANT_LABEL, a, TURN_END)
    parts += (USER_LABEL, user, ASSISTANT_LABEL)
    return "".join(parts)


def chat_messages(system: str | None, history: Sequence[tuple[str, str]], user: str) -> list[dict]:
    """The chat endpoint's messages: [system] + (user, assistant) per earlier turn + the next user message."""
    messages = [{"role": "system", "content": system}] if system else []
    for u, a in history:
        messages += ({"role": "user", "content": u}, {"role": "assistant", "content": a})
    messages.append({"role": "user", "content": user})
    return messages


def reference_answer(answer: str, endpoint: str) -> str:
    """A dataset's answer as resent in the history: verbatim in a chat message; after one space in completions text
    (where a generated answer begins with the model's own space)."""
    if endpoint == "chat" or not answer or answer[0].isspace():
        return answer
    return " " + answer
