"""The request options (--chat-template-kwargs, --tools, --tool-choice, --extra-body): each bad value is one line
naming the option, the problem and the fix, found before any load (the checks a headless run makes, in their order:
tests/helpers/badinput.py) with nothing sent; good values become exactly the fields build_payload adds, from the
command line, a config file, a LOCUST_* variable or the web UI's text alike."""

from __future__ import annotations

import hashlib
import json

import pytest
from vllm_loadtest.analysis import servers
from vllm_loadtest.locustfiles import options as options_mod
from vllm_loadtest.locustfiles import request_options
from vllm_loadtest.locustfiles.openai_user import build_payload

from tests.helpers.badinput import first_error
from tests.helpers.inprocess import parse_options
from tests.helpers.servers import FakeServer

pytestmark = pytest.mark.unit

CHAT = ("--endpoint", "chat")
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CLOCK = {"type": "function", "function": {"name": "get_time"}}


@pytest.fixture(scope="module")
def server():
    """One fake server for the bad-input cases: none of them may send it a completion."""
    server = FakeServer(["--model", "served-model"])
    yield server
    server.stop()


def tools_file(tmp_path, content, name="tools.json") -> str:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def payload(*args: str, prompt="hi") -> dict:
    options = parse_options(*args)
    request_options.check(options)
    options_mod.check_server_type(options)
    return build_payload(options, "m", prompt)


# --- bad input: one line, nothing sent --------------------------------------------------------------------------
def bad(server, tmp_path, *args: str) -> str:
    line = first_error("--host", server.url, "--run-dir", str(tmp_path / "r"), *args)
    assert server.get("/stats")["requests"] == 0 and server.get("/truth") == {}
    return line


def test_chat_template_kwargs_that_is_not_json_names_the_position_and_the_fix(server, tmp_path):
    line = bad(server, tmp_path, *CHAT, "--chat-template-kwargs", '{"enable_thinking": False}')
    assert line.startswith("error: --chat-template-kwargs is not valid JSON (Expecting value at line 1 column 21)")
    assert """e.g. --chat-template-kwargs '{"enable_thinking": false}'""" in line


def test_nan_is_not_json(server, tmp_path):
    line = bad(server, tmp_path, *CHAT, "--extra-body", '{"top_p": NaN}')
    assert "--extra-body is not valid JSON (NaN is not JSON); give a JSON object" in line


@pytest.mark.parametrize(("text", "kind"), [("[1, 2]", "a list"), ('"x"', "a string"), ("3", "a number")])
def test_chat_template_kwargs_must_be_an_object(server, tmp_path, text, kind):
    line = bad(server, tmp_path, *CHAT, "--chat-template-kwargs", text)
    assert f"--chat-template-kwargs must be a JSON object, not {kind}; e.g." in line


@pytest.mark.parametrize(
    "args",
    [
        ("--chat-template-kwargs", '{"enable_thinking": false}'),
        ("--tools", "TOOLS"),
        ("--tool-choice", "auto"),
    ],
    ids=["chat-template-kwargs", "tools", "tool-choice"],
)
def test_the_chat_options_are_refused_with_the_completions_endpoint(server, tmp_path, args):
    args = tuple(tools_file(tmp_path, [WEATHER]) if a == "TOOLS" else a for a in args)
    line = bad(server, tmp_path, "--endpoint", "completions", *args)
    assert f"{args[0]} only applies to --endpoint chat" in line and f"drop {args[0]}" in line


def test_chat_template_kwargs_is_refused_for_a_server_without_it(server, tmp_path):
    for kind in ("openai", "tgi"):
        line = bad(server, tmp_path, *CHAT, "--server-type", kind, "--chat-template-kwargs", '{"enable_thinking": 0}')
        assert f"--chat-template-kwargs cannot be sent to a {servers.get(kind).title} server" in line
        assert "--extra-body" in line  # the escape hatch is named
    for kind in ("vllm", "sglang", "llamacpp"):
        options = parse_options(*CHAT, "--server-type", kind, "--chat-template-kwargs", "{}")
        options_mod.check_server_type(options)
        options_mod.check_server_type(options, kind)
    with pytest.raises(ValueError, match=r"\(--server-type openai \(detected\)\)"):
        options_mod.check_server_type(parse_options(*CHAT, "--chat-template-kwargs", "{}"), "openai")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("[{]", "is not valid JSON (Expecting property name enclosed in double quotes at line 1 column 3)"),
        ("[]", "must hold a non-empty JSON list of tool definitions, not an empty list"),
        ({"tools": [WEATHER]}, 'not an object (it holds {"tools": [...]}: keep only the list)'),
        ([WEATHER, "get_time"], ": tools[1] is a string, not an object"),
        ([{"type": "retrieval", "function": {"name": "x"}}], ": tools[0] has type 'retrieval', not 'function'"),
        ([{"type": "function", "name": "x"}], ': tools[0] has no "function" object'),
        ([{"type": "function", "function": {"name": "get weather"}}], "tools[0] has function name 'get weather'"),
        ([{"type": "function", "function": {}}], "tools[0] has function name None"),
        ([{"type": "function", "function": {"name": "f", "parameters": []}}], '(f): "parameters" is a list'),
        ([{"type": "function", "function": {"name": "f", "description": 3}}], '(f): "description" is a number'),
        ([WEATHER, CLOCK, WEATHER], "tools[2] repeats the function name 'get_weather' of tools[0]"),
    ],
    ids=["json", "empty", "wrapped", "string", "type", "no-function", "name", "no-name", "parameters",
         "description", "duplicate"],
)  # fmt: skip
def test_a_bad_tools_file_names_the_file_the_index_and_what_is_wrong(server, tmp_path, content, expected):
    path = tools_file(tmp_path, content)
    line = bad(server, tmp_path, *CHAT, "--tools", path)
    assert line.startswith(f"error: --tools {path}") and expected in line, line


