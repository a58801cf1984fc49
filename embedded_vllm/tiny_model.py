"""Generate a tiny random-weight Llama model with a real tokenizer and a chat template, without any download.

Runs with the embedded server's own Python (it needs torch, transformers and tokenizers, which the suite's
environment does not have):

    <vllm venv>/bin/python embedded_vllm/tiny_model.py OUTPUT_DIR

The weights are random (seeded), so the text is gibberish; the shapes are what vLLM's CPU attention accepts
(head_dim 64). Every generated token is still one real decoding step, which is what a load test needs.

For vLLM's reasoning and tool-call parsers the vocabulary holds their markers as ordinary (non-special) added
tokens, as Qwen3's does: <think> and </think> (the qwen3 and deepseek_r1 reasoning parsers look them up by id and
find them in the text), <tool_call> and </tool_call> (the hermes tool parser). The chat template renders the
request's tools (hermes style), assistant tool calls, tool results, and Qwen3's `enable_thinking=false` (an
empty thought closed in the prompt). Without tools or chat_template_kwargs it renders exactly what it always did.
The server regenerates a cached model whose recorded generator hash (this file's) differs (server.ensure_model).
"""

from __future__ import annotations

import hashlib
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

# Ordinary added tokens (not special: a detokenizer that skips special tokens keeps them in the text, which the
# text-matching parts of the parsers need).
PARSER_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]

CHAT_TEMPLATE = (
    "{% if tools %}<|system|>\n# Tools\n<tools>\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}"
    '</tools>\nCall a function as <tool_call>\n{"name": <name>, "arguments": <args-json>}\n</tool_call></s>\n'
    "{% endif %}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] if message['content'] is not none else '' }}"
    "{% for call in message['tool_calls'] or [] %}"
    '<tool_call>\n{"name": "{{ call[\'function\'][\'name\'] }}", "arguments": '
    "{{ call['function']['arguments'] if call['function']['arguments'] is string "
    "else call['function']['arguments'] | tojson }}}\n</tool_call>"
    "{% endfor %}</s>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)


def generator_hash() -> str:
    """What the cache compares: this file's content (its tokenizer, template, shapes and seed)."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


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
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
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
    trained = tok.get_vocab_size()
    # After training, so the BPE merges (and every prompt's token count) stay what they were.
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in PARSER_TOKENS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(output)

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=trained,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=True,
        torch_dtype="float32",
        **MODEL,
    )
    model = LlamaForCausalLM(config)
    # The weights of the model before the parsers' tokens (same seed, same shapes), and the new tokens' rows zero:
    # their logits are exactly 0, below the best of the 512 others at every step, so a greedy answer (the suite's
    # default temperature 0) is what it was; sampled, each comes about once in 516 tokens.
    model.resize_token_embeddings(len(fast), mean_resizing=False)
    with torch.no_grad():
        model.get_input_embeddings().weight[trained:] = 0.0
    model.save_pretrained(output, safe_serialization=True)
    info = {
        "architecture": "LlamaForCausalLM",
        "vocab_size": len(fast),
        "weights": "random, torch seed 0",
        **MODEL,
        "parser_tokens": {t: fast.convert_tokens_to_ids(t) for t in PARSER_TOKENS},
        "generator": generator_hash(),
    }
    (output / "tiny_model.json").write_text(json.dumps(info, indent=2))
    return info


if __name__ == "__main__":
    print(json.dumps(build(Path(sys.argv[1]))))
