"""Conversations (--turns) in this process: the parsers, the bad inputs (one line, exit 3), the completions text
format, a user's conversation state (history, history_tokens, a failed turn, think times), sharegpt's whole
conversations, and the SSE parser's opt-in answer text."""

from __future__ import annotations

import json
import random

import pytest
from vllm_loadtest.analysis.conversation import (
    ConversationError,
    Turn,
    chat_messages,
    completion_text,
    parse_turns,
    reference_answer,
)
from vllm_loadtest.analysis.records import RequestRecord
from vllm_loadtest.analysis.sse import StreamParser
from vllm_loadtest.locustfiles import datasets
from vllm_loadtest.locustfiles.conversation import Conversation, ConversationPlayer, parse_think_time
from vllm_loadtest.locustfiles.settings import SuiteOptions

from tests.helpers.badinput import first_error

pytestmark = pytest.mark.unit


def test_turns_parse():
    assert parse_turns("1") == 1 and parse_turns(" 3 ") == 3 and parse_turns("ALL") is None
    for bad in ("0", "-2", "x", "", "1.5"):
        with pytest.raises(ConversationError, match="--turns"):
            parse_turns(bad)


def test_think_times_parse_and_draw():
    rng = random.Random(1)
    assert parse_think_time("0").draw(rng) == 0
    assert parse_think_time("constant:2s").draw(rng) == 2.0
    assert parse_think_time("constant:500ms").draw(rng) == 0.5
    assert parse_think_time("constant:1m").draw(rng) == 60.0
    assert parse_think_time("constant:1.5").draw(rng) == 1.5
    uniform = parse_think_time("uniform:1s:4s")
    draws = [uniform.draw(rng) for _ in range(2000)]
    assert min(draws) >= 1 and max(draws) <= 4 and 2.3 < sum(draws) / len(draws) < 2.7
    exponential = parse_think_time("exponential:5s")
    draws = [exponential.draw(rng) for _ in range(4000)]
    assert min(draws) >= 0 and 4.5 < sum(draws) / len(draws) < 5.5  # mean 5 s, sd of the mean ~0.08 s
    # Seeded: the same seed draws the same think times.
    a, b = random.Random("s"), random.Random("s")
    assert [exponential.draw(a) for _ in range(5)] == [exponential.draw(b) for _ in range(5)]
    for bad in ("2s", "constant", "constant:x", "uniform:4s:1s", "uniform:1s", "gauss:1s", "constant:-1s"):
        with pytest.raises(ConversationError, match="--think-time"):
            parse_think_time(bad)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--turns", "0"), ("--turns", "positive integer")),
        (("--turns", "many"), ("--turns", "positive integer")),
        (("--turns", "all"), ("--turns all", "sharegpt")),
        (("--turns", "all", "--dataset", "synthetic:16"), ("--turns all", "sharegpt")),
        (("--turns", "3", "--history", "reference"), ("--history reference", "sharegpt")),
        (("--history", "reference"), ("--history reference", "--turns")),
        (("--think-time", "constant:2s"), ("--think-time", "--turns")),
        (("--turns", "3", "--think-time", "sometimes"), ("--think-time", "constant:2s")),
        (("--turns", "3", "--think-time", "uniform:3s:1s"), ("--think-time", "LOW")),
        (("--turns", "3", "--trace", "t.jsonl"), ("--turns", "--trace", "drop --turns")),
    ],
)
def test_bad_conversation_options_are_one_line(args, words):
    line = first_error(*args)
    for word in words:
        assert word in line, line


def test_good_conversation_options_pass(tmp_path):
    from vllm_loadtest.locustfiles.startup import check_options

    from tests.helpers.inprocess import parse_options

    path = tmp_path / "s.json"
    path.write_text(json.dumps([{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}]))
    for args in (
        ("--turns", "3"),
        ("--turns", "3", "--dataset", "shared-prefix:64", "--think-time", "exponential:1s"),
        ("--turns", "all", "--dataset", f"sharegpt:{path}", "--history", "reference"),
        ("--turns", "2", "--dataset", f"sharegpt:{path}", "--think-time", "uniform:0:500ms"),
    ):
        check_options(parse_options("--headless", *args))


def test_the_completions_format_is_exact():
    assert completion_text(None, (), "Hi") == "User: Hi\nAssistant:"
    text = completion_text("SYS", [("Hi", " there"), ("More", " ok")], "Last")
    assert text == "SYS\nUser: Hi\nAssistant: there\nUser: More\nAssistant: ok\nUser: Last\nAssistant:"
    # Each turn's prompt begins with the previous prompt and its answer, byte for byte (the prefix cache's need).
    first = completion_text("SYS", (), "Hi")
    assert completion_text("SYS", [("Hi", " there")], "More").startswith(first + " there")
    assert reference_answer("Yes.", "completions") == " Yes." and reference_answer("Yes.", "chat") == "Yes."
    messages = chat_messages("SYS", [("Hi", "there")], "More")
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert chat_messages(None, (), "Hi") == [{"role": "user", "content": "Hi"}]


