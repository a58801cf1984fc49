"""GPU telemetry in this process: DCGM's text parsed under its own names with every label, metrics.parquet's source
column (old runs read as the server's), the GPU series' units and identities, the per-step GPU columns exact on
known samples (gaps, a GPU without profiling fields, DCGM's blank values: missing, never 0), and --gpu-metrics-url's
parsing and checks."""

from __future__ import annotations

import json
import math

import gevent
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from vllm_loadtest.analysis import glossary
from vllm_loadtest.analysis.gpu import GPU_COLUMNS, STEP_GPU_COLUMNS, gpu_identity, gpu_series, step_gpu_table
from vllm_loadtest.analysis.integrity import integrity
from vllm_loadtest.analysis.prometheus_text import parse_gpu_samples, parse_samples, scrape_line
from vllm_loadtest.analysis.run import compute_table
from vllm_loadtest.analysis.server_metrics import (
    METRICS_FILE,
    SCRAPES_FILE,
    ServerSeries,
    load_metrics,
    merge_scrapes,
)
from vllm_loadtest.locustfiles.options import gpu_metrics_urls

from tests.helpers.badinput import first_error
from tests.helpers.inprocess import parse_options
from tests.helpers.paths import FIXTURES
from tests.helpers.records import frame, rec
from tests.helpers.runs import wait_until

pytestmark = pytest.mark.unit

H100 = (FIXTURES / "dcgm" / "dcgm-exporter-4.5.3-h100x2.txt").read_text()
RTX = (FIXTURES / "dcgm" / "dcgm-exporter-k8s-rtx4090-no-profiling.txt").read_text()
URL_A = "http://node-a:9400/metrics"
URL_B = "http://node-b:9400/metrics"
MIB = 2**20


# --- parsing: DCGM's names and labels, kept as they are ------------------------------------------------------------
def test_dcgm_text_is_kept_under_dcgms_names_with_every_label():
    samples = parse_gpu_samples(H100)
    names = {name for name, _, _ in samples}
    assert len(samples) == 26 * 2  # every default counter (plus SM activity) for each of the two GPUs
    assert all(name.startswith("DCGM_") for name in names) and "DCGM_FI_PROF_SM_ACTIVE" in names
    util = {labels["gpu"]: (labels, value) for name, labels, value in samples if name == "DCGM_FI_DEV_GPU_UTIL"}
    labels, value = util["1"]
    assert value == 31.0
    assert labels == {
        "gpu": "1", "UUID": "GPU-5f3a2b1c-0001-4c1e-9b2a-000000000001", "pci_bus_id": "00000000:28:00.0",
        "device": "nvidia1", "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "gpu-node-1",
        "DCGM_FI_DRIVER_VERSION": "550.54.15",
    }  # fmt: skip
    # The server's parser (any profile) takes none of them: DCGM's series are never renamed or mixed in.
    assert parse_samples(H100) == [] and parse_samples(H100, profile="sglang") == []


def _write_scrapes(run_dir, lines: list[bytes]) -> None:
    (run_dir / SCRAPES_FILE).write_bytes(b"".join(lines))


def _server_samples(running: float) -> list:
    return [("vllm:num_requests_running", {"model_name": "m"}, running)]


def test_metrics_parquet_gains_a_source_column_last_and_each_up_sample_carries_its_source(tmp_path):
    _write_scrapes(
        tmp_path,
        [
            scrape_line(10.0, _server_samples(1.0)),
            scrape_line(10.1, parse_gpu_samples(H100), source=URL_A),
            scrape_line(11.1, None, "URLError: refused", source=URL_A),
            scrape_line(11.0, _server_samples(2.0)),
        ],
    )
    metrics = merge_scrapes(tmp_path)
    assert list(metrics.columns) == ["timestamp", "metric", "labels", "value", "source"]
    assert pq.read_schema(tmp_path / METRICS_FILE).names[-1] == "source"
    up = metrics[metrics["metric"] == "up"]
    assert up["source"].tolist() == ["server", URL_A, URL_A, "server"]
    assert up["value"].tolist() == [1.0, 1.0, 0.0, 1.0]
    gap = up[(up["source"] == URL_A) & (up["value"] == 0)]
    assert json.loads(gap["labels"].iloc[0]) == {"error": "URLError: refused"}  # the exporter's gap is its own
    assert set(metrics.loc[metrics["metric"].str.startswith("DCGM_"), "source"]) == {URL_A}
    assert (metrics.loc[metrics["metric"] == "vllm:num_requests_running", "source"] == "server").all()


