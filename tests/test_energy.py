"""GPU energy (issue 35) in this process: the joules of a window from dcgm-exporter's energy counter on synthetic
samples with exactly known answers (constant power: the exact integral, whatever the scrapes' phase; a counter reset
inside a window; a ramp within its bound), a GPU without the field left out and counted, no field at all (or DCGM's
blank) missing, never 0; per output token and per request; summary.json's totals per GPU; the fake exporter's counter
the exact integral of the power it reports."""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import pandas as pd
import pytest
from vllm_loadtest.analysis import glossary
from vllm_loadtest.analysis.energy import (
    ENERGY_COLUMNS,
    ENERGY_FIELD,
    INT64_BLANK,
    console_lines,
    energy_series,
    energy_summary,
    per_gpu_energy,
    step_energy_table,
    window_energy_j,
)
from vllm_loadtest.analysis.prometheus_text import parse_gpu_samples
from vllm_loadtest.analysis.run import compute_table

from tests import fakedcgm
from tests.helpers.paths import FIXTURES
from tests.helpers.records import frame, rec

pytestmark = pytest.mark.unit

URL = "http://node-a:9400/metrics"
T0 = 99.37  # the first scrape: off the windows' edges, as a real exporter's phase is


def _counter(times, watts: float, base: float = 9e9, since: float = T0) -> pd.Series:
    """A counter in mJ of a GPU drawing `watts` from `since` on, read at `times`."""
    return pd.Series([base + watts * 1000 * (t - since) for t in times], index=[float(t) for t in times])


def _rows(key: str, counter: pd.Series, labels: dict | None = None) -> list[dict]:
    host, gpu = key.split("/")
    labels = {"gpu": gpu, "UUID": f"GPU-{key}", "Hostname": host, "modelName": "H100", **(labels or {})}
    return [{"timestamp": t, "metric": ENERGY_FIELD, "labels": json.dumps(labels, sort_keys=True), "value": v,
             "source": URL} for t, v in counter.items()]  # fmt: skip


def _power_rows(key: str, times, watts: float) -> list[dict]:
    host, gpu = key.split("/")
    labels = json.dumps({"gpu": gpu, "UUID": f"GPU-{key}", "Hostname": host}, sort_keys=True)
    return [{"timestamp": float(t), "metric": "DCGM_FI_DEV_POWER_USAGE", "labels": labels, "value": watts,
             "source": URL} for t in times]  # fmt: skip


SCRAPES = [T0 + i for i in range(32)]  # every 1 s, 99.37 ... 130.37
TIMELINE = [
    {"step": 0, "users": 1, "start_time": 95.0, "measure_start": 100.0, "end_time": 107.5},
    {"step": 1, "users": 2, "start_time": 107.5, "measure_start": 110.0, "end_time": 120.0},
    {"step": 2, "users": 4, "start_time": 120.0, "measure_start": 122.0, "end_time": 130.0},
]


# --- one GPU's window -----------------------------------------------------------------------------------------------
def test_constant_power_gives_the_exact_integral_whatever_the_scrapes_phase():
    for phase in (0.0, 0.37, 0.5, 0.99):
        times = [99.0 + phase + i for i in range(12)]
        counter = _counter(times, 300.0, since=times[0])
        assert window_energy_j(counter, 100.0, 107.5, 1.0) == pytest.approx(300.0 * 7.5, rel=1e-12), phase
    # A window shorter than one scrape interval, inside one pair of scrapes: its share of the pair's increase.
    assert window_energy_j(_counter(SCRAPES, 250.0), 100.1, 100.3, 1.0) == pytest.approx(250.0 * 0.2, rel=1e-9)
    # Scrapes exactly on the edges: the counter's own values, nothing interpolated.
    times = [100.0, 101.0, 102.0, 103.0]
    assert window_energy_j(_counter(times, 400.0, since=100.0), 100.0, 103.0, 1.0) == pytest.approx(1200.0)


