"""The master's and workers' commands of docker-compose.yml, run as compose runs them (without Docker)."""

import os
import subprocess
import sys

import pandas as pd
import pytest

from tests.helpers.compose import load
from tests.helpers.net import free_port
from tests.helpers.paths import ROOT
from tests.helpers.runs import kill_still_running

pytestmark = pytest.mark.contract


def test_compose_commands_run_a_complete_distributed_run(fake_server, tmp_path):
    """The master's and workers' commands exactly as compose runs them (no Docker engine here: the hostnames become
    loopback, the shared ./reports volume a shared working directory), with LOCUST_ARGS making the run headless."""
    server = fake_server("--ttft-ms", "10", "--itl-ms", "2")
    port = free_port()
    app = tmp_path / "app"  # the containers' /app: the repository's code, and ./reports mounted from the host
    app.mkdir()
    for name in ("locustfiles", "analysis", "embedded_vllm", "vllm_loadtest"):
        (app / name).symlink_to(ROOT / name)
    services = load()["services"]
    locust_args = (
        "--headless --expect-workers 3 --steps 2,4 --step-duration 3s --step-warmup 0s --max-tokens 8 "
        f"--stop-timeout 10 --master-bind-host 127.0.0.1 --master-bind-port {port}"
    )

    def command(svc: str) -> str:
        # Compose's own interpolation: ${VAR:-} from its environment (no profile: the CPU run), $$ for a literal $.
        cmd = services[svc]["command"].replace("${LOCUST_ARGS:-}", locust_args).replace("${COMPOSE_PROFILES:-}", "")
        cmd = cmd.replace("$$", "$")
        cmd = cmd.replace("http://vllm:8000", server.url).replace("python -m", f"{sys.executable} -m")
        cmd = cmd.replace("locust -f", f"{sys.executable} -m locust -f")
        return cmd.replace("--master-host locust-master", f"--master-host 127.0.0.1 --master-port {port}")

    env = {**os.environ, "PYTHONPATH": str(app)}
    procs = [
        subprocess.Popen(
            ["sh", "-c", command("locust-master")],
            cwd=app,
            env=env,
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    ]
    procs += [
        subprocess.Popen(
            ["sh", "-c", command("locust-worker")],
            cwd=app,
            env=env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(3)
    ]
    try:
        out, _ = procs[0].communicate(timeout=120)
        assert procs[0].returncode == 0, out[-3000:]
    finally:
        kill_still_running(*procs)
    (run_dir,) = (app / "reports").iterdir()  # the default run directory, on the "host"
    records = pd.read_parquet(run_dir / "requests.parquet")
    assert records["worker"].nunique() == 3 and not records["request_id"].duplicated().any()
    ok = records[records["status"] == "ok"]
    assert len(ok) == server.get("/stats")["ok"] and ok["output_tokens"].sum() == server.get("/stats")["tokens"]
    for name in ("steps.csv", "summary.json", "metrics.parquet", "report.html"):
        assert (run_dir / name).exists(), name