def test_a_run_written_before_gpu_telemetry_reads_as_the_servers(tmp_path):
    # metrics.jsonl lines without a source, and a metrics.parquet without the column: both the server's.
    _write_scrapes(tmp_path, [scrape_line(10.0, _server_samples(1.0))])
    assert set(merge_scrapes(tmp_path, write=False)["source"]) == {"server"}
    old = pa.Table.from_pydict(
        {"timestamp": [10.0, 10.0], "metric": ["up", "vllm:num_requests_running"], "labels": ["{}", "{}"],
         "value": [1.0, 3.0]}
    )  # fmt: skip
    (tmp_path / SCRAPES_FILE).unlink()
    pq.write_table(old, tmp_path / METRICS_FILE)
    metrics = load_metrics(tmp_path)
    assert metrics["source"].tolist() == ["server", "server"]
    assert gpu_series(metrics).empty and list(gpu_series(metrics).columns) == list(gpu_series(None).columns)


def test_a_gpu_exporters_scrapes_are_not_the_servers(tmp_path):
    # A GPU scrape (and a gap) before the server's first: the server's counters still start at its own first scrape,
    # and a run whose only scrapes are a GPU's has no server metrics for the integrity check.
    _write_scrapes(
        tmp_path,
        [
            scrape_line(5.0, None, "refused", source=URL_A),
            scrape_line(6.0, parse_gpu_samples(H100), source=URL_A),
            scrape_line(10.0, _server_samples(1.0)),
        ],
    )
    metrics = merge_scrapes(tmp_path, write=False)
    assert ServerSeries(metrics).first_scrape == 10.0
    gpu_only = metrics[metrics["source"] == URL_A]
    records = frame([rec(0, 0, 1, 10.0, 0.1, 4, 0.01)])
    check = integrity(records, gpu_only, "m")
    assert check["available"] is False and "no server metrics" in check["reason"]


# --- the GPU series: units and identities ---------------------------------------------------------------------------
def _metrics(*scrapes: tuple[float, str, str]) -> pd.DataFrame:
    """metrics.parquet's rows from (timestamp, source, DCGM text) scrapes."""
    rows = []
    for t, source, text in scrapes:
        rows.append({"timestamp": t, "metric": "up", "labels": "{}", "value": 1.0, "source": source})
        for name, labels, value in parse_gpu_samples(text):
            rows.append({"timestamp": t, "metric": name, "labels": json.dumps(labels, sort_keys=True),
                         "value": value, "source": source})  # fmt: skip
    return pd.DataFrame(rows)


def test_gpu_series_converts_dcgms_units_and_names_each_gpu():
    series = gpu_series(_metrics((100.0, URL_A, H100)))
    assert list(series.columns) == ["timestamp", "gpu_key", "hostname", "gpu", "uuid", "model_name", "field", "value"]
    got = {(r.gpu_key, r.field): r.value for r in series.itertuples()}
    # Scrape k = 3 of tests/fakedcgm.py's schedule (the fixture's values).
    assert got == {
        ("gpu-node-1/0", "util"): 0.21, ("gpu-node-1/0", "sm_active"): 0.39, ("gpu-node-1/0", "dram_active"): 0.51,
        ("gpu-node-1/0", "mem_used_bytes"): 70024 * MIB, ("gpu-node-1/0", "power_w"): 303.75,
        ("gpu-node-1/1", "util"): 0.31, ("gpu-node-1/1", "sm_active"): 0.68, ("gpu-node-1/1", "dram_active"): 0.82,
        ("gpu-node-1/1", "mem_used_bytes"): 71024 * MIB, ("gpu-node-1/1", "power_w"): 313.75,
    }  # fmt: skip
    first = series.iloc[0]
    assert (first.hostname, first.gpu, first.model_name) == ("gpu-node-1", "0", "NVIDIA H100 80GB HBM3")
    assert first.uuid == "GPU-5f3a2b1c-0000-4c1e-9b2a-000000000000"


