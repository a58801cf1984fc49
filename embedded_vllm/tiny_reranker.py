"""Generate a tiny random-weight cross-encoder (a reranker) from the tiny text model: its Llama layers and tokenizer
with a one-label classification head, `LlamaForSequenceClassification`.

Runs with the embedded server's own Python, after tiny_model.py made the text model:

    <vllm venv>/bin/python embedded_vllm/tiny_reranker.py TEXT_MODEL_DIR OUTPUT_DIR

vLLM 0.32 serves an architecture ending in ForSequenceClassification with its pooling runner (the causal LM with a
score head, the last token's hidden state), and a model of one label as a cross-encoder: /v1/rerank, /rerank,
/v2/rerank and /score. Its scores are random: the suite measures the server's timing and checks the answer's shape.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path


def generator_hash() -> str:
    """What the cache compares: this file's content (head, seed)."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


def build(text_model: Path, output: Path) -> dict:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

    output.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(text_model)
    tok.save_pretrained(output)
    config = LlamaConfig.from_pretrained(text_model)
    config.num_labels = 1
    config.architectures = ["LlamaForSequenceClassification"]
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(config)
    # The text model's layers (its embeddings and blocks), a fresh one-label head.
    model.model.load_state_dict(LlamaForCausalLM.from_pretrained(text_model).model.state_dict())
    model.save_pretrained(output, safe_serialization=True)
    info = {
        "architecture": "LlamaForSequenceClassification",
        "num_labels": 1,
        "weights": "the tiny text model's layers; score head random, torch seed 0",
        "generator": generator_hash(),
        "text_generator": json.loads((text_model / "tiny_model.json").read_text())["generator"],
    }
    (output / "tiny_model.json").write_text(json.dumps(info, indent=2))
    return info


if __name__ == "__main__":
    print(json.dumps(build(Path(sys.argv[1]), Path(sys.argv[2]))))
