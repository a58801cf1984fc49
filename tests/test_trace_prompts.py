"""Trace prompts (locustfiles/trace_prompts.py): exact lengths by the server's count, shared blocks byte for byte."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from vllm_loadtest.analysis.trace import TraceError, load_trace
from vllm_loadtest.locustfiles import trace_prompts
from vllm_loadtest.locustfiles.datasets import Tokenizer
from vllm_loadtest.locustfiles.trace_prompts import TracePrompts

from tests.fakeserver import count_tokens
from tests.helpers.paths import FIXTURES, ROOT
from tests.helpers.tokenizer import FakeTokenizer

pytestmark = pytest.mark.unit

TRACES = FIXTURES / "traces"
MOONCAKE = str(TRACES / "mooncake.jsonl")
AZURE = str(TRACES / "azure.csv")
GENERIC = str(TRACES / "generic.jsonl")


def served(prompt: str | list[dict]) -> int:
    """What the fake server reports as usage.prompt_tokens for this prompt."""
    return count_tokens(messages=prompt) if isinstance(prompt, list) else count_tokens(prompt)


def text_of(prompt: str | list[dict]) -> str:
    return prompt[0]["content"] if isinstance(prompt, list) else prompt


def common_prefix(a: str, b: str) -> int:
    """How many leading characters two prompts share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def common_words(a: str, b: str) -> int:
    """How many leading words two prompts share."""
    n = 0
    for x, y in zip(a.split(), b.split(), strict=False):
        if x != y:
            break
        n += 1
    return n


# --- exact lengths --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("endpoint", ["completions", "chat"])
@pytest.mark.parametrize("path", [MOONCAKE, AZURE])
def test_every_row_is_its_input_length_by_the_servers_count(path, endpoint):
    trace = load_trace(path)
    notes: list[str] = []
    prompts = TracePrompts(trace, endpoint, 512, 0, FakeTokenizer(), notes)
    assert notes == []
    for i in range(len(trace)):
        prompt = prompts.prompt(i)
        assert isinstance(prompt, list if endpoint == "chat" else str)
        if endpoint == "chat":
            assert len(prompt) == 1 and prompt[0]["role"] == "user"
        assert served(prompt) == trace.input_tokens[i], i
    assert prompts.info["checked"] == 3 and "check_mismatch_tokens" not in prompts.info
    # The fake server: BOS on a prompt; BOS, 3 per message and 1 for the generation prompt on chat.
    assert prompts.overhead == (5 if endpoint == "chat" else 1)


def test_calibration_is_a_few_calls_not_one_per_row():
    trace = load_trace(MOONCAKE)
    tok = FakeTokenizer()
    prompts = TracePrompts(trace, "completions", 512, 0, tok, [])
    assert tok.calls == prompts.info["tokenize_calls"] < 250
    before = tok.calls
    for i in range(len(trace)):
        prompts.prompt(i)
    assert tok.calls == before  # building a prompt never asks the server
    # Only the words the fake server counts as one token (up to 4 characters) are used.
    assert prompts.vocab and all(len(w) <= 5 and w.startswith(" ") for w in prompts.vocab)


def test_short_blocks_and_rows_longer_than_their_blocks():
    # --trace-block-tokens 100 on a 512-block trace: the rows' hash_ids cover fewer tokens than they have, so
    # each row ends with words of its own; the lengths stay exact.
    trace = load_trace(MOONCAKE)
    prompts = TracePrompts(trace, "completions", 100, 0, FakeTokenizer(), [])
    for i in range(len(trace)):
        assert served(prompts.prompt(i)) == trace.input_tokens[i]
    a, b = text_of(prompts.prompt(0)), text_of(prompts.prompt(2))
    assert common_words(a, b) == 300  # the 3 shared blocks of 100, then each row's own words


def test_rows_shorter_than_the_overhead_are_noted(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0]}\n'
        '{"timestamp": 5, "input_length": 9, "output_length": 1, "hash_ids": [0]}\n'
    )
    notes: list[str] = []
    prompts = TracePrompts(load_trace(str(path)), "chat", 512, 0, FakeTokenizer(), notes)
    assert served(prompts.prompt(0)) == 6  # 5 template tokens and one word: the shortest prompt there is
    assert served(prompts.prompt(1)) == 9
    assert prompts.info["short_rows"] == 1
    assert any("1 row(s) ask for at most 5 input tokens" in n for n in notes)


def test_rows_beyond_the_servers_context_are_noted():
    tok = FakeTokenizer()
    tok.max_model_len = 1100
    notes: list[str] = []
    prompts = TracePrompts(load_trace(MOONCAKE), "completions", 512, 0, tok, notes)
    # 1100 + 12, 1600 + 20, 2000 + 30: three rows the server cannot hold; still built to their length.
    assert prompts.info["too_long_rows"] == 3
    assert any("3 of 7 row(s) need more than the server's max_model_len 1100" in n for n in notes)
    assert served(prompts.prompt(6)) == 2000