def test_a_ramp_is_within_the_power_change_of_one_interval_at_each_edge():
    # P(t) = 200 + 20 (t - T0) W: the counter is its exact integral, a parabola; the window's true energy is known.
    times = np.array(SCRAPES)
    counter = pd.Series(9e9 + 1000 * (200 * (times - T0) + 10 * (times - T0) ** 2), index=times)
    exact = 200 * (107.5 - 100.0) + 10 * ((107.5 - T0) ** 2 - (100.0 - T0) ** 2)
    got = window_energy_j(counter, 100.0, 107.5, 1.0)
    assert got != pytest.approx(exact, rel=1e-9)  # interpolation is not exact on a ramp...
    assert abs(got - exact) <= 2 * 20 * 1.0 * 1.0  # ...but off by at most the power's change over one interval per edge
    assert got == pytest.approx(exact, rel=0.005)


def test_a_counter_reset_inside_the_window_counts_from_zero():
    # The counter restarts from 0 just after the scrape at 103.37 (a driver reload) and the GPU keeps drawing 300 W:
    # the drop is read as a restart, as Prometheus' increase() does, so the window's energy is still 300 W x 7.5 s.
    before = [t for t in SCRAPES if t <= 103.37]
    after = [t for t in SCRAPES if t > 103.37]
    counter = pd.concat([_counter(before, 300.0), _counter(after, 300.0, base=0.0, since=103.37)])
    assert counter[104.37] < counter[103.37]  # the reset is in the data
    assert window_energy_j(counter, 100.0, 107.5, 1.0) == pytest.approx(300.0 * 7.5, rel=1e-12)
    # Without the reset handling the drop would read as negative joules.
    assert (counter[107.37] - counter[99.37]) / 1000 < 0


def test_an_edge_without_a_scrape_beyond_it_is_extrapolated_only_within_one_interval():
    counter = _counter(SCRAPES, 300.0)
    # Scraping began 0.37 s after this window's start (within 1.1 intervals): extrapolated at the window's power.
    assert window_energy_j(counter, 99.0, 107.5, 1.0) == pytest.approx(300.0 * 8.5, rel=1e-12)
    # ...and stopped 0.13 s before this one's end.
    assert window_energy_j(counter, 125.0, 130.5, 1.0) == pytest.approx(300.0 * 5.5, rel=1e-12)
    # Scraping began 2.37 s into the window: the energy before it is not guessed.
    assert math.isnan(window_energy_j(counter, 97.0, 107.5, 1.0))
    # Too few scrapes: one, or none at all near the window.
    assert math.isnan(window_energy_j(counter.iloc[:1], 99.0, 99.5, 1.0))
    assert math.isnan(window_energy_j(counter, 200.0, 210.0, 1.0))


def test_a_gap_inside_the_window_costs_nothing_the_counter_kept_counting():
    times = [t for t in SCRAPES if not 101.0 < t < 106.0]  # the exporter was down for 5 s
    assert window_energy_j(_counter(times, 300.0), 100.0, 107.5, 1.0) == pytest.approx(300.0 * 7.5, rel=1e-12)


def test_the_counter_is_read_from_dcgm_exporters_own_text_as_the_scraper_stores_it():
    # prometheus_client names the counter's sample DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total; the fixture's GPU 0
    # reads 9000900000 mJ (scrape k = 3 of the fake's old schedule), its GPU 1 one more.
    text = (FIXTURES / "dcgm" / "dcgm-exporter-4.5.3-h100x2.txt").read_text()
    rows = [{"timestamp": 100.0, "metric": name, "labels": json.dumps(labels, sort_keys=True), "value": value,
             "source": URL} for name, labels, value in parse_gpu_samples(text)]  # fmt: skip
    series = energy_series(pd.DataFrame(rows))
    assert series["counter_mj"].tolist() == [9000900000.0, 9000900001.0]
    assert series["gpu_key"].tolist() == ["gpu-node-1/0", "gpu-node-1/1"]


