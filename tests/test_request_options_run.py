"""The request options end to end: real `locust` runs against the fake server, which records every body it receives
(GET /prompts: the fields besides the prompt). Every request of a run carries exactly the fields the options say,
whichever path built it (prepared bodies, a conversation's turns, a trace's rows); run.json keeps them; bad input
stops the run with one line, exit code 3 and nothing sent; a strict OpenAI API is never sent chat_template_kwargs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pandas as pd
import pytest

from tests.helpers.net import free_port, get, post, wait_for
from tests.helpers.paths import LOCUSTFILE, ROOT
from tests.helpers.runs import locust, short_run, wait_until

pytestmark = pytest.mark.contract

FAST = ("--ttft-ms", "5", "--itl-ms", "1")
SUITE_FIELDS = {"model", "max_tokens", "temperature", "stream", "stream_options"}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    },
    {"type": "function", "function": {"name": "get_time"}},
]
NO_THINKING = '{"enable_thinking": false}'


def tools_file(tmp_path) -> str:
    path = tmp_path / "tools.json"
    path.write_text(json.dumps(TOOLS))
    return str(path)


def bodies(server) -> list[dict]:
    received = server.get("/prompts")["prompts"]
    assert received, "the fake server received no completion"
    return [p["body"] for p in received]


def one_error_line(proc) -> str:
    assert proc.returncode == 3, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return errors[0]


def test_every_request_carries_exactly_the_request_options_and_run_json_keeps_them(fake_server, tmp_path):
    server = fake_server(*FAST)
    path = tools_file(tmp_path)
    proc = short_run(
        server.url, tmp_path / "r", "--endpoint", "chat", "--no-report", "--chat-template-kwargs", NO_THINKING,
        "--tools", path, "--tool-choice", "get_time",
        "--extra-body", '{"top_k": 20, "stream_options": {"continuous_usage_stats": false}}',
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = """Request options: chat_template_kwargs {"enable_thinking": false}; tools get_weather, get_time (from """
    assert proc.stderr.count(line) == 1 and "; extra body fields top_k, stream_options" in proc.stderr
    for body in bodies(server):
        assert set(body) == SUITE_FIELDS | {"chat_template_kwargs", "tools", "tool_choice", "top_k"}, body
        assert body["chat_template_kwargs"] == {"enable_thinking": False} and body["tools"] == TOOLS
        assert body["tool_choice"] == {"type": "function", "function": {"name": "get_time"}}
        assert body["top_k"] == 20 and body["stream"] is True
        assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": False}
    run = json.loads((tmp_path / "r" / "run.json").read_text())
    assert run["options"]["chat_template_kwargs"] == NO_THINKING and run["options"]["tools"] == path
    assert run["options"]["tool_choice"] == "get_time"
    assert json.loads(run["options"]["extra_body"])["top_k"] == 20
    entry = run["request_options"]
    assert entry["tools"]["names"] == ["get_weather", "get_time"] and len(entry["tools"]["sha256"]) == 64
    assert entry["chat_template_kwargs"] == {"enable_thinking": False} and entry["extra_body"]["top_k"] == 20


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--chat-template-kwargs", "{enable_thinking: false}"), "--chat-template-kwargs is not valid JSON"),
        (("--tools", "TOOLS", "--tool-choice", "nope"), "--tool-choice 'nope' is not auto, none, required"),
        (("--extra-body", '{"stream": false}'), '--extra-body sets "stream": false'),
    ],
    ids=["chat-template-kwargs", "tool-choice", "extra-body"],
)
def test_bad_request_options_stop_the_run_with_one_line_exit_3_and_nothing_sent(fake_server, tmp_path, args, expected):
    server = fake_server(*FAST)
    args = tuple(tools_file(tmp_path) if a == "TOOLS" else a for a in args)
    line = one_error_line(short_run(server.url, tmp_path / "r", "--endpoint", "chat", *args))
    assert expected in line, line
    assert server.get("/stats")["requests"] == 0 and server.get("/truth") == {}


def test_a_strict_openai_api_is_never_sent_chat_template_kwargs(fake_server, tmp_path):
    strict = fake_server("--strict", *FAST)
    for args in (["--server-type", "openai"], []):  # given, and detected (the strict server serves no /metrics)
        proc = short_run(strict.url, tmp_path / "r", "--endpoint", "chat", "--chat-template-kwargs", NO_THINKING, *args)
        line = one_error_line(proc)
        assert "--chat-template-kwargs cannot be sent to a generic OpenAI-compatible API server" in line, args
    assert strict.get("/stats")["requests"] == 0
    # Tools are OpenAI API fields: the strict server takes them.
    proc = short_run(
        strict.url, tmp_path / "ok", "--endpoint", "chat", "--no-report", "--server-type", "openai",
        "--tools", tools_file(tmp_path), "--tool-choice", "required",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    sent = bodies(strict)
    assert all(b["tool_choice"] == "required" and b["tools"] == TOOLS for b in sent)
    # None answered with a 400 (the strict server refuses an unknown field before it records the request).
    records = pd.read_parquet(tmp_path / "ok" / "requests.parquet")
    assert len(records) >= len(sent) and set(records["error_type"].dropna()) <= {"cut_off"}


def test_a_conversation_sends_them_with_every_turn(fake_server, tmp_path):
    server = fake_server(*FAST)
    proc = locust(
        "--host", server.url, "--endpoint", "chat", "--turns", "2", "--steps", "1", "--step-duration", "2s",
        "--step-warmup", "0s", "--max-tokens", "4", "--no-report", "--run-dir", str(tmp_path / "r"),
        "--chat-template-kwargs", NO_THINKING, "--extra-body", '{"top_k": 20}',
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    received = server.get("/prompts")["prompts"]
    assert any(len(p["messages"]) == 3 for p in received), "no second turn was sent"
    for p in received:
        assert p["body"]["chat_template_kwargs"] == {"enable_thinking": False} and p["body"]["top_k"] == 20


def test_a_trace_replay_sends_them_with_every_row(fake_server, tmp_path):
    server = fake_server(*FAST)
    trace = tmp_path / "trace.jsonl"  # Mooncake's format: six rows 40 ms apart
    rows = [{"timestamp": 40 * i, "input_length": 24, "output_length": 2 + i, "hash_ids": [i]} for i in range(6)]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = locust(
        "--host", server.url, "--endpoint", "chat", "--trace", str(trace), "--trace-block-tokens", "16",
        "--step-warmup", "0s", "--no-report", "--run-dir", str(tmp_path / "r"),
        "--chat-template-kwargs", NO_THINKING, "--extra-body", '{"top_k": 20}',
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    received = server.get("/prompts")["prompts"]
    assert len(received) == len(rows)
    for p in received:
        assert p["body"]["chat_template_kwargs"] == {"enable_thinking": False} and p["body"]["top_k"] == 20
    assert sorted(p["max_tokens"] for p in received) == sorted(r["output_length"] for r in rows)


def test_the_web_ui_start_form_hands_them_over_as_text_and_a_bad_one_stops_the_run(fake_server, tmp_path):
    """The start form sends every option back as text: a bad value is refused when the run starts (nothing sent),
    then the corrected form's values reach every body."""
    server = fake_server(*FAST)
    port = free_port()
    ui = f"http://127.0.0.1:{port}"
    log = tmp_path / "locust.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "locust", "-f", LOCUSTFILE, "--host", server.url, "--web-host", "127.0.0.1",
         "--web-port", str(port), "--run-dir", str(tmp_path / "run"), "--endpoint", "chat"],
        cwd=ROOT, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    form = {"host": server.url, "steps": "1", "step_duration": "2s", "step_warmup": "0s", "max_tokens": "4"}
    try:
        wait_for(ui + "/")
        post(ui + "/swarm", {**form, "extra_body": '{"top_k": 20'})
        assert wait_until(lambda: "--extra-body is not valid JSON" in log.read_text(), 30), log.read_text()[-2000:]
        assert wait_until(lambda: json.loads(get(ui + "/stats/requests"))["state"] == "stopped", 30)
        assert server.get("/stats")["requests"] == 0
        started = post(
            ui + "/swarm",
            {**form, "extra_body": '{"top_k": 20}', "chat_template_kwargs": NO_THINKING, "tools": tools_file(tmp_path),
             "tool_choice": "auto"},
        )  # fmt: skip
        assert started["success"], started
        assert wait_until(lambda: (tmp_path / "run" / "steps.csv").exists(), 60), log.read_text()[-2000:]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    for body in bodies(server):
        assert body["top_k"] == 20 and body["chat_template_kwargs"] == {"enable_thinking": False}
        assert body["tools"] == TOOLS and body["tool_choice"] == "auto"


def test_synthetic_chat_prompts_count_the_tools_the_template_renders(fake_server, tmp_path):
    """--dataset synthetic:N asks the server's tokenizer with the run's tools (vLLM's /tokenize takes them), so each
    prompt is N tokens as the server counts it, tools included (the fake server counts them as a template would)."""
    server = fake_server(*FAST)
    proc = short_run(
        server.url, tmp_path / "r", "--endpoint", "chat", "--no-report", "--dataset", "synthetic:120",
        "--num-prompts", "3", "--tools", tools_file(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = pd.read_parquet(tmp_path / "r" / "requests.parquet")
    assert len(records) and (records["prompt_tokens"].dropna() == 120).all(), records["prompt_tokens"].tolist()
    without = [p for p in server.get("/prompts")["prompts"] if "tools" not in p["body"]]
    assert not without