def test_a_tools_file_that_cannot_be_read(server, tmp_path):
    line = bad(server, tmp_path, *CHAT, "--tools", str(tmp_path / "missing.json"))
    assert "missing.json cannot be read (No such file or directory); give a JSON file" in line


def test_tool_choice_needs_tools_and_a_name_among_them(server, tmp_path):
    line = bad(server, tmp_path, *CHAT, "--tool-choice", "required")
    assert "--tool-choice required needs --tools FILE" in line
    path = tools_file(tmp_path, [WEATHER, CLOCK])
    line = bad(server, tmp_path, *CHAT, "--tools", path, "--tool-choice", "get_wether")
    assert "--tool-choice 'get_wether' is not auto, none, required or the name of a tool in" in line
    assert "(its tools: get_weather, get_time)" in line


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ('{"top_k": 20,}', "--extra-body is not valid JSON (Expecting property name enclosed in double quotes at "
         "line 1 column 14); give a JSON object, e.g. --extra-body '{\"top_k\": 20}'"),
        ("[]", "--extra-body must be a JSON object, not a list"),
        ('{"stream": false}', '--extra-body sets "stream": false; the suite measures streamed answers'),
        ('{"stream_options": {"include_usage": false}}', "stream_options.include_usage to false"),
        ('{"stream_options": true}', '"stream_options" to a boolean; it must be an object'),
        ('{"n": 2}', '"n": 2; the suite measures one answer per request'),
        ('{"model": "other"}', "--extra-body sets 'model', which the suite sets itself; use --model instead"),
        ('{"messages": []}', "sets 'messages', which the suite sets itself; use --prompt, --prompt-file or --dataset"),
        ('{"max_tokens": 5}', "use --max-tokens or --max-tokens-dist"),
        ('{"max_completion_tokens": 5}', "use --max-tokens or --max-tokens-dist"),
    ],
    ids=["json", "list", "stream", "include_usage", "stream_options", "n", "model", "messages", "max_tokens",
         "max_completion_tokens"],
)  # fmt: skip
def test_a_bad_extra_body(server, tmp_path, extra, expected):
    line = bad(server, tmp_path, *CHAT, "--extra-body", extra)
    assert expected in line, line


def test_extra_body_and_the_option_setting_the_same_field_are_refused_together(server, tmp_path):
    line = bad(server, tmp_path, *CHAT, "--chat-template-kwargs", "{}", "--extra-body", '{"chat_template_kwargs": {}}')
    assert "--extra-body sets 'chat_template_kwargs' and --chat-template-kwargs is given too; give it once" in line


# --- what is sent -----------------------------------------------------------------------------------------------
def test_the_fields_sent_with_every_chat_request(tmp_path):
    path = tools_file(tmp_path, [WEATHER, CLOCK])
    body = payload(
        *CHAT, "--chat-template-kwargs", '{"enable_thinking": false}', "--tools", path, "--tool-choice", "get_time",
        "--extra-body", '{"top_k": 20, "stream_options": {"continuous_usage_stats": false}}',
    )  # fmt: skip
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert body["tools"] == [WEATHER, CLOCK]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_time"}}
    assert body["top_k"] == 20
    # An object merges key by key: include_usage stays (the final usage is how tokens are counted).
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": False}
    assert body["messages"] == [{"role": "user", "content": "hi"}] and body["stream"] is True
    for keyword in ("auto", "none", "required"):
        assert payload(*CHAT, "--tools", path, "--tool-choice", keyword)["tool_choice"] == keyword


def test_without_request_options_the_body_is_what_it_was():
    assert set(payload(*CHAT)) == {"model", "max_tokens", "temperature", "stream", "stream_options", "messages"}
    assert set(payload()) == {"model", "max_tokens", "temperature", "stream", "stream_options", "prompt"}


def test_extra_body_reaches_the_completions_endpoint_and_overrides_the_suite(tmp_path):
    body = payload(
        "--extra-body", '{"temperature": 0.7, "ignore_eos": true, "stop": ["\\n"]}', "--server-type", "openai"
    )
    assert body["temperature"] == 0.7 and body["ignore_eos"] is True and body["stop"] == ["\n"]  # sent as asked
    assert body["prompt"] == "hi"


