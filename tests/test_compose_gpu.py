"""docker-compose.yml's GPU telemetry: the dcgm-exporter service (GPU profile) and the master's --gpu-metrics-url in
that profile only, checked in the file and in the command Compose resolves (`config`), run by a real shell."""

from __future__ import annotations

import shlex
import subprocess

import pytest
import yaml

from tests.helpers.compose import NO_CLIENT, client, config, load
from tests.helpers.paths import ROOT

pytestmark = pytest.mark.unit

DCGM_URL = "http://dcgm-exporter:9400/metrics"
# The fields analysis/gpu.py turns into steps.csv's GPU columns.
FIELDS = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_POWER_USAGE",
)


def counters(text: str) -> dict[str, str]:
    """A dcgm-exporter counters file's enabled fields -> their Prometheus type (comment lines skipped)."""
    fields = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            parts = [p.strip() for p in line.split(",")]
            assert len(parts) >= 3, f"a counters line needs field, type, help: {line!r}"
            fields[parts[0]] = parts[1]
    return fields


def test_dcgm_exporter_is_nvidias_image_pinned_in_the_gpu_profile_with_the_gpus_reserved():
    services = load()["services"]
    dcgm = services["dcgm-exporter"]
    assert dcgm["profiles"] == ["gpu"]
    image, tag = dcgm["image"].split(":", 1)
    assert image == "nvcr.io/nvidia/k8s/dcgm-exporter"
    default_tag = tag.split(":-", 1)[-1].rstrip("}")
    assert default_tag[0].isdigit() and "latest" not in default_tag  # a release, e.g. 4.5.3-4.8.2-distroless
    assert dcgm["deploy"] == services["vllm"]["deploy"]  # the same GPU reservation as vLLM's
    assert "SYS_ADMIN" in dcgm["cap_add"]  # DCGM's profiling fields need it
    assert "ports" not in dcgm  # only the master reads it, on the compose network


def test_dcgm_exporter_collects_the_fields_the_suite_reads_every_second():
    dcgm = load()["services"]["dcgm-exporter"]
    command = dcgm["command"]
    mounted = {v.split(":")[1]: ROOT / v.split(":")[0] for v in dcgm["volumes"]}
    counters_file = mounted[command[command.index("-f") + 1]]
    fields = counters(counters_file.read_text())
    assert all(fields.get(f) == "gauge" for f in FIELDS), sorted(set(FIELDS) - set(fields))
    assert command[command.index("-c") + 1] == "1000"  # ms; the exporter's default is 30 s


def test_the_master_scrapes_the_exporter_in_the_gpu_profile():
    command = load()["services"]["locust-master"]["command"]
    assert f"--gpu-metrics-url {DCGM_URL}" in command
    assert "*,gpu,*" in command and "${COMPOSE_PROFILES:-}" in command


def master_arguments(profile: str, tmp_path, **env: str) -> list[str]:
    """The arguments the master's resolved command passes to locust, its shell run with python and locust stubbed."""
    proc = config(profile, **env)
    assert proc.returncode == 0, proc.stderr
    resolved = yaml.safe_load(proc.stdout)["services"]["locust-master"]["command"]
    if isinstance(resolved, list):
        resolved = shlex.join(resolved)
    # `config` prints $$ for a literal $ (it stays Compose input); the container's shell sees one.
    argv = shlex.split(resolved.replace("$$", "$"))
    assert argv[:2] == ["sh", "-c"], argv
    script = tmp_path / "master.sh"
    script.write_text("python() { :; }\nlocust() { printf '%s\\n' \"$@\"; }\n" + argv[2] + "\n")
    run = subprocess.run(["sh", str(script)], capture_output=True, text=True, check=True)
    return run.stdout.splitlines()


@pytest.mark.skipif(client() is None, reason=NO_CLIENT)
def test_resolved_master_command_has_the_gpu_url_in_the_gpu_profile_only(tmp_path):
    gpu = master_arguments("gpu", tmp_path, LOCUST_ARGS="--headless --steps 1,2")
    assert gpu[gpu.index("--gpu-metrics-url") + 1] == DCGM_URL
    assert gpu[-3:] == ["--headless", "--steps", "1,2"]  # LOCUST_ARGS still comes last
    cpu = master_arguments("cpu", tmp_path)
    assert "--gpu-metrics-url" not in cpu
    assert cpu[cpu.index("--host") + 1] == "http://vllm:8000"
    both = master_arguments("gpu,cpu", tmp_path)
    assert "--gpu-metrics-url" in both