def test_a_consumer_gpu_in_kubernetes_has_no_profiling_fields_and_a_lower_case_hostname():
    series = gpu_series(_metrics((100.0, URL_B, RTX)))
    assert set(series["field"]) == {"util", "mem_used_bytes", "power_w"}  # no sm_active, no dram_active rows
    assert set(series["gpu_key"]) == {"worker-7/0"}  # dcgm-exporter after 4.5.3-4.8.2 writes hostname
    assert series.loc[series["field"] == "mem_used_bytes", "value"].tolist() == [21504 * MIB]


def test_gpu_identity_falls_back_to_the_uuid_and_tells_mig_instances_apart():
    assert gpu_identity({"gpu": "0", "UUID": "GPU-x"})["gpu_key"] == "GPU-x"  # dcgm-exporter --no-hostname
    assert gpu_identity({"gpu": "0", "uuid": "GPU-y"})["uuid"] == "GPU-y"  # the 1.x-compatible label name
    assert gpu_identity({"gpu": "3"}, URL_A)["gpu_key"] == f"{URL_A}/3"
    mig = gpu_identity({"gpu": "0", "UUID": "GPU-x", "Hostname": "h", "GPU_I_ID": "2", "GPU_I_PROFILE": "1g.10gb"})
    assert mig["gpu_key"] == "h/0/mig2"


def test_dcgms_blank_values_are_missing_not_numbers():
    blank = H100.replace(" 0.390000\n", " 140737488355328.000000\n")  # DCGM_FT_FP64_BLANK for GPU 0's SM activity
    assert blank != H100
    series = gpu_series(_metrics((100.0, URL_A, blank)))
    sm = series[series["field"] == "sm_active"]
    assert sm["gpu_key"].tolist() == ["gpu-node-1/1"]  # GPU 0's blank value left out, not kept as 1.4e14


# --- the per-step GPU columns ---------------------------------------------------------------------------------------
TIMELINE = [
    {"step": 0, "users": 1, "start_time": 95.0, "measure_start": 100.0, "end_time": 110.0},
    {"step": 1, "users": 2, "start_time": 110.0, "measure_start": 112.0, "end_time": 120.0},
    {"step": 2, "users": 4, "start_time": 120.0, "measure_start": 122.0, "end_time": 130.0},
]


def _row(t: float, key: str, field: str, value: float, labels: dict | None = None) -> dict:
    host, gpu = key.split("/")
    metric = {"util": "DCGM_FI_DEV_GPU_UTIL", "sm_active": "DCGM_FI_PROF_SM_ACTIVE",
              "dram_active": "DCGM_FI_PROF_DRAM_ACTIVE", "mem_used_bytes": "DCGM_FI_DEV_FB_USED",
              "power_w": "DCGM_FI_DEV_POWER_USAGE"}[field]  # fmt: skip
    labels = {"gpu": gpu, "UUID": f"GPU-{key}", "Hostname": host, "modelName": "H100", **(labels or {})}
    return {"timestamp": t, "metric": metric, "labels": json.dumps(labels, sort_keys=True), "value": value,
            "source": URL_A if host == "a" else URL_B}  # fmt: skip


