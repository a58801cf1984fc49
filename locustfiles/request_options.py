"""The request options: --chat-template-kwargs, --tools, --tool-choice and --extra-body, checked before any load and
turned into the fields every request body carries (kinds.build_payload).

Each option arrives as text (the command line, a config file, a LOCUST_* variable or the web UI's start form all
hand over the same string), is parsed once per process and text, and is refused with one line naming the option,
what is wrong and the fix. See docs/explanation/options-in-depth.md#request-options.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from ..analysis import kinds
from .declare import option

logger = logging.getLogger("vllm_loadtest")


@dataclass(frozen=True)
class RequestOptions:
    """What every request carries (the body's fields) and how it is sent."""

    GROUP: ClassVar[str] = "Request"

    model: str = option(
        "--model",
        "",
        "Model name to request. Default: the first model listed by the server's /v1/models",
    )
    endpoint: str = option(
        "--endpoint",
        "completions",
        "completions (/v1/completions), chat (/v1/chat/completions), embeddings (/v1/embeddings: not "
        "streamed, --batch-size inputs per request) or rerank (/v1/rerank: not streamed, a query and "
        "--documents documents per request)",
        choices=sorted(kinds.paths()),
    )
    max_tokens: int = option("--max-tokens", 256, "max_tokens per request")
    temperature: float = option("--temperature", 0.0, "Sampling temperature (0 for deterministic comparisons)")
    ignore_eos: bool = option(
        "--ignore-eos",
        False,
        "Send ignore_eos (vLLM, SGLang, llama.cpp) so every request generates exactly --max-tokens. Refused "
        "(exit code 3, nothing sent) with a server type that has no such field (openai, tgi): lengths would "
        "not be exact, and a strict API rejects the field",
    )
    chat_template_kwargs: str = option(
        "--chat-template-kwargs",
        "",
        "Chat endpoint: a JSON object sent as chat_template_kwargs, e.g. '{\"enable_thinking\": false}' for Qwen3",
    )
    tools: str = option(
        "--tools",
        "",
        "Chat endpoint: a JSON file holding a list of OpenAI tool definitions sent with every request "
        "(run.json keeps its path, sha256 and tool names)",
    )
    tool_choice: str = option(
        "--tool-choice",
        "",
        "With --tools: auto, none, required or the NAME of one of the tools (sent as tool_choice)",
    )
    extra_body: str = option(
        "--extra-body",
        "",
        "A JSON object merged into every request body (server-specific fields, e.g. '{\"top_k\": 20}'; saved in"
        " run.json: no secrets): objects merge key by key, other values replace the suite's; model, prompt, "
        "messages, max_tokens (their own options) and a stream other than true are refused",
    )
    read_timeout: float = option(
        "--read-timeout",
        600.0,
        "Seconds the server may take to answer a request's headers, then each complete line of its stream (a "
        "non-streamed answer: its whole body); a request that waits longer fails as a timeout. A stream trickling "
        "bytes without completing a line keeps nothing alive. Long by default: a queued request may wait minutes "
        "for its first token",
    )
    no_continuous_usage: bool = option(
        "--no-continuous-usage",
        False,
        "Do not ask for stream_options.continuous_usage_stats (for servers that reject it)",
    )
    keep_alive: bool = option(
        "--keep-alive",
        False,
        "Reuse each user's connection between requests. Off by default: uvicorn (vLLM's HTTP server) can drop"
        " a request that arrives right after the previous response on the same connection",
    )


TOOL_CHOICES = ("auto", "none", "required")
# OpenAI's constraint on a function's name (its API answers any other with a 400).
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
THINKING_EXAMPLE = """--chat-template-kwargs '{"enable_thinking": false}'"""
EXTRA_EXAMPLE = """--extra-body '{"top_k": 20}'"""

# --extra-body fields the suite's measurement rests on: each has an option of its own, and a body that changed it
# would no longer be what the run's records, run.json and the dataset's token counts say was sent.
OWN_FIELDS = {
    "model": "--model",
    "prompt": "--prompt, --prompt-file or --dataset",
    "messages": "--prompt, --prompt-file or --dataset",
    "max_tokens": "--max-tokens or --max-tokens-dist",
    "max_completion_tokens": "--max-tokens or --max-tokens-dist",
}
# The fields --extra-body may carry that the request options also set: giving both is refused (which one is sent?).
FLAG_FIELDS = {
    "chat_template_kwargs": "--chat-template-kwargs",
    "tools": "--tools",
    "tool_choice": "--tool-choice",
}


@dataclass(frozen=True)
class RequestFields:
    """The parsed request options of a run: the fields added to every chat request, and --extra-body."""

    chat_template_kwargs: dict | None = None
    tools: list | None = None
    tool_choice: str | dict | None = None
    extra_body: dict | None = None
    tools_path: str = ""
    tools_sha256: str | None = None
    tool_names: tuple[str, ...] = ()
    chat: dict = field(default_factory=dict)  # the chat fields, in the order they are sent

    @property
    def empty(self) -> bool:
        return not self.chat and not self.extra_body


NONE = RequestFields()


def _json_error(e: json.JSONDecodeError) -> str:
    if e.doc in _CONSTANTS:  # raised by _no_constant, which knows no position
        return e.msg
    return f"{e.msg} at line {e.lineno} column {e.colno}"


_CONSTANTS = ("NaN", "Infinity", "-Infinity")


def _no_constant(name: str) -> None:
    # Python's json reads NaN and Infinity, which are not JSON: a server would reject the body they make.
    raise json.JSONDecodeError(f"{name} is not JSON", name, 0)


def _kind(value: object) -> str:
    return {list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number" if isinstance(value, int | float) else type(value).__name__
    )


def parse_object(text: str, flag: str, example: str) -> dict | None:
    """A JSON object option: None when empty; raises ValueError naming the flag, the JSON error's position and the
    fix."""
    text = str(text or "").strip()
    if not text:
        return None
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise ValueError(f"{flag} is not valid JSON ({_json_error(e)}); give a JSON object, e.g. {example}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{flag} must be a JSON object, not {_kind(value)}; e.g. {example}")
    return value


def check_tool(index: int, tool: object, path: str) -> str:
    """One tool definition's shape (OpenAI's {"type": "function", "function": {"name", "parameters"?,
    "description"?}}); returns its function's name, raises ValueError naming the file and the index."""
    where = f"--tools {path}: tools[{index}]"
    shape = 'each entry is {"type": "function", "function": {"name": "...", "parameters": {...}}}'
    if not isinstance(tool, dict):
        raise ValueError(f"{where} is {_kind(tool)}, not an object; {shape}")
    if tool.get("type") != "function":
        raise ValueError(f"{where} has type {tool.get('type')!r}, not 'function'; {shape}")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise ValueError(f'{where} has no "function" object; {shape}')
    name = function.get("name")
    if not isinstance(name, str) or not TOOL_NAME.match(name):
        raise ValueError(f"{where} has function name {name!r}: it must be 1 to 64 letters, digits, '_' or '-'; {shape}")
    if "parameters" in function and not isinstance(function["parameters"], dict):
        raise ValueError(
            f'{where} ({name}): "parameters" is {_kind(function["parameters"])}; it must be a JSON Schema '
            'object, e.g. {"type": "object", "properties": {}}'
        )
    if "description" in function and not isinstance(function["description"], str):
        raise ValueError(f'{where} ({name}): "description" is {_kind(function["description"])}, not a string')
    return name


def load_tools(path: str) -> tuple[list, str]:
    """--tools FILE: its tool definitions (a non-empty JSON list, each checked) and the file's sha256; raises
    ValueError with one line naming the file."""
    try:
        data = Path(path).expanduser().read_bytes()
    except OSError as e:
        raise ValueError(
            f"--tools {path} cannot be read ({e.strerror or e}); give a JSON file holding a list of tool definitions"
        ) from None
    try:
        tools = json.loads(data, parse_constant=_no_constant)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        why = _json_error(e) if isinstance(e, json.JSONDecodeError) else "not UTF-8 text"
        raise ValueError(f"--tools {path} is not valid JSON ({why}); give a JSON list of tool definitions") from None
    if isinstance(tools, dict) and isinstance(tools.get("tools"), list):
        hint = ' (it holds {"tools": [...]}: keep only the list)'
    else:
        hint = ""
    if not isinstance(tools, list) or not tools:
        what = "an empty list" if tools == [] else _kind(tools) if not isinstance(tools, dict) else "an object"
        raise ValueError(f"--tools {path} must hold a non-empty JSON list of tool definitions, not {what}{hint}")
    seen: dict[str, int] = {}
    for index, tool in enumerate(tools):
        name = check_tool(index, tool, path)
        if name in seen:
            raise ValueError(
                f"--tools {path}: tools[{index}] repeats the function name {name!r} of tools[{seen[name]}]; give each "
                "tool its own name"
            )
        seen[name] = index
    return tools, hashlib.sha256(data).hexdigest()


def tool_choice_field(text: str, names: tuple[str, ...], path: str) -> str | dict | None:
    """--tool-choice as sent: auto, none or required as they are, a tool's NAME as {"type": "function",
    "function": {"name": NAME}}; raises ValueError when it names no tool of --tools."""
    choice = str(text or "").strip()
    if not choice:
        return None
    if not path:
        raise ValueError(f"--tool-choice {choice} needs --tools FILE (the tools it chooses from); add --tools")
    if choice in TOOL_CHOICES:  # a keyword wins over a tool of the same name, as in OpenAI's API
        return choice
    if choice not in names:
        raise ValueError(
            f"--tool-choice {choice!r} is not auto, none, required or the name of a tool in {path} (its tools: "
            f"{', '.join(names)})"
        )
    return {"type": "function", "function": {"name": choice}}


def check_extra_body(extra: dict | None, options) -> None:
    """--extra-body's fields: none of those the measurement rests on (OWN_FIELDS), stream only true,
    stream_options.include_usage only true, n only 1, and no field a request option also sets."""
    if not extra:
        return
    for key, flag in OWN_FIELDS.items():
        if key in extra:
            raise ValueError(f"--extra-body sets {key!r}, which the suite sets itself; use {flag} instead")
    if "stream" in extra and extra["stream"] is not True:
        raise ValueError(
            f'--extra-body sets "stream": {json.dumps(extra["stream"])}; the suite measures streamed answers, so '
            "stream stays true: drop it"
        )
    stream_options = extra.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise ValueError(
            f'--extra-body sets "stream_options" to {_kind(stream_options)}; it must be an object, e.g. '
            '{"stream_options": {"continuous_usage_stats": false}}'
        )
    if isinstance(stream_options, dict) and stream_options.get("include_usage", True) is not True:
        raise ValueError(
            "--extra-body sets stream_options.include_usage to "
            f"{json.dumps(stream_options['include_usage'])}; the suite counts tokens from the final usage: drop it"
        )
    if "n" in extra and extra["n"] != 1:
        raise ValueError(
            f'--extra-body sets "n": {json.dumps(extra["n"])}; the suite measures one answer per request: drop it'
        )
    for key, flag in FLAG_FIELDS.items():
        if key in extra and str(getattr(options, flag[2:].replace("-", "_")) or "").strip():
            raise ValueError(f"--extra-body sets {key!r} and {flag} is given too; give it once")


def key(options) -> tuple:
    """The option texts the request fields depend on."""
    return tuple(
        str(getattr(options, name) or "").strip()
        for name in ("chat_template_kwargs", "tools", "tool_choice", "extra_body", "endpoint")
    )


def parse(options) -> RequestFields:
    """The run's request options, parsed and checked (no cache); raises ValueError with a one-line message."""
    kwargs_text, tools_path, choice_text, extra_text, endpoint = key(options)
    kwargs = parse_object(kwargs_text, "--chat-template-kwargs", THINKING_EXAMPLE)
    extra = parse_object(extra_text, "--extra-body", EXTRA_EXAMPLE)
    if endpoint != "chat":
        for flag, given in (
            ("--chat-template-kwargs", kwargs_text),
            ("--tools", tools_path),
            ("--tool-choice", choice_text),
        ):
            if given:
                raise ValueError(
                    f"{flag} only applies to --endpoint chat (the completions endpoint takes a bare prompt: no chat "
                    f"template, no tools); add --endpoint chat or drop {flag}"
                )
    tools, digest, names = None, None, ()
    if tools_path:
        tools, digest = load_tools(tools_path)
        names = tuple(t["function"]["name"] for t in tools)
    choice = tool_choice_field(choice_text, names, tools_path)
    check_extra_body(extra, options)
    chat: dict = {}
    if kwargs is not None:
        chat["chat_template_kwargs"] = kwargs
    if tools is not None:
        chat["tools"] = tools
    if choice is not None:
        chat["tool_choice"] = choice
    return RequestFields(
        chat_template_kwargs=kwargs, tools=tools, tool_choice=choice, extra_body=extra, tools_path=tools_path,
        tools_sha256=digest, tool_names=names, chat=chat,
    )  # fmt: skip


def check(options) -> RequestFields:
    """Before any load: every request option parses (startup.check_options); the file of --tools is read again, so a
    web UI run sees its current content."""
    return parse(options)


def fields(options) -> RequestFields:
    """The run's request options, parsed now (NONE without any); a process's users take theirs from its
    FieldsCache instead (resources.ProcessResources.request_fields), parsed once per run."""
    return parse(options) if any(key(options)[:4]) else NONE


class FieldsCache:
    """A process's parsed request options, once per option text (held by its RunContext): build_payload runs per
    body. Cleared at each run's start, so the web UI's next run reads the --tools file again."""

    def __init__(self) -> None:
        self._parsed: dict[tuple, RequestFields] = {}

    def get(self, options) -> RequestFields:
        k = key(options)
        if k not in self._parsed:
            self._parsed[k] = fields(options)
        return self._parsed[k]

    def clear(self) -> None:
        self._parsed.clear()


# What a chat template renders into the prompt: the fields a tokenizer endpoint that applies the template (vLLM's
# /tokenize: TokenizeChatRequest.tools, .chat_template_kwargs) is asked with, so synthetic:N counts them.
TEMPLATE_FIELDS = ("chat_template_kwargs", "tools")


def tokenize_fields(options) -> dict:
    """The request fields the chat template renders (tools, chat_template_kwargs; --extra-body's win), for the
    tokenizer to count chat messages as the server will; {} without them or when they do not parse."""
    try:
        parsed = fields(options)
    except ValueError:  # refused before the run; the dataset is not the place to say it
        return {}
    out = {k: v for k, v in parsed.chat.items() if k in TEMPLATE_FIELDS}
    out.update({k: v for k, v in (parsed.extra_body or {}).items() if k in TEMPLATE_FIELDS})
    return out


def tokenize_key(options) -> tuple:
    """What tokenize_fields depends on, for the keys of built datasets and replays."""
    try:
        parsed = fields(options)
    except ValueError:
        return ()
    return (json.dumps(tokenize_fields(options), sort_keys=True), parsed.tools_sha256)


def merge(body: dict, extra: dict) -> dict:
    """--extra-body merged into a request body: an object merges key by key (so '{"stream_options":
    {"continuous_usage_stats": false}}' keeps include_usage), anything else replaces the suite's value."""
    for key, value in extra.items():
        mine = body.get(key)
        body[key] = merge(dict(mine), value) if isinstance(mine, dict) and isinstance(value, dict) else value
    return body


def run_entry(options) -> dict | None:
    """run.json's `request_options`: what the options made every request carry (the tools file by its path, sha256
    and function names, not its content); None when none is given or they do not parse."""
    try:
        parsed = fields(options)
    except ValueError:
        return None
    if parsed.empty:
        return None
    return {
        "chat_template_kwargs": parsed.chat_template_kwargs,
        "tools": None
        if parsed.tools is None
        else {"path": parsed.tools_path, "sha256": parsed.tools_sha256, "names": list(parsed.tool_names)},
        "tool_choice": parsed.tool_choice,
        "extra_body": parsed.extra_body,
    }


def describe(options) -> str | None:
    """The one console line about what every request carries besides the prompt; None when nothing."""
    entry = run_entry(options)
    if entry is None:
        return None
    parts = []
    if entry["chat_template_kwargs"] is not None:
        parts.append(f"chat_template_kwargs {json.dumps(entry['chat_template_kwargs'])}")
    if entry["tools"] is not None:
        parts.append(f"tools {', '.join(entry['tools']['names'])} (from {entry['tools']['path']})")
    if entry["tool_choice"] is not None:
        parts.append(f"tool_choice {json.dumps(entry['tool_choice'])}")
    if entry["extra_body"]:
        parts.append(f"extra body fields {', '.join(entry['extra_body'])}")
    return "Request options: " + "; ".join(parts) if parts else None


def register(environment, ctx) -> None:
    """run.json's `request_options` section, and its one console line as the run starts (the controller's)."""
    ctx.sections["request_options"] = lambda: run_entry(environment.parsed_options)
    if not ctx.is_controller:
        return

    def on_started(options, **_kw) -> None:
        described = describe(options)
        if described:
            logger.info(described)

    ctx.run_events.started.add_listener(on_started)
