"""The embeddings request on the Locust side: StreamClient.fetch (one read stamp for the body's last byte, whatever
its framing), and in-process runs against tests/fakeserver.py's /v1/embeddings: every request carries its batch of
consecutive dataset texts, a malformed or cut answer is an error record of its category (bad_response,
connection_error, timeout), never a crash, and --encoding-format base64 is read. (A real `locust` process at 8
users, timed against the server: tests/test_embeddings_run.py.)"""

from __future__ import annotations

import json
import subprocess
import sys

import locust  # noqa: F401 - first: it monkey-patches the standard library for gevent
import pandas as pd
import pytest
from geventhttpclient.url import URL
from vllm_loadtest.analysis.records import load_records
from vllm_loadtest.locustfiles.kinds import fetched
from vllm_loadtest.locustfiles.kinds.embeddings import embeddings_payload
from vllm_loadtest.locustfiles.kinds.fetched import item_text as embedding_text
from vllm_loadtest.locustfiles.openai_user import OpenAIStreamingUser
from vllm_loadtest.locustfiles.stream_client import StreamClient

from tests.helpers.inprocess import parse_options, run_in_process

pytestmark = pytest.mark.unit

# A server that answers every connection with the given pieces of bytes, each after its delay, then closes (an
# RST instead with "reset"): framings and splits the fake server does not make.
RAW_SERVER = r"""
import json, socket, struct, sys, time
pieces, reset = json.loads(sys.argv[1]), sys.argv[2] == "reset"
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); srv.bind(("127.0.0.1", 0))
srv.listen(8); print(srv.getsockname()[1], flush=True)
while True:
    conn, _ = srv.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int([l.split(b":")[1] for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0])
    while len(body) < length:
        body += conn.recv(65536)
    for delay, text in pieces:
        time.sleep(delay)
        conn.sendall(text.encode("latin-1"))
    if reset:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()
"""


@pytest.fixture
def raw_server():
    procs = []

    def start(pieces: list[tuple[float, str]], reset: bool = False) -> str:
        proc = subprocess.Popen(
            [sys.executable, "-c", RAW_SERVER, json.dumps(pieces), "reset" if reset else "close"],
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        return f"http://127.0.0.1:{proc.stdout.readline().strip()}"

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def client(url: str) -> StreamClient:
    return StreamClient(URL(url), "/v1/embeddings", {"Content-Type": "application/json"}, 5.0, 5.0, False)


BODY = '{"data":[{"index":0,"embedding":[1.0,2.0]}],"usage":{"prompt_tokens":3}}'


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel stamps", "user-space stamps"])
def test_fetch_stamps_the_read_that_completed_a_split_body(raw_server, kernel):
    head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(BODY)}\r\n\r\n"
    url = raw_server([(0.0, head + BODY[:10]), (0.15, BODY[10:])])
    http = client(url)
    http.kernel_stamps = http.kernel_stamps and kernel  # as on a platform without SO_TIMESTAMPNS, or over TLS
    try:
        body = http.fetch(http.prepare(b"{}"), "r1")
    finally:
        http.close()
    assert bytes(body) == BODY.encode() and http.status == 200 and http.complete
    assert http.nbytes == len(BODY) and http.content_type == "application/json"
    # The body's last byte came 0.15 s after its first: the stamp is that last read's, not the first one's.
    assert 0.15 <= http.last_offset_s < 5.0


def test_fetch_reads_a_chunked_body_and_one_delimited_by_the_close(raw_server):
    chunked = f"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n{len(BODY[:7]):x}\r\n{BODY[:7]}\r\n"
    rest = f"{len(BODY[7:]):x}\r\n{BODY[7:]}\r\n0\r\n\r\n"
    for pieces in ([(0.0, chunked), (0.1, rest)], [(0.0, "HTTP/1.1 200 OK\r\n\r\n" + BODY[:7]), (0.1, BODY[7:])]):
        http = client(raw_server(pieces))
        try:
            body = http.fetch(http.prepare(b"{}"), "r1")
        finally:
            http.close()
        assert bytes(body) == BODY.encode() and http.complete, pieces
        # The close (read as b"") is noticed after the last byte: the stamp is the last read that brought bytes.
        assert 0.1 <= http.last_offset_s < 5.0