def test_the_step_columns_are_means_over_gpus_of_each_gpus_window_mean():
    rows = [
        # Step 0 [100, 110): GPU a/0 scraped three times, b/0 once (the others were gaps): each GPU weighs the same.
        _row(100.0, "a/0", "util", 20), _row(104.0, "a/0", "util", 40), _row(109.9, "a/0", "util", 90),
        _row(105.0, "b/0", "util", 10),
        _row(100.0, "a/0", "dram_active", 0.5), _row(104.0, "a/0", "dram_active", 0.7),
        _row(105.0, "b/0", "dram_active", 0.9),
        _row(100.0, "a/0", "mem_used_bytes", 1000), _row(104.0, "a/0", "mem_used_bytes", 3000),
        _row(105.0, "b/0", "mem_used_bytes", 2000),
        _row(100.0, "a/0", "power_w", 300.0), _row(105.0, "b/0", "power_w", 200.0),
        # Outside every window: the warm-up of step 0, the end instant of step 0 (windows are [start, end)).
        _row(99.0, "a/0", "util", 100), _row(110.0, "a/0", "util", 100), _row(111.0, "b/0", "util", 100),
        # Step 1: one GPU, with a pod label that changed mid-step (Kubernetes' pod mapping): still one GPU.
        _row(113.0, "a/0", "util", 50, {"pod": "vllm-1"}), _row(115.0, "a/0", "util", 70, {"pod": "vllm-2"}),
        # Step 2: nothing (the exporters were down).
    ]  # fmt: skip
    table = step_gpu_table(pd.DataFrame(rows), TIMELINE).set_index("step")
    assert list(table.columns) == STEP_GPU_COLUMNS
    s0, s1, s2 = table.loc[0], table.loc[1], table.loc[2]
    assert (s0["window_start_time"], s0["window_end_time"]) == (100.0, 110.0)
    assert s0["gpus"] == 2
    assert s0["gpu_util_mean"] == pytest.approx((((20 + 40 + 90) / 3) / 100 + 0.10) / 2, rel=1e-12)
    assert s0["gpu_dram_active_mean"] == pytest.approx(((0.5 + 0.7) / 2 + 0.9) / 2, rel=1e-12)
    assert s0["gpu_mem_used_max_bytes"] == 3000 * MIB
    assert s0["gpu_power_mean_w"] == pytest.approx(250.0)
    assert pd.isna(s0["gpu_sm_active_mean"])  # no GPU sent SM activity: missing, not 0
    assert s1["gpus"] == 1 and s1["gpu_util_mean"] == pytest.approx(0.60)
    assert pd.isna(s1["gpu_dram_active_mean"]) and pd.isna(s1["gpu_mem_used_max_bytes"])
    assert pd.isna(s2["gpus"]) and all(pd.isna(s2[c]) for c in STEP_GPU_COLUMNS[3:])  # a gap: missing, not 0
    assert (s2["window_start_time"], s2["window_end_time"]) == (122.0, 130.0)


def test_without_gpu_telemetry_the_window_times_are_still_written():
    table = step_gpu_table(None, [*TIMELINE, {"step": 3, "users": 8, "measure_start": 132.0, "end_time": None}])
    assert table["window_start_time"].tolist() == [100.0, 112.0, 122.0, 132.0]
    assert table["window_end_time"].tolist()[:3] == [110.0, 120.0, 130.0] and math.isnan(table["window_end_time"][3])
    assert table["gpus"].isna().all() and table[STEP_GPU_COLUMNS[3:]].isna().all().all()


def test_steps_csv_ends_with_the_gpu_section_then_energy_in_the_glossarys_order():
    records = frame([rec(i, 0, 1, 101.0 + i, 0.1, 8, 0.01) for i in range(5)])
    table = compute_table(records, TIMELINE[:1], _metrics((105.0, URL_A, H100)))
    mine = [c for c in GPU_COLUMNS if c in STEP_GPU_COLUMNS]
    section = glossary.names(glossary.GPU)  # this module's columns, then the roofline verdict's (analysis/roofline.py)
    after = [glossary.ENERGY, glossary.LORA, glossary.SPEC]  # issue 35's sections after it
    energy = sum(len(glossary.names(s)) for s in after)
    assert list(table.columns)[-len(section) - energy : -energy] == section
    assert section[: len(mine)] == mine == STEP_GPU_COLUMNS
    row = table.iloc[0]
    assert row["gpus"] == 2 and row["gpu_util_mean"] == pytest.approx(0.26)
    assert row["gpu_mem_used_max_bytes"] == 71024 * MIB and row["window_start_time"] == 100.0


