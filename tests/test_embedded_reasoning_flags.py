"""The embedded vLLM's reasoning and tool flags reach vLLM's command line, one tool flag without the other is
refused before anything starts, and a tiny model from another generator (or from before the parsers' tokens) is
not taken for current."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from vllm_loadtest.embedded_vllm import EmbeddedVLLM, ServerSettings
from vllm_loadtest.embedded_vllm import __main__ as cli
from vllm_loadtest.embedded_vllm import server as server_mod

pytestmark = pytest.mark.unit


def command(settings: ServerSettings) -> list[str]:
    server = EmbeddedVLLM(settings, cache=Path("/nonexistent"))
    server.python, server.model_dir = Path("python"), Path("model")
    return server.command()


def test_the_parsers_are_passed_to_vllm_only_when_asked():
    plain = command(ServerSettings(port=1))
    assert "--reasoning-parser" not in plain and "--enable-auto-tool-choice" not in plain
    both = command(ServerSettings(port=1, reasoning_parser="qwen3", tool_call_parser="hermes"))
    assert both[len(plain) :] == [
        "--reasoning-parser", "qwen3", "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "args, message",
    [
        (["--enable-auto-tool-choice"], "--enable-auto-tool-choice needs --tool-call-parser"),
        (["--tool-call-parser", "hermes"], "only with --enable-auto-tool-choice"),
    ],
)
def test_one_tool_flag_without_the_other_is_one_line_exit_3(capsys, monkeypatch, args, message):
    monkeypatch.setattr(cli, "EmbeddedVLLM", None)  # nothing may start
    assert cli.main(["serve", *args]) == 3
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_serve_flags_become_settings():
    a = cli.argparse.Namespace(
        port=0, num_blocks=64, block_size=32, max_model_len=512, max_num_seqs=8, startup_timeout=10,
        no_prefix_caching=False, reasoning_parser="deepseek_r1", enable_auto_tool_choice=True,
        tool_call_parser="hermes",
    )  # fmt: skip
    s = cli._settings(a)
    assert (s.reasoning_parser, s.tool_call_parser) == ("deepseek_r1", "hermes")


def test_a_model_from_another_generator_is_not_current(tmp_path):
    model = tmp_path / "tiny-model"
    model.mkdir()
    assert not server_mod._model_is_current(model)  # nothing generated
    (model / "tiny_model.json").write_text(json.dumps({"vocab_size": 512}))  # before the parsers' tokens
    assert not server_mod._model_is_current(model)
    (model / "tiny_model.json").write_text(json.dumps({"generator": "0" * 16}))
    assert not server_mod._model_is_current(model)
    (model / "tiny_model.json").write_text(json.dumps({"generator": server_mod.generator_hash()}))
    assert server_mod._model_is_current(model)
