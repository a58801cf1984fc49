"""Against a real vLLM (CPU build serving the tiny generated model): real batching, /metrics and error bodies.

Select with `-m vllm`, skip with `-m "not vllm"`. The server starts once per session (tests/conftest.py).
"""

import json
import subprocess
import sys
import time
import urllib.request

import pandas as pd
import pytest

from analysis.records import load_records
from analysis.server_metrics import GENERATION_TOKENS, RUNNING, SUCCESS, counter_total, parse_samples
from locustfiles.openai_user import OpenAIStreamingUser
from tests.conftest import ROOT, run_in_process

pytestmark = pytest.mark.vllm


class User(OpenAIStreamingUser):
    pass


def scrape(url: str) -> list:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        return parse_samples(r.read().decode())


def finished_counts(url: str) -> tuple[float, float]:
    """Requests finished normally (stop/length) and generated tokens, once nothing is running."""
    deadline = time.monotonic() + 60
    while True:
        samples = scrape(url)
        if counter_total(samples, RUNNING) == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    done = sum(
        v for name, labels, v in samples if name == SUCCESS and labels.get("finished_reason") in ("stop", "length")
    )
    return done, counter_total(samples, GENERATION_TOKENS)


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_client_counts_equal_the_servers_counters(vllm_server, tmp_path, endpoint):
    before = finished_counts(vllm_server.url)
    run_in_process(
        User,
        vllm_server.url,
        tmp_path,
        "--endpoint",
        endpoint,
        "--max-tokens",
        "48",
        "--ignore-eos",
        users=4,
        seconds=8,
        stop_timeout=60,
    )
    after = finished_counts(vllm_server.url)
    records = load_records(tmp_path)
    ok = records[records["status"] == "ok"]
    assert len(ok) > 4 and len(ok) == len(records), records["error"].dropna().unique()
    assert len(ok) == after[0] - before[0]
    assert ok["output_tokens"].sum() == after[1] - before[1]
    assert (ok["output_tokens"] == 48).all() and not ok["output_tokens_estimated"].any()
    assert (ok["model"] == "tiny").all()  # discovered from /v1/models
    assert ok["ttft_s"].notna().all() and (ok["tpot_s"] > 0).all()
    assert (ok["chunk_tokens"].map(sum) == 48).all()


def test_vllm_rejections_carry_vllms_own_message(vllm_server, tmp_path):
    run_in_process(User, vllm_server.url, tmp_path / "a", "--max-tokens", "5000", users=1, seconds=1)
    run_in_process(User, vllm_server.url, tmp_path / "b", "--model", "nope", users=1, seconds=1)
    too_long = load_records(tmp_path / "a")
    unknown = load_records(tmp_path / "b")
    long_err = too_long[too_long["error_type"] != "cut_off"]
    assert len(long_err) > 0 and (long_err["error_type"] == "http_400").all()
    assert long_err["error"].str.contains("max_tokens=5000 cannot be greater than max_model_len=512").all()
    model_err = unknown[unknown["error_type"] != "cut_off"]
    assert len(model_err) > 0 and (model_err["error_type"] == "http_404").all()
    assert model_err["error"].str.contains("The model `nope` does not exist").all()


def test_stepped_headless_run_scrapes_the_servers_kv_cache(vllm_server, tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "locust",
            "-f",
            str(ROOT / "locustfiles" / "vllm_streaming.py"),
            "--headless",
            "--host",
            vllm_server.url,
            "--steps",
            "1,16",
            "--step-duration",
            "12s",
            "--step-warmup",
            "3s",
            "--max-tokens",
            "64",
            "--ignore-eos",
            "--stop-timeout",
            "60",
            "--run-dir",
            str(run_dir),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = pd.read_csv(run_dir / "steps.csv")
    assert list(steps["users"]) == [1, 16]
    assert (steps["requests"] > 0).all()
    assert steps["kv_cache_usage_max"].iloc[1] > steps["kv_cache_usage_max"].iloc[0] > 0
    assert steps["running_max"].iloc[1] > 1
    records = pd.read_parquet(run_dir / "requests.parquet")
    assert (records["status"] == "ok").all()  # --stop-timeout let the last requests finish
    metrics = pd.read_parquet(run_dir / "metrics.parquet")
    up = metrics[metrics["metric"] == "up"]
    assert len(up) >= 20 and (up["value"] == 1).all()
    run = json.loads((run_dir / "run.json").read_text())
    assert run["options"]["max_tokens"] == 64
