"""GPU telemetry end to end: real headless Locust runs against tests/fakeserver.py with --gpu-metrics-url pointing
at fake dcgm-exporters (tests/fakedcgm.py: DCGM's exact text, values on a known schedule). steps.csv's GPU columns
equal the means of the values each exporter says it served, over the scrapes inside each step's window; two GPU hosts
are one table; a GPU without profiling fields (or with DCGM's blank values) leaves them missing, not 0; an exporter
that goes down mid-run, or never answers, is gaps and one warning, and the run goes on to exit 0; a URL that is not
http(s) stops the run before any load."""

from __future__ import annotations

import csv
import json
import math
import subprocess

import pandas as pd
import pytest

from tests.helpers.net import free_port
from tests.helpers.paths import ROOT
from tests.helpers.runs import kill_still_running, locust, locust_command, wait_until
from tests.helpers.servers import FakeDCGM

pytestmark = pytest.mark.contract

SCRAPE = ("--scrape-interval", "0.25")
FIELDS = ("util", "sm_active", "dram_active", "fb_used_mib", "power_w")


def _scrape_times(metrics: pd.DataFrame, source: str) -> list[float]:
    up = metrics[(metrics["metric"] == "up") & (metrics["source"] == source) & (metrics["value"] == 1.0)]
    return sorted(up["timestamp"].tolist())


def _served_at_scrapes(truth: dict, times: list[float]) -> list[tuple[float, dict]]:
    """Each successful scrape's stamp with the answer the exporter served it: the last one served before the stamp
    (the scraper stamps an answer when it arrives). The preflight's own GET is served too, and matched by none."""
    served = sorted(truth["served"], key=lambda e: e["served_at"])
    out = []
    for t in times:
        before = [e for e in served if e["served_at"] <= t]
        assert before, (t, served[:1])
        out.append((t, before[-1]))
    assert len({e["k"] for _, e in out}) == len(out), "two scrapes matched one answer"
    return out


def _expected(truths: dict[str, list[tuple[float, dict]]], start: float, end: float) -> dict:
    """The step's GPU columns from the served values: per GPU the mean over its scrapes in [start, end), then the
    mean over the GPUs; memory the max."""
    per_gpu = []
    for scrapes in truths.values():
        inside = [e for t, e in scrapes if start <= t < end]
        if not inside:
            continue
        for g in range(len(inside[0]["gpus"])):
            values = {f: [e["gpus"][g][f] for e in inside] for f in FIELDS}
            per_gpu.append({f: sum(v) / len(v) for f, v in values.items()} | {"mem": max(values["fb_used_mib"])})
    mean = lambda f: sum(g[f] for g in per_gpu) / len(per_gpu)  # noqa: E731
    return {
        "gpus": len(per_gpu),
        "gpu_util_mean": mean("util") / 100,
        "gpu_sm_active_mean": mean("sm_active"),
        "gpu_dram_active_mean": mean("dram_active"),
        "gpu_mem_used_max_bytes": max(g["mem"] for g in per_gpu) * 2**20,
        "gpu_power_mean_w": mean("power_w"),
    }


def test_two_gpu_hosts_give_exact_step_means_and_a_silent_one_a_single_warning(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "5", "--itl-ms", "1")
    a = FakeDCGM(["--gpus", "2", "--hostname", "node-a"])
    b = FakeDCGM(["--gpus", "1", "--hostname", "node-b", "--hostname-label", "hostname", "--uuid-prefix", "0b0b0b0b",
                  "--model-name", "NVIDIA A100-SXM4-80GB"])  # fmt: skip
    silent = f"http://127.0.0.1:{free_port()}/metrics"  # nothing listens there
    run_dir = tmp_path / "run"
    try:
        urls = ("--gpu-metrics-url", a.metrics_url, "--gpu-metrics-url", b.metrics_url, "--gpu-metrics-url", silent)
        # A warm-up: the window starts after it, and the samples before it are not the step's.
        proc = locust("--host", server.url, "--steps", "1,2", "--step-duration", "3s", "--step-warmup", "1s",
                      "--max-tokens", "8", "--run-dir", str(run_dir), *SCRAPE, *urls)  # fmt: skip
        truth = {a.metrics_url: a.get("/truth"), b.metrics_url: b.get("/truth")}
    finally:
        a.stop()
        b.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The exporter that never answered: warned about once (by the preflight), and the scraper does not repeat it.
    about_silent = [line for line in proc.stderr.splitlines() if silent in line]
    assert len(about_silent) == 1 and "do not answer" in about_silent[0], about_silent
    assert "GPU metrics at" not in proc.stderr.replace(about_silent[0], "")

    metrics = pd.read_parquet(run_dir / "metrics.parquet")
    assert set(metrics["source"]) == {"server", a.metrics_url, b.metrics_url, silent}
    silent_up = metrics[(metrics["source"] == silent)]
    assert set(silent_up["metric"]) == {"up"} and (silent_up["value"] == 0).all() and len(silent_up) >= 4
    util_a = metrics[(metrics["metric"] == "DCGM_FI_DEV_GPU_UTIL") & (metrics["source"] == a.metrics_url)]
    labels = json.loads(util_a["labels"].iloc[0])
    assert labels["Hostname"] == "node-a" and labels["modelName"] == "NVIDIA H100 80GB HBM3"  # raw, every label
    assert labels["DCGM_FI_DRIVER_VERSION"] == "550.54.15"

    matched = {url: _served_at_scrapes(truth[url], _scrape_times(metrics, url)) for url in truth}
    steps = pd.read_csv(run_dir / "steps.csv")
    timeline = [t for t in json.loads((run_dir / "run.json").read_text())["timeline"] if "step" in t]
    assert json.loads((run_dir / "run.json").read_text())["options"]["gpu_metrics_url"] == [
        a.metrics_url, b.metrics_url, silent
    ]  # fmt: skip
    assert len(steps) == 2
    for step, row in zip(timeline, steps.to_dict(orient="records")):
        start, end = step["measure_start"], step["end_time"]
        assert row["window_start_time"] == pytest.approx(start, abs=1e-6)
        assert row["window_end_time"] == pytest.approx(end, abs=1e-6)
        expected = _expected(matched, start, end)
        assert step["measure_start"] >= step["start_time"] + 1.0  # the warm-up is outside the window
        assert expected["gpus"] == 3 and row["gpus"] == 3
        for column, value in expected.items():
            assert row[column] == pytest.approx(value, rel=1e-12), (step["step"], column)


