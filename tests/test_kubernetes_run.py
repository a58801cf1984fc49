"""deploy/kubernetes/'s Locust commands run as the pods run them: the master Job's `locust --config master.conf` and
the worker Deployment's command, real Locust processes against the fake server (only the addresses and the step
lengths are overridden on the command line, which wins over the config file, as Locust documents)."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from tests.helpers.manifests import master_conf, pod_spec, resource
from tests.helpers.net import free_port
from tests.helpers.paths import ROOT
from tests.helpers.runs import kill_still_running

pytestmark = pytest.mark.contract


def as_here(command: list[str]) -> list[str]:
    """A pod's `locust ...` command, run by this interpreter from the checkout (the image's WORKDIR, /app)."""
    assert command[0] == "locust", command
    return [sys.executable, "-m", "locust", *command[1:]]


def test_the_master_job_and_the_worker_deployment_run_a_distributed_run(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "10", "--itl-ms", "2")
    # The exporter's in-cluster address does not resolve here: the GPU scrape is tested with its fake (part A).
    conf = tmp_path / "master.conf"
    conf.write_text(master_conf(keep_gpu_url=False))
    run_dir = tmp_path / "run"
    port = free_port()
    job = pod_spec(resource("Job", "locust-master"))["containers"][0]
    master_cmd = as_here(job["command"])
    master_cmd[master_cmd.index("--config") + 1] = str(conf)  # the mounted file's place, here tmp_path
    master_cmd += [
        "--host", server.url, "--metrics-url", f"{server.url}/metrics",
        "--expect-workers", "2", "--master-bind-host", "127.0.0.1", "--master-bind-port", str(port),
        "--steps", "1,2", "--step-duration", "2s", "--step-warmup", "0s", "--max-tokens", "8",
        "--stop-timeout", "10", "--run-dir", str(run_dir),
    ]  # fmt: skip
    worker_cmd = as_here(pod_spec(resource("Deployment", "locust-worker"))["containers"][0]["command"])
    worker_cmd[worker_cmd.index("--master-host") + 1] = "127.0.0.1"
    worker_cmd += ["--master-port", str(port)]
    log = open(tmp_path / "master.log", "w")
    master = subprocess.Popen(master_cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    workers = [
        # Each in its own process group, which kill_still_running ends whole.
        subprocess.Popen(
            worker_cmd,
            cwd=ROOT,
            stdout=open(tmp_path / f"worker{i}.log", "w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for i in range(2)
    ]
    try:
        assert master.wait(120) == 0, (tmp_path / "master.log").read_text()[-3000:]
    finally:
        kill_still_running(master, *workers)
    steps = pd.read_csv(run_dir / "steps.csv")
    assert list(steps["users"]) == [1, 2]
    records = pd.read_parquet(run_dir / "requests.parquet")
    assert records["worker"].nunique() == 2  # both workers, each from the Deployment's command, ran users
    ok = records[records["status"] == "ok"]
    assert len(ok) > 0 and (ok["output_tokens"] == 8).all()  # the command line's --max-tokens won over the file's
    # master.conf's own settings held where nothing overrode them.
    saved = json.loads((run_dir / "run.json").read_text())["options"]
    assert saved["master"] and saved["headless"] and saved["ignore_eos"]
    assert saved["expect_workers"] == 2 and saved["steps"] == "1,2"
