"""Every injected failure is counted, categorized and recorded; the run goes on."""

import pandas as pd

from analysis.records import load_records
from locustfiles.openai_user import OpenAIStreamingUser
from tests.conftest import run_in_process

# fake server fault kind -> the category the client must record
EXPECTED = {
    "http_429": "http_429",
    "http_500": "http_500",
    "http_503": "http_503",
    "stream_error": "stream_error",
    "truncate": "connection_error",
    "reset": "connection_error",
    "no_done": "incomplete_stream",
    "bad_json": "malformed_json",
    "html": "not_sse",
    "stall": "timeout",
}


class User(OpenAIStreamingUser):
    pass


def test_fault_matrix_is_counted_categorized_and_recorded(fake_server, tmp_path):
    schedule = (
        "http_429=23,http_500=7,http_503=29,stream_error=11,truncate=13,reset=17,no_done=19,bad_json=31,"
        "html=37,stall=41"
    )
    server = fake_server("--ttft-ms", "5", "--itl-ms", "2", "--faults", schedule, "--stall-s", "3")
    env = run_in_process(User, server.url, tmp_path, "--max-tokens", "16", "--read-timeout", "1", users=6, seconds=8)
    stats = server.get("/stats")
    records = load_records(tmp_path)

    # Every request the server saw has exactly one record; a record the server never saw can only be a request
    # that failed to reach it (a connection error or a timeout before the server read it).
    received = set(server.get("/received")["request_ids"])
    assert len(received) == stats["requests"] and records["request_id"].is_unique
    assert received <= set(records["request_id"])
    unseen = records[~records["request_id"].isin(received)]
    assert unseen["error_type"].isin(["connection_error", "timeout", "cut_off"]).all(), unseen[["error_type", "error"]]
    cut = records["error_type"] == "cut_off"
    assert cut.sum() <= 6  # at most one in flight per user when the run stopped
    counts = records[~cut].groupby("error_type").size().to_dict()
    for kind in stats["faults"]:
        category = EXPECTED[kind]
        same = [k for k, c in EXPECTED.items() if c == category]
        expected = sum(stats["faults"].get(k, 0) for k in same)
        assert expected - cut.sum() <= counts.get(category, 0) <= expected, (kind, counts)
    assert set(counts) <= set(EXPECTED.values())
    assert all(stats["faults"].get(k, 0) > 0 for k in EXPECTED), stats  # the run was long enough for each fault

    # The server's own message is kept for errors before the stream.
    e500 = records[records["error_type"] == "http_500"]
    assert (e500["error"] == "injected http_500").all() and (e500["http_status"] == 500).all()
    assert records.loc[records["error_type"] == "stream_error", "error"].eq("injected engine failure").all()

    # Locust's own statistics carry the same failures (cut-off requests are not server failures).
    entry = env.stats.get("/v1/completions", "POST")
    assert entry.num_failures == int((~cut & (records["status"] == "error")).sum())
    assert entry.num_requests == int((~cut).sum())
    ok = records[records["status"] == "ok"]
    assert len(ok) > 0 and (ok["output_tokens"] == 16).all()


def test_connection_refused_is_a_recorded_connection_error(tmp_path):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    run_in_process(User, f"http://127.0.0.1:{port}", tmp_path, "--model", "m", users=1, seconds=0.5)
    records = load_records(tmp_path)
    assert len(records) > 0
    assert (records["error_type"].isin(["connection_error", "cut_off"])).all()
    assert records["error"].str.contains("ConnectionRefused").any()
    assert pd.isna(records["ttft_s"]).all()
