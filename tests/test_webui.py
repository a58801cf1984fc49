"""The web UI's LLM tab over HTTP (the browser test against the real vLLM is tests/integration/test_webui_browser.py):
live rows from the same step table as the end of the run, merged across workers, and an API key never shown."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error

import pandas as pd
import pytest

from tests.helpers.net import BUILD_TIMEOUT_S, free_port, get, post, wait_for
from tests.helpers.paths import LOCUSTFILE, ROOT

pytestmark = pytest.mark.contract


def llm_rows(ui: str) -> list[dict]:
    stats = json.loads(get(ui + "/stats/requests"))
    (tab,) = [t for t in stats.get("extended_stats", []) if t["key"] == "llm"]
    return tab["data"]


def test_llm_tab_live_rows_in_a_distributed_run_match_the_final_table(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "20", "--itl-ms", "5", "--api-key", "sk-test-SECRET-7777")
    port = free_port()
    ui = f"http://127.0.0.1:{port}"
    run_dir = tmp_path / "run"
    master_port = str(free_port())  # not --processes' default 5557: another run on the machine may have it
    proc = subprocess.Popen(
        [sys.executable, "-m", "locust", "-f", LOCUSTFILE, "--host", server.url, "--processes", "2",
         "--web-host", "127.0.0.1", "--web-port", str(port), "--api-key", "sk-test-SECRET-7777",
         "--master-bind-port", master_port, "--master-port", master_port, "--run-dir", str(run_dir)],
        cwd=ROOT, stdout=open(tmp_path / "locust.log", "w"), stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        wait_for(ui + "/")
        page = get(ui + "/").decode()
        assert "sk-test-SECRET-7777" not in page  # the start form shows a mask, not the key
        assert '"extended_tabs"' in page and "LLM" in page
        # Start as the form does, sending the mask back for the unchanged key: the server must still get the key.
        started = post(
            ui + "/swarm",
            {"host": server.url, "steps": "2,4", "step_duration": "4s", "step_warmup": "1s", "max_tokens": "16",
             "api_key": "********"},
        )  # fmt: skip
        assert started["success"], started
        seen: list[list[dict]] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            rows = llm_rows(ui)
            if rows:
                seen.append(rows)
            if json.loads(get(ui + "/stats/requests"))["state"] == "stopped" and (run_dir / "report.html").exists():
                break
            time.sleep(0.5)
        final = llm_rows(ui)
        while final and final[0]["scope"] != "last step" and time.monotonic() < deadline + 10:
            time.sleep(0.3)  # the run's end is being written; the tab switches to its final numbers after that
            final = llm_rows(ui)
        report_so_far = get(ui + "/llm/report.html", BUILD_TIMEOUT_S).decode()
        records_download = get(ui + "/llm/requests.parquet", BUILD_TIMEOUT_S)
        assert not any("SECRET" in json.dumps(r) for r in seen)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    assert seen, "the LLM tab never showed a row"
    live_during = [r for rows in seen for r in rows if r["scope"] == "current step" and r["requests"] not in ("0", "-")]
    assert live_during and all(float(r["ttft_p50_ms"]) > 0 for r in live_during)
    assert {r["kv_cache_usage"] for r in live_during} - {"-"}  # the server's gauges were live too
    # After the run the tab keeps the final numbers: the same as steps.csv, computed by the same code.
    steps = pd.read_csv(run_dir / "steps.csv")
    last, whole = final[0], final[1]
    assert last["scope"] == "last step" and whole["scope"] == "whole run"
    assert int(last["requests"]) == steps["requests"].iloc[-1]
    assert int(whole["requests"]) == steps["requests"].sum() > 0
    # (shown with one decimal)
    assert abs(float(last["ttft_p50_ms"]) - steps["ttft_p50_s"].iloc[-1] * 1000) <= 0.051
    assert abs(float(last["aggregate_tok_s"]) - steps["aggregate_tok_s"].iloc[-1]) <= 0.051
    records = pd.read_parquet(run_dir / "requests.parquet")
    # The key reached the server: every request ok, but those the stop cut off (in flight when the run ended).
    measured = records[records["error_type"] != "cut_off"]
    assert records["worker"].nunique() == 2 and len(measured) and (measured["status"] == "ok").all()
    assert "Plotly.newPlot" in report_so_far and records_download[:4] == b"PAR1"
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert b"sk-test-SECRET-7777" not in path.read_bytes(), path
    assert "sk-test-SECRET-7777" not in (tmp_path / "locust.log").read_text()


def test_llm_routes_follow_web_base_path(fake_server, tmp_path):
    """Behind a reverse proxy's path (--web-base-path), the LLM tab's routes and download links live under it."""
    server = fake_server("--ttft-ms", "5", "--itl-ms", "1")
    port = free_port()
    ui = f"http://127.0.0.1:{port}/lt"
    proc = subprocess.Popen(
        [sys.executable, "-m", "locust", "-f", LOCUSTFILE, "--host", server.url, "--web-host", "127.0.0.1",
         "--web-port", str(port), "--web-base-path", "/lt", "--run-dir", str(tmp_path / "run")],
        cwd=ROOT, stdout=open(tmp_path / "locust.log", "w"), stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        wait_for(ui + "/llm/stats")
        assert b"/lt/llm/requests.parquet" in get(ui + "/") and b"/lt/llm/report.html" in get(ui + "/")
        try:
            get(f"http://127.0.0.1:{port}/llm/stats")
            raise AssertionError("the LLM routes are also served outside --web-base-path")
        except urllib.error.HTTPError as e:
            assert e.code == 404
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