def record(status="ok", prompt_tokens=10, output_tokens=4) -> RequestRecord:
    r = RequestRecord("r" * 32, "w", 0, 1, False, 0.0, "chat", "m")
    r.status, r.prompt_tokens, r.output_tokens = status, prompt_tokens, output_tokens
    return r


def player(items, turns="3", endpoint="chat", history="generated", think="0", conversations=None):
    dataset = datasets.Dataset("x", items, conversations=conversations)
    options = SuiteOptions(turns=turns, history=history, think_time=think)
    return ConversationPlayer(dataset, options, endpoint, "seed", "abc", 0)


def play_turn(p, answer, **kw):
    r = record(**kw)
    r.request_id = f"{p._next:032x}"
    prompt, turn, text = p.ask(r)
    r_out = (r, prompt, turn, text)
    p.answered(r, turn, text, lambda: answer)
    return r_out


def test_a_conversation_resends_its_history_and_counts_it():
    items = [datasets.Item([{"role": "user", "content": f"u{i}"}]) for i in range(5)]
    p = player(items, think="constant:2s")
    r1, prompt1, _, _ = play_turn(p, "a0", prompt_tokens=10, output_tokens=4)
    assert prompt1 == [{"role": "user", "content": "u0"}]
    assert (r1.session_id, r1.turn, r1.history_tokens) == ("abc-1", 1, 0)
    assert p.in_conversation and p.take_think_time() == 2.0 and p.take_think_time() == 0.0
    r2, prompt2, _, _ = play_turn(p, "a1", prompt_tokens=20, output_tokens=5)
    assert [m["content"] for m in prompt2] == ["u0", "a0", "u1"]
    assert (r2.session_id, r2.turn, r2.history_tokens) == ("abc-1", 2, 14)
    r3, prompt3, _, _ = play_turn(p, "a2")
    assert [m["content"] for m in prompt3] == ["u0", "a0", "u1", "a1", "u2"]
    assert (r3.turn, r3.history_tokens) == (3, 25)
    assert not p.in_conversation  # 3 turns: the next request begins a new conversation, with the next items
    r4, prompt4, _, _ = play_turn(p, "x", status="error")
    assert (r4.session_id, r4.turn, r4.history_tokens, prompt4[-1]["content"]) == ("abc-2", 1, 0, "u3")
    assert not p.in_conversation and p.take_think_time() == 0.0  # a failed turn ends its conversation
    r5, _, _, _ = play_turn(p, "y")
    assert (r5.session_id, r5.turn) == ("abc-3", 1)


def test_history_tokens_are_missing_when_the_server_gave_no_usage():
    p = player([datasets.Item("u")], turns="2", endpoint="completions")
    play_turn(p, " a", prompt_tokens=None)
    r2, prompt2, _, _ = play_turn(p, " b")
    assert r2.history_tokens is None and prompt2 == "User: u\nAssistant: a\nUser: u\nAssistant:"


def test_shared_prefix_keeps_the_system_prompt_and_each_turns_request_id():
    ph = datasets.REQUEST_ID_PLACEHOLDER
    for endpoint in ("chat", "completions"):
        if endpoint == "chat":
            messages = [[{"role": "system", "content": "P P P"}, {"role": "user", "content": f"Request {ph}. Q{i}"}]
                        for i in range(2)]  # fmt: skip
            items = [datasets.Item(m, per_request=True) for m in messages]
        else:
            items = [datasets.Item(f"P P P\nRequest {ph}. Q{i}", per_request=True) for i in range(2)]
        p = player(items, turns="2", endpoint=endpoint)
        r1, prompt1, _, _ = play_turn(p, " a")
        r2, prompt2, _, _ = play_turn(p, " b")
        if endpoint == "chat":
            assert prompt2[0] == {"role": "system", "content": "P P P"}
            assert prompt2[1]["content"] == f"Request {r1.request_id}. Q0"  # turn 1 as it was sent
            assert prompt2[3]["content"] == f"Request {r2.request_id}. Q1"
        else:
            assert prompt1 == f"P P P\nUser: Request {r1.request_id}. Q0\nAssistant:"
            assert prompt2 == f"{prompt1} a\nUser: Request {r2.request_id}. Q1\nAssistant:"