# --- the step table -------------------------------------------------------------------------------------------------
def _records() -> pd.DataFrame:
    """Step 0: 5 ok requests of 40 tokens completing in its window; step 1: 4 of 25 tokens, one of them failed."""
    rows = [rec(i, 0, 1, 100.5 + i, 0.5, 40, 0.01) for i in range(5)]
    rows += [rec(10 + i, 1, 2, 111.0 + i, 0.5, 25, 0.01) for i in range(4)]
    rows[-1]["status"], rows[-1]["error_type"] = "error", "http_error"
    return frame(rows)


def _metrics(*gpus: tuple[str, float]) -> pd.DataFrame:
    rows = []
    for key, watts in gpus:
        rows += _rows(key, _counter(SCRAPES, watts)) + _power_rows(key, SCRAPES, watts)
    return pd.DataFrame(rows)


def test_the_step_columns_sum_the_gpus_and_divide_by_the_windows_tokens_and_requests():
    records = _records()
    table = compute_table(records, TIMELINE, _metrics(("a/0", 300.0), ("a/1", 100.0)))
    s0, s1, s2 = (table[table["step"] == s].iloc[0] for s in (0, 1, 2))
    assert s0["energy_gpus"] == 2 and s0["energy_j"] == pytest.approx(400.0 * 7.5, rel=1e-12)
    assert s0["output_tokens"] == 200 and s0["energy_per_output_token_j"] == pytest.approx(3000.0 / 200, rel=1e-12)
    assert s0["energy_per_request_j"] == pytest.approx(3000.0 / 5, rel=1e-12)
    assert s0["energy_power_w"] == pytest.approx(200.0, rel=1e-12) == s0["gpu_power_mean_w"]
    assert s1["energy_j"] == pytest.approx(4000.0, rel=1e-12) and s1["output_tokens"] == 75
    assert s1["energy_per_request_j"] == pytest.approx(4000.0 / 3, rel=1e-12)  # the failed one completed nothing
    # Step 2 has energy but no request completed: per token and per request missing, not 0 or inf.
    assert s2["energy_j"] == pytest.approx(3200.0, rel=1e-12)
    assert pd.isna(s2["energy_per_output_token_j"]) and pd.isna(s2["energy_per_request_j"])
    # The interval: the tok/s interval's bounds, inverted.
    if not pd.isna(s0["aggregate_tok_s_ci_low"]):
        watts = 3000.0 / 7.5
        assert s0["energy_per_output_token_j_ci_low"] == pytest.approx(watts / s0["aggregate_tok_s_ci_high"])
        assert s0["energy_per_output_token_j_ci_high"] == pytest.approx(watts / s0["aggregate_tok_s_ci_low"])
    assert glossary.applies(table, glossary.ENERGY)


def test_steps_csv_has_the_energy_section_right_after_the_gpu_section():
    table = compute_table(_records(), TIMELINE, _metrics(("a/0", 300.0)))
    gpu, energy = glossary.names(glossary.GPU), glossary.names(glossary.ENERGY)
    assert energy == ENERGY_COLUMNS
    columns = list(table.columns)
    start = columns.index(gpu[0])
    assert columns[start : start + len(gpu) + len(energy)] == gpu + energy


def test_a_gpu_without_the_field_is_left_out_and_counted():
    metrics = pd.DataFrame(_rows("a/0", _counter(SCRAPES, 300.0)) + _power_rows("a/0", SCRAPES, 300.0)
                           + _power_rows("a/1", SCRAPES, 120.0))  # fmt: skip
    table = compute_table(_records(), TIMELINE, metrics)
    s0 = table[table["step"] == 0].iloc[0]
    assert s0["gpus"] == 2 and s0["energy_gpus"] == 1  # two GPUs seen, one with the energy counter
    assert s0["energy_j"] == pytest.approx(300.0 * 7.5, rel=1e-12) and s0["energy_power_w"] == pytest.approx(300.0)