# --- shared blocks ----------------------------------------------------------------------------------------------
def test_rows_sharing_hash_ids_share_their_blocks_byte_for_byte():
    trace = load_trace(MOONCAKE)
    prompts = TracePrompts(trace, "completions", 512, 0, FakeTokenizer(), [])
    text = [text_of(prompts.prompt(i)) for i in range(len(trace))]
    blocks = {h: prompts.block(h) for ids in trace.hash_ids for h in ids}
    assert len(set(blocks.values())) == len(blocks)  # distinct ids, distinct blocks
    for i, ids in enumerate(trace.hash_ids):
        # A row is its blocks in order; the last one cut to what the row still needs.
        whole = "".join(blocks[h] for h in ids)
        assert whole.startswith(text[i])
        assert len(text[i]) > len("".join(blocks[h] for h in ids[:-1]))
    # Row 0 [0, 1, 2] ends inside block 2, which row 2 [0, 1, 2, 4] holds whole: row 0 is a prefix of row 2.
    assert text[2].startswith(text[0])
    # Rows 2 and 6 have the same hash_ids; 2000 > 1600 tokens: row 2 is a prefix of row 6.
    assert text[6].startswith(text[2])
    # Rows 1 [0, 3] and 4 [0, 3, 6]: the same block 0, then block 3.
    assert text[4].startswith(text[1])


def test_rows_without_a_shared_block_share_no_prefix():
    trace = load_trace(MOONCAKE)
    prompts = TracePrompts(trace, "completions", 512, 0, FakeTokenizer(), [])
    text = [text_of(prompts.prompt(i)) for i in range(len(trace))]
    # Rows 3 [5] and 5 [7] and row 0 [0, ...]: different first blocks differ from their first word (the tag).
    for a, b in ((3, 5), (0, 3), (0, 5)):
        assert text[a].split(" ")[1] != text[b].split(" ")[1] or text[a].split(" ")[2] != text[b].split(" ")[2]
        assert common_prefix(text[a], text[b]) < 20
    # Block 1 follows block 0 in rows 0, 2, 6 only; block 3 in rows 1, 4: they part right after block 0.
    assert common_prefix(text[0], text[1]) < len(prompts.block(0)) + 20
    # Azure rows carry no block: every row is its own.
    azure = load_trace(AZURE)
    ap = TracePrompts(azure, "completions", 512, 0, FakeTokenizer(), [])
    texts = [ap.prompt(i) for i in range(len(azure))]
    assert max(common_prefix(a, b) for a in texts for b in texts if a is not b) < 20


def test_the_same_rows_in_every_process_and_other_bytes_with_another_seed():
    trace = load_trace(MOONCAKE)
    # Two workers, each building only its shard (in another order): the same bytes for the same row.
    one = TracePrompts(trace, "completions", 512, 7, FakeTokenizer(), [])
    two = TracePrompts(trace, "completions", 512, 7, FakeTokenizer(), [])
    for i in reversed(trace.shard(1, 2).tolist()):
        assert two.prompt(i) == one.prompt(i)
    other = TracePrompts(trace, "completions", 512, 8, FakeTokenizer(), [])
    assert other.prompt(0) != one.prompt(0) and served(other.prompt(0)) == served(one.prompt(0))


def test_block_cache_stays_bounded(monkeypatch):
    monkeypatch.setattr(trace_prompts, "BLOCK_CACHE", 2)
    trace = load_trace(MOONCAKE)
    prompts = TracePrompts(trace, "completions", 512, 0, FakeTokenizer(), [])
    first = [prompts.prompt(i) for i in range(len(trace))]
    assert len(prompts._blocks) <= 2
    assert [prompts.prompt(i) for i in range(len(trace))] == first  # rebuilt blocks are the same bytes


# --- rows given as text, no tokenizer, bad input -----------------------------------------------------------
@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_generic_rows_with_a_prompt_are_sent_as_given(endpoint):
    trace = load_trace(GENERIC)
    prompts = TracePrompts(trace, endpoint, 512, 0, FakeTokenizer(), [])
    assert text_of(prompts.prompt(1)) == "Write a haiku about load testing."
    assert text_of(prompts.prompt(3)) == "Explain prefix caching in one paragraph."
    for i in (0, 2, 4):
        assert served(prompts.prompt(i)) == trace.input_tokens[i]


def test_without_a_tokenizer_lengths_are_estimates_with_a_warning():
    trace = load_trace(MOONCAKE)
    notes: list[str] = []
    prompts = TracePrompts(trace, "completions", 512, 0, None, notes)
    assert len(notes) == 1 and "no usable tokenizer; prompt lengths are estimates" in notes[0]
    assert "\n" not in notes[0]
    for i in range(len(trace)):
        assert len(prompts.prompt(i).split()) == trace.input_tokens[i]  # one common word per token
    assert prompts.info["tokenizer"].startswith("none")


def test_block_tokens_below_one_is_refused():
    with pytest.raises(TraceError, match=r"^--trace-block-tokens 0 must be an integer >= 1"):
        TracePrompts(load_trace(MOONCAKE), "completions", 0, 0, None, [])