def test_reference_history_resends_the_datasets_answers():
    script = [Turn("h1", "g1", 3), Turn("h2", "g2", 4), Turn("h3", "g3", 5)]
    p = player([datasets.Item("h1")], turns="all", history="reference", conversations=[script, script[:1]])
    _, _, turn1, _ = play_turn(p, "GENERATED")
    assert turn1.reference_output_tokens == 3
    _, prompt2, _, _ = play_turn(p, "GENERATED")
    assert [m["content"] for m in prompt2] == ["h1", "g1", "h2"]
    play_turn(p, "GENERATED")
    assert not p.in_conversation
    r4, _, _, _ = play_turn(p, "x")  # the second conversation has one turn only
    assert r4.turn == 1 and not p.in_conversation and r4.session_id == "abc-2"


def test_a_conversation_turn_by_turn():
    c = Conversation("s", None, [Turn("a"), Turn("b")], "completions")
    assert c.ask("id")[0] == "User: a\nAssistant:" and not c.finished
    c.history.append(("a", " x"))
    assert c.ask("id")[0] == "User: a\nAssistant: x\nUser: b\nAssistant:" and c.finished


SHAREGPT = [
    {"conversations": [{"from": "human", "value": "h1"}, {"from": "gpt", "value": "g1 g1"},
                       {"from": "human", "value": "h2"}, {"from": "gpt", "value": "g2"},
                       {"from": "human", "value": "h3 without an answer"}]},
    {"conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "k1"},
                       {"from": "gpt", "value": "j1"}, {"from": "gpt", "value": "breaks the alternation"},
                       {"from": "human", "value": "k2"}, {"from": "gpt", "value": "j2"}]},
    {"conversations": [{"from": "gpt", "value": "no human"}]},
]  # fmt: skip


def test_sharegpt_whole_conversations_keep_the_single_turn_prompts(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(SHAREGPT))
    source = datasets.ShareGPTSource(str(path))
    assert source.conversations() == [[("h1", "g1 g1"), ("h2", "g2")], [("k1", "j1")]]
    assert source.pairs() == [("h1", "g1 g1"), ("k1", "j1")]  # the single-turn prompts, as before
    ctx = datasets.BuildContext("chat", 0, 10, SuiteOptions())
    scripts = source.build_conversations(ctx, None)
    assert sorted(len(s) for s in scripts) == [1, 2]
    two = next(s for s in scripts if len(s) == 2)
    assert two[0] == Turn("h1", "g1 g1", 1) and two[1].text == "h2"  # estimates: 4 characters a token
    assert all(len(s) == 1 for s in source.build_conversations(ctx, 1))


def test_the_parser_keeps_the_answer_text_only_when_asked():
    lines = [
        b'data: {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}',
        b'data: {"choices": [{"index": 0, "delta": {"content": "Hel"}}]}',
        b'data: {"choices": [{"index": 0, "delta": {"reasoning_content": "hmm"}}]}',
        b'data: {"choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}]}',
        b"data: [DONE]",
    ]
    kept, plain = StreamParser(keep_text=True), StreamParser()
    for i, line in enumerate(lines):
        kept.feed(i * 0.01, line)
        plain.feed(i * 0.01, line)
    assert kept.text() == "Hello" and plain.text() == "" and plain.texts is None
    assert kept.result.token_offsets_s == plain.result.token_offsets_s and kept.result.finish_reason == "stop"
    completions = StreamParser(keep_text=True)
    for line in (b'data: {"choices": [{"text": " a"}]}', b'data: {"choices": [{"text": " b"}]}'):
        completions.feed(0.0, line)
    assert completions.text() == " a b"


class FakeTokenizer:
    """The fake server's tokenizer (tests/fakeserver.py count_tokens), in this process."""

    max_model_len = 4096

    def count(self, prompt, special=True):
        from tests.fakeserver import count_tokens

        if isinstance(prompt, list):
            return count_tokens(messages=prompt)
        return count_tokens(prompt, special=special)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_a_synthetic_first_turn_is_exactly_n_tokens(endpoint):
    from tests.fakeserver import count_tokens

    options = SuiteOptions(turns="3")
    ctx = datasets.BuildContext(endpoint, 0, 4, options, tokenizer=FakeTokenizer())
    items = datasets.SyntheticSource("40").build(ctx)
    p = ConversationPlayer(datasets.Dataset("synthetic:40", items), SuiteOptions(turns="3"), endpoint, "s", "u", 0)
    r = record()
    prompt, _, _ = p.ask(r)
    if endpoint == "chat":
        assert count_tokens(messages=prompt) == 40
    else:
        assert prompt.startswith("User: ") and prompt.endswith("\nAssistant:") and count_tokens(prompt) == 40
    # A single-turn run's synthetic prompts are unchanged: the bare text is N tokens.
    single = datasets.SyntheticSource("40").build(
        datasets.BuildContext(endpoint, 0, 1, SuiteOptions(), FakeTokenizer())
    )
    assert FakeTokenizer().count(single[0].prompt) == 40
