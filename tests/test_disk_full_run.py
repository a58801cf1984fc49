"""Real headless Locust runs whose disk fills, or whose run directory cannot be made (issue 22): the run stops within
10 s of the first failed write with one error line, exit code 4 and no traceback; every line kept is a complete
record of a request the server finished; `python -m analysis report` afterwards builds the results from them. The
disk fills by a file size limit (RLIMIT_FSIZE, SIGXFSZ ignored: writes fail with EFBIG, no root needed), or for real
on a 3 MiB tmpfs where the test runs as root and may mount one. A master does the same for the records its workers
ship; a worker that cannot write its own run directory only ships."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from vllm_loadtest.analysis.records import SCHEMA

from tests.helpers.disk import file_size_limit, fill, small_tmpfs
from tests.helpers.net import free_port
from tests.helpers.paths import ROOT
from tests.helpers.runs import kill_still_running, locust, locust_command, wait_until

pytestmark = pytest.mark.contract

EXIT_WRITE_FAILED = 4
# 8 users, 256-token answers at 1 ms a token: about 30 requests/s of 6.5 KB records, and a step far longer than the
# disk lasts (a run that did not stop would take the whole minute).
LOAD = ["--steps", "8", "--step-duration", "60s", "--step-warmup", "0s", "--max-tokens", "256"]
FAST = ["--ttft-ms", "5", "--itl-ms", "1"]


def log_time(line: str) -> float:
    """The Unix time of a Locust log line '[2026-12-01 20:55:48,686] host/LEVEL/name: ...' (local time)."""
    stamp = line[1 : line.index("]")]
    whole, ms = stamp.split(",")
    return time.mktime(time.strptime(whole, "%Y-%m-%d %H:%M:%S")) + int(ms) / 1000


def error_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if "/ERROR/" in line or line.startswith("error:")]


def check_stopped_cleanly(log: str, run_dir: Path, records: str, server, words: str) -> float:
    """One error line about the failed write of `records` (a folder of run_dir), no traceback, no load 10 s after
    it, every kept line a complete record of a request the server finished; returns the error's time."""
    assert "Traceback" not in log, log[-3000:]
    errors = error_lines(log)
    assert len(errors) == 1, errors
    error = errors[0]
    assert f"{words} writing {run_dir / records}/" in error and "records: stopping the run; " in error, error
    failed_at = log_time(error)
    truth = server.get("/truth")
    last_sent = max(entry["recv_wall"] for entry in truth.values())
    assert last_sent <= failed_at + 10, (last_sent - failed_at, error)
    kept = 0
    for path in (run_dir / records).glob("*.jsonl"):
        data = path.read_bytes()
        assert data.endswith(b"\n") or not data, path
        for line in data.splitlines():
            record = orjson.loads(line)  # a torn line would not parse
            assert set(SCHEMA.names) <= set(record), sorted(set(SCHEMA.names) - set(record))
            assert record["status"] == "ok" and truth[record["request_id"]]["tokens"] == record["output_tokens"]
            kept += 1
    assert kept > 0 and f"after {kept:,} records" in error, (kept, error)
    return failed_at


