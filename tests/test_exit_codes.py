"""Exit codes for pipelines: 0 ok, 1 failed requests over --max-error-rate, 2 the tool crashed, 3 bad input (that one:
tests/test_bad_input.py)."""

import subprocess

import pytest

from tests.helpers.paths import ROOT
from tests.helpers.runs import locust, locust_command

pytestmark = pytest.mark.contract

RUN = ["--steps", "2", "--step-duration", "3s", "--step-warmup", "0s", "--max-tokens", "8"]


@pytest.mark.parametrize(("limit", "code"), [("0", 1), ("10%", 1), ("0.5", 0), ("50%", 0)])
def test_failed_requests_over_the_limit_exit_1(fake_server, tmp_path, limit, code):
    server = fake_server("--ttft-ms", "5", "--itl-ms", "1", "--faults", "http_500=5")  # 20 % fail
    proc = locust("--host", server.url, *RUN, "--max-error-rate", limit, "--run-dir", str(tmp_path / "r"))
    assert proc.returncode == code, proc.stderr[-2000:]
    verdict = "over" if code else "within"
    assert f"{verdict} --max-error-rate" in proc.stdout


def test_a_clean_run_exits_0(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "5", "--itl-ms", "1")
    proc = locust("--host", server.url, *RUN, "--run-dir", str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Errors: 0 of" in proc.stdout


def test_a_bug_in_the_load_generator_exits_2(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "5", "--itl-ms", "1")
    proc = subprocess.run(
        locust_command("--host", server.url, *RUN, "--max-error-rate", "100%", "--run-dir", str(tmp_path / "r"),
                       locustfile=str(ROOT / "tests" / "locustfiles" / "crashing.py")),
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "a bug in the load generator" in proc.stderr
