"""deploy/kubernetes/: its manifests, parsed, by file and by kind and name."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.helpers.paths import ROOT

KUBE = ROOT / "deploy" / "kubernetes"


def manifest_files() -> list[Path]:
    """Every manifest (extras/ too); kustomization.yaml is kustomize's, not a resource."""
    return sorted(p for p in KUBE.rglob("*.yaml") if p.name != "kustomization.yaml")


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def kustomization() -> dict:
    return yaml.safe_load((KUBE / "kustomization.yaml").read_text())


def resource(kind: str, name: str) -> dict:
    """The resource of that kind and name among the kustomization's resources."""
    for file in kustomization()["resources"]:
        for doc in documents(KUBE / file):
            if doc["kind"] == kind and doc["metadata"]["name"] == name:
                return doc
    raise KeyError(f"no {kind} {name} in {KUBE}")


def pod_spec(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


def master_conf(keep_gpu_url: bool = True) -> str:
    """master.conf's text; without its gpu-metrics-url line when not keep_gpu_url."""
    text = (KUBE / "master.conf").read_text()
    if keep_gpu_url:
        return text
    return "\n".join(line for line in text.splitlines() if not line.startswith("gpu-metrics-url")) + "\n"
