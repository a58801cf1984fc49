"""Conversations (--turns) end to end: real `locust` processes against the fake server, whose /truth and /prompts
say what each request carried. Turns arrive in order per session with growing prompts, each turn resends the
earlier turns and answers (generated or reference), think times are waited outside the latencies, a 2-process run
keeps each conversation in its user, an open loop starts conversations at the rate, --turns 1 leaves the
conversation columns empty, and bad input stops before anything is sent."""

from __future__ import annotations

import itertools
import json
import time

import numpy as np
import pandas as pd
import pytest
from vllm_loadtest.analysis.run import STEPS_FILE

from tests.helpers.runs import locust

pytestmark = pytest.mark.contract

TOKENS = 6  # max_tokens: the fake server streams " tok1 ... tok6"
ANSWER = "".join(f" tok{i}" for i in range(1, TOKENS + 1))


def run(server, run_dir, *args: str, code: int = 0):
    proc = locust(
        "--host", server.url, "--max-tokens", str(TOKENS), "--step-warmup", "0s", "--no-report", "--run-dir",
        str(run_dir), "--stop-timeout", "5", *args,
    )  # fmt: skip
    assert proc.returncode == code, proc.stderr[-3000:]
    records = pd.read_parquet(run_dir / "requests.parquet")
    prompts = {p["request_id"]: p for p in server.get("/prompts")["prompts"]}
    return proc, records, server.get("/truth"), prompts


def sessions(records: pd.DataFrame):
    """Each session's answered turns in send order."""
    ok = records[records["status"] == "ok"].sort_values("start_time")
    return {sid: group for sid, group in ok.groupby("session_id")}


def check_order_and_growth(records, truth):
    """Per session: turns 1, 2, ... in send order, each prompt longer than the last, history_tokens = the previous
    turn's prompt + output tokens (the server's usage), and the server counted the same prompt."""
    assert records["session_id"].notna().all() and records["turn"].notna().all()
    groups = sessions(records)
    assert len(groups) >= 2
    for _, group in groups.items():
        turns = list(group["turn"])
        assert turns == list(range(1, len(turns) + 1)), turns
        tokens = [truth[rid]["prompt_tokens"] for rid in group["request_id"]]
        assert tokens == list(group["prompt_tokens"])
        assert all(b > a for a, b in itertools.pairwise(tokens)), tokens
        history = list(group["history_tokens"])
        assert history[0] == 0
        expected = (group["prompt_tokens"] + group["output_tokens"]).tolist()[:-1]
        assert history[1:] == expected
    return groups


def test_chat_turns_resend_the_history_in_order_and_think_outside_the_latency(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "20", "--itl-ms", "2")
    _, records, truth, prompts = run(
        server, tmp_path / "r", "--steps", "2", "--step-duration", "4s", "--endpoint", "chat",
        "--dataset", "synthetic:24", "--turns", "3", "--think-time", "constant:300ms",
    )  # fmt: skip
    groups = check_order_and_growth(records, truth)
    assert {len(g) for g in groups.values()} >= {3}  # complete conversations; the last ones may be cut by the end
    assert records["session_id"].str.len().min() > 20  # the user's random prefix and a counter
    for _, group in groups.items():
        ids = list(group["request_id"])
        for k, rid in enumerate(ids):
            messages = prompts[rid]["messages"]
            assert truth[rid]["messages"] == len(messages) == 2 * k + 1
            assert [m["role"] for m in messages] == ["user", "assistant"] * k + ["user"]
            # Each earlier turn exactly as it was sent, and its answer exactly as the server streamed it.
            for j, earlier in enumerate(ids[:k]):
                assert messages[2 * j] == prompts[earlier]["messages"][-1]
                assert messages[2 * j + 1]["content"] == ANSWER
        # Think time: the next turn is sent at least 300 ms after the previous one ended, and no latency holds it.
        ends = (group["start_time"] + group["duration_s"]).to_numpy()[:-1]
        gaps = group["start_time"].to_numpy()[1:] - ends
        assert (gaps >= 0.3 - 0.005).all(), gaps
    ok = records[records["status"] == "ok"]
    assert (ok["e2e_s"] < 0.25).all() and (ok["duration_s"] < 0.25).all()
    # The first turn is exactly the synthetic prompt (24 tokens with the chat template).
    assert set(ok.loc[ok["turn"] == 1, "prompt_tokens"]) == {24}


