"""The embedded vLLM's --embed and --vision: what reaches vLLM's command line, the refusals before anything starts,
and when a cached vision model is current (its own generator and the text model's tokenizer)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from vllm_loadtest.embedded_vllm import EmbeddedServerError, EmbeddedVLLM, ServerSettings
from vllm_loadtest.embedded_vllm import __main__ as cli
from vllm_loadtest.embedded_vllm import server as server_mod

pytestmark = pytest.mark.unit


def command(settings: ServerSettings) -> list[str]:
    server = EmbeddedVLLM(settings, cache=Path("/nonexistent"))
    server.python, server.model_dir = Path("python"), Path("model")
    return server.command()


def test_embed_asks_for_the_pooling_runner_and_nothing_else_changes():
    plain = command(ServerSettings(port=1))
    embed = command(ServerSettings(port=1, embed=True))
    assert "--runner" not in plain and "--convert" not in plain
    assert embed == [*plain, "--runner", "pooling", "--convert", "embed"]
    assert command(ServerSettings(port=1, vision=True)) == plain  # the model directory is what differs
    assert command(ServerSettings(port=1, rerank=True)) == plain  # its architecture picks vLLM's pooling runner


@pytest.mark.parametrize(
    "args, message",
    [
        (["serve", "--embed", "--vision"], "--embed and --vision serve different models; choose one"),
        (["demo", "--embed"], "demo runs text generation; use serve --embed"),
        (["demo", "--vision"], "demo runs text generation; use serve --vision"),
        (["serve", "--embed", "--rerank"], "--embed and --rerank serve different models; choose one"),
        (["demo", "--rerank"], "demo runs text generation; use serve --rerank"),
    ],
)
def test_refused_in_one_line_exit_3_before_anything_starts(capsys, monkeypatch, args, message):
    monkeypatch.setattr(cli, "EmbeddedVLLM", None)  # nothing may start
    assert cli.main(args) == 3
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_serve_flags_become_settings():
    a = cli.argparse.Namespace(
        port=0, num_blocks=64, block_size=32, max_model_len=512, max_num_seqs=8, startup_timeout=10,
        no_prefix_caching=False, reasoning_parser="", enable_auto_tool_choice=False, tool_call_parser="",
        embed=True, vision=False,
    )  # fmt: skip
    assert cli._settings(a).embed and not cli._settings(a).vision


def test_both_models_at_once_are_refused_by_the_library_too(tmp_path, monkeypatch):
    monkeypatch.setattr(server_mod, "ensure_installed", None)  # refused before any install
    with pytest.raises(EmbeddedServerError, match="choose one"):
        EmbeddedVLLM(ServerSettings(embed=True, vision=True), cache=tmp_path).start()


def write_info(model: Path, **info) -> None:
    model.mkdir(parents=True, exist_ok=True)
    (model / "tiny_model.json").write_text(json.dumps(info))


def test_a_vision_model_is_current_only_with_both_generators_hashes(tmp_path, monkeypatch):
    calls = []

    def fake_generate(cmd, log, what, env=None):
        calls.append(cmd)
        write_info(
            Path(cmd[-1]),
            generator=server_mod.generator_hash(server_mod.TINY_VISION_MODEL),
            text_generator=server_mod.generator_hash(),
        )

    monkeypatch.setattr(server_mod, "_run_logged", fake_generate)
    write_info(tmp_path / "tiny-model", generator=server_mod.generator_hash())  # a current text model
    vision = tmp_path / "tiny-vision-model"
    assert server_mod.ensure_vision_model(Path("python"), tmp_path) == vision
    assert len(calls) == 1 and calls[0][1:3] == [str(server_mod.TINY_VISION_MODEL), str(tmp_path / "tiny-model")]
    assert server_mod.ensure_vision_model(Path("python"), tmp_path) == vision
    assert len(calls) == 1  # current: not made again
    # Made around an older tokenizer (another text generator's hash): made again.
    write_info(vision, generator=server_mod.generator_hash(server_mod.TINY_VISION_MODEL), text_generator="old")
    server_mod.ensure_vision_model(Path("python"), tmp_path)
    assert len(calls) == 2
    assert json.loads((vision / "tiny_model.json").read_text())["text_generator"] == server_mod.generator_hash()
