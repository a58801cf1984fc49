"""End to end: real `locust` processes, as a user runs them, against the fake server."""

import json
import signal
import subprocess
import sys
import time
import urllib.request

import pandas as pd
import pytest
from vllm_loadtest.analysis.adaptive import STEP_END_COLUMNS
from vllm_loadtest.analysis.batch import BATCH_COLUMNS
from vllm_loadtest.analysis.energy import ENERGY_COLUMNS
from vllm_loadtest.analysis.generator import GENERATOR_COLUMNS
from vllm_loadtest.analysis.gpu import GPU_COLUMNS
from vllm_loadtest.analysis.lora import LORA_COLUMNS
from vllm_loadtest.analysis.reasoning import REASONING_COLUMNS
from vllm_loadtest.analysis.run import STEPS_FILE
from vllm_loadtest.analysis.schedule import OPEN_LOOP_COLUMNS
from vllm_loadtest.analysis.server_metrics import SERVER_BOUND_COLUMNS, SERVER_COLUMNS
from vllm_loadtest.analysis.spec_decode import SPEC_COLUMNS
from vllm_loadtest.analysis.sse import CUT_OFF
from vllm_loadtest.analysis.steps import STEP_COLUMNS, UNCERTAINTY_COLUMNS

from tests.helpers.net import free_port
from tests.helpers.paths import LOCUSTFILE, ROOT  # noqa: F401 - LOCUSTFILE: for modules that import it from here
from tests.helpers.runs import locust, locust_command, short_run, wait_until  # noqa: F401 - short_run: likewise

pytestmark = pytest.mark.contract