def test_no_energy_field_leaves_every_column_missing_never_zero():
    records = _records()
    for metrics in (None, pd.DataFrame(_power_rows("a/0", SCRAPES, 300.0))):
        table = compute_table(records, TIMELINE, metrics)
        assert table[ENERGY_COLUMNS].isna().all().all(), metrics
        assert not glossary.applies(table, glossary.ENERGY) and console_lines(table) == []
        assert energy_summary(table, records, metrics, TIMELINE) is None
    # DCGM's int64 blank ("not supported") is no reading either; a real counter above 2**31 mJ is one.
    blank = pd.Series([INT64_BLANK, float(0x7FFFFFFFFFFFFFFF)], index=[100.0, 101.0])
    assert not len(energy_series(pd.DataFrame(_rows("a/0", blank))))
    big = energy_series(pd.DataFrame(_rows("a/0", _counter(SCRAPES, 700.0, base=5e10))))
    assert len(big) == len(SCRAPES) and big["gpu_key"].unique().tolist() == ["a/0"]
    # A MIG GPU's instances each repeat the device's counter: one GPU, counted once.
    counter = _counter(SCRAPES, 300.0)
    mig = pd.DataFrame(_rows("a/0", counter, {"GPU_I_ID": "1"}) + _rows("a/0", counter, {"GPU_I_ID": "2"}))
    assert energy_series(mig)["gpu_key"].unique().tolist() == ["a/0"] and len(energy_series(mig)) == len(SCRAPES)


def test_a_step_without_scrapes_is_missing_and_the_others_keep_their_value():
    times = [t for t in SCRAPES if t < 120.0]  # the exporter went away before step 2
    table = step_energy_table(
        pd.DataFrame(_rows("a/0", _counter(times, 300.0))), TIMELINE,
        pd.DataFrame({"step": [0, 1, 2], "output_tokens": [10, 20, 30]}), _records(),
    )  # fmt: skip
    assert table["energy_j"].tolist()[:2] == pytest.approx([2250.0, 3000.0], rel=1e-12)
    assert pd.isna(table["energy_j"][2]) and pd.isna(table["energy_gpus"][2])


# --- the run's totals -----------------------------------------------------------------------------------------------
def test_the_runs_totals_are_over_the_measured_windows_per_gpu_and_summed():
    records = _records()
    metrics = _metrics(("a/0", 300.0), ("a/1", 100.0))
    table = compute_table(records, TIMELINE, metrics)
    summary = energy_summary(table, records, metrics, TIMELINE)
    assert summary["steps"] == [0, 1, 2] and summary["gpus"] == 2
    assert summary["window_s"] == pytest.approx(7.5 + 10 + 8)
    assert summary["energy_j"] == pytest.approx(400.0 * 25.5, rel=1e-12)
    assert summary["output_tokens"] == 275 and summary["requests"] == 8
    assert summary["energy_per_output_token_j"] == pytest.approx(400.0 * 25.5 / 275, rel=1e-12)
    assert summary["energy_per_request_j"] == pytest.approx(400.0 * 25.5 / 8, rel=1e-12)
    assert summary["energy_power_w"] == pytest.approx(200.0, rel=1e-12)  # per GPU
    a0, a1 = summary["per_gpu"]
    assert (a0["gpu_key"], a0["hostname"], a0["gpu"]) == ("a/0", "a", "0")
    assert a0["energy_j"] == pytest.approx(300.0 * 25.5) and a1["energy_j"] == pytest.approx(100.0 * 25.5)
    assert a0["steps"] == pytest.approx({"0": 2250.0, "1": 3000.0, "2": 2400.0})
    json.dumps(summary)  # summary.json takes it as it is
    per_gpu = per_gpu_energy(energy_series(metrics), TIMELINE)
    assert per_gpu["scrapes"].tolist() == [8, 10, 8] * 2  # the scrapes inside each window [start, end)


def test_the_console_shows_an_energy_table_only_with_energy():
    table = compute_table(_records(), TIMELINE, _metrics(("a/0", 300.0)))
    lines = console_lines(table)
    assert lines[1].startswith("Energy (")
    assert lines[2].split() == ["step", "users", "gpus", "J", "J/token", "J/request", "W/GPU"]
    assert lines[3].split() == ["0", "1", "1", "2250", "11.250", "450.0", "300"]


