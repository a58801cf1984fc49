"""Master/worker runs against the fake server: exact merged results from 1 process or 4, and a worker killed
mid-run (the same against the real vLLM lives in tests/integration/test_distributed_vllm.py)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
from vllm_loadtest.analysis.generator import GENERATOR_DIR, GENERATOR_FILE
from vllm_loadtest.analysis.records import RECEIVED_DIR, RECORDS_DIR, merge_records

from tests.helpers.net import free_port  # noqa: F401 - for modules that import it from here
from tests.helpers.paths import ROOT
from tests.helpers.runs import cluster, kill_still_running, locust, locust_command

pytestmark = pytest.mark.contract

STEPPED = ["--steps", "2,4,8", "--step-duration", "3s", "--step-warmup", "0s", "--max-tokens", "16"]


def server_truth(server) -> pd.DataFrame:
    """Per request id, the tokens the server streamed to completion."""
    truth = server.get("/truth")
    return pd.DataFrame({"request_id": list(truth), "server_tokens": [t["tokens"] for t in truth.values()]})


def per_step_against_server(run_dir: Path, server, unread: int = 0) -> pd.DataFrame:
    """Per step: the client's ok requests and tokens, and the server's for the same request ids.

    `unread`: how many streams the server may have finished that no client read to the end (a killed worker's)."""
    records = pd.read_parquet(run_dir / "requests.parquet")
    assert not records["request_id"].duplicated().any()
    ok = records[records["status"] == "ok"].merge(server_truth(server), on="request_id", how="outer", indicator=True)
    assert (ok["_merge"] != "left_only").all(), ok[ok["_merge"] == "left_only"]  # no ok record the server denies
    assert (ok["_merge"] == "right_only").sum() <= unread, ok[ok["_merge"] == "right_only"]
    ok = ok[ok["_merge"] == "both"]
    return ok.groupby("step").agg(
        requests=("request_id", "size"), tokens=("output_tokens", "sum"), server_tokens=("server_tokens", "sum")
    )


def test_four_processes_give_the_same_exact_results_as_one(fake_server, tmp_path):
    tables = {}
    for processes in (1, 4):
        server = fake_server("--ttft-ms", "20", "--itl-ms", "5")
        run_dir = tmp_path / f"p{processes}"
        extra = ["--processes", str(processes)] if processes > 1 else []
        proc = locust("--host", server.url, *STEPPED, "--stop-timeout", "10", *extra, "--run-dir", str(run_dir))
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "Unknown message type" not in proc.stderr, proc.stderr[-3000:]  # every suite message had a handler
        table = per_step_against_server(run_dir, server)
        assert (table["tokens"] == table["server_tokens"]).all()
        assert table["requests"].sum() == server.get("/stats")["ok"]
        steps = pd.read_csv(run_dir / "steps.csv")
        assert list(steps["users"]) == [2, 4, 8] and steps["cut_off"].sum() + steps["requests"].sum() > 0
        tables[processes] = table
        records = pd.read_parquet(run_dir / "requests.parquet")
        run = json.loads((run_dir / "run.json").read_text())
        if processes == 4:
            assert records["worker"].nunique() == 4  # every worker contributed
            assert len(run["workers"]) == 4
            for w in run["workers"]:
                assert w["records_reported"] == w["records_received"] > 0 and w["missing_at"] is None
            # The master's copies alone are complete: a run with workers on other hosts has only those.
            for local in (run_dir / RECORDS_DIR).glob("*.jsonl"):
                local.unlink()
            only_received = merge_records(run_dir, write=False)
            assert set(only_received["request_id"]) == set(records["request_id"])
            assert (run_dir / RECORDS_DIR / RECEIVED_DIR).is_dir()
    # Both runs measured every step (how many requests fit in a step depends on the machine's load: not compared).
    for processes, table in tables.items():
        assert list(table.index) == [0, 1, 2] and (table["requests"] > 0).all(), (processes, table)


def test_a_worker_killed_mid_run_loses_nothing_already_recorded(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "20", "--itl-ms", "5")
    run_dir = tmp_path / "run"
    with cluster(
        tmp_path, 2, server.url, "--steps", "4,8", "--step-duration", "8s", "--step-warmup", "0s",
        "--max-tokens", "16", "--stop-timeout", "10", "--run-dir", str(run_dir),
    ) as (master, workers):  # fmt: skip
        deadline = time.monotonic() + 60
        victim_file = run_dir / RECORDS_DIR / f"{socket.gethostname()}-{workers[1].pid}.jsonl"
        while time.monotonic() < deadline and not (victim_file.exists() and victim_file.stat().st_size > 0):
            time.sleep(0.2)
        time.sleep(2)
        os.kill(workers[1].pid, signal.SIGKILL)
        killed_at = time.time()
        assert master.wait(120) in (0, 1)
        workers[0].wait(30)
    log = (tmp_path / "master.log").read_text()
    victim = f"{socket.gethostname()}-{workers[1].pid}"
    survivor = f"{socket.gethostname()}-{workers[0].pid}"
    records = pd.read_parquet(run_dir / "requests.parquet")
    # Everything the dead worker had written before it died is in the merged result, exactly once.
    written = pd.read_json(victim_file, lines=True)
    assert set(written["request_id"]) <= set(records["request_id"])
    assert not records["request_id"].duplicated().any()
    assert {victim, survivor} <= set(records["worker"])
    # The survivor carried on alone, and every request the server completed is in the records, but for the streams
    # the victim was reading when it was killed (it had 2 of the 4 users).
    assert (records[records["worker"] == survivor]["start_time"] > killed_at + 1).any()
    table = per_step_against_server(run_dir, server, unread=2)
    assert (table["tokens"] == table["server_tokens"]).all()
    run = json.loads((run_dir / "run.json").read_text())
    entry = next(w for w in run["workers"] if w["worker"] == victim)
    # Missing once --heartbeat-timeout (10 s by default) has passed without a heartbeat, give or take a busy machine.
    assert entry["missing_at"] is not None and killed_at + 8 < entry["missing_at"] < killed_at + 25
    assert f"Worker {victim} went missing" in log
    assert f"Worker {victim} went missing" in (run_dir / "report.html").read_text()
    # Its self-check samples shipped before it died are kept too.
    samples = pd.read_parquet(run_dir / GENERATOR_FILE)
    assert {victim, survivor} == set(samples["worker"])
    assert samples.loc[samples["worker"] == victim, "timestamp"].max() < killed_at


def test_every_worker_silent_past_the_heartbeat_timeout_ends_the_run_complete_with_exit_5(fake_server, tmp_path):
    """Both workers frozen (SIGSTOP: a machine too busy to run them) longer than --heartbeat-timeout: Locust stops
    the run and its master quits at once; the run directory is still complete, one line says why, exit code 5.
    Frozen for less than the timeout, nothing is missed (the run of test_four_processes... covers a normal end)."""
    server = fake_server("--ttft-ms", "20", "--itl-ms", "5")
    run_dir = tmp_path / "run"
    with cluster(
        tmp_path, 2, server.url, "--steps", "2,4", "--step-duration", "8s", "--step-warmup", "0s",
        "--max-tokens", "16", "--stop-timeout", "5", "--heartbeat-timeout", "3", "--run-dir", str(run_dir),
    ) as (master, workers):  # fmt: skip
        files = [run_dir / RECORDS_DIR / f"{socket.gethostname()}-{w.pid}.jsonl" for w in workers]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(f.exists() and f.stat().st_size > 0 for f in files):
            time.sleep(0.2)
        for w in workers:
            os.kill(w.pid, signal.SIGSTOP)
        frozen_at = time.time()
        written = pd.concat([pd.read_json(f, lines=True) for f in files])  # what the workers had written by then
        try:
            code = master.wait(120)
        finally:
            for w in workers:
                os.kill(w.pid, signal.SIGCONT)
        for w in workers:
            w.wait(30)
    log = (tmp_path / "master.log").read_text()
    assert code == 5, log[-3000:]
    assert log.count("every worker went missing (no heartbeat for --heartbeat-timeout 3 s)") == 1, log[-3000:]
    missing = [line for line in log.splitlines() if "went missing (no heartbeat); its records" in line]
    assert not missing[-1].endswith("the run goes on"), log[-3000:]  # the last one left: the run does not go on
    run = json.loads((run_dir / "run.json").read_text())
    assert run["finished_at"] is not None
    assert all(frozen_at < w["missing_at"] < frozen_at + 20 for w in run["workers"])
    for name in ("steps.csv", "summary.json", "report.html"):
        assert (run_dir / name).is_file(), name
    # Every record a worker wrote before it froze is in the merged result, once.
    records = pd.read_parquet(run_dir / "requests.parquet")
    assert set(written["request_id"]) <= set(records["request_id"]) and not records["request_id"].duplicated().any()


def test_ctrl_c_on_a_processes_run_keeps_every_record_of_every_worker(fake_server, tmp_path):
    """Ctrl-C in a terminal reaches the master and every worker of `--processes`: each worker stops, ships its last
    records (the cut-off ones included) and its final message before it quits, and the master merges them all."""
    server = fake_server("--ttft-ms", "20", "--itl-ms", "5")
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        locust_command("--host", server.url, "--processes", "2", "--steps", "4", "--step-duration", "60s",
                       "--step-warmup", "0s", "--max-tokens", "64", "--run-dir", str(run_dir)),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(list((run_dir / RECORDS_DIR).glob("*.jsonl"))) < 2:
            time.sleep(0.2)
        time.sleep(3)
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=60)  # a bound against a hang, not a speed claim
    finally:
        kill_still_running(proc)
    assert "sent no final message" not in out and "left without" not in out, out[-3000:]
    local = {p.name: pd.read_json(p, lines=True) for p in (run_dir / RECORDS_DIR).glob("*.jsonl")}
    received = {p.name: pd.read_json(p, lines=True) for p in (run_dir / RECORDS_DIR / RECEIVED_DIR).glob("*.jsonl")}
    assert len(local) == 2 and local.keys() == received.keys()
    for name in local:  # everything a worker wrote also reached the master
        assert set(local[name]["request_id"]) == set(received[name]["request_id"])
    records = pd.read_parquet(run_dir / "requests.parquet")
    assert len(records) == sum(len(f) for f in local.values())
    # Each request is ok, or recorded as cut off by the interrupt (usually a few are: one per user in flight).
    assert records["status"].eq("ok").sum() + records["error_type"].eq("cut_off").sum() == len(records)
    ok, truth = set(records.loc[records["status"] == "ok", "request_id"]), set(server.get("/truth"))
    assert ok <= truth and len(truth - ok) <= 4  # at most one stream per user ended on the server as it was cut
    # The self-check samples of both workers are on disk, in their own files and in the master's merge.
    own = {p.stem for p in (run_dir / GENERATOR_DIR).glob("*.jsonl")}
    assert len(own) == 2 and set(pd.read_parquet(run_dir / GENERATOR_FILE)["worker"]) == own
