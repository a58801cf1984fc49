"""The embedded real vLLM servers the `vllm` tier uses: one of each kind per pytest session, all stopped at its end.

The `vllm` tests run in two pytest-xdist groups (tests/conftest.py), each on one worker with servers of its own:
`vllm-a` the base server's longer runs, `vllm-b` every other server and a second base server. One group, serial, took
712 s on an idle 2-core machine, the whole suite's critical path. Within a group, when the first test asks for a
server, every server of the group the session's tests need starts, side by side, and the tests wait until all
answer: no server of the group starts while one of its tests measures (in a fresh clone an embeddings step beside
the other servers' starts finished no request in 5 s). Eager mode (no torch.compile) halves a start on this 2-core
machine (21 s against 44 s); what the tests measure does not depend on it.
"""

from __future__ import annotations

from collections.abc import Iterable

from vllm_loadtest.embedded_vllm import EmbeddedVLLM, ServerSettings

# max_num_seqs above what the 128-block cache holds, so the cache, not the batch-size cap, binds under load.
BASE = ServerSettings(num_blocks=128, block_size=32, max_model_len=512, max_num_seqs=64, enforce_eager=True)

# Fixture name -> the server it yields. Each test that uses one of these fixtures is a `vllm` test.
SERVERS: dict[str, ServerSettings] = {
    "vllm_server": BASE,
    # The same settings, a server of its own in the other group (for runs that need the base model, to balance them).
    "vllm_server_b": BASE,
    # `--reasoning-parser qwen3 --enable-auto-tool-choice --tool-call-parser hermes`.
    "reasoning_vllm": ServerSettings(
        num_blocks=64, max_num_seqs=16, reasoning_parser="qwen3", tool_call_parser="hermes", enforce_eager=True
    ),
    # The tiny model as an embedding model (`--runner pooling --convert embed`).
    "embed_vllm": ServerSettings(num_blocks=64, max_num_seqs=16, embed=True, enforce_eager=True),
    # The tiny BLIP-2-layout vision-language model.
    "vision_vllm": ServerSettings(num_blocks=64, max_num_seqs=16, vision=True, enforce_eager=True),
    # The tiny cross-encoder (LlamaForSequenceClassification, one label): /v1/rerank.
    "rerank_vllm": ServerSettings(num_blocks=64, max_num_seqs=16, rerank=True, enforce_eager=True),
    # The tiny model with two tiny LoRA adapters, tiny-lora-a and tiny-lora-b (`--enable-lora --lora-modules`), and
    # ngram speculative decoding, 3 draft tokens (`--speculative-config`): vLLM's vllm:spec_decode_* counters.
    "lora_vllm": ServerSettings(num_blocks=64, max_num_seqs=16, lora=True, speculative="ngram", enforce_eager=True),
}
# Fixture names served by another's server: each server started beside the others costs the whole session its start
# (7 servers took 280 s to answer together, 5 took 121 s), and neither the LoRA nor the spec-decode test minds the
# other feature.
SHARED = {"spec_vllm": "lora_vllm"}
SERVER_FIXTURES = (*SERVERS, *SHARED)  # every fixture name that yields an embedded server


GROUP = "vllm-a"  # the xdist group of a `vllm` test that uses no server of another group
GROUPS = {name: ("vllm-a" if name == "vllm_server" else "vllm-b") for name in SERVER_FIXTURES}


def group_of(fixturenames: Iterable[str]) -> str:
    """The xdist group of a `vllm` test: that of the servers it uses (all in one group)."""
    groups = {GROUPS[name] for name in fixturenames if name in GROUPS}
    if len(groups) > 1:
        raise ValueError(f"a test uses servers of two groups {sorted(groups)}: they run on different workers")
    return groups.pop() if groups else GROUP


def needed(fixturenames: Iterable[Iterable[str]]) -> list[str]:
    """The servers some of the selected tests use (each test's fixture names), in SERVERS' order."""
    used = {SHARED.get(name, name) for name in set().union(*map(set, fixturenames))}
    return [name for name in SERVERS if name in used]


class Fleet:
    """The servers this process started, each at most once, all stopped together."""

    def __init__(self, names: Iterable[str] = ()) -> None:
        self.names = list(names)  # SERVERS' names, started together (a group's) at the first get()
        self.servers: dict[str, EmbeddedVLLM] = {}

    def get(self, fixture: str) -> EmbeddedVLLM:
        name = SHARED.get(fixture, fixture)
        if name not in self.servers:
            group = [n for n in dict.fromkeys([*self.names, name]) if GROUPS[n] == GROUPS[name]]  # this worker's only
            starting = [n for n in group if n not in self.servers]
            for n in starting:
                self.servers[n] = EmbeddedVLLM(SERVERS[n]).launch()
            for n in starting:
                self.servers[n].wait_ready()
        return self.servers[name]

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()