def check_report_afterwards(run_dir: Path, copy: Path, expected_requests: int) -> None:
    """`python -m analysis report` on a copy elsewhere builds the results from the records kept."""
    shutil.copytree(run_dir, copy)
    proc = subprocess.run(
        [sys.executable, "-m", "analysis", "report", str(copy)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "RuntimeWarning" not in proc.stderr, proc.stderr[-3000:]  # the open last step is closed, not infinite
    summary = orjson.loads((copy / "summary.json").read_bytes())
    assert summary["requests"] == summary["ok"] == expected_requests
    assert summary["steps"][0]["aggregate_tok_s"] is not None and (copy / "report.html").exists()


def test_a_file_size_limit_stops_the_run_within_seconds_with_one_line_and_exit_4(fake_server, tmp_path):
    server = fake_server(*FAST)
    run_dir = tmp_path / "run"
    began = time.monotonic()
    proc = subprocess.run(
        locust_command("--host", server.url, *LOAD, "--run-dir", str(run_dir)),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=file_size_limit(400_000),  # ~60 records; the report (plotly inlined, ~4.6 MB) cannot fit either
    )
    took = time.monotonic() - began
    assert proc.returncode == EXIT_WRITE_FAILED, proc.stderr[-3000:]
    assert took < 45, took  # the 60 s step was cut short
    check_stopped_cleanly(proc.stderr, run_dir, "records", server, "file too large")
    # The end-of-run files that fit are written, the report's failure is one warning; the rest is rebuilt later.
    assert "file too large writing " in proc.stderr and "the results from it on were not written" in proc.stderr
    kept = sum(len(p.read_bytes().splitlines()) for p in (run_dir / "records").glob("*.jsonl"))
    check_report_afterwards(run_dir, tmp_path / "copy", kept)


def test_a_disk_that_fills_stops_the_run_and_the_report_is_built_afterwards(fake_server, tmp_path):
    with small_tmpfs("3m", tmp_path) as disk:
        filler = fill(disk, leave_bytes=1_000_000)  # a disk that is nearly full: it fills within seconds
        run_dir = disk / "run"
        server = fake_server(*FAST)
        began = time.monotonic()
        proc = locust("--host", server.url, *LOAD, "--run-dir", str(run_dir), timeout=120)
        took = time.monotonic() - began
        assert proc.returncode == EXIT_WRITE_FAILED, proc.stderr[-3000:]
        assert took < 45, took
        check_stopped_cleanly(proc.stderr, run_dir, "records", server, "disk full")
        # Each other writer that failed said so once (run.json, the results); none more than once.
        warnings = [line for line in proc.stderr.splitlines() if "/WARNING/" in line and "disk full" in line]
        assert len(warnings) == len({w.split(": ", 1)[1].split(" ")[3] for w in warnings}), warnings
        assert "the results from it on were not written" in proc.stderr
        # The console still shows the table of what was kept, computed without writing.
        assert "Batching curve" in proc.stdout
        assert not list(run_dir.glob("*.tmp")) and not (run_dir / "requests.parquet").exists()
        kept = sum(len(p.read_bytes().splitlines()) for p in (run_dir / "records").glob("*.jsonl"))
        filler.unlink()  # the space is freed: the records are read in place, the report built on a copy (4.6 MB)
        check_report_afterwards(run_dir, tmp_path / "copy", kept)


def test_a_run_directory_that_cannot_be_made_is_refused_before_any_load(fake_server):
    server = fake_server()
    proc = locust("--host", server.url, *LOAD, "--run-dir", "/proc/nope/run", timeout=60)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "/INFO/" not in line]
    assert lines == [
        "error: cannot create run directory /proc/nope/run (/proc/nope: No such file or directory); pass a writable "
        "--run-dir"
    ], lines
    assert server.get("/stats")["requests"] == 0


def start(args: list[str], log: Path, cwd: Path, preexec_fn=None) -> subprocess.Popen:
    """A Locust process in the background in `cwd`, its own process group, logging to `log`."""
    return subprocess.Popen(
        locust_command(*args, headless=False),
        cwd=cwd,
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=preexec_fn,
    )


def master_and_worker(tmp_path: Path, host: str, master_cwd: Path, worker_cwd: Path, *args: str, limit=None):
    port = free_port()
    master = start(
        ["--master", "--headless", "--expect-workers", "1", "--master-bind-host", "127.0.0.1",
         "--master-bind-port", str(port), "--host", host, *args],
        tmp_path / "master.log", master_cwd, limit,
    )  # fmt: skip
    worker = start(
        ["--worker", "--master-host", "127.0.0.1", "--master-port", str(port)], tmp_path / "worker.log", worker_cwd
    )
    return master, worker


def test_a_master_that_cannot_write_the_shipped_records_stops_the_run(fake_server, tmp_path):
    server = fake_server(*FAST)
    run_dir = tmp_path / "run"
    master, worker = master_and_worker(
        tmp_path, server.url, ROOT, ROOT, *LOAD, "--run-dir", str(run_dir), limit=file_size_limit(300_000)
    )
    try:
        assert wait_until(lambda: master.poll() is not None, 120), "the master did not stop"
        assert wait_until(lambda: worker.poll() is not None, 30), "the worker did not stop"
    finally:
        kill_still_running(master, worker)
    master_log, worker_log = (tmp_path / "master.log").read_text(), (tmp_path / "worker.log").read_text()
    assert master.returncode == EXIT_WRITE_FAILED, master_log[-3000:]
    assert "Traceback" not in worker_log, worker_log[-3000:]
    check_stopped_cleanly(master_log, run_dir, "records/received", server, "file too large")
    # The worker's own copy has every record the master could not keep (the merge keeps one per request).
    received = sum(len(p.read_bytes().splitlines()) for p in (run_dir / "records" / "received").glob("*.jsonl"))
    own = sum(len(p.read_bytes().splitlines()) for p in (run_dir / "records").glob("*.jsonl"))
    assert own > received


def test_a_worker_that_cannot_write_its_own_run_directory_warns_and_ships(fake_server, tmp_path):
    server = fake_server(*FAST)
    master_cwd, worker_cwd = tmp_path / "m", tmp_path / "w"
    master_cwd.mkdir()
    worker_cwd.mkdir()
    (worker_cwd / "out").write_text("a file where the worker's run directory would go")
    args = ["--steps", "2", "--step-duration", "3s", "--step-warmup", "0s", "--max-tokens", "16"]
    args += ["--run-dir", "out/run"]
    master, worker = master_and_worker(tmp_path, server.url, master_cwd, worker_cwd, *args)
    try:
        assert wait_until(lambda: master.poll() is not None, 120), "the master did not stop"
        assert wait_until(lambda: worker.poll() is not None, 30), "the worker did not stop"
    finally:
        kill_still_running(master, worker)
    master_log, worker_log = (tmp_path / "master.log").read_text(), (tmp_path / "worker.log").read_text()
    assert master.returncode == 0, master_log[-3000:]
    assert "Traceback" not in master_log + worker_log and not error_lines(master_log + worker_log)
    said = [line for line in worker_log.splitlines() if "no local copy of this worker's records" in line]
    assert len(said) == 1 and "cannot create out/run/records (" in said[0], said
    run_dir = master_cwd / "out" / "run"
    assert not (worker_cwd / "out").is_dir() and not list((run_dir / "records").glob("*.jsonl"))
    summary = orjson.loads((run_dir / "summary.json").read_bytes())
    # Every request the server finished was shipped: ok, or cut off at the stop after the server's last byte and
    # before the client read it (213 finished, 212 ok and 1 cut off in a fresh clone's parallel pytest, 2026-12-03).
    check = summary["integrity"]
    assert summary["requests"] > 0 and check["requests_within"] and not check["mismatch"], check
    assert (
        sum(len(p.read_bytes().splitlines()) for p in (run_dir / "records" / "received").glob("*.jsonl"))
        == (summary["requests"])
    )
    assert os.listdir(worker_cwd) == ["out"]
