"""deploy/kubernetes/: every manifest valid against the Kubernetes schemas (offline, kubernetes-validate), the
kustomization complete, the master's arguments accepted by the suite's own option parser and checks, and the pieces
wired to one another (workers -> master's Service, master -> vLLM's and the dcgm-exporter's Services)."""

from __future__ import annotations

import copy
import shutil
import subprocess
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml
from vllm_loadtest.embedded_vllm import server as embedded_server
from vllm_loadtest.locustfiles import startup

from tests.helpers.compose import load as load_compose
from tests.helpers.inprocess import parse_options
from tests.helpers.manifests import (
    KUBE,
    documents,
    kustomization,
    manifest_files,
    master_conf,
    pod_spec,
    resource,
)

pytestmark = pytest.mark.unit

# The oldest Kubernetes the manifests are for (internalTrafficPolicy is GA from 1.26) and the newest schemas known.
VERSIONS = ("1.28.0", kubernetes_validate.latest_version())
MASTER_CONF = "/etc/vllm-loadtest/master.conf"


def validate(doc: dict) -> None:
    for version in VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)  # strict: an unknown (misspelt) field fails too


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: str(p.relative_to(KUBE)))
def test_manifest_validates_against_the_kubernetes_schemas(path):
    docs = documents(path)
    assert docs, f"{path} holds no resource"
    for doc in docs:
        validate(doc)


def test_the_validator_rejects_what_kubernetes_would():
    worker = resource("Deployment", "locust-worker")
    validate(worker)
    for breakage in (
        lambda d: d["spec"].__setitem__("replicas", "four"),
        lambda d: pod_spec(d)["containers"][0].__setitem__("comand", ["locust"]),  # misspelt
        lambda d: pod_spec(d)["containers"][0].pop("name"),
    ):
        broken = copy.deepcopy(worker)
        breakage(broken)
        with pytest.raises(kubernetes_validate.ValidationError):
            validate(broken)


def test_kustomization_lists_every_manifest_and_generated_file():
    k = kustomization()
    resources = set(k["resources"])
    top_level = {p.name for p in KUBE.glob("*.yaml")} - {"kustomization.yaml"}
    assert resources == top_level  # extras/ are applied by hand (README.md), never by the kustomization
    generated = {f for g in k["configMapGenerator"] for f in g["files"]}
    assert all((KUBE / f).is_file() for f in generated)
    others = {p.name for p in KUBE.iterdir() if p.is_file()} - top_level - generated
    assert others == {"kustomization.yaml", "README.md"}
    assert {d["kind"] for f in resources for d in documents(KUBE / f)} >= {
        "Namespace",
        "Deployment",
        "Service",
        "Job",
        "DaemonSet",
        "PersistentVolumeClaim",
    }


def kustomize() -> list[str] | None:
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    return None


