"""Generate a tiny random-weight LoRA adapter for the tiny text model, in peft's format, without peft.

Runs with the embedded server's own Python, after tiny_model.py made the text model:

    <vllm venv>/bin/python embedded_vllm/tiny_lora.py TEXT_MODEL_DIR SEED OUTPUT_DIR

It writes what vLLM's --lora-modules NAME=DIR reads: `adapter_config.json` (peft_type LORA, task_type CAUSAL_LM, r,
lora_alpha, target_modules) and `adapter_model.safetensors`, tensors named as peft names them
(`base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight`, [r, in]; `...lora_B.weight`, [out, r]). Both
factors are random (peft starts B at zero, which would make the adapter the base model): each seed's adapter answers
differently, which the suite does not look at; it measures the server's timing with adapters in the batch.
The shapes come from the text model's config.json; `tensor_shapes` is pure (no torch) so the suite's tests check it.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

RANK = 8  # one of vLLM 0.32's --max-lora-rank values (1, 8, 16, 32, ...)
ALPHA = 16
TARGET_MODULES = ("q_proj", "v_proj")
# The adapters the embedded server serves (`serve --lora`): name -> seed.
ADAPTERS = {"tiny-lora-a": 1, "tiny-lora-b": 2}
CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"


def generator_hash() -> str:
    """What the cache compares: this file's content (rank, modules, scale)."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


def module_shape(config: dict, module: str) -> tuple[int, int]:
    """(out, in) of one of a Llama layer's projections, from the model's config.json."""
    hidden = config["hidden_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * head_dim
    shapes = {
        "q_proj": (config["num_attention_heads"] * head_dim, hidden),
        "k_proj": (kv, hidden),
        "v_proj": (kv, hidden),
        "o_proj": (hidden, config["num_attention_heads"] * head_dim),
        "gate_proj": (config["intermediate_size"], hidden),
        "up_proj": (config["intermediate_size"], hidden),
        "down_proj": (hidden, config["intermediate_size"]),
    }
    return shapes[module]


def tensor_shapes(config: dict, rank: int = RANK, modules: tuple[str, ...] = TARGET_MODULES) -> dict[str, list[int]]:
    """peft's tensor name -> shape for every layer's target modules: lora_A [r, in], lora_B [out, r]."""
    shapes = {}
    for layer in range(config["num_hidden_layers"]):
        for module in modules:
            part = "mlp" if module in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            out, inp = module_shape(config, module)
            prefix = f"base_model.model.model.layers.{layer}.{part}.{module}"
            shapes[f"{prefix}.lora_A.weight"] = [rank, inp]
            shapes[f"{prefix}.lora_B.weight"] = [out, rank]
    return shapes


def adapter_config(base_model: str, rank: int = RANK) -> dict:
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": rank,
        "lora_alpha": ALPHA,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": list(TARGET_MODULES),
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "inference_mode": True,
    }


def build(text_model: Path, seed: int, output: Path) -> dict:
    import torch
    from safetensors.torch import save_file

    output.mkdir(parents=True, exist_ok=True)
    config = json.loads((text_model / "config.json").read_text())
    generator = torch.Generator().manual_seed(seed)
    # Small values (std 0.02, the model's own initializer range): the adapted logits stay finite and near the base's.
    tensors = {
        name: (torch.randn(shape, generator=generator, dtype=torch.float32) * 0.02).contiguous()
        for name, shape in tensor_shapes(config).items()
    }
    save_file(tensors, str(output / WEIGHTS), metadata={"format": "pt"})
    (output / CONFIG).write_text(json.dumps(adapter_config(str(text_model)), indent=2))
    info = {
        "kind": "lora",
        "rank": RANK,
        "lora_alpha": ALPHA,
        "target_modules": list(TARGET_MODULES),
        "weights": f"random, torch seed {seed}",
        "generator": generator_hash(),
        "text_generator": json.loads((text_model / "tiny_model.json").read_text())["generator"],
    }
    (output / "tiny_model.json").write_text(json.dumps(info, indent=2))
    return info


if __name__ == "__main__":
    print(json.dumps(build(Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))))
