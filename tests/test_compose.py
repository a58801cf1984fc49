"""docker-compose.yml: checked structurally here, and with `docker compose config` (or Debian's docker-compose, which
`make compose` installs) on both profiles; these machines have the Docker client but no engine, which `config` does
not need."""

import subprocess

import pytest

from tests.helpers.compose import NO_CLIENT, client, load
from tests.helpers.paths import ROOT

pytestmark = pytest.mark.unit


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


@pytest.mark.skipif(client() is None, reason=NO_CLIENT)
def test_compose_config_validates():
    for profile in ("gpu", "cpu"):
        proc = subprocess.run(
            [*client(), "config", "-q"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env={"PATH": "/usr/bin:/bin:/usr/local/bin", "COMPOSE_PROFILES": profile},
        )
        assert proc.returncode == 0, proc.stderr
