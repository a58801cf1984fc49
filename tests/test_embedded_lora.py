"""The embedded vLLM's --lora: the tiny adapters' tensor names and shapes against the tiny model's config, what
reaches vLLM's command line, the refusals before anything starts, when a cached adapter is current, the captures of
vLLM 0.32 serving them (tests/fixtures/vllm-0.32-cpu-lora-*), and, where the embedded vLLM's Python is installed, the
files the generator really writes (read back without torch: a safetensors header is JSON)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
from pathlib import Path

import pytest
from vllm_loadtest.analysis.server_metrics import parse_samples
from vllm_loadtest.embedded_vllm import EmbeddedServerError, EmbeddedVLLM, ServerSettings, tiny_lora
from vllm_loadtest.embedded_vllm import __main__ as cli
from vllm_loadtest.embedded_vllm import server as server_mod
from vllm_loadtest.embedded_vllm.tiny_model import MODEL

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"  # vLLM 0.32 CPU captures of `serve --lora`
# The tiny model's config.json as transformers writes it: MODEL's fields (head_dim = hidden / heads = 64).
CONFIG = {**MODEL, "head_dim": MODEL["hidden_size"] // MODEL["num_attention_heads"]}


def test_tensor_names_and_shapes_follow_peft_and_the_tiny_models_layers():
    shapes = tiny_lora.tensor_shapes(CONFIG)
    assert len(shapes) == 2 * 2 * 2  # layers x (q_proj, v_proj) x (A, B)
    prefix = "base_model.model.model.layers"
    # q_proj: 2 heads x 64 out of 128 in; v_proj: 1 KV head x 64 out of 128 in.
    assert shapes[f"{prefix}.0.self_attn.q_proj.lora_A.weight"] == [8, 128]
    assert shapes[f"{prefix}.0.self_attn.q_proj.lora_B.weight"] == [128, 8]
    assert shapes[f"{prefix}.1.self_attn.v_proj.lora_A.weight"] == [8, 128]
    assert shapes[f"{prefix}.1.self_attn.v_proj.lora_B.weight"] == [64, 8]
    # head_dim left out of a config: hidden / heads, the same shapes.
    assert tiny_lora.tensor_shapes(MODEL) == shapes


def test_mlp_modules_sit_under_mlp_with_the_intermediate_size():
    shapes = tiny_lora.tensor_shapes(CONFIG, rank=1, modules=("down_proj",))
    assert shapes["base_model.model.model.layers.0.mlp.down_proj.lora_A.weight"] == [1, 256]
    assert shapes["base_model.model.model.layers.0.mlp.down_proj.lora_B.weight"] == [128, 1]


def test_the_adapter_config_is_peft_lora_for_a_causal_lm_within_vllms_ranks():
    config = tiny_lora.adapter_config("/models/tiny")
    assert config["peft_type"] == "LORA" and config["task_type"] == "CAUSAL_LM"
    assert config["r"] == tiny_lora.RANK and config["lora_alpha"] == tiny_lora.ALPHA
    assert config["target_modules"] == ["q_proj", "v_proj"] and config["base_model_name_or_path"] == "/models/tiny"
    assert tiny_lora.RANK in (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM 0.32's MaxLoRARanks


def command(settings: ServerSettings, cache: Path = Path("/cache")) -> list[str]:
    server = EmbeddedVLLM(settings, cache=cache)
    server.python, server.model_dir = Path("python"), Path("model")
    return server.command()


def test_lora_adds_vllms_lora_flags_with_the_adapters_beside_the_model():
    plain = command(ServerSettings(port=1))
    assert "--enable-lora" not in plain
    assert command(ServerSettings(port=1, lora=True)) == [
        *plain, "--enable-lora", "--max-loras", "2", "--max-lora-rank", "8",
        "--lora-modules", "tiny-lora-a=/cache/tiny-lora-a", "tiny-lora-b=/cache/tiny-lora-b",
    ]  # fmt: skip


def test_describe_records_each_adapters_generator_record(tmp_path):
    write_info(tmp_path / "tiny-lora-a", rank=8, weights="random, torch seed 1")
    described = EmbeddedVLLM(ServerSettings(port=1, lora=True), cache=tmp_path).describe()
    assert described["lora_adapters"] == {
        "tiny-lora-a": {"rank": 8, "weights": "random, torch seed 1"},
        "tiny-lora-b": {},
    }
    assert EmbeddedVLLM(ServerSettings(port=1), cache=tmp_path).describe()["lora_adapters"] is None


@pytest.mark.parametrize("other", ["--embed", "--vision", "--rerank"])
def test_lora_with_another_model_is_refused_in_one_line_exit_3(capsys, monkeypatch, other):
    monkeypatch.setattr(cli, "EmbeddedVLLM", None)  # nothing may start
    assert cli.main(["serve", "--lora", other]) == 3
    err = capsys.readouterr().err.strip()
    assert f"--lora adapts the text model; it does not go with {other}" in err and len(err.splitlines()) == 1


def test_serve_lora_becomes_the_setting(monkeypatch):
    seen = []

    class Recorder:
        def __init__(self, settings):
            seen.append(settings)
            raise EmbeddedServerError("stop here")

    monkeypatch.setattr(cli, "EmbeddedVLLM", Recorder)
    assert cli.main(["serve", "--lora"]) == 1
    assert seen[0].lora and not seen[0].embed


def test_the_library_refuses_lora_with_another_model_before_any_install(tmp_path, monkeypatch):
    monkeypatch.setattr(server_mod, "ensure_installed", None)
    with pytest.raises(EmbeddedServerError, match="lora adapts the text model"):
        EmbeddedVLLM(ServerSettings(lora=True, rerank=True), cache=tmp_path).start()


def write_info(model: Path, **info) -> None:
    model.mkdir(parents=True, exist_ok=True)
    (model / "tiny_model.json").write_text(json.dumps(info))


def test_each_adapter_is_made_once_and_again_for_a_new_text_model(tmp_path, monkeypatch):
    calls = []

    def fake_generate(cmd, log, what, env=None):
        calls.append(cmd)
        write_info(
            Path(cmd[-1]),
            generator=server_mod.generator_hash(server_mod.TINY_LORA),
            text_generator=server_mod.generator_hash(),
            weights=f"random, torch seed {cmd[-2]}",
        )

    monkeypatch.setattr(server_mod, "_run_logged", fake_generate)
    write_info(tmp_path / "tiny-model", generator=server_mod.generator_hash())  # a current text model
    made = server_mod.ensure_loras(Path("python"), tmp_path)
    assert made == {name: tmp_path / name for name in ("tiny-lora-a", "tiny-lora-b")}
    assert [c[1:4] for c in calls] == [[str(server_mod.TINY_LORA), str(tmp_path / "tiny-model"), s] for s in "12"]
    server_mod.ensure_loras(Path("python"), tmp_path)
    assert len(calls) == 2  # both current
    write_info(tmp_path / "tiny-lora-b", generator=server_mod.generator_hash(server_mod.TINY_LORA), text_generator="x")
    server_mod.ensure_loras(Path("python"), tmp_path)
    assert len(calls) == 3 and calls[-1][-1].startswith(str(tmp_path / "tiny-lora-b.new-"))


def test_vllms_models_list_names_both_adapters_with_the_base_model_as_parent():
    models = {m["id"]: m for m in json.loads((FIXTURES / "vllm-0.32-cpu-lora-models.json").read_text())["data"]}
    assert set(models) == {"tiny", *tiny_lora.ADAPTERS}
    assert models["tiny"]["parent"] is None
    assert all(models[name]["parent"] == "tiny" for name in tiny_lora.ADAPTERS)


def test_vllms_lora_gauge_names_the_running_adapters_in_labels_stamped_with_the_time():
    samples = list(parse_samples((FIXTURES / "vllm-0.32-cpu-lora-metrics.txt").read_text()))
    lora = [(labels, value) for name, labels, value in samples if name == "vllm:lora_requests_info"]
    assert len(lora) == 4 and all(labels["max_lora"] == "2" for labels, _ in lora)
    # One series per set of adapters seen; the latest stamp is the current set (both, mid-flight in the capture).
    latest, _ = max(lora, key=lambda lv: lv[1])
    assert latest["running_lora_adapters"] == "tiny-lora-a,tiny-lora-b"
    assert all(1.7e9 < value < 1.9e9 for _, value in lora)


def embedded_python_and_model() -> tuple[Path, Path] | None:
    cache = Path(os.environ.get("VLLM_LOADTEST_CACHE", ROOT / ".cache" / "embedded-vllm"))
    python, model = cache / "venv" / "bin" / "python", cache / "tiny-model"
    return (python, model) if python.exists() and (model / "config.json").exists() else None


def safetensors_header(path: Path) -> dict:
    """The file's JSON header: 8 bytes of its length (little-endian), then the header."""
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + length])


