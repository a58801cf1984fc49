"""--endpoint embeddings before any load: a server whose model does not embed (vLLM 0.32 has no /v1/embeddings route
for a generation model: 404), or that answers something that is not an embeddings list, stops the run with one line
naming the answer and the fix (exit 3: tests/helpers/badinput.py runs the checks a headless run makes, in order)."""

from __future__ import annotations

import pytest
from vllm_loadtest.locustfiles.preflight import preflight

from tests.helpers.badinput import first_error
from tests.helpers.inprocess import parse_options

pytestmark = pytest.mark.unit


def test_a_server_without_embeddings_is_refused_with_the_fix(fake_server, tmp_path):
    server = fake_server("--no-embeddings")
    line = first_error("--host", server.url, "--endpoint", "embeddings", "--run-dir", str(tmp_path / "run"))
    assert line.startswith(f"error: --endpoint embeddings: {server.url}/v1/embeddings answered HTTP 404 for model "
                           "'fake-model' (no route POST /v1/embeddings); serve an embedding model"), line  # fmt: skip
    assert server.get("/stats")["ok"] == 0


def test_a_malformed_answer_is_refused(fake_server, tmp_path):
    server = fake_server("--faults", "wrong_count=1")  # every request: one vector too few
    line = first_error("--host", server.url, "--endpoint", "embeddings", "--run-dir", str(tmp_path / "run"))
    assert "answered a body that is not an embeddings list (0 embedding(s) for 1 input(s))" in line, line


def test_an_embedding_server_passes_with_the_runs_own_fields(fake_server, tmp_path):
    server = fake_server()
    options = parse_options(
        "--headless", "--host", server.url, "--endpoint", "embeddings", "--encoding-format", "base64",
        "--extra-body", '{"dimensions": 8}', "--run-dir", str(tmp_path / "run"),
    )  # fmt: skip
    preflight(options)
    [probe] = server.get("/prompts")["prompts"]
    assert probe["input"] == ["hello"] and probe["body"] == {
        "model": "fake-model", "encoding_format": "base64", "dimensions": 8,
    }  # fmt: skip
