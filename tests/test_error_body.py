"""One reading of a server's error answer: the records' error text, the preflight's and the stream's agree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from vllm_loadtest.analysis import error_body

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).resolve().parent / "fixtures"  # vLLM 0.32 CPU captures


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"error": {"message": "max_tokens is too large", "type": "BadRequestError", "code": 400}}',
         "max_tokens is too large"),
        (b'{"detail": "Not Found"}', "Not Found"),
        (b'{"error": {"detail": "no such model"}}', "no such model"),
        (b'{"error": "rate limited"}', "rate limited"),
        (b'{"message": "upstream timed out"}', "upstream timed out"),
        (b'{"error": {"message": "two\\n  lines"}}', "two lines"),
        (b"<html><body>502 Bad Gateway</body></html>", "<html><body>502 Bad Gateway</body></html>"),
        (b"  ", "an empty body"),
        (b'{"object": "list"}', '{"object": "list"}'),
        (b"[1, 2]", "[1, 2]"),
    ],
)  # fmt: skip
def test_the_message_an_error_body_carries(body, message):
    assert error_body.message_from_body(body) == message


def test_a_long_message_is_cut():
    body = json.dumps({"error": {"message": "x" * 5000}}).encode()
    assert error_body.message_from_body(body) == "x" * error_body.MESSAGE_CHARS


def test_objects_without_a_message_give_none():
    assert error_body.message_of({"data": []}) is None
    assert error_body.message_of(["error"]) is None
    assert error_body.message_of({"error": None, "message": ""}) is None


def test_vllms_recorded_error_bodies_give_their_message():
    bodies = sorted(FIXTURES.rglob("error_*.json"))
    assert len(bodies) >= 8
    for path in bodies:
        obj = json.loads(path.read_bytes())
        message = obj["error"]["message"] if "error" in obj else obj["detail"]  # FastAPI's 404 has only detail
        assert error_body.message_from_body(path.read_bytes()) == " ".join(message.split())[:300], path.name
    assert error_body.message_from_body((FIXTURES / "error_404_model.json").read_bytes()) == (
        "The model `nope` does not exist. Valid aliases: tiny."
    )