def test_fetch_of_a_body_cut_short_is_not_complete(raw_server):
    head = f"HTTP/1.1 200 OK\r\ncontent-length: {len(BODY)}\r\n\r\n"
    http = client(raw_server([(0.0, head + BODY[:10])]))
    try:
        body = http.fetch(http.prepare(b"{}"), "r1")
    finally:
        http.close()
    assert http.status == 200 and not http.complete and bytes(body) == BODY[:10].encode() and http.nbytes == 10


def test_fetch_keeps_the_start_of_an_error_body(raw_server):
    error = '{"error": {"message": "model is not an embedding model"}}'
    head = f"HTTP/1.1 400 Bad Request\r\ncontent-length: {len(error)}\r\n\r\n"
    http = client(raw_server([(0.0, head + error)]))
    try:
        http.fetch(http.prepare(b"{}"), "r1")
    finally:
        http.close()
    assert http.status == 400 and http.error_body == error.encode()


def test_the_body_is_the_contract_and_extra_body_is_merged_last(tmp_path):
    opts = parse_options("--endpoint", "embeddings", "--encoding-format", "base64", "--extra-body", '{"dimensions": 4}')
    assert embeddings_payload(opts, "m", ["a"]) == {
        "model": "m", "input": ["a"], "encoding_format": "base64", "dimensions": 4,
    }  # fmt: skip
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
    ]
    assert embedding_text(messages) == "be brief\nhi" and embedding_text("plain") == "plain"


class User(OpenAIStreamingUser):
    pass


def run(server, tmp_path, *args: str, users: int = 4, seconds: float = 3, min_records: int = 0) -> pd.DataFrame:
    # `min_records`: what the test's assertions need, waited for however slowly a busy machine gets there.
    run_in_process(
        User, server.url, tmp_path, "--endpoint", "embeddings", "--dataset", "synthetic:24", "--num-prompts", "10",
        "--read-timeout", "1", *args, users=users, seconds=seconds, min_records=min_records,
    )  # fmt: skip
    return load_records(tmp_path)


def test_every_request_carries_its_batch_of_consecutive_dataset_texts(fake_server, tmp_path):
    server = fake_server("--embed-ms", "3", "--embed-dim", "16")
    records = run(server, tmp_path, "--batch-size", "3", min_records=48)
    ok = records[records["status"] == "ok"]
    truth = server.get("/truth")
    prompts = {p["request_id"]: p for p in server.get("/prompts")["prompts"]}
    assert len(ok) >= 40 and ok["request_id"].isin(truth).all()
    assert (ok["endpoint"] == "embeddings").all() and (ok["inputs"] == 3).all()
    # 24 tokens per input by the server's tokenizer (synthetic:24), usage.prompt_tokens the batch's sum.
    assert (ok["prompt_tokens"] == 72).all()
    assert all(truth[r]["input_tokens"] == [24, 24, 24] for r in ok["request_id"])
    # Streaming fields do not apply: missing, never 0.
    for column in ("ttft_s", "tpot_s", "output_tokens", "finish_reason", "ttfo_s", "max_tokens"):
        assert ok[column].isna().all(), column
    # duration_s runs on perf_counter from just after the wall-clock send stamp: equal to e2e_s within microseconds.
    assert (ok["chunks"] == 0).all() and (ok["e2e_s"] >= 0.003).all() and (ok["duration_s"] > ok["e2e_s"] - 1e-4).all()
    # The 10 texts in batches of 3 consecutive ones (modulo 10): a user's batches, joined, run through the dataset's
    # cycle of 10 texts, and every user runs through the same cycle (from its own starting batch).
    cycle = None
    for _, user in ok.groupby(ok["request_id"].str[:20]):  # the id's per-user prefix
        sequence = [t for r in user.sort_values("start_time")["request_id"] for t in prompts[r]["input"]]
        assert len(sequence) >= 12
        assert all(sequence[i] == sequence[i + 10] for i in range(len(sequence) - 10))
        assert len(set(sequence[:10])) == 10
        if cycle is None:
            cycle = sequence[:10]
        shift = cycle.index(sequence[0])
        assert sequence[:10] == cycle[shift:] + cycle[:shift]