def test_chat_template_kwargs_is_left_out_for_a_profile_without_it_even_unchecked():
    """build_payload's own guard, as for ignore_eos: the check refuses it first (a strict API answers a 400)."""
    options = parse_options(*CHAT, "--chat-template-kwargs", '{"enable_thinking": false}', "--server-type", "openai")
    assert "chat_template_kwargs" not in build_payload(options, "m", "hi")
    options.server_type = "sglang"
    assert build_payload(options, "m", "hi")["chat_template_kwargs"] == {"enable_thinking": False}


def test_conversation_and_trace_bodies_carry_them_too(tmp_path):
    """A conversation's turns (messages) and a trace's rows (max_tokens given) go through build_payload."""
    options = parse_options(*CHAT, "--chat-template-kwargs", '{"enable_thinking": true}', "--extra-body", '{"x": 1}')
    history = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ]
    body = build_payload(options, "m", history, 7)
    assert body["messages"] == history and body["max_tokens"] == 7
    assert body["chat_template_kwargs"] == {"enable_thinking": True} and body["x"] == 1


def test_the_bodies_do_not_share_what_the_merge_changes():
    options = parse_options(*CHAT, "--extra-body", '{"stream_options": {"continuous_usage_stats": false}}')
    first, second = build_payload(options, "m", "a"), build_payload(options, "m", "b")
    first["stream_options"]["include_usage"] = "changed"
    assert second["stream_options"]["include_usage"] is True
    assert request_options.fields(options).extra_body == {"stream_options": {"continuous_usage_stats": False}}


def test_the_prepared_body_key_changes_with_the_tools_file_content(tmp_path):
    """_prepare_dataset keys a process's prepared bodies by the body without its prompt: an edited tools file (the
    web UI's next run reads it again) must not reuse the old bytes."""
    path = tools_file(tmp_path, [WEATHER])
    options = parse_options(*CHAT, "--tools", path)
    cache = request_options.FieldsCache()  # a process's (plugin.RunContext.request_fields)
    before = json.dumps(build_payload(options, "m", "", fields=cache.get(options)))
    tools_file(tmp_path, [CLOCK])
    assert json.dumps(build_payload(options, "m", "", fields=cache.get(options))) == before  # parsed once per run
    assert json.dumps(build_payload(options, "m", "")) != before  # without the cache: read now
    cache.clear()  # the next run's test_start
    assert json.dumps(build_payload(options, "m", "", fields=cache.get(options))) != before


# --- every source of an option ------------------------------------------------------------------------------------
def test_the_same_text_from_a_config_file_an_environment_variable_and_the_web_ui(tmp_path, monkeypatch):
    expected = payload(*CHAT, "--chat-template-kwargs", '{"enable_thinking": false}', "--extra-body", '{"top_k": 20}')
    config = tmp_path / "locust.conf"
    config.write_text(
        'endpoint = chat\nchat-template-kwargs = {"enable_thinking": false}\nextra-body = {"top_k": 20}\n'
    )
    assert payload("--config", str(config)) == expected
    monkeypatch.setenv("LOCUST_CHAT_TEMPLATE_KWARGS", '{"enable_thinking": false}')
    monkeypatch.setenv("LOCUST_EXTRA_BODY", ' {"top_k": 20} ')
    assert payload(*CHAT) == expected
    monkeypatch.delenv("LOCUST_CHAT_TEMPLATE_KWARGS")
    monkeypatch.delenv("LOCUST_EXTRA_BODY")
    # The web UI's start form sets the options' attributes to the fields' text (locust/web.py keeps a str a str).
    options = parse_options(*CHAT)
    options.chat_template_kwargs, options.extra_body = '{"enable_thinking": false}', '{"top_k": 20}'
    request_options.check(options)
    assert build_payload(options, "m", "hi") == expected
    options.extra_body = '{"top_k": 20'  # edited in the form: checked again at the run's start
    with pytest.raises(ValueError, match="--extra-body is not valid JSON"):
        request_options.check(options)


def test_run_json_entry(tmp_path):
    path = tools_file(tmp_path, [WEATHER, CLOCK])
    options = parse_options(
        *CHAT, "--tools", path, "--tool-choice", "required", "--chat-template-kwargs", '{"enable_thinking": false}',
        "--extra-body", '{"top_k": 20}',
    )  # fmt: skip
    entry = request_options.run_entry(options)
    sha = hashlib.sha256((tmp_path / "tools.json").read_bytes()).hexdigest()
    assert entry == {
        "chat_template_kwargs": {"enable_thinking": False},
        "tools": {"path": path, "sha256": sha, "names": ["get_weather", "get_time"]},
        "tool_choice": "required",
        "extra_body": {"top_k": 20},
    }
    assert request_options.run_entry(parse_options(*CHAT)) is None
    assert request_options.run_entry(parse_options(*CHAT, "--extra-body", "{")) is None  # refused before the run
