"""Every injected failure is counted, categorized and recorded; the run goes on (in-process runs; the server dying
mid-run under a real `locust` process: tests/test_faults_run.py)."""

import time

import pandas as pd
import pytest
from vllm_loadtest.analysis.records import load_records
from vllm_loadtest.locustfiles.openai_user import OpenAIStreamingUser

from tests.helpers.inprocess import run_in_process

pytestmark = pytest.mark.unit

# fake server fault kind -> the category the client must record
EXPECTED = {
    "http_400": "http_400",
    "http_404": "http_404",
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
    "big": None,  # a 1 MiB chunk: read correctly, the request is ok
}


class User(OpenAIStreamingUser):
    pass


def test_fault_matrix_is_counted_categorized_and_recorded(fake_server, tmp_path):
    schedule = (
        "http_429=23,http_500=7,http_503=29,stream_error=11,truncate=13,reset=17,no_done=19,bad_json=31,"
        "html=37,stall=41,http_400=43,http_404=47,big=53"
    )
    server = fake_server("--ttft-ms", "5", "--itl-ms", "2", "--faults", schedule, "--stall-s", "3")
    env = run_in_process(User, server.url, tmp_path, "--max-tokens", "16", "--read-timeout", "1", users=6, seconds=8)
    # A request sent just before the users were stopped may reach the server's counters a moment later.
    deadline = time.monotonic() + 5
    while True:
        stats = server.get("/stats")
        received = set(server.get("/received")["request_ids"])
        if len(received) == stats["requests"] or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    records = load_records(tmp_path)

    # Every request the server saw has exactly one record; a record the server never saw can only be a request
    # that failed to reach it (a connection error or a timeout before the server read it).
    assert len(received) == stats["requests"] and records["request_id"].is_unique
    assert received <= set(records["request_id"])
    unseen = records[~records["request_id"].isin(received)]
    assert unseen["error_type"].isin(["connection_error", "timeout", "cut_off"]).all(), unseen[["error_type", "error"]]
    cut = records["error_type"] == "cut_off"
    assert cut.sum() <= 6  # at most one in flight per user when the run stopped
    counts = records[~cut].groupby("error_type").size().to_dict()
    for kind in stats["faults"]:
        category = EXPECTED[kind]
        if category is None:
            continue
        same = [k for k, c in EXPECTED.items() if c == category]
        expected = sum(stats["faults"].get(k, 0) for k in same)
        assert expected - cut.sum() <= counts.get(category, 0) <= expected, (kind, counts)
    assert set(counts) <= set(EXPECTED.values()) | {None}
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
    assert len(ok) > 0 and (ok["output_tokens"] == 16).all()  # the 1 MiB-chunk requests among them
    assert stats["ok"] - cut.sum() <= len(ok) <= stats["ok"]  # every completed stream, but those cut at the end

    # The report is produced and lists every kind of error with the server's message.
    page = (tmp_path / "report.html").read_text()
    for category in set(EXPECTED.values()) - {None}:
        assert f"× {category}:" in page, category


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


def test_a_long_queue_is_not_a_false_timeout_under_defaults(fake_server, tmp_path):
    """A first token after 8 s of queueing (the server sends nothing meanwhile) is a slow success, not a timeout:
    the default --read-timeout is 600 s (Locust's FastHttpUser would give up after 60 s)."""
    server = fake_server("--ttft-ms", "5", "--itl-ms", "1", "--faults", "queue=1", "--queue-s", "8")
    # Stopped while the first requests still queue: the stop waits for them (stop_timeout), a second round adds nothing.
    run_in_process(User, server.url, tmp_path, "--max-tokens", "4", users=2, seconds=1, stop_timeout=20)
    records = load_records(tmp_path)
    assert len(records) >= 2 and (records["status"] == "ok").all(), records[["error_type", "error"]]
    assert (records["ttft_s"] >= 8).all()


@pytest.mark.parametrize("mode", ["down", "garbage", "slow", "flaky"])
def test_metrics_endpoint_trouble_is_a_gap_not_a_crash(fake_server, tmp_path, mode, caplog):
    server = fake_server("--ttft-ms", "5", "--itl-ms", "1", "--metrics", mode)
    run_in_process(User, server.url, tmp_path, "--max-tokens", "4", "--scrape-interval", "0.5", users=2, seconds=5)
    records = load_records(tmp_path)
    assert len(records) > 10 and (records[records["error_type"] != "cut_off"]["status"] == "ok").all()
    metrics = pd.read_parquet(tmp_path / "metrics.parquet")
    up = metrics[metrics["metric"] == "up"]
    assert len(up) >= 3
    assert (up["value"] == 0).any()  # recorded as gaps, with the error (slow: a scrape over its 1 s bound)
    if mode == "slow":
        assert up[up["value"] == 0]["labels"].str.contains("imeout").all()
    if mode == "flaky":
        assert (up["value"] == 1).any()
    warnings = [r for r in caplog.records if "cannot scrape" in r.getMessage()]
    assert len(warnings) == 1  # warned once, not per scrape
    assert (tmp_path / "report.html").exists() and (tmp_path / "steps.csv").exists()
