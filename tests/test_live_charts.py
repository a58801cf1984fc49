"""The live charts' data (analysis/live_charts.py): the JSON's shape, missing values as null, the step intervals and
suspect flags when the table has them, and metrics.jsonl read incrementally (appended lines only, a torn line left
for the next read)."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pandas as pd
import pytest
from vllm_loadtest.analysis import live_charts
from vllm_loadtest.analysis.live_charts import ScrapeTail, chart_data, latency_bins, to_json
from vllm_loadtest.analysis.prometheus_text import parse_samples, scrape_line
from vllm_loadtest.analysis.server_metrics import KV_CACHE, RUNNING, WAITING

from tests.helpers.paths import FIXTURES

pytestmark = pytest.mark.unit

T0 = 1_700_000_000.0
TIMELINE = [
    {"step": 0, "users": 1, "start_time": T0, "measure_start": T0 + 1, "end_time": T0 + 10, "rate_rps": None},
    {"step": 1, "users": 2, "start_time": T0 + 10, "measure_start": T0 + 11, "end_time": T0 + 20, "rate_rps": None},
    {"step": 2, "users": 4, "start_time": T0 + 20, "measure_start": T0 + 21, "end_time": None, "rate_rps": None},
]


def scrape(t: float, kv: float | None, waiting: float = 0.0, model: str = "m") -> bytes:
    samples = [(WAITING, {"engine": "0", "model_name": model}, waiting), (RUNNING, {"model_name": model}, 3.0)]
    if kv is not None:
        samples.append((KV_CACHE, {"engine": "0", "model_name": model}, kv))
    return scrape_line(t, samples)


def records(n: int = 400, t0: float = T0) -> pd.DataFrame:
    rng = np.random.default_rng(1)
    start = t0 + np.sort(rng.uniform(0, 28, n))
    return pd.DataFrame(
        {
            "start_time": start,
            "e2e_s": np.full(n, 0.5),
            "ttft_s": rng.uniform(0.01, 0.02, n),
            "tpot_s": np.where(np.arange(n) % 10 == 0, np.nan, 0.003),  # one-token answers have no TPOT
            "status": np.where(np.arange(n) % 50 == 0, "error", "ok"),
        }
    )


def test_scrape_tail_reads_only_appended_lines_and_leaves_a_torn_line_for_the_next_read(tmp_path):
    path = tmp_path / "metrics.jsonl"
    tail = ScrapeTail(path, model="m")
    assert tail.read() == 0 and tail.t == []  # no file yet: nothing, no error
    path.write_bytes(scrape(T0, 0.25, 1) + scrape(T0 + 1, 0.5, 2))
    assert tail.read() == 2
    assert tail.values["kv_cache_usage"] == [0.25, 0.5] and tail.values["waiting"] == [1, 2]
    offset = tail.offset
    assert offset == path.stat().st_size
    assert tail.read() == 0 and len(tail.t) == 2  # nothing new: nothing parsed twice
    line = scrape(T0 + 2, 0.75, 3)
    with open(path, "ab") as f:
        f.write(line[:20])  # the scraper is writing this line
    assert tail.read() == 0 and tail.offset == offset and len(tail.t) == 2
    with open(path, "ab") as f:
        f.write(line[20:] + scrape_line(T0 + 3, None, "HTTP 503"))
    assert tail.read() == 2
    assert tail.t == [T0, T0 + 1, T0 + 2, T0 + 3]
    assert tail.values["kv_cache_usage"] == [0.25, 0.5, 0.75, None]  # a failed scrape is a gap, not 0
    assert tail.scrapes == 4 and tail.gaps == 1 and tail.last_error == "HTTP 503"


def test_scrape_tail_reads_within_its_budget_and_catches_up_later(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b"".join(scrape(T0 + i, i / 100) for i in range(100)))
    tail = ScrapeTail(path)
    assert tail.read(max_bytes=4096) < 100 and tail.behind  # a big backlog: a part per read
    while tail.behind:
        tail.read(max_bytes=4096)
    assert tail.values["kv_cache_usage"] == [i / 100 for i in range(100)]
    assert tail.offset == path.stat().st_size


def test_scrape_tail_sums_engines_keeps_its_model_and_marks_missing_series(tmp_path):
    path = tmp_path / "metrics.jsonl"
    samples = [
        (WAITING, {"engine": "0", "model_name": "m"}, 2.0),
        (WAITING, {"engine": "1", "model_name": "m"}, 3.0),
        (WAITING, {"engine": "0", "model_name": "other"}, 100.0),
    ]
    path.write_bytes(scrape_line(T0, samples))
    tail = ScrapeTail(path, model="m")
    tail.read()
    assert tail.values == {"kv_cache_usage": [None], "waiting": [5.0], "running": [None]}


def test_a_real_vllm_scrape_gives_its_gauges(tmp_path):
    samples = parse_samples((FIXTURES / "vllm-0.32-cpu-metrics.txt").read_text())
    (tmp_path / "metrics.jsonl").write_bytes(scrape_line(T0, samples))
    tail = ScrapeTail(tmp_path / "metrics.jsonl")
    assert tail.read() == 1
    assert all(tail.values[k][0] is not None for k in ("kv_cache_usage", "waiting", "running"))


def test_chart_data_shape_with_missing_values_as_null(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b"".join(scrape(T0 - 0.5 + i, None if i == 3 else i / 30, i % 4) for i in range(30)))
    tail = ScrapeTail(path, model="m")
    tail.read()
    table = pd.DataFrame(
        {
            "step": [0, 1, 2],
            "users": [1, 2, 4],
            "requests": [100, 250, 30],
            "aggregate_tok_s": [100.0, 210.0, math.nan],  # the last step still in its warm-up
            "ttft_p95_s": [0.02, 0.03, math.nan],
            "tpot_p95_s": [0.003, 0.004, math.nan],
        }
    )
    data = json.loads(to_json(chart_data(table, TIMELINE, records(), tail, T0 + 29, "running", "m")))
    assert set(data) == {"version", "state", "model", "started_at", "elapsed_s", "has_ci", "has_flags", "items",
                         "steps", "latency", "server"}  # fmt: skip
    assert data["items"] is None  # a streamed kind's run: its curve is tok/s
    assert data["state"] == "running" and data["model"] == "m" and data["elapsed_s"] == 29
    assert not data["has_ci"] and not data["has_flags"]
    first, _, last = data["steps"]
    assert first["start"] == 0 and first["measure_start"] == 1 and first["end"] == 10 and not first["running"]
    assert last["end"] is None and last["running"] and last["aggregate_tok_s"] is None  # NaN -> null, never 0
    assert first["ci_low"] is None and first["stable"] is None and not first["suspect"]
    assert first["few_samples"] and not data["steps"][1]["few_samples"]  # 100 < 200 for a p95
    lat = data["latency"]
    assert lat["bin_s"] == 2 and len(lat["t"]) == len(lat["ttft_p95_s"]) == len(lat["n"])
    assert all(v is None for v, n in zip(lat["ttft_p95_s"], lat["n"]) if n < live_charts.MIN_BIN_SAMPLES)
    assert any(v is not None for v in lat["ttft_p95_s"])
    srv = data["server"]
    assert srv["t"][0] == -0.5 and len(srv["t"]) == len(srv["kv_cache_usage"]) == len(srv["waiting"]) == 30
    assert srv["kv_cache_usage"][3] is None and srv["kv_cache_usage"][4] == pytest.approx(4 / 30)
    assert srv["scrapes"] == 30 and srv["catching_up"] is False


def test_intervals_and_suspect_flags_are_passed_when_the_table_has_them():
    table = pd.DataFrame(
        {
            "step": [0, 1, 2],
            "users": [1, 2, 4],
            "requests": [300, 300, 300],
            "aggregate_tok_s": [100.0, 120.0, 400.0],
            "aggregate_tok_s_ci_low": [95.0, 110.0, math.nan],
            "aggregate_tok_s_ci_high": [105.0, 130.0, math.nan],
            "stable": [True, False, True],
            "outlier": [False, True, None],
        }
    )
    data = json.loads(to_json(chart_data(table, TIMELINE, None, None, T0 + 25, "running")))
    assert data["has_ci"] and data["has_flags"] and data["server"] is None
    s0, s1, s2 = data["steps"]
    assert (s0["ci_low"], s0["ci_high"]) == (95.0, 105.0) and s2["ci_low"] is None
    assert not s0["suspect"] and s1["suspect"] and s1["suspect_why"] == ["outlier", "unstable"]
    assert s2["outlier"] is None and not s2["suspect"]
    assert data["latency"]["t"] == []


def test_no_run_yet_gives_an_empty_payload():
    data = json.loads(to_json(chart_data(None, [], None, None, time.time(), "ready")))
    assert data["steps"] == [] and data["started_at"] is None and data["server"] is None


def test_latency_bins_match_numpy_percentiles():
    df = records(2000)
    out = latency_bins(df, T0, T0 + 29)
    ok = df[df["status"] == "ok"]
    finish = ok["start_time"] + ok["e2e_s"]
    for i, value in enumerate(out["ttft_p95_s"]):
        inside = ok[((finish - T0) // out["bin_s"]) == i]
        assert out["n"][i] == len(inside)
        if len(inside) >= live_charts.MIN_BIN_SAMPLES:
            assert value == pytest.approx(np.percentile(inside["ttft_s"], 95))
    tpot = out["tpot_p95_s"]
    assert any(v is not None for v in tpot) and all(v is None or v == pytest.approx(0.003) for v in tpot)


def test_long_runs_are_downsampled_to_their_peaks():
    t = np.arange(10_000, dtype=float)
    kv = np.zeros(10_000)
    kv[5_003] = 1.0
    out_t, out = live_charts.downsample(t, {"kv": kv}, max_points=100)
    assert len(out_t) == 100 and out["kv"].max() == 1.0 and out_t[-1] == 9_999


def test_bin_width_keeps_the_bins_few():
    assert live_charts.bin_width(30) == 2 and live_charts.bin_width(3600) == 30
    assert 3600 * 10 / live_charts.bin_width(3600 * 10) <= live_charts.MAX_BINS


def test_latency_bins_kept_between_refreshes_equal_those_computed_at_once():
    df = records(3000)
    finish = df["start_time"] + df["e2e_s"]
    bins = live_charts.LatencyBins()
    for now in np.arange(T0 + 1, T0 + 29, 0.7):  # refreshes during the run: the records finished by then
        seen = bins.update(df[finish <= now], T0, now)
    assert seen == latency_bins(df[finish <= now], T0, now)
    assert len(bins._frozen["n"]) > 0  # bins were kept
