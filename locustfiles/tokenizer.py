"""The server's tokenizer, asked for exact prompt lengths by --dataset's sources and --trace's prompts (vLLM's
POST /tokenize, or the server profile's endpoint: analysis/servers), and the error a prompt that cannot be built
raises."""

from __future__ import annotations

import json

from geventhttpclient import HTTPClient
from geventhttpclient.url import URL

from ..analysis import servers
from . import request_options


class DatasetError(ValueError):
    """Bad --dataset input or a dataset that cannot be built; the message is one line with the fix."""


# --- the server's tokenizer ---------------------------------------------------------------------------------
DEFAULT_TOKENIZER = servers.PROFILES["vllm"].tokenizer


class Tokenizer:
    """Token counts from the server's tokenizer endpoint (vLLM's POST /tokenize, or the profile's: analysis/servers),
    counted as the server counts a request's prompt."""

    MISSING = (404, 405, 501)  # no such endpoint

    def __init__(
        self,
        host: str,
        model: str,
        api_key: str | None = None,
        timeout: float = 30.0,
        endpoint: servers.TokenizerEndpoint | None = DEFAULT_TOKENIZER,
        chat: bool = False,
        server: str = "vllm",
        chat_fields: dict | None = None,
    ) -> None:
        base = URL(host)
        self.endpoint = endpoint
        self.chat = chat  # the run's endpoint is chat: prompts are messages, counted with the chat template
        # The request options the chat template renders (tools, chat_template_kwargs), counted with the messages.
        self.chat_fields = chat_fields or {}
        self.server = server
        self.path = base.path.rstrip("/") + (endpoint.path if endpoint is not None else "/tokenize")
        self.model = model
        # A fresh connection per call: uvicorn (vLLM's HTTP server) can drop a request sent on a kept-alive
        # connection right after the previous response (uvicorn #824/#1637), and these calls come back to back.
        self.headers = {"Content-Type": "application/json", "Accept": "application/json", "Connection": "close"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.client = HTTPClient.from_url(base, connection_timeout=min(10.0, timeout), network_timeout=timeout)
        self.max_model_len: int | None = None
        self.calls = 0

    def _post(self, body: dict) -> tuple[int, bytes]:
        try:
            response = self.client.post(self.path, body=json.dumps(body).encode(), headers=self.headers)
            self.calls += 1
            return response.status_code, response.read()
        except Exception as e:  # transport errors of any kind: one line naming the endpoint
            raise DatasetError(
                f"the server's {self.path} failed ({type(e).__name__}: {e}) while building the dataset"
            ) from None

    def probe(self) -> str | None:
        """None when the tokenizer answers; else why not (one line, for the fallback's warning)."""
        if self.endpoint is None:
            return f"--server-type {self.server} has no tokenizer endpoint"
        if self.chat and not self.endpoint.chat:
            return f"the {self.server} tokenizer endpoint cannot apply the chat template to messages"
        try:
            status, body = self._post(servers.tokenize_body(self.endpoint, self.model, "hello"))
        except DatasetError as e:  # no usable tokenizer: the caller warns and falls back to estimates
            return str(e)
        if status != 200:
            return f"HTTP {status}" + ("" if status in self.MISSING else f": {body[:200].decode(errors='replace')}")
        try:
            answer = json.loads(body)
            servers.token_count(self.endpoint, answer)
        except (ValueError, KeyError, TypeError):
            return "its answer has no token count"
        self.max_model_len = servers.max_model_len(self.endpoint, answer)
        return None

    def count(self, prompt: str | list[dict], special: bool = True) -> int:
        """Tokens of a prompt (with the special tokens the server adds, e.g. BOS) or of chat messages (with the
        chat template); `special=False` counts bare text, as for a reference answer."""
        if self.endpoint is None:
            raise DatasetError(f"--server-type {self.server} has no tokenizer endpoint")
        body = servers.tokenize_body(self.endpoint, self.model, prompt, special)
        if isinstance(prompt, list) and self.chat_fields:
            body.update(self.chat_fields)
        status, answer = self._post(body)
        if status != 200:
            raise DatasetError(
                f"the server's {self.endpoint.path} answered HTTP {status} "
                f"({answer[:200].decode(errors='replace')}) while building the dataset; use --dataset fixed or fix "
                "the server"
            )
        return servers.token_count(self.endpoint, json.loads(answer))

    def close(self) -> None:
        self.client.close()


def server_tokenizer(host: str, model: str, api_key: str | None, options) -> Tokenizer:
    """The server's tokenizer for the run's options: its profile's endpoint, the chat template's fields (tools,
    chat_template_kwargs) on the chat endpoint; shared by --dataset and --trace."""
    profile = servers.of_options(options)
    return Tokenizer(
        host, model, api_key, timeout=min(60.0, float(options.read_timeout)), endpoint=profile.tokenizer,
        chat=options.endpoint == "chat", server=profile.name, chat_fields=request_options.tokenize_fields(options),
    )  # fmt: skip