def test_stepped_headless_run_writes_records_and_the_step_table(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "20", "--itl-ms", "5")
    run_dir = tmp_path / "run"
    proc = locust(
        "--host",
        server.url,
        "--steps",
        "1,2,4",
        "--step-duration",
        "3s",
        "--step-warmup",
        "1s",
        "--max-tokens",
        "16",
        "--run-dir",
        str(run_dir),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Batching curve" in proc.stdout

    records = pd.read_parquet(run_dir / "requests.parquet")
    steps = pd.read_csv(run_dir / STEPS_FILE)
    assert list(steps.columns) == (
        STEP_COLUMNS
        + SERVER_COLUMNS
        + GENERATOR_COLUMNS
        + OPEN_LOOP_COLUMNS
        + UNCERTAINTY_COLUMNS
        + SERVER_BOUND_COLUMNS
        + STEP_END_COLUMNS
        + REASONING_COLUMNS
        + BATCH_COLUMNS
        + GPU_COLUMNS
        + ENERGY_COLUMNS
        + LORA_COLUMNS
        + SPEC_COLUMNS
    )
    assert set(steps["end_reason"]) == {"fixed"}
    # The fake server's /metrics was scraped: its counters match the client's records exactly, but for a stream cut
    # off at the stop that the server had already sent whole (unread in its socket when the user was stopped, seen
    # on a loaded machine: 3056 against 3040, one 16-token request). The server counts whole requests, so the
    # difference is 16 tokens for each such stream, and never more of them than the records' cut-off ones.
    metrics = pd.read_parquet(run_dir / "metrics.parquet")
    last = metrics[metrics["metric"] == "vllm:generation_tokens_total"]["value"].iloc[-1]
    extra = last - records.query("status == 'ok'")["output_tokens"].sum()
    assert extra % 16 == 0 and 0 <= extra // 16 <= (records["error_type"] == CUT_OFF).sum(), extra
    assert (steps["kv_cache_usage_max"] > 0).all()
    assert list(steps["users"]) == [1, 2, 4] and list(steps["step"]) == [0, 1, 2]
    assert (steps["requests"] > 0).all() and (steps["errors"] == 0).all()
    # Aggregate throughput grows with users against a server that does not saturate.
    assert steps["aggregate_tok_s"].is_monotonic_increasing
    assert set(records["step"]) == {0, 1, 2}
    assert dict(records.groupby("step")["users"].first()) == {0: 1, 1: 2, 2: 4}
    assert records["warmup"].any() and not records["warmup"].all()
    # Every request the server answered is in the records, once.
    assert len(records) == server.get("/stats")["requests"] and records["request_id"].is_unique
    # Table counts come from the raw records.
    measured = records[~records["warmup"] & (records["status"] == "ok")]
    assert steps["requests"].sum() <= len(measured)
    run = json.loads((run_dir / "run.json").read_text())
    assert [t["users"] for t in run["timeline"]] == [1, 2, 4]
    assert run["finished_at"] is not None


def test_options_from_env_vars_and_pyproject(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "5", "--itl-ms", "1")
    (tmp_path / "pyproject.toml").write_text('[tool.locust]\nsteps = "2"\nstep-duration = "2s"\nmax-tokens = 7\n')
    proc = locust(
        "--host",
        server.url,
        "--step-warmup",
        "0s",
        cwd=tmp_path,
        env={"LOCUST_MAX_TOKENS": "9", "LOCUST_RUN_DIR": str(tmp_path / "r")},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = pd.read_parquet(tmp_path / "r" / "requests.parquet")
    assert set(records["users"]) == {2}  # from pyproject.toml
    assert set(records.query("status == 'ok'")["output_tokens"]) == {9}  # LOCUST_* beats pyproject.toml


def test_default_run_dir_is_a_utc_timestamp_under_reports(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "5", "--itl-ms", "1")
    # 3 s of 8-token requests: some complete even on a machine busy enough to slow Locust's start (a run that
    # completes none exits 1).
    proc = locust(
        "--host", server.url, "--steps", "1", "--step-duration", "3s", "--step-warmup", "0s", "--max-tokens", "8",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = (tmp_path / "reports").iterdir()
    assert len(run_dir.name) == len("20261129T170000Z") and run_dir.name.endswith("Z")
    assert (run_dir / "requests.parquet").exists()


def test_bad_steps_fail_fast_with_one_line_and_no_load(fake_server, tmp_path):
    server = fake_server()
    proc = locust("--host", server.url, "--steps", "1,x", "--run-dir", str(tmp_path / "r"))
    assert proc.returncode == 3
    assert "error: --steps '1,x' is not a list of user counts; use e.g. --steps 1,2,4,8" in proc.stderr
    assert server.get("/stats")["requests"] == 0


def test_unreachable_host_without_model_stops_with_a_clear_error(tmp_path):
    proc = locust(
        "--host",
        "http://127.0.0.1:9",
        "--steps",
        "1",
        "--step-duration",
        "10s",
        "--run-dir",
        str(tmp_path / "r"),
        timeout=60,
    )
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "error: nothing is listening at http://127.0.0.1:9 (connection refused); start the server" in proc.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_interrupt_keeps_every_completed_request(fake_server, tmp_path, sig):
    """Ctrl-C and SIGTERM stop the run and write its results; even SIGKILL leaves every completed request on disk,
    and the report is then rebuilt from the run directory alone."""
    server = fake_server("--ttft-ms", "10", "--itl-ms", "5")
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        locust_command("--host", server.url, "--steps", "4", "--step-duration", "60s", "--step-warmup", "0s",
                       "--max-tokens", "20", "--run-dir", str(run_dir)),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    # Interrupted once the run is under way (a few requests per user done), whenever that is on a busy machine.
    assert wait_until(lambda: server.get("/stats")["ok"] >= 12, timeout=60), proc.poll()
    proc.send_signal(sig)
    proc.communicate(timeout=60)
    time.sleep(0.5)  # streams the server was sending when the client died end on its side
    stats = server.get("/stats")
    assert stats["ok"] > 0
    if sig != signal.SIGKILL:
        assert (run_dir / STEPS_FILE).exists() and (run_dir / "report.html").exists()
        (run_dir / "requests.parquet").unlink()
    # Rebuilt from records/ alone: every request the client finished is there.
    rebuilt = subprocess.run(
        [sys.executable, "-m", "analysis", "report", str(run_dir)], cwd=ROOT, capture_output=True, text=True
    )
    assert rebuilt.returncode == 0, rebuilt.stderr
    records = pd.read_parquet(run_dir / "requests.parquet")
    assert (records["status"] == "ok").sum() >= stats["ok"] - 4  # at most the in-flight ones were cut off
    if sig != signal.SIGKILL:
        assert len(records) == stats["requests"]  # the cut-off ones are recorded too
    assert (run_dir / "report.html").exists() and (run_dir / "summary.json").exists()


def test_a_second_run_into_the_same_run_dir_goes_to_a_sibling(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "5", "--itl-ms", "1")
    args = (
        "--host",
        server.url,
        "--steps",
        "1",
        "--step-duration",
        "3s",  # some requests complete even on a busy machine (a run that completes none exits 1)
        "--step-warmup",
        "0s",
        "--max-tokens",
        "8",
        "--run-dir",
        str(tmp_path / "r"),
    )
    first_run, second_run = locust(*args), locust(*args)
    assert first_run.returncode == 0, first_run.stderr[-3000:]
    assert second_run.returncode == 0, second_run.stderr[-3000:]
    first = pd.read_parquet(tmp_path / "r" / "requests.parquet")
    second = pd.read_parquet(tmp_path / "r-2" / "requests.parquet")
    assert len(first) + len(second) == server.get("/stats")["requests"]
    assert not set(first["request_id"]) & set(second["request_id"])


def test_options_appear_in_the_web_ui_start_form(tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        locust_command(
            "--host", "http://127.0.0.1:9", "--web-host", "127.0.0.1", "--web-port", str(port), headless=False
        ),
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        page = ""
        for _ in range(100):
            try:
                page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2).read().decode()
                break
            except OSError:
                time.sleep(0.2)
        start = page.index('"extra_options"')
        extra = json.JSONDecoder().raw_decode(page[page.index("{", start) :])[0]
    finally:
        proc.terminate()
        proc.wait(10)
    for name in (
        "model",
        "endpoint",
        "prompt",
        "max_tokens",
        "temperature",
        "ignore_eos",
        "read_timeout",
        "api_key_env",
        "no_continuous_usage",
        "steps",
        "step_duration",
        "step_warmup",
        "run_dir",
    ):
        assert name in extra, name
    assert extra["endpoint"]["choices"] == ["chat", "completions", "embeddings", "rerank"]
    assert extra["max_tokens"]["default_value"] == 256


def test_plain_users_and_run_time_run_one_step(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "5", "--itl-ms", "1")
    proc = locust("--host", server.url, "-u", "3", "-t", "3s", "--max-tokens", "8", "--run-dir", str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = pd.read_csv(tmp_path / "r" / STEPS_FILE)
    assert list(steps["users"]) == [3]
    assert 1.5 < steps["window_s"].iloc[0] < 4.5  # 3 s minus the default 5 s warm-up clipped to 0 s
