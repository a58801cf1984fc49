"""The integrity check in a real run: the report says MISMATCH when someone else used the server meanwhile."""

import pytest

from tests.helpers.runs import locust

pytestmark = pytest.mark.contract


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