# --- --gpu-metrics-url -----------------------------------------------------------------------------------------------
def test_the_flag_repeats_and_its_environment_variable_holds_several(monkeypatch):
    options = parse_options("--gpu-metrics-url", URL_A, "--gpu-metrics-url", URL_B, "--gpu-metrics-url", URL_A)
    assert gpu_metrics_urls(options) == [URL_A, URL_B]  # each exporter once
    assert gpu_metrics_urls(parse_options()) == [] and parse_options().gpu_metrics_url is None
    monkeypatch.setenv("LOCUST_GPU_METRICS_URL", f"{URL_A}, {URL_B}")
    assert gpu_metrics_urls(parse_options()) == [URL_A, URL_B]
    monkeypatch.setenv("LOCUST_GPU_METRICS_URL", f"{URL_A} {URL_B}")
    assert gpu_metrics_urls(parse_options()) == [URL_A, URL_B]
    web_form = parse_options()
    web_form.gpu_metrics_url = f"{URL_B},{URL_A}"  # the web UI's start form hands back text
    assert gpu_metrics_urls(web_form) == [URL_B, URL_A]


@pytest.mark.parametrize("url", ["node-a:9400/metrics", "ftp://node-a/metrics", "http://", "http://node-a:port/x"])
def test_a_gpu_url_that_is_not_http_is_one_line_naming_the_fix(url):
    line = first_error("--gpu-metrics-url", url)
    assert f"--gpu-metrics-url {url!r} is not an http(s) URL" in line and "http://gpu-node:9400/metrics" in line


# --- the scraper's child process: GPU exporters alone, each its own source, one warning each ----------------------
def test_the_scraper_polls_gpu_exporters_without_a_server_and_warns_once_per_failing_one(tmp_path, caplog):
    from vllm_loadtest.locustfiles.scraper import MetricsScraper

    from tests.helpers.net import free_port
    from tests.helpers.servers import FakeDCGM

    dcgm = FakeDCGM(["--gpus", "1"])
    silent = f"http://127.0.0.1:{free_port()}/metrics"
    try:
        scraper = MetricsScraper("", 0.1, tmp_path, gpu_urls=[dcgm.metrics_url, silent]).start()  # --metrics-url off
        try:  # until three polls of each (0.6 s was two on a busy machine): a condition, not a time
            polled = wait_until(lambda: min(scraper.gpu_scrapes.values()) >= 3, 60, sleep=gevent.sleep)
            assert polled, scraper.gpu_scrapes
        finally:
            scraper.stop()  # else its warnings reach the next test's log
        served = len(dcgm.get("/truth")["served"])
    finally:
        dcgm.stop()
    lines = [json.loads(line) for line in (tmp_path / SCRAPES_FILE).read_text().splitlines()]
    assert {line["source"] for line in lines} == {dcgm.metrics_url, silent}  # no server line at all
    ok = [line for line in lines if line["source"] == dcgm.metrics_url]
    assert len(ok) == served >= 3 and all(line["error"] is None for line in ok)
    assert all(line["samples"] is None for line in lines if line["source"] == silent)
    assert scraper.gpu_scrapes[dcgm.metrics_url] == served and scraper.gpu_gaps[dcgm.metrics_url] == 0
    assert scraper.gpu_gaps[silent] == scraper.gpu_scrapes[silent] >= 3
    warnings = [r.getMessage() for r in caplog.records if "GPU metrics" in r.getMessage()]
    assert len(warnings) == 1 and silent in warnings[0]  # one for the whole run, not one per failed scrape
    assert scraper.scrapes == 0 and scraper.last_samples is None  # the server's live view has nothing from a GPU


def test_the_preflight_warns_once_per_exporter_that_is_silent_or_not_a_dcgm_exporter(caplog):
    from vllm_loadtest.locustfiles.preflight import check_gpu_endpoints

    from tests.helpers.net import free_port
    from tests.helpers.servers import FakeDCGM, FakeServer

    dcgm, server = FakeDCGM(["--gpus", "1"]), FakeServer([])
    silent = f"http://127.0.0.1:{free_port()}/metrics"
    try:
        options = parse_options("--gpu-metrics-url", f"{dcgm.metrics_url},{silent},{server.url}/metrics")
        unanswered = check_gpu_endpoints(options, timeout=2.0)
    finally:
        dcgm.stop()
        server.stop()
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2, warnings
    assert silent in warnings[0] and "do not answer" in warnings[0]
    assert f"{server.url}/metrics serves no DCGM_ series" in warnings[1]  # the server's own /metrics, by mistake
    assert unanswered == {silent, f"{server.url}/metrics"}  # the scraper does not warn about these again
