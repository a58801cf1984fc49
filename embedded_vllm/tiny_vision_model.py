"""Generate a tiny random-weight vision-language model (BLIP-2 layout) around the tiny text model's tokenizer.

Runs with the embedded server's own Python, after tiny_model.py made the text model (whose tokenizer and chat
template it reuses, with an `<image>` token added):

    <vllm venv>/bin/python embedded_vllm/tiny_vision_model.py TEXT_MODEL_DIR OUTPUT_DIR

Why BLIP-2: the suite's vLLM CPU environment has no torchvision (PyPI's wheel is built for CUDA torch and fails to
register its operators against the CPU torch, "operator torchvision::nms does not exist", which breaks
transformers' imports; the CPU wheel lives on PyTorch's own index, not PyPI). vLLM 0.32 reaches torchvision
whenever a model's vision tower is CLIP, SigLIP or Pixtral (model_executor/models/vision.get_vision_encoder_info
imports pixtral, which imports transformers' Pixtral image processor, which imports torchvision): LLaVA, LLaVA-Next,
PaliGemma, InternVL, Mistral3 fail to load. Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Gemma3 import torchvision directly.
BLIP-2 (its own ViT, a Q-Former, an OPT language model, a PIL image processor) needs none of it.

An image becomes NUM_QUERY_TOKENS prompt tokens whatever its size (the Q-Former's queries; 32, as in the real
BLIP-2), after the server decodes it and resizes it to IMAGE_SIZE pixels square; vLLM 0.32 accepts one image per
prompt for BLIP-2 (more: HTTP 400 "At most 1 image(s) may be provided in one prompt"). The language model's
attention has head_dim 64, as the CPU attention needs.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

IMAGE_SIZE = 56  # pixels square after the server's resize: 4 x 4 patches of 14
NUM_QUERY_TOKENS = 32

TEXT = {"hidden_size": 128, "ffn_dim": 256, "num_hidden_layers": 2, "num_attention_heads": 2}
VISION = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2}


def generator_hash() -> str:
    """What the cache compares: this file's content (shapes, seed)."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


def build(text_model: Path, output: Path) -> dict:
    import torch
    from transformers import (
        AutoTokenizer,
        Blip2Config,
        Blip2ForConditionalGeneration,
        Blip2Processor,
        Blip2QFormerConfig,
        Blip2VisionConfig,
        OPTConfig,
    )
    from transformers.models.blip.image_processing_pil_blip import BlipImageProcessorPil

    output.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(text_model)
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    image_token = tok.convert_tokens_to_ids("<image>")
    processor = Blip2Processor(
        image_processor=BlipImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}),
        tokenizer=tok,
        num_query_tokens=NUM_QUERY_TOKENS,
        chat_template=tok.chat_template,
    )
    processor.save_pretrained(output)

    torch.manual_seed(0)
    text = OPTConfig(
        vocab_size=len(tok),
        word_embed_proj_dim=TEXT["hidden_size"],
        max_position_embeddings=2048,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **TEXT,
    )
    vision = Blip2VisionConfig(image_size=IMAGE_SIZE, patch_size=14, **VISION)
    qformer = Blip2QFormerConfig(
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=128,
        encoder_hidden_size=VISION["hidden_size"],
    )
    config = Blip2Config(
        vision_config=vision.to_dict(),
        qformer_config=qformer.to_dict(),
        text_config=text.to_dict(),
        num_query_tokens=NUM_QUERY_TOKENS,
        image_token_index=image_token,
        torch_dtype="float32",
    )
    Blip2ForConditionalGeneration(config).save_pretrained(output, safe_serialization=True)
    info = {
        "architecture": "Blip2ForConditionalGeneration",
        "vocab_size": len(tok),
        "weights": "random, torch seed 0",
        "text": TEXT,
        "vision": VISION,
        "image_size": IMAGE_SIZE,
        "image_tokens": NUM_QUERY_TOKENS,
        "image_token_id": image_token,
        "max_images_per_prompt": 1,
        "generator": generator_hash(),
        # The text model's generator hash: the server makes this model again when the tokenizer's source changed.
        "text_generator": json.loads((text_model / "tiny_model.json").read_text())["generator"],
    }
    (output / "tiny_model.json").write_text(json.dumps(info, indent=2))
    return info


if __name__ == "__main__":
    print(json.dumps(build(Path(sys.argv[1]), Path(sys.argv[2]))))