class Miscounting(FakeTokenizer):
    """A tokenizer that merges two particular words into one token: the check must notice and say so."""

    def count(self, prompt, special=True):
        n = super().count(prompt, special)
        text = text_of(prompt)
        return n - (len(text) > 3000) * 3


def test_a_tokenizer_failing_while_calibrating_names_the_trace(fake_server):
    server = fake_server()
    tok = Tokenizer(server.url, "fake-model")
    assert tok.probe() is None
    server.stop()  # the server goes away after its probe
    with pytest.raises(TraceError) as e:
        TracePrompts(load_trace(MOONCAKE), "completions", 512, 0, tok, [])
    message = str(e.value)
    assert message.startswith(f"--trace {MOONCAKE}: calibrating the prompts' lengths failed: the server's /tokenize")
    assert "\n" not in message and "--dataset" not in message
    tok.close()


def test_a_mismatch_found_by_the_check_goes_to_the_notes():
    notes: list[str] = []
    prompts = TracePrompts(load_trace(MOONCAKE), "completions", 512, 0, Miscounting(), notes)
    assert prompts.info["check_mismatch_tokens"] == -3
    assert any("checked prompts differ from their input length (by up to -3 tokens" in n for n in notes)


# --- the real datasets.Tokenizer against the fake server, and the tiny model's real tokenizer -----------------
@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_against_the_fake_servers_tokenize(fake_server, endpoint):
    server = fake_server()
    tok = Tokenizer(server.url, "fake-model", chat=endpoint == "chat")
    assert tok.probe() is None
    trace = load_trace(MOONCAKE)
    prompts = TracePrompts(trace, endpoint, 512, 0, tok, [])
    for i in range(len(trace)):
        assert tok.count(prompts.prompt(i)) == trace.input_tokens[i]
    tok.close()


def tiny_model() -> tuple[Path, Path] | None:
    cache = Path(os.environ.get("VLLM_LOADTEST_CACHE", ROOT / ".cache" / "embedded-vllm"))
    python, model = cache / "venv" / "bin" / "python", cache / "tiny-model"
    return (python, model) if python.exists() and (model / "tokenizer.json").exists() else None


# Counts as vLLM's /tokenize does: a prompt with the tokenizer's special tokens; messages through the chat template
# with the generation prompt, then without special tokens.
COUNTER = """
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
print("ready", flush=True)
for line in sys.stdin:
    req = json.loads(line)
    if "messages" in req:
        text = tok.apply_chat_template(req["messages"], add_generation_prompt=True, tokenize=False)
        ids = tok.encode(text, add_special_tokens=False)
    else:
        ids = tok.encode(req["prompt"], add_special_tokens=req.get("special", True))
    print(len(ids), flush=True)
"""


class RealTokenizer:
    """The embedded vLLM's tiny model tokenizer in its own Python (transformers is not in the suite's)."""

    max_model_len = None

    def __init__(self, python: Path, model: Path) -> None:
        self.proc = subprocess.Popen(
            [str(python), "-c", COUNTER, str(model)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        )
        assert self.proc.stdout.readline().strip() == "ready"
        self.calls = 0

    def count(self, prompt, special=True) -> int:
        self.calls += 1
        req = {"messages": prompt} if isinstance(prompt, list) else {"prompt": prompt, "special": special}
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(10)


@pytest.fixture(scope="module")
def real_tokenizer():
    found = tiny_model()
    if found is None:
        pytest.skip("no embedded vLLM tiny model (python -m embedded_vllm install, or set VLLM_LOADTEST_CACHE)")
    tok = RealTokenizer(*found)
    yield tok
    tok.close()


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_exact_lengths_with_the_tiny_models_real_tokenizer(real_tokenizer, endpoint, tmp_path):
    # The tiny model's 512-token BPE makes only a few common words one token: the calibration finds them.
    path = tmp_path / "t.jsonl"
    rows = [(0, 40, [0, 1, 2]), (10, 33, [0, 1, 3]), (20, 50, [4, 5, 6, 7]), (30, 7, [0]), (40, 90, [])]
    path.write_text("".join(json.dumps(dict(timestamp=t, input_length=n, output_length=4, hash_ids=h)) + "\n"
                            for t, n, h in rows))  # fmt: skip
    trace = load_trace(str(path))
    notes: list[str] = []
    prompts = TracePrompts(trace, endpoint, 16, 0, real_tokenizer, notes)
    assert "check_mismatch_tokens" not in prompts.info, notes
    assert 2 <= len(prompts.vocab) < 100
    for i in range(len(trace)):
        assert real_tokenizer.count(prompts.prompt(i)) == trace.input_tokens[i], (i, notes)
    text = [text_of(prompts.prompt(i)) for i in range(len(trace))]
    # Rows 0 and 1 share blocks 0 and 1 (16 words each), as far as the shorter one goes.
    words = [len(t.split()) for t in text]
    assert common_words(text[0], text[1]) == min(32, words[0], words[1])
    assert common_words(text[0], text[3]) == min(16, words[3])
    assert common_words(text[0], text[2]) < 3
    assert np.all(trace.input_tokens > prompts.overhead)
