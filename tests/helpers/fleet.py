"""The embedded real vLLM servers the `vllm` tier uses: one of each kind per pytest session, all stopped at its end.

The tests that use one server all run on one pytest-xdist worker (an xdist group per server, tests/conftest.py), so
each server starts once, when its first test asks for it, and the four start and serve side by side on different
workers. Eager mode (no torch.compile) halves a start on this 2-core machine (21 s against 44 s); what the tests
measure does not depend on it.
"""

from __future__ import annotations

from collections.abc import Iterable

from vllm_loadtest.embedded_vllm import EmbeddedVLLM, ServerSettings

# Fixture name -> the server it yields. Each test that uses one of these fixtures is a `vllm` test.
SERVERS: dict[str, ServerSettings] = {
    # max_num_seqs above what the 128-block cache holds, so the cache, not the batch-size cap, binds under load.
    "vllm_server": ServerSettings(
        num_blocks=128, block_size=32, max_model_len=512, max_num_seqs=64, enforce_eager=True
    ),
    # `--reasoning-parser qwen3 --enable-auto-tool-choice --tool-call-parser hermes`.
    "reasoning_vllm": ServerSettings(
        num_blocks=64, max_num_seqs=16, reasoning_parser="qwen3", tool_call_parser="hermes", enforce_eager=True
    ),
    # The tiny model as an embedding model (`--runner pooling --convert embed`).
    "embed_vllm": ServerSettings(num_blocks=64, max_num_seqs=16, embed=True, enforce_eager=True),
    # The tiny BLIP-2-layout vision-language model.
    "vision_vllm": ServerSettings(num_blocks=64, max_num_seqs=16, vision=True, enforce_eager=True),
}


def group(fixturenames: Iterable[str]) -> str:
    """The xdist group of a `vllm` test: the first server it uses (a test using none goes with `vllm_server`)."""
    names = set(fixturenames)
    return next((name for name in SERVERS if name in names), "vllm_server")


class Fleet:
    """The servers this process started, each at most once, all stopped together."""

    def __init__(self) -> None:
        self.servers: dict[str, EmbeddedVLLM] = {}

    def get(self, name: str) -> EmbeddedVLLM:
        if name not in self.servers:
            self.servers[name] = EmbeddedVLLM(SERVERS[name]).start()
        return self.servers[name]

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()
