"""The server's own message in an error answer, read one way for every request kind and for the preflight.

OpenAI's shape is {"error": {"message": ...}}; FastAPI's (vLLM's routes before the OpenAI layer) {"detail": ...};
some servers and proxies send {"error": "text"} or {"message": ...}.
"""

from __future__ import annotations

import json

MESSAGE_CHARS = 300  # enough for vLLM's longest validation message; a whole HTML error page is not kept


def message_of(obj: object) -> str | None:
    """The message an error object carries (error.message, error.detail, error as text, message, detail), else
    None."""
    if not isinstance(obj, dict):
        return None
    err = obj.get("error")
    if isinstance(err, dict):
        found = err.get("message") or err.get("detail")
    elif err:
        found = err
    else:
        found = obj.get("message") or obj.get("detail")
    return " ".join(str(found).split())[:MESSAGE_CHARS] if found else None


def message_from_body(body: bytes) -> str:
    """The server's message from an error body, else the body's start (whitespace collapsed), or 'an empty body'."""
    text = body.decode("utf-8", errors="replace")
    try:
        found = message_of(json.loads(text))
    except ValueError:
        found = None
    return found or " ".join(text.split())[:MESSAGE_CHARS] or "an empty body"
