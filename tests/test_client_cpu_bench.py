"""Issue 36's benchmark parts: the server on vLLM's HTTP stack answers exactly as the vLLM 0.32 capture does and
counts what it sent, and the profile's split names each sampled stack's part."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import orjson
import pytest

from tests.benchmarks import profile_client
from tests.helpers.paths import ROOT

# Not imported from the server's module: Starlette imports ssl before Locust's gevent patches it (in this process).
CAPTURE = ROOT / "tests" / "fixtures" / "completions_continuous_usage.sse"

pytestmark = pytest.mark.unit


def events(body: bytes) -> list[bytes]:
    return [e[6:] for e in body.split(b"\n\n") if e.startswith(b"data: ")]


@pytest.fixture
def server():
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.benchmarks.vllmhttpserver", "--ttft-ms", "1", "--itl-ms", "1"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening on "), line
        yield f"http://127.0.0.1:{int(line.split()[-1])}"
    finally:
        proc.kill()
        proc.wait()


def get(url: str):
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def test_the_stream_is_vllms_shape_one_event_per_token_and_counted(server):
    body = orjson.dumps({"model": "m", "prompt": "one two three", "max_tokens": 4, "stream": True})
    request = urllib.request.Request(
        server + "/v1/completions", data=body, headers={"X-Request-Id": "r1", "Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as r:
        assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
        assert r.headers["transfer-encoding"] == "chunked"
        got = events(r.read())
    captured = events(CAPTURE.read_bytes())
    assert got[-1] == captured[-1] == b"[DONE]"
    objs = [orjson.loads(e) for e in got[:-1]]
    reference = [orjson.loads(e) for e in captured[:-1]]
    assert [list(o) for o in objs[:-1]] == [list(reference[0])] * 4  # the capture's keys, in its order
    assert list(objs[0]["choices"][0]) == list(reference[0]["choices"][0])
    assert [o["usage"]["completion_tokens"] for o in objs[:-1]] == [1, 2, 3, 4]  # continuous usage
    assert [o["choices"][0]["finish_reason"] for o in objs[:-1]] == [None, None, None, "length"]
    assert list(objs[-1]) == list(reference[-1]) and objs[-1]["choices"] == []  # the usage-only chunk
    assert objs[-1]["usage"] == {"prompt_tokens": 3, "total_tokens": 7, "completion_tokens": 4}
    assert len({o["id"] for o in objs}) == 1 and objs[0]["model"] == "m"
    assert get(server + "/counter")["tokens"] == 4
    truth = get(server + "/truth")["r1"]
    assert len(truth["sent"]) == 4 and truth["received"] <= truth["sent"][0]
    assert get(server + "/version") == {"version": "0.32.0"}


STREAM = "StreamClient.stream (locustfiles/stream_client.py:{})"
USER = "User.run (locust/user/users.py:174);StreamingRequester._send (locustfiles/kinds/streaming.py:241)"


def line_of(text: str) -> int:
    lines = (ROOT / "locustfiles" / "stream_client.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line and "#" not in line.split(text)[0])


@pytest.mark.parametrize(
    ("leaf", "part"),
    [
        (STREAM.format(line_of("wait(readable)")), "wait"),
        (STREAM.format(line_of("raw.recvmsg(")), "recv"),
        (STREAM.format(line_of("feed(data)")), "llhttp"),
        (STREAM.format(line_of(".split(b")), "split + parser call"),
        (STREAM.format(line_of(".split(b")) + ";StreamParser.feed (analysis/sse.py:171)", "SSE + orjson"),
        (STREAM.format(line_of("pool.get_socket()")), "connect"),
        (STREAM.format(line_of("sock.sendall(")), "send"),
    ],
)
def test_a_stack_is_named_by_its_first_part_from_the_leaf(leaf, part):
    assert profile_client.classify(f"{USER};{leaf}".split(";")) == part


def test_the_hub_and_the_rest():
    assert profile_client.classify(["Hub.run (gevent/hub.py:647)"]) == "hub"
    assert profile_client.classify(["SelfCheck._probe (locustfiles/selfcheck.py:76)"]) == "other"


def test_the_split_counts_the_main_thread_only():
    raw = "\n".join(
        [
            f"thread (1);{USER};{STREAM.format(line_of('raw.recvmsg('))} 3",
            "thread (1);Hub.run (gevent/hub.py:647) 1",
            "thread (2);_WorkerGreenlet.run (gevent/threadpool.py:216) 50",
        ]
    )
    parts, _, total = profile_client.split(raw)
    assert total == 4 and parts["recv"] == 3 and parts["hub"] == 1