def test_completions_with_a_shared_prefix_keep_the_system_prompt_byte_identical(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "10", "--itl-ms", "1")
    _, records, truth, prompts = run(
        server, tmp_path / "r", "--steps", "2", "--step-duration", "3s", "--dataset", "shared-prefix:32",
        "--turns", "2",
    )  # fmt: skip
    groups = check_order_and_growth(records, truth)
    texts = [prompts[rid]["prompt"] for rid in records["request_id"]]
    system = {text.partition("\n")[0] for text in texts}
    assert len(system) == 1  # one system prompt for every user and turn: the server's prefix cache can share it
    complete = [list(g["request_id"]) for g in groups.values() if len(g) == 2]
    assert complete
    for rid1, rid2 in complete:
        first, second = prompts[rid1]["prompt"], prompts[rid2]["prompt"]
        assert rid1 in first and first.endswith("\nAssistant:") and "\nUser: Request " in first
        assert second.startswith(first + ANSWER + "\nUser: Request " + rid2)
        assert truth[rid2]["last_user"].startswith(f"Request {rid2}.")
        assert truth[rid1]["messages"] is None


SHAREGPT = [
    {"conversations": [
        {"from": "human", "value": f"c{c} question {t}"} if i % 2 == 0 else
        {"from": "gpt", "value": f"c{c} answer {t} " + "word " * (3 + t)}
        for i, t in ((i, i // 2) for i in range(2 * (c % 3 + 1)))
    ]}
    for c in range(6)
]  # fmt: skip  # conversation c has c % 3 + 1 turns


def test_sharegpt_conversations_with_their_reference_answers(fake_server, tmp_path):
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(SHAREGPT))
    server = fake_server("--ttft-ms", "10", "--itl-ms", "1")
    _, records, truth, prompts = run(
        server, tmp_path / "r", "--steps", "2", "--step-duration", "3s", "--endpoint", "chat",
        "--dataset", f"sharegpt:{path}", "--turns", "all", "--history", "reference",
    )  # fmt: skip
    by_text = {turn["value"]: conv["conversations"] for conv in SHAREGPT for turn in conv["conversations"]}
    groups = check_order_and_growth(records, truth)
    for _, group in groups.items():
        ids = list(group["request_id"])
        script = by_text[prompts[ids[0]]["messages"][0]["content"]]
        assert len(ids) <= len(script) // 2  # its own turns, no more
        for k, rid in enumerate(ids):
            sent = [m["content"] for m in prompts[rid]["messages"]]
            assert sent == [t["value"] for t in script[: 2 * k + 1]]  # the dataset's turns and answers, in order
    # max_tokens is each turn's reference length (the default for sharegpt); fuller conversations went to the end.
    assert records["reference_output_tokens"].notna().all()
    assert (records["max_tokens"] == records["reference_output_tokens"]).all()
    full = [g for g in groups.values() if len(g) == 3]
    assert full, "no three-turn conversation was played to its end"


def test_sharegpt_turns_n_cut_the_conversations_and_history_is_generated(fake_server, tmp_path):
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(SHAREGPT))
    server = fake_server("--ttft-ms", "10", "--itl-ms", "1")
    _, records, truth, prompts = run(
        server, tmp_path / "r", "--steps", "1", "--step-duration", "3s", "--dataset", f"sharegpt:{path}",
        "--turns", "2", "--max-tokens-dist", "fixed",
    )  # fmt: skip
    check_order_and_growth(records, truth)
    assert records["turn"].max() == 2
    second = records[records["turn"] == 2]
    assert len(second)
    for rid in second["request_id"]:
        text = prompts[rid]["prompt"]
        assert text.count("User: ") == 2 and f"\nAssistant:{ANSWER}\nUser: " in text  # the streamed answer


def test_single_turn_runs_leave_the_conversation_columns_empty(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "10", "--itl-ms", "1")
    _, records, _, _ = run(server, tmp_path / "r", "--steps", "1", "--step-duration", "2s")
    assert len(records)
    for column in ("session_id", "turn", "history_tokens"):
        assert records[column].isna().all(), column