GENERATE = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from tiny_lora import build
text, out = Path(sys.argv[2]), Path(sys.argv[3])
for name, seed in (("a", 1), ("a-again", 1), ("b", 2)):
    build(text, seed, out / name)
"""


def test_the_generator_writes_what_its_shapes_say_deterministically(tmp_path):
    found = embedded_python_and_model()
    if found is None:
        pytest.skip("no embedded vLLM Python and tiny model (python -m embedded_vllm install, or VLLM_LOADTEST_CACHE)")
    python, model = found
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    subprocess.run(
        [str(python), "-c", GENERATE, str(server_mod.TINY_LORA.parent), str(model), str(tmp_path)],
        check=True, env=env, timeout=300,
    )  # fmt: skip
    a = tmp_path / "a"
    assert sorted(p.name for p in a.iterdir()) == [tiny_lora.CONFIG, tiny_lora.WEIGHTS, "tiny_model.json"]
    header = safetensors_header(a / tiny_lora.WEIGHTS)
    assert header.pop("__metadata__") == {"format": "pt"}
    config = json.loads((model / "config.json").read_text())
    assert {name: t["shape"] for name, t in header.items()} == tiny_lora.tensor_shapes(config)
    assert {t["dtype"] for t in header.values()} == {"F32"}
    assert json.loads((a / tiny_lora.CONFIG).read_text()) == tiny_lora.adapter_config(str(model))
    weights = {d: (tmp_path / d / tiny_lora.WEIGHTS).read_bytes() for d in ("a", "a-again", "b")}
    assert weights["a"] == weights["a-again"] and weights["a"] != weights["b"]
