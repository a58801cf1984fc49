"""The server's own message in an error answer, read one way for every request kind and for the preflight.

OpenAI's shape is {"error": {"message": ...}}; FastAPI's (vLLM's routes before the OpenAI layer) {"detail": ...};
some servers and proxies send {"error": "text"} or {"message": ...}.
"""

from __future__ import annotations

import json

import orjson

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


def json_object(body: bytes | bytearray) -> tuple[dict | None, str | None]:
    """A whole answer's body as a JSON object, else (None, one line saying why): not JSON (with its start), or
    another JSON type. For the kinds whose answers are one JSON object (embeddings, rerank)."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        start = bytes(body[:60]).decode("utf-8", errors="replace")
        return None, f"the body is not JSON ({e}): {' '.join(start.split())!r}"
    if not isinstance(obj, dict):
        return None, f"the body is a JSON {type(obj).__name__}, not an object"
    return obj, None


def error_with_200(obj: dict, missing: str) -> str:
    """Why an answer lacks its `missing` field: an error object sent with HTTP 200 (a proxy, or a server that
    reports errors in the body), else the field's absence."""
    if "error" in obj:
        return f"an error with HTTP 200: {message_of(obj) or str(obj['error'])[:200]}"
    return f"the body has no {missing}"
