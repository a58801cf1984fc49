"""DCGM samples built by hand, shaped as metrics.parquet holds them (timestamp, metric, labels as JSON, value,
source), and gpu_series of them for the roofline tests.

`gpu_series` here is a minimal stand-in for analysis/gpu.py's (issue 20, part A: the same contract), used only while
that module is absent: `use_gpu_series(monkeypatch)` installs it as vllm_loadtest.analysis.gpu then, and leaves the
real one alone once it exists.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from collections.abc import Callable

import numpy as np
import pandas as pd

URL = "http://dcgm:9400/metrics"
MIB = 2**20
# DCGM's field name -> (gpu_series field, scale to its unit)
FIELDS = {
    "DCGM_FI_DEV_GPU_UTIL": ("util", 0.01),
    "DCGM_FI_PROF_SM_ACTIVE": ("sm_active", 1.0),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("dram_active", 1.0),
    "DCGM_FI_DEV_FB_USED": ("mem_used_bytes", float(MIB)),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0),
}
SERIES_COLUMNS = ["timestamp", "gpu_key", "hostname", "gpu", "uuid", "model_name", "field", "value"]


def labels(gpu: int, host: str = "node-1") -> dict:
    return {
        "gpu": str(gpu),
        "UUID": f"GPU-{host}-{gpu:04d}",
        "pci_bus_id": f"00000000:{gpu + 7:02X}:00.0",
        "device": f"nvidia{gpu}",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": host,
        "DCGM_FI_DRIVER_VERSION": "550.54.15",
    }


def metrics_frame(
    times: np.ndarray,
    values: Callable[[int, float], dict[str, float]],
    gpus: int = 1,
    host: str = "node-1",
    source: str = URL,
) -> pd.DataFrame:
    """One scrape per time: an `up` sample with its source, then for each GPU the DCGM fields values(gpu, t) gives
    (DCGM's names and units: util in %, memory in MiB; a field left out of the dict is not served)."""
    rows = []
    for t in times:
        rows.append((float(t), "up", "{}", 1.0, source))
        for gpu in range(gpus):
            text = json.dumps(labels(gpu, host), sort_keys=True)
            for name, value in values(gpu, float(t)).items():
                rows.append((float(t), name, text, float(value), source))
    return pd.DataFrame(rows, columns=["timestamp", "metric", "labels", "value", "source"])


def gpu_series(metrics: pd.DataFrame) -> pd.DataFrame:
    """The contract's gpu_series: one row per DCGM sample, its field in the suite's units."""
    out = []
    rows = metrics[metrics["metric"].isin(list(FIELDS))]
    for t, metric, text, value in zip(rows["timestamp"], rows["metric"], rows["labels"], rows["value"]):
        lab = json.loads(text)
        field, scale = FIELDS[metric]
        host = lab.get("Hostname")
        key = f"{host}/{lab.get('gpu')}" if host else lab.get("UUID")
        out.append((t, key, host, lab.get("gpu"), lab.get("UUID"), lab.get("modelName"), field, value * scale))
    return pd.DataFrame(out, columns=SERIES_COLUMNS)


def use_gpu_series(monkeypatch) -> None:
    """vllm_loadtest.analysis.gpu: the real module when it exists, else this stand-in."""
    if importlib.util.find_spec("vllm_loadtest.analysis.gpu") is not None:
        return
    module = types.ModuleType("vllm_loadtest.analysis.gpu")
    module.gpu_series = gpu_series
    monkeypatch.setitem(sys.modules, "vllm_loadtest.analysis.gpu", module)
