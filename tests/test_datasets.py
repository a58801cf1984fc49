"""Prompt sources (--dataset) and per-request max_tokens (--max-tokens-dist): unit tests, and the server's
/tokenize through tests/fakeserver.py (its fake tokenizer: one token per 4 characters of a word, plus a BOS)."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import pytest
from vllm_loadtest.locustfiles import datasets
from vllm_loadtest.locustfiles.datasets import (
    REQUEST_ID_PLACEHOLDER,
    DatasetError,
    FixedSource,
    Item,
    SharedPrefixSource,
    SyntheticSource,
    build_dataset,
    fit_words,
    parse_dataset,
    parse_max_tokens,
)

from tests.fakeserver import count_tokens
from tests.helpers.inprocess import parse_options
from tests.helpers.tokenizer import FakeTokenizer

pytestmark = pytest.mark.unit

SHAREGPT = [
    {"id": "a", "conversations": [{"from": "human", "value": "What is a cat?"},
                                  {"from": "gpt", "value": "A small animal."}]},
    {"id": "b", "conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Hi"},
                                  {"from": "gpt", "value": "Hello there, how can I help you today?"},
                                  {"from": "human", "value": "second question"}, {"from": "gpt", "value": "x"}]},
    {"id": "c", "conversations": [{"from": "human", "value": "no answer"}]},  # skipped: no gpt turn
    {"id": "d", "conversations": [{"from": "gpt", "value": "answer first"}, {"from": "human", "value": "late"}]},
    {"id": "e"},  # skipped: no conversations
]  # fmt: skip


def context(endpoint: str = "completions", tokenizer: FakeTokenizer | None = None, n: int = 20, **opts):
    options = parse_options("--endpoint", endpoint, *[x for k, v in opts.items() for x in (f"--{k}", str(v))])
    return datasets.BuildContext(endpoint=endpoint, seed=0, num_prompts=n, options=options, tokenizer=tokenizer)


# --- parsing ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("spec", "kind"),
    [
        ("fixed", FixedSource),
        ("", FixedSource),
        ("synthetic:128", SyntheticSource),
        ("shared-prefix:64", SharedPrefixSource),
    ],
)
def test_specs_parse(spec, kind):
    assert isinstance(parse_dataset(spec), kind)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("lorem", "is not a prompt source"),
        ("synthetic", "needs N"),
        ("synthetic:0", "positive integer"),
        ("synthetic:many", "positive integer"),
        ("shared-prefix:-5", "positive integer"),
        ("sharegpt", "needs PATH"),
        ("fixed:x", "takes no argument"),
    ],
)
def test_bad_specs_are_one_line_errors(spec, expected):
    with pytest.raises(DatasetError) as e:
        parse_dataset(spec).check()
    assert expected in str(e.value) and "\n" not in str(e.value)


# --- fitting text to a token count --------------------------------------------------------------------------
@pytest.mark.parametrize("target", [2, 3, 17, 100, 333])
def test_fit_words_hits_the_exact_count(target):
    rng = random.Random(target)
    words = rng.choices(datasets.WORDS, k=target + 8)
    calls = []

    def count(text: str) -> int:
        calls.append(text)
        assert text, "an empty prompt is never sent to /tokenize (vLLM rejects it)"
        return count_tokens(text)

    text, n = fit_words(words, target, count)
    assert n == target == count_tokens(text)
    assert len(calls) < 40  # a search, not a scan


def test_fit_words_takes_more_words_when_a_word_is_less_than_a_token():
    def count(text: str) -> int:  # 1 + one token per two words
        return 1 + len(text.split()) // 2

    text, n = fit_words(["a"] * 10, 50, count, more=lambda k: ["b"] * k)
    assert n == 50 and len(text.split()) in (98, 99)


def test_fit_words_refuses_a_target_below_one_word():
    with pytest.raises(DatasetError, match="shorter than any word"):
        fit_words(["between"], 1, count_tokens)  # BOS + 2 tokens > 1, and BOS + a filler > 1


# --- the sources --------------------------------------------------------------------------------------------
def test_fixed_is_the_prompt_or_the_prompt_file(tmp_path):
    assert [i.prompt for i in FixedSource("").build(context(prompt="hello"))] == ["hello"]
    path = tmp_path / "p.json"
    path.write_text('["one", "two"]')
    items = FixedSource("").build(context(**{"prompt-file": str(path)}))
    assert [i.prompt for i in items] == ["one", "two"] and all(i.reference_output_tokens is None for i in items)


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_synthetic_prompts_have_exactly_n_tokens(endpoint):
    tok = FakeTokenizer()
    items = SyntheticSource("60").build(context(endpoint, tok, n=10))
    assert len(items) == 10 and len({json.dumps(i.prompt) for i in items}) == 10  # distinct
    for item in items:
        assert tok.count(item.prompt) == 60  # as the server counts the request's prompt (chat: with its template)
        assert isinstance(item.prompt, list) == (endpoint == "chat")
    assert tok.calls < 10 * 25


def test_synthetic_is_the_same_for_the_same_seed():
    a = SyntheticSource("40").build(context(tokenizer=FakeTokenizer(), n=5))
    b = SyntheticSource("40").build(context(tokenizer=FakeTokenizer(), n=5))
    assert a == b


def test_synthetic_without_tokenizer_is_n_common_words():
    items = SyntheticSource("50").build(context(n=3))
    assert all(len(i.prompt.split()) == 50 and set(i.prompt.split()) <= set(datasets.WORDS) for i in items)


def write_sharegpt(tmp_path: Path, data: object) -> str:
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_sharegpt_first_human_turn_and_the_answer_length(tmp_path):
    source = parse_dataset(f"sharegpt:{write_sharegpt(tmp_path, SHAREGPT)}")
    source.check()
    tok = FakeTokenizer()
    items = source.build(context(tokenizer=tok))
    by_prompt = {i.prompt: i.reference_output_tokens for i in items}
    assert by_prompt == {
        "What is a cat?": count_tokens("A small animal.", special=False),
        "Hi": count_tokens("Hello there, how can I help you today?", special=False),
    }
    # Without /tokenize: ~4 characters per token.
    estimated = {i.prompt: i.reference_output_tokens for i in source.build(context())}
    assert estimated == {"What is a cat?": 4, "Hi": 10}
    # --num-prompts draws (seeded) that many conversations.
    assert len(source.build(context(tokenizer=tok, n=1))) == 1


def test_sharegpt_skips_conversations_longer_than_the_server_holds(tmp_path):
    source = parse_dataset(f"sharegpt:{write_sharegpt(tmp_path, SHAREGPT)}")
    tok = FakeTokenizer()
    tok.max_model_len = 10  # the cat: 5 prompt + 5 answer tokens fit; "Hi": 2 + 11 do not
    ctx = context(tokenizer=tok)
    items = source.build(ctx)
    assert [i.prompt for i in items] == ["What is a cat?"] and "skipped 1 conversation" in ctx.notes[0]
    tok.max_model_len = 3
    with pytest.raises(DatasetError, match="no conversation fits"):
        source.build(context(tokenizer=tok))


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('[{"conversations": [', "is not JSON"),
        ('{"conversations": []}', "must be a JSON list"),
        ('[{"conversations": [{"from": "human", "value": "only a question"}]}]', "no conversation with a human turn"),
        (None, "No such file"),
    ],
)
def test_a_bad_sharegpt_file_is_a_one_line_error(tmp_path, content, expected):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(DatasetError) as e:
        parse_dataset(f"sharegpt:{path}").check()
    assert expected in str(e.value) and "\n" not in str(e.value) and str(path) in str(e.value)


def unique(prompt: str | list[dict], request_id: str) -> str:
    """The prompt as a request sends it (its id in place of the placeholder), as text."""
    return json.dumps(prompt).replace(REQUEST_ID_PLACEHOLDER, request_id)


def test_shared_prefix_prompts_share_exactly_the_prefix_and_differ_after_it():
    tok = FakeTokenizer()
    items = SharedPrefixSource("100").build(context(tokenizer=tok, n=4))
    assert all(i.per_request and REQUEST_ID_PLACEHOLDER in i.prompt for i in items)
    prefix = items[0].prompt.split("\n")[0] + "\n"
    assert tok.count(prefix) == 100  # the first L tokens of every prompt (BOS included)
    sent = [json.loads(unique(i.prompt, f"{n:032x}")) for n, i in enumerate(items * 2)]  # ids differ per request
    assert all(p.startswith(prefix) for p in sent)
    assert len({p[len(prefix) :] for p in sent}) == len(sent)  # and the rest is unique to each request


def test_shared_prefix_on_chat_is_a_system_message_of_l_tokens():
    tok = FakeTokenizer()
    items = SharedPrefixSource("50").build(context("chat", tok, n=3))
    systems = {json.dumps(i.prompt[0]) for i in items}
    assert len(systems) == 1 and items[0].prompt[0]["role"] == "system"
    assert tok.count(items[0].prompt[0]["content"], special=False) == 50
    assert all(REQUEST_ID_PLACEHOLDER in i.prompt[1]["content"] for i in items)


# --- max_tokens ---------------------------------------------------------------------------------------------
def test_max_tokens_fixed_reference_and_auto():
    item = Item("p", reference_output_tokens=77)
    rng = random.Random(0)
    assert parse_max_tokens("", 256).draw(rng, item) == 256
    assert parse_max_tokens("fixed", 256, parse_dataset("sharegpt:x.json")).draw(rng, item) == 256
    assert parse_max_tokens("", 256, parse_dataset("sharegpt:x.json")).draw(rng, item) == 77  # auto: reference
    assert parse_max_tokens("reference", 256).draw(rng, Item("p")) == 256  # no reference: --max-tokens
    assert not parse_max_tokens("reference", 256).varies


def test_max_tokens_distributions_are_seeded_and_bounded():
    item = Item("p")
    uniform = parse_max_tokens("uniform:64:512", 256)
    draws = [uniform.draw(random.Random(7), item) for _ in range(3)]
    assert len(set(draws)) == 1  # the same seed, the same draw
    rng = random.Random(1)
    values = [uniform.draw(rng, item) for _ in range(2000)]
    assert min(values) >= 64 and max(values) <= 512 and {64, 512} <= set(values) and uniform.varies
    normal = parse_max_tokens("normal:256:64", 256)
    rng = random.Random(1)
    values = [normal.draw(rng, item) for _ in range(2000)]
    assert all(isinstance(v, int) and v >= 1 for v in values)
    assert 246 < sum(values) / len(values) < 266
    assert all(v >= 1 for v in (parse_max_tokens("normal:2:50", 1).draw(rng, item) for _ in range(200)))


@pytest.mark.parametrize(
    "text", ["poisson:3", "uniform:5", "uniform:0:10", "uniform:10:5", "uniform:1.5:4", "normal:0:5", "normal:5:-1"]
)
def test_bad_max_tokens_dist_is_a_one_line_error(text):
    with pytest.raises(DatasetError) as e:
        parse_max_tokens(text, 256)
    assert "--max-tokens-dist" in str(e.value) and "\n" not in str(e.value)


def test_option_check_covers_the_dataset_options(tmp_path):
    from vllm_loadtest.locustfiles.startup import check_options as check

    check(parse_options("--dataset", "synthetic:32", "--max-tokens-dist", "uniform:1:8"))
    (tmp_path / "p.json").write_text('["a prompt"]')
    for args, expected in [
        (["--dataset", "nope"], "not a prompt source"),
        (
            ["--dataset", "synthetic:8", "--prompt-file", str(tmp_path / "p.json")],
            "--prompt-file applies to --dataset fixed",
        ),
        (["--num-prompts", "0"], "--num-prompts"),
        (["--max-tokens-dist", "uniform:9:1"], "--max-tokens-dist"),
        (["--dataset", f"sharegpt:{tmp_path / 'missing.json'}"], "No such file"),
    ]:
        with pytest.raises(ValueError, match=expected):
            check(parse_options(*args))


# --- against a server: /tokenize and its fallback -----------------------------------------------------------
def test_build_with_the_servers_tokenize(fake_server):
    server = fake_server()
    options = parse_options("--num-prompts", "5")
    dataset = build_dataset("synthetic:40", options, server.url, "fake-model")
    assert dataset.info["tokenizer"] == "/tokenize" and dataset.info["items"] == 5
    assert all(count_tokens(i.prompt) == 40 for i in dataset.items)
    assert server.get("/prompts")["tokenize_calls"] == dataset.info["tokenize_calls"] > 5


def test_build_without_tokenize_falls_back_with_one_warning(fake_server, caplog):
    server = fake_server("--no-tokenize")
    options = parse_options("--num-prompts", "3")
    with caplog.at_level(logging.WARNING, logger="vllm_loadtest.datasets"):
        dataset = build_dataset("synthetic:40", options, server.url, "fake-model")
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "no usable /tokenize" in warnings[0] and "approximate" in warnings[0]
    assert dataset.info["tokenizer"].startswith("none (HTTP 404)")
    assert all(len(i.prompt.split()) == 40 for i in dataset.items)


def test_fixed_never_asks_the_server(fake_server):
    server = fake_server()
    dataset = build_dataset("fixed", parse_options("--prompt", "hi"), server.url, "fake-model")
    assert [i.prompt for i in dataset.items] == ["hi"] and server.get("/prompts")["tokenize_calls"] == 0
