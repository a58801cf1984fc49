"""docker-compose.yml: checked structurally here, and with `docker compose config` where a Compose client exists
(these machines have the Docker client but no engine)."""

import shutil
import subprocess

import pytest
import yaml

from tests.conftest import ROOT

COMPOSE = ROOT / "docker-compose.yml"


def load() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_gpu_vllm_service():
    vllm = load()["services"]["vllm"]
    assert vllm["image"].startswith("vllm/vllm-openai:")
    cmd = " ".join(vllm["command"])
    assert "${MODEL:-Qwen/Qwen3-8B}" in cmd
    assert "--max-model-len 8192" in cmd and "--gpu-memory-utilization 0.90" in cmd
    devices = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    assert any("/root/.cache/huggingface" in v for v in vllm["volumes"])
    assert "HF_TOKEN" in vllm["environment"]
    assert "/health" in " ".join(vllm["healthcheck"]["test"])


def test_cpu_alternative_is_behind_a_profile_and_reachable_under_the_same_name():
    cpu = load()["services"]["vllm-cpu"]
    assert cpu["profiles"] == ["cpu"]
    assert "vllm" in cpu["networks"]["default"]["aliases"]
    assert "/health" in " ".join(cpu["healthcheck"]["test"])


def test_locust_master_and_workers_share_the_locustfiles_and_reports():
    services = load()["services"]
    master, worker = services["locust-master"], services["locust-worker"]
    assert "8089:8089" in master["ports"]
    assert "--master" in master["command"] and "--worker" in worker["command"]
    for svc in (master, worker):
        assert "embedded_vllm wait http://vllm:8000" in svc["command"]  # waits for vLLM to be healthy
        assert "./reports:/app/reports" in svc["volumes"]
        assert any(v.startswith("./locustfiles:") for v in svc["volumes"])
    assert "ports" not in worker  # so that --scale locust-worker=N does not collide


def compose_client() -> list[str] | None:
    for cmd in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(cmd[0]) and subprocess.run([*cmd, "version"], capture_output=True).returncode == 0:
            return cmd
    return None


@pytest.mark.skipif(compose_client() is None, reason="no Compose client (docker compose plugin or docker-compose)")
def test_compose_config_validates():
    for profile in ("gpu", "cpu"):
        proc = subprocess.run(
            [*compose_client(), "config", "-q"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env={"PATH": "/usr/bin:/bin:/usr/local/bin", "COMPOSE_PROFILES": profile},
        )
        assert proc.returncode == 0, proc.stderr


def test_compose_commands_run_a_complete_distributed_run(fake_server, tmp_path):
    """The master's and workers' commands exactly as compose runs them (no Docker engine here: the hostnames become
    loopback, the shared ./reports volume a shared working directory), with LOCUST_ARGS making the run headless."""
    import os
    import signal
    import socket
    import sys

    import pandas as pd

    server = fake_server("--ttft-ms", "10", "--itl-ms", "2")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = tmp_path / "app"  # the containers' /app: the repository's code, and ./reports mounted from the host
    app.mkdir()
    for name in ("locustfiles", "analysis", "embedded_vllm"):
        (app / name).symlink_to(ROOT / name)
    services = load()["services"]
    locust_args = (
        "--headless --expect-workers 3 --steps 2,4 --step-duration 3s --step-warmup 0s --max-tokens 8 "
        f"--stop-timeout 10 --master-bind-host 127.0.0.1 --master-bind-port {port}"
    )

    def command(svc: str) -> str:
        cmd = services[svc]["command"].replace("${LOCUST_ARGS:-}", locust_args)
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
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    (run_dir,) = (app / "reports").iterdir()  # the default run directory, on the "host"
    records = pd.read_parquet(run_dir / "requests.parquet")
    assert records["worker"].nunique() == 3 and not records["request_id"].duplicated().any()
    ok = records[records["status"] == "ok"]
    assert len(ok) == server.get("/stats")["ok"] and ok["output_tokens"].sum() == server.get("/stats")["tokens"]
    for name in ("steps.csv", "summary.json", "metrics.parquet", "report.html"):
        assert (run_dir / name).exists(), name
