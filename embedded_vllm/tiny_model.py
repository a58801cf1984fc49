"""Generate a tiny random-weight Llama model with a real tokenizer and a chat template, without any download.

Runs with the embedded server's own Python (it needs torch, transformers and tokenizers, which the suite's
environment does not have):

    <vllm venv>/bin/python embedded_vllm/tiny_model.py OUTPUT_DIR

The weights are random (seeded), so the text is gibberish; the shapes are what vLLM's CPU attention accepts
(head_dim 64). Every generated token is still one real decoding step, which is what a load test needs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

CORPUS = [
    "Explica en detalle cómo funciona la fotosíntesis.",
    "La fotosíntesis convierte la luz del sol, el agua y el dióxido de carbono en glucosa y oxígeno.",
    "Photosynthesis converts light energy into chemical energy stored in sugars.",
    "The quick brown fox jumps over the lazy dog while the server streams tokens.",
    "Large language models generate one token at a time; batching many requests keeps the hardware busy.",
    "Time to first token, time per output token and throughput pull against each other under load.",
    "El caché de claves y valores crece con cada token generado y limita cuántas peticiones caben a la vez.",
    "Hello! How can I help you today? Please describe the problem in a few sentences.",
]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

MODEL = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 4096,
}


def build(output: Path) -> dict:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    output.mkdir(parents=True, exist_ok=True)
    special = ["<unk>", "<s>", "</s>", "<pad>", "<|user|>", "<|assistant|>", "<|system|>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(output)

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(fast),
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=True,
        torch_dtype="float32",
        **MODEL,
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(output, safe_serialization=True)
    info = {"architecture": "LlamaForCausalLM", "vocab_size": len(fast), "weights": "random, torch seed 0", **MODEL}
    (output / "tiny_model.json").write_text(json.dumps(info, indent=2))
    return info


if __name__ == "__main__":
    print(json.dumps(build(Path(sys.argv[1]))))