@pytest.mark.skipif(kustomize() is None, reason="neither kustomize nor kubectl (kubectl kustomize) is installed")
def test_kustomize_build_is_valid_and_wires_the_generated_config_maps():
    proc = subprocess.run([*kustomize(), str(KUBE)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    for doc in docs:
        validate(doc)
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == "vllm-loadtest"
    config_maps = {d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"}
    job = next(d for d in docs if d["kind"] == "Job")
    daemon_set = next(d for d in docs if d["kind"] == "DaemonSet")
    for workload in (job, daemon_set):  # the hashed names of the generated ConfigMaps replace the plain ones
        assert {v["configMap"]["name"] for v in pod_spec(workload)["volumes"] if "configMap" in v} <= config_maps
    images = {c["image"] for d in docs if d["kind"] in ("Job", "Deployment") for c in pod_spec(d)["containers"]}
    assert "vllm-loadtest:local" in images  # the kustomization's images: entry, which README.md says to set


def test_master_arguments_parse_and_pass_the_suites_checks(tmp_path):
    conf = tmp_path / "master.conf"
    conf.write_text(master_conf(keep_gpu_url=True))
    options = parse_options("--config", str(conf))
    startup.check_options(options)  # every check that needs no server: the same a headless master runs first
    assert options.master and options.headless
    assert options.locustfile == "locustfiles/vllm_streaming.py"
    assert options.expect_workers == resource("Deployment", "locust-worker")["spec"]["replicas"]
    assert options.metrics_url == f"{options.host}/metrics"
    assert options.gpu_metrics_url == ["http://dcgm-exporter:9400/metrics"]
    # The Job really reads this file: mounted from the generated ConfigMap where its command looks for it.
    job = pod_spec(resource("Job", "locust-master"))
    container = job["containers"][0]
    assert container["command"] == ["locust", "--config", MASTER_CONF]
    mount = next(m for m in container["volumeMounts"] if MASTER_CONF.startswith(m["mountPath"] + "/"))
    volume = next(v for v in job["volumes"] if v["name"] == mount["name"])
    generator = next(g for g in kustomization()["configMapGenerator"] if g["name"] == volume["configMap"]["name"])
    assert generator["files"] == [MASTER_CONF.rsplit("/", 1)[1]]


def service_port(url: str) -> None:
    """An in-cluster URL names a Service of the kustomization and one of its ports."""
    parts = urlsplit(url)
    service = resource("Service", parts.hostname)
    assert parts.port in {p["port"] for p in service["spec"]["ports"]}, url


def test_the_master_reaches_vllm_and_the_dcgm_exporter_through_their_services(tmp_path):
    conf = tmp_path / "master.conf"
    conf.write_text(master_conf(keep_gpu_url=False))
    options = parse_options("--config", str(conf))
    service_port(options.host)
    service_port(options.metrics_url)
    # Read from the file itself: the option may not exist yet in this branch's parser (see above).
    lines = master_conf().splitlines()
    service_port(next(line.split("=", 1)[1].strip() for line in lines if line.startswith("gpu-metrics-url")))
    # The exporter's Service answers from the client's node, and the master runs on vLLM's: vLLM's GPUs.
    assert resource("Service", "dcgm-exporter")["spec"]["internalTrafficPolicy"] == "Local"
    affinity = pod_spec(resource("Job", "locust-master"))["affinity"]["podAffinity"]
    term = affinity["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    vllm_labels = resource("Deployment", "vllm")["spec"]["template"]["metadata"]["labels"]
    assert term["labelSelector"]["matchLabels"].items() <= vllm_labels.items()


def test_every_service_selects_the_pods_it_serves():
    pods = [
        d["spec"]["template"]["metadata"]["labels"]
        for f in kustomization()["resources"]
        for d in documents(KUBE / f)
        if d["kind"] in ("Deployment", "Job", "DaemonSet")
    ]
    for f in kustomization()["resources"]:
        for service in (d for d in documents(KUBE / f) if d["kind"] == "Service"):
            selector = service["spec"]["selector"].items()
            assert sum(selector <= labels.items() for labels in pods) == 1, service["metadata"]["name"]


def test_the_workers_connect_to_the_masters_service_on_locusts_port():
    worker = pod_spec(resource("Deployment", "locust-worker"))["containers"][0]["command"]
    assert "--worker" in worker
    service = resource("Service", "locust-master")
    assert worker[worker.index("--master-host") + 1] == service["metadata"]["name"]
    port = service["spec"]["ports"][0]
    assert port["port"] == parse_options().master_port == 5557  # the workers' default --master-port
    master = pod_spec(resource("Job", "locust-master"))["containers"][0]
    assert port["targetPort"] in {p["name"] for p in master["ports"]}
    assert {p["containerPort"] for p in master["ports"]} == {5557}


def test_vllm_runs_the_official_pinned_image_with_composes_arguments_on_a_gpu():
    container = pod_spec(resource("Deployment", "vllm"))["containers"][0]
    image, tag = container["image"].split(":")
    assert image == "vllm/vllm-openai"
    # The release of the embedded CPU build the suite's vllm tests run (embedded_vllm/server.py).
    assert tag == "v" + embedded_server.VLLM_PACKAGE.split("==")[1]
    compose = load_compose()["services"]["vllm"]["command"]
    resolved = [arg.replace("${MODEL:-", "").rstrip("}") if arg.startswith("${") else arg for arg in compose]
    assert container["args"] == resolved
    assert container["resources"]["limits"]["nvidia.com/gpu"]
    assert {m["mountPath"] for m in container["volumeMounts"]} >= {"/root/.cache/huggingface", "/dev/shm"}
    assert container["startupProbe"]["httpGet"]["path"] == "/health"


def test_reports_land_on_the_claim_and_the_locust_pods_run_the_suites_image():
    job = pod_spec(resource("Job", "locust-master"))
    reports = next(m for m in job["containers"][0]["volumeMounts"] if m["mountPath"] == "/app/reports")
    volume = next(v for v in job["volumes"] if v["name"] == reports["name"])
    resource("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])
    # /app is the Dockerfile's WORKDIR: the default run directory reports/<timestamp>/ is on the claim.
    assert "WORKDIR /app" in (KUBE.parents[1] / "Dockerfile").read_text()
    images = {i["name"] for i in kustomization()["images"]}  # kustomize points them at the pushed image
    for name in ("locust-master", "locust-worker"):
        kind = "Job" if name == "locust-master" else "Deployment"
        spec = pod_spec(resource(kind, name))
        assert {c["image"] for c in spec["containers"] + spec.get("initContainers", [])} <= images


def test_the_exporter_is_composes_release_with_the_same_counters_every_second():
    container = pod_spec(resource("DaemonSet", "dcgm-exporter"))["containers"][0]
    compose = load_compose()["services"]["dcgm-exporter"]
    compose_tag = compose["image"].split(":-", 1)[1].rstrip("}")  # ${DCGM_EXPORTER_TAG:-<release>}
    assert container["image"] == f"nvcr.io/nvidia/k8s/dcgm-exporter:{compose_tag}"
    assert container["args"] == compose["command"]
    # The same counters file: compose mounts it from here, the DaemonSet from the generated ConfigMap.
    target = container["args"][container["args"].index("-f") + 1]
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == target)
    assert any(v.startswith(f"./deploy/kubernetes/{mount['subPath']}:{target}") for v in compose["volumes"])
    generator = next(g for g in kustomization()["configMapGenerator"] if g["name"] == "dcgm-counters")
    assert generator["files"] == [mount["subPath"]]