def test_malformed_and_cut_answers_are_error_records_of_their_category(fake_server, tmp_path):
    faults = "wrong_count=5,ragged=7,no_usage=11,html=13,truncate=17,reset=19,http_500=23,stall=29"
    server = fake_server("--embed-ms", "2", "--faults", faults, "--stall-s", "2")
    records = run(server, tmp_path, "--batch-size", "2", users=4, seconds=5)
    stats = server.get("/stats")
    cut = records["error_type"] == "cut_off"
    counts = records[~cut].groupby("error_type").size().to_dict()
    expected = {
        "bad_response": sum(stats["faults"].get(k, 0) for k in ("wrong_count", "ragged", "no_usage", "html")),
        "connection_error": sum(stats["faults"].get(k, 0) for k in ("truncate", "reset")),
        "http_500": stats["faults"].get("http_500", 0),
        "timeout": stats["faults"].get("stall", 0),
    }
    assert all(n > 0 for n in expected.values()), stats
    for category, n in expected.items():
        assert n - cut.sum() <= counts.get(category, 0) <= n, (category, counts, stats)
    bad = records[records["error_type"] == "bad_response"]
    messages = " | ".join(bad["error"].unique())
    for part in ("1 embedding(s) for 2 input(s)", "data[1] has 7 values, data[0] 8", "no usage.prompt_tokens",
                 "not JSON"):  # fmt: skip
        assert part in messages, messages
    assert bad["e2e_s"].notna().all()  # the body came whole: its time is known, the request still failed
    assert records.loc[records["error_type"] == "connection_error", "e2e_s"].isna().all()
    ok = records[records["status"] == "ok"]
    assert len(ok) > 0 and (ok["prompt_tokens"] == 2 * 24).all()


def test_base64_vectors_are_read(fake_server, tmp_path):
    server = fake_server("--embed-ms", "2", "--embed-dim", "32")
    records = run(server, tmp_path, "--encoding-format", "base64", "--batch-size", "4", users=2, min_records=24)
    truth = server.get("/truth")
    ok = records[records["status"] == "ok"]
    assert len(ok) >= 20 and (records["status"] == "ok").mean() > 0.9
    assert all(truth[r]["encoding_format"] == "base64" and truth[r]["inputs"] == 4 for r in ok["request_id"])


def test_bodies_serialized_per_request_carry_the_same_batches(fake_server, tmp_path, monkeypatch):
    # Too much text to prepare (the limit set to 0 bytes): each body is serialized before its send instead.
    monkeypatch.setattr(fetched, "PREPARED_BYTES", 0)
    server = fake_server("--embed-ms", "2")
    records = run(server, tmp_path, "--batch-size", "4", users=2, min_records=24)
    ok = records[records["status"] == "ok"]
    prompts = {p["request_id"]: p["input"] for p in server.get("/prompts")["prompts"]}
    assert len(ok) >= 20 and (ok["prompt_tokens"] == 96).all()
    for _, user in ok.groupby(ok["request_id"].str[:20]):
        sequence = [t for r in user.sort_values("start_time")["request_id"] for t in prompts[r]]
        assert len(set(sequence[:10])) == 10 and all(sequence[i] == sequence[i + 10] for i in range(len(sequence) - 10))


def test_an_input_that_carries_the_request_id_gets_each_requests_own(fake_server, tmp_path):
    server = fake_server("--embed-ms", "2")
    records = run(server, tmp_path, "--batch-size", "2", "--dataset", "shared-prefix:16", users=2, min_records=24)
    ok = records[records["status"] == "ok"]
    prompts = {p["request_id"]: p["input"] for p in server.get("/prompts")["prompts"]}
    assert len(ok) >= 20
    for request_id in ok["request_id"]:
        assert all(f"Request {request_id}." in text for text in prompts[request_id]), prompts[request_id]


@pytest.mark.parametrize("keep_alive", [False, True])
def test_keep_alive_reuses_each_users_connection(fake_server, tmp_path, keep_alive):
    server = fake_server("--embed-ms", "2")
    records = run(server, tmp_path, *(["--keep-alive"] if keep_alive else []), users=2, min_records=24)
    stats = server.get("/stats")
    records = records[records["error_type"] != "cut_off"]  # in flight when the run stopped
    assert (records["status"] == "ok").all() and len(records) >= 20
    # Without it a fresh connection per request (the suite's default); with it one per user.
    if keep_alive:
        assert stats["embed_connections"] == 2, stats
    else:
        assert stats["embed_connections"] == stats["requests"], stats