def test_two_processes_keep_each_conversation_in_its_user(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "10", "--itl-ms", "1")
    _, records, truth, _ = run(
        server, tmp_path / "r", "--steps", "4", "--step-duration", "4s", "--endpoint", "chat",
        "--dataset", "synthetic:16", "--turns", "3", "--think-time", "uniform:50ms:150ms", "--processes", "2",
    )  # fmt: skip
    assert records["worker"].nunique() == 2
    assert (records.groupby("session_id")["worker"].nunique() == 1).all()
    # A user holds one conversation at a time: its sessions (its id prefix, a counter) follow one another.
    for _, mine in records.sort_values("start_time").groupby(records["session_id"].str.rpartition("-")[0]):
        counters = mine["session_id"].str.rpartition("-")[2].astype(int).tolist()
        assert counters == sorted(counters), counters
    check_order_and_growth(records, truth)
    assert not records["session_id"].isna().any()


def test_an_open_loop_starts_conversations_at_the_rate(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "10", "--itl-ms", "1")
    rate, seconds = 5.0, 4
    _, records, truth, _ = run(
        server, tmp_path / "r", "--rates", str(rate), "--arrival", "constant", "--max-users", "20",
        "--step-duration", f"{seconds}s", "--endpoint", "chat", "--dataset", "synthetic:16", "--turns", "3",
        "--think-time", "constant:200ms",
    )  # fmt: skip
    check_order_and_growth(records, truth)
    first = records[records["turn"] == 1]
    later = records[records["turn"] > 1]
    assert first["intended_start_time"].notna().all() and first["schedule_lag_s"].notna().all()
    assert later["intended_start_time"].isna().all() and later["schedule_lag_s"].isna().all()
    intended = np.sort(first["intended_start_time"].to_numpy())
    # Every intended time of the schedule started one new conversation, evenly spaced at the rate.
    assert np.diff(intended) == pytest.approx(np.full(len(intended) - 1, 1 / rate), abs=1e-6)
    assert abs(len(intended) - rate * seconds) <= 1
    assert len(later) >= len(first)  # the users went on with the later turns
    assert first["schedule_lag_s"].median() < 0.05  # (the very first may wait for the users to start)
    # The step's achieved rate is the rate of new conversations, not of requests (turns).
    steps = pd.read_csv(tmp_path / "r" / STEPS_FILE)
    assert steps["achieved_rps"].iloc[0] == pytest.approx(rate, rel=0.25)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--turns", "0"), "--turns"),
        (("--turns", "all", "--dataset", "synthetic:16"), "--turns all"),
        (("--turns", "2", "--history", "reference"), "--history reference"),
        (("--turns", "2", "--think-time", "soon"), "--think-time"),
    ],
)
def test_bad_conversation_input_sends_nothing(fake_server, tmp_path, args, words):
    server = fake_server()
    proc = locust(
        "--host",
        server.url,
        "--steps",
        "1",
        "--step-duration",
        "2s",
        "--step-warmup",
        "0s",
        "--run-dir",
        str(tmp_path),
        *args,
    )
    assert proc.returncode == 3, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and words in errors[0], proc.stderr[-2000:]
    assert server.get("/received")["request_ids"] == []


def test_conversations_go_on_across_steps_each_turn_tagged_with_the_step_at_its_send(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "10", "--itl-ms", "1")
    run_dir = tmp_path / "r"
    proc = locust(
        "--host", server.url, "--max-tokens", str(TOKENS), "--steps", "1,2", "--step-duration", "2s",
        "--step-warmup", "0s", "--turns", "6", "--think-time", "constant:250ms", "--run-dir", str(run_dir),
    )  # fmt: skip  # with the report: a conversation run's records go through the whole end of the run
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (run_dir / "report.html").stat().st_size > 0
    records = pd.read_parquet(run_dir / "requests.parquet")
    timeline = json.loads((run_dir / "run.json").read_text())["timeline"]
    second_step_starts = timeline[1]["start_time"]
    spanning = records.groupby("session_id")["step"].nunique()
    assert (spanning == 2).any()  # a conversation begun in step 0 went on in step 1
    sent = records[(records["start_time"] - second_step_starts).abs() > 0.05]  # the step is read just before the send
    assert ((sent["start_time"] < second_step_starts) == (sent["step"] == 0)).all()


def test_a_user_thinking_stops_at_once_when_the_run_ends(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "10", "--itl-ms", "1")
    started = time.monotonic()
    _, records, _, _ = run(
        server, tmp_path / "r", "--steps", "2", "--step-duration", "2s", "--turns", "2", "--think-time",
        "constant:60s", "--stop-timeout", "30",
    )  # fmt: skip
    assert time.monotonic() - started < 25  # not the 60 s think time, nor the 30 s stop timeout
    assert list(records["turn"]) == [1, 1] and (records["status"] == "ok").all()  # nothing was cut off
