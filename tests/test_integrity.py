"""The integrity check: client records against the server's counters."""

import pandas as pd

from analysis.integrity import integrity
from analysis.server_metrics import GENERATION_TOKENS, SUCCESS, merge_scrapes, scrape_line
from tests.test_headless import locust


def metrics(tmp_path, scrapes):
    with open(tmp_path / "metrics.jsonl", "wb") as f:
        for t, (stop, length, tokens) in scrapes:
            lab = {"model_name": "m"}
            f.write(
                scrape_line(
                    t,
                    [
                        (SUCCESS, {**lab, "finished_reason": "stop"}, stop),
                        (SUCCESS, {**lab, "finished_reason": "length"}, length),
                        (SUCCESS, {**lab, "finished_reason": "abort"}, 0.0),
                        (GENERATION_TOKENS, lab, tokens),
                    ],
                )
            )
    return merge_scrapes(tmp_path, write=False)


def records(ok_tokens, failed=0):
    n = len(ok_tokens) + failed
    return pd.DataFrame(
        {"status": ["ok"] * len(ok_tokens) + ["error"] * failed, "output_tokens": list(ok_tokens) + [3] * failed},
        index=range(n),
    )


def test_exact_agreement(tmp_path):
    m = metrics(tmp_path, [(0, (5, 10, 1000)), (1, (6, 11, 1030)), (2, (7, 12, 1050))])
    check = integrity(records([10, 10, 15, 15]), m)
    assert check["requests_match"] and check["tokens_match"] and not check["mismatch"]
    assert (check["server_finished"], check["server_generated_tokens"]) == (4, 50)


def test_extra_server_traffic_is_a_mismatch(tmp_path):
    m = metrics(tmp_path, [(0, (0, 0, 0)), (1, (1, 2, 90))])
    check = integrity(records([20, 30]), m)
    assert check["mismatch"] and check["text"][0].startswith("MISMATCH") and "+1" in check["text"][0]


def test_failed_streams_explain_a_token_difference(tmp_path):
    m = metrics(tmp_path, [(0, (0, 0, 0)), (1, (0, 2, 56))])
    check = integrity(records([20, 30], failed=2), m)
    assert check["requests_match"] and not check["tokens_match"] and not check["mismatch"]


def test_without_metrics_it_says_so():
    check = integrity(records([1]), None)
    assert not check["available"] and "not available" in check["text"][0]


def test_report_shows_a_mismatch_when_someone_else_used_the_server(fake_server, tmp_path):
    import threading
    import urllib.request

    server = fake_server("--ttft-ms", "5", "--itl-ms", "1")
    stop = threading.Event()

    def other_client():  # another user of the same server during the run
        while not stop.is_set():
            req = urllib.request.Request(
                server.url + "/v1/completions", data=b'{"max_tokens": 4, "stream": true}', method="POST"
            )
            urllib.request.urlopen(req, timeout=10).read()
            stop.wait(0.2)

    thread = threading.Thread(target=other_client, daemon=True)
    thread.start()
    try:
        proc = locust(
            "--host", server.url, "--steps", "1", "--step-duration", "3s", "--step-warmup", "0s",
            "--max-tokens", "8", "--run-dir", str(tmp_path / "r"),
        )  # fmt: skip
    finally:
        stop.set()
        thread.join(10)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "MISMATCH" in proc.stdout
    page = (tmp_path / "r" / "report.html").read_text()
    assert "Integrity check" in page and "MISMATCH" in page