# --- the fake exporter ----------------------------------------------------------------------------------------------
def _state(**options) -> fakedcgm.State:
    return fakedcgm.State(_cfg(**options))


def test_the_fake_exporters_energy_is_the_exact_integral_of_the_power_it_reports():
    st = _state()
    t0 = st.started
    # Answers at t0 + 1, + 1.5, + 4 reporting 300, 350, 200 W: each held until the next answer.
    e1 = st.advance_energy(t0 + 1.0, [300.0, 310.0])
    e2 = st.advance_energy(t0 + 1.5, [350.0, 320.0])
    e3 = st.advance_energy(t0 + 4.0, [200.0, 330.0])
    assert e1[0] - 9e9 == pytest.approx(300.0 * 1.0 * 1000)  # before the first answer: its own watts
    assert e2[0] - e1[0] == pytest.approx(300.0 * 0.5 * 1000) and e3[0] - e2[0] == pytest.approx(350.0 * 2.5 * 1000)
    assert e3[1] - e2[1] == pytest.approx(320.0 * 2.5 * 1000)
    text, truth = fakedcgm.render(7, _cfg(), {}, e3)
    assert f'{ENERGY_FIELD}{{gpu="0"' in text and f" {int(e3[0])}\n" in text and truth[0]["energy_mj"] == int(e3[0])


def test_the_fake_exporters_counter_resets_and_can_be_left_out():
    st = _state(energy_reset_after=2.0)
    t0 = st.started + 0.5
    st.advance_energy(t0, [300.0, 300.0])  # its first answer: the reset is counted from here
    st.advance_energy(t0 + 1.0, [300.0, 300.0])
    after = st.advance_energy(t0 + 3.0, [300.0, 300.0])
    assert after[0] == pytest.approx(300.0 * 1.0 * 1000)  # from 0 at t0 + 2: only the second since
    later = st.advance_energy(t0 + 4.0, [300.0, 300.0])
    assert later[0] - after[0] == pytest.approx(300.0 * 1000)  # once
    text, _ = fakedcgm.render(0, _cfg(no_energy=True), {}, later)
    assert ENERGY_FIELD not in text and "DCGM_FI_DEV_POWER_USAGE" in text
    cfg = _cfg(power_w=[250.0, 260.0])
    assert [v["power_w"] for v in fakedcgm.values(3, cfg, {})] == [250.0, 260.0]


def _cfg(**options) -> argparse.Namespace:
    """The fake exporter's options as its command line parses them, without --port."""
    defaults = dict(gpus=2, hostname="gpu-node-1", hostname_label="Hostname", model_name="NVIDIA H100 80GB HBM3",
                    uuid_prefix="5f3a2b1c", driver="550.54.15", no_profiling=False, blank_profiling=False,
                    no_energy=False, power_w=None, energy_reset_after=None, down_after=None, down_for=0.0,
                    down_mode="reset")  # fmt: skip
    return argparse.Namespace(**{**defaults, **options})


def test_the_reports_energy_part_tabulates_steps_and_gpus_and_is_absent_without_energy():
    from types import SimpleNamespace

    from vllm_loadtest.analysis.report.energy import energy_html

    records = _records()
    metrics = _metrics(("a/0", 300.0), ("<b>/1", 100.0))  # a hostname from the exporter: escaped
    table = compute_table(records, TIMELINE, metrics)
    part = energy_html(SimpleNamespace(table=table, summary={"energy": energy_summary(table, records, metrics,
                                                                                        TIMELINE)}))  # fmt: skip
    assert part.startswith("<h2>Energy</h2>") and "&lt;b&gt;/1" in part and "<b>/1" not in part
    assert "<td>3000</td><td>15.000 [" in part  # step 0: 3000 J, 15 J per output token, its interval
    assert "10200 J on 2 GPUs" in part
    bare = compute_table(records, TIMELINE, None)
    assert energy_html(SimpleNamespace(table=bare, summary={"energy": None})) == ""
