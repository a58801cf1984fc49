"""How the fake server counts tokens, reads images and caches prefixes, and which request fields it knows
(tests/fakeserver.py; the tests count with the same rules)."""

from __future__ import annotations

import base64
import hashlib
import json

MAX_MODEL_LEN = 4096


def prompt_facts(req: dict) -> dict:
    """What a conversation test needs of a request's prompt: its tokens, its messages, a short hash, its last user
    text (the last user message, or what follows the last "User: " of a completions prompt)."""
    messages = req.get("messages")
    prompt = req.get("prompt")
    if isinstance(messages, list):
        users = [content_text(m.get("content", "")) for m in messages if m.get("role") == "user"]
        last = users[-1] if users else None
    else:
        last = str(prompt).rpartition("User: ")[2].removesuffix("\nAssistant:") if prompt is not None else None
    digest = hashlib.sha1(json.dumps([prompt, messages], sort_keys=True).encode()).hexdigest()[:12]
    return {
        "prompt_tokens": count_tokens(prompt, messages, tools=req.get("tools")),
        "messages": len(messages) if isinstance(messages, list) else None,
        "prompt_hash": digest,
        "last_user": last,
    }


def count_tokens(prompt: object = None, messages: object = None, special: bool = True, tools: object = None) -> int:
    """The fake tokenizer: a word (whitespace-separated) of up to 4 characters is one token, longer words one
    token per 4 characters; the prompt gets one BOS token (with special tokens); chat messages get a BOS, 3
    template tokens per message and 1 for the generation prompt, and a request's tools, as a template renders them
    into the prompt, the tokens of their JSON text."""

    def words(text: str) -> int:
        return sum(-(-len(w) // 4) for w in str(text).split())

    if messages is not None:
        rendered = words(json.dumps(tools)) if tools else 0
        return 1 + sum(3 + words(content_text(m.get("content", ""))) for m in messages) + 1 + rendered
    return words(prompt or "") + (1 if special else 0)


def token_list(prompt: object = None, messages: object = None) -> list[str]:
    """The prompt as the fake tokenizer's tokens (count_tokens' model, so len() is its prompt_tokens): 4-character
    pieces of each word; a chat prompt is BOS, per message <|role|> content <|end|> and a newline, then the
    generation prompt <|assistant|>, which the next turn's assistant message starts with, as in a real template."""

    def pieces(text: object) -> list[str]:
        return [w[i : i + 4] for w in str(text or "").split() for i in range(0, len(w), 4)]

    if messages is not None:
        out = ["<bos>"]
        for m in messages:
            out += [f"<|{m.get('role')}|>", *pieces(content_text(m.get("content", ""))), "<|end|>", "\n"]
        return [*out, "<|assistant|>"]
    return ["<bos>", *pieces(prompt)]


# --- images (--images): content parts, decoded as a vision-language server would ---------------------------------

IMAGE_PATCH = 28  # pixels per side of one image token (Qwen2-VL's 14-pixel patches merged 2x2)


def content_text(content: object) -> str:
    """A message's text: the content itself, or the text parts of a content-part list joined by newlines."""
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return "" if content is None else str(content)


def image_urls(messages: object) -> list[str]:
    """Every image_url part's URL of a chat request, in order."""
    urls = []
    for m in messages if isinstance(messages, list) else []:
        for part in m.get("content") if isinstance(m.get("content"), list) else []:
            if isinstance(part, dict) and part.get("type") == "image_url":
                urls.append(str((part.get("image_url") or {}).get("url", "")))
    return urls


def decode_image(url: str) -> dict:
    """A data URL decoded with Pillow: width, height, format, its bytes and a hash of its pixels (as vLLM hashes
    an image: the decoded pixels, not the file); raises ValueError when it is not a decodable image."""
    import binascii
    import io

    from PIL import Image, UnidentifiedImageError

    head, sep, data = url.partition(",")
    if not sep or not head.startswith("data:image/") or not head.endswith(";base64"):
        raise ValueError(f"not a base64 image data URL: {url[:40]!r}")
    try:
        raw = base64.b64decode(data, validate=True)
        image = Image.open(io.BytesIO(raw))
        image.load()
    except (binascii.Error, UnidentifiedImageError, OSError) as e:
        raise ValueError(f"image does not decode: {e}") from None
    pixels = hashlib.sha1(image.convert("RGB").tobytes()).hexdigest()[:16]
    return {"width": image.width, "height": image.height, "format": str(image.format).lower(),
            "mime": head[5:].removesuffix(";base64"), "bytes": len(raw), "pixels": pixels}  # fmt: skip


def image_tokens(images: list[dict]) -> int:
    """The prompt tokens of a request's images: one per IMAGE_PATCH x IMAGE_PATCH patch (sides rounded up)."""
    return sum(-(-im["width"] // IMAGE_PATCH) * -(-im["height"] // IMAGE_PATCH) for im in images)


def _image_stub(part: dict) -> dict:
    url = str((part.get("image_url") or {}).get("url", ""))
    return {"type": "image_url", "image_url": {"url": f"<{len(url)} chars>"}}


def without_images(messages: object) -> object:
    """The messages with each image part's URL replaced by its length (what /prompts keeps: not megabytes)."""
    if not isinstance(messages, list) or not image_urls(messages):
        return messages
    out = []
    for m in messages:
        parts = m.get("content")
        if isinstance(parts, list):
            parts = [_image_stub(p) if isinstance(p, dict) and p.get("type") == "image_url" else p for p in parts]
        out.append({**m, "content": parts})
    return out


class PrefixCache:
    """--prefix-cache BLOCK: vLLM's automatic prefix caching in miniature. Each full block of BLOCK tokens is kept
    under the hash of its whole prefix, so a prompt's cached tokens are the longest prefix, in whole blocks, that
    it shares with any earlier prompt (or earlier prompt and answer). As vLLM, the last prompt token is always
    computed: an identical prompt hits all but the block holding it. Call under the state's lock."""

    def __init__(self) -> None:
        self.blocks: set[int] = set()
        self.queries = 0  # prompt tokens looked up (vllm:prefix_cache_queries_total)
        self.hits = 0  # prompt tokens found (vllm:prefix_cache_hits_total)

    @staticmethod
    def _hashes(tokens: list[str], block: int) -> list[int]:
        out, h = [], 0
        for start in range(0, len(tokens) - block + 1, block):
            h = hash((h, *tokens[start : start + block]))
            out.append(h)
        return out

    def lookup(self, tokens: list[str], block: int) -> int:
        """Cached tokens of a prompt, then its blocks are kept."""
        hashes = self._hashes(tokens[: max(len(tokens) - 1, 0)], block)
        hit = next((i for i, h in enumerate(hashes) if h not in self.blocks), len(hashes))
        self.queries += len(tokens)
        self.hits += hit * block
        self.keep(tokens, block)
        return hit * block

    def keep(self, tokens: list[str], block: int) -> None:
        self.blocks.update(self._hashes(tokens, block))


# The request fields of OpenAI's completions and chat completions APIs (a subset is enough: what a client sends).
OPENAI_FIELDS = {
    "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stream",
    "stream_options", "stop", "seed", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "user",
    "echo", "suffix", "best_of", "top_logprobs", "response_format", "tools", "tool_choice",
}  # fmt: skip
OPENAI_STREAM_OPTIONS = {"include_usage", "include_obfuscation"}


def unknown_fields(req: dict, path: str) -> list[str]:
    """The fields of a request body that OpenAI's API does not define (it answers them with a 400)."""
    unknown = sorted(k for k in req if k not in OPENAI_FIELDS)
    if path.endswith("chat/completions"):
        unknown += [k for k in ("prompt", "echo", "suffix", "best_of") if k in req]
    elif "messages" in req:
        unknown.append("messages")
    opts = req.get("stream_options") or {}
    unknown += sorted(f"stream_options.{k}" for k in opts if k not in OPENAI_STREAM_OPTIONS)
    return unknown