def test_an_exporter_down_mid_run_is_gaps_and_one_warning_and_missing_fields_stay_empty(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "5", "--itl-ms", "1")
    consumer = FakeDCGM(["--gpus", "1", "--hostname", "desk", "--no-profiling"])  # no DCGM_FI_PROF_* at all
    blank = FakeDCGM(["--gpus", "1", "--hostname", "old", "--blank-profiling"])  # DCGM's blank value for them
    run_dir = tmp_path / "run"
    args = ["--host", server.url, "--steps", "1,2", "--step-duration", "3s", "--step-warmup", "0s", "--max-tokens",
            "8", "--run-dir", str(run_dir), *SCRAPE, "--gpu-metrics-url", consumer.metrics_url, "--gpu-metrics-url",
            blank.metrics_url]  # fmt: skip
    err = tmp_path / "stderr.log"
    with open(tmp_path / "stdout.log", "w") as out, open(err, "w") as errors:  # files: a full pipe would stall it
        proc = subprocess.Popen(locust_command(*args), cwd=ROOT, stdout=out, stderr=errors, start_new_session=True)
    try:
        assert wait_until(lambda: len(consumer.get("/truth")["served"]) >= 3, timeout=30)
        consumer.post("/down", {"down": True})
        assert wait_until(lambda: consumer.get("/truth")["failed"] >= 4, timeout=10)
        consumer.post("/down", {"down": False})
        proc.wait(timeout=60)
        served_after = consumer.get("/truth")["served"]
    finally:
        kill_still_running(proc)
        consumer.stop()
        blank.stop()
    stderr = err.read_text()
    assert proc.returncode == 0, stderr[-3000:]
    warnings = [line for line in stderr.splitlines() if "cannot scrape the GPU metrics at" in line]
    assert len(warnings) == 1 and consumer.metrics_url in warnings[0], warnings  # one, not one per failed scrape
    assert "Traceback" not in stderr

    metrics = pd.read_parquet(run_dir / "metrics.parquet")
    up = metrics[(metrics["metric"] == "up") & (metrics["source"] == consumer.metrics_url)].sort_values("timestamp")
    values = up["value"].tolist()
    assert values.count(0.0) >= 4 and values[-1] == 1.0  # the gaps, then scraped again: the run went on
    assert (metrics.loc[(metrics["metric"] == "up") & (metrics["source"] == "server"), "value"] == 1.0).all()
    assert len(served_after) > 3

    with open(run_dir / "steps.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        assert row["gpu_sm_active_mean"] == "" and row["gpu_dram_active_mean"] == "", row  # missing, never 0
        assert row["gpus"] == "2" and 0 <= float(row["gpu_util_mean"]) <= 1
        assert float(row["gpu_mem_used_max_bytes"]) >= 70000 * 2**20 and not math.isnan(float(row["gpu_power_mean_w"]))
        assert row["window_start_time"] and row["window_end_time"]


def test_a_gpu_url_that_is_not_http_stops_the_run_with_one_line_and_nothing_sent(fake_server, tmp_path):
    server = fake_server()
    proc = locust("--host", server.url, "--steps", "1", "--step-duration", "2s", "--step-warmup", "0s",
                  "--gpu-metrics-url", "gpu-node:9400/metrics", "--run-dir", str(tmp_path / "r"))  # fmt: skip
    assert proc.returncode == 3, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "--gpu-metrics-url 'gpu-node:9400/metrics' is not an http(s) URL" in errors[0]
    assert server.get("/stats")["requests"] == 0
