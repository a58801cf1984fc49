"""The roofline verdict (analysis/roofline.py) on DCGM samples built by hand: each regime on clean data with its
interval, then disturbed data where a verdict on the means would be confidently wrong (spikes, a GPU idle for most of
the step, one GPU of four busy, readings the exporter did not refresh, no profiling counters), the interval's
coverage on autocorrelated readings, and the columns it adds to steps.csv."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from vllm_loadtest.analysis import roofline
from vllm_loadtest.analysis.glossary import ENERGY, GPU, LORA, SPEC, names
from vllm_loadtest.analysis.roofline import (
    COMPUTE_BOUND,
    MEMORY_BOUND,
    NEITHER,
    NO_PROFILING,
    UNTOLD,
    VERDICT_COLUMNS,
    judge,
    roofline_table,
    step_verdicts,
)
from vllm_loadtest.analysis.run import compute_table
from vllm_loadtest.analysis.uncertainty import series_mean_interval, t_interval

from tests.helpers.gpu import gpu_series, metrics_frame, use_gpu_series

pytestmark = pytest.mark.unit

T = np.arange(100.0, 130.0, 1.0)  # 30 scrapes, 1 s apart, all inside the step's window
TIMELINE = [{"step": 0, "users": 16, "start_time": 95.0, "measure_start": 100.0, "end_time": 130.0}]


def dcgm(dram, sm, gpus: int = 1, noise: float = 0.01, seed: int = 0, profiling: bool = True, times=T):
    """DCGM samples: dram(gpu, t) and sm(gpu, t) (or constants) with N(0, noise) added, util as DCGM's whole
    percent, 60 GiB used, power following DRAM; profiling=False leaves out the DCGM_FI_PROF_* fields."""
    rng = np.random.default_rng(seed)

    def values(gpu: int, t: float) -> dict[str, float]:
        d = dram(gpu, t) if callable(dram) else dram
        s = sm(gpu, t) if callable(sm) else sm
        d, s = (float(np.clip(v + noise * rng.normal(), 0, 1)) for v in (d, s))
        out = {
            "DCGM_FI_DEV_GPU_UTIL": round(min(1.0, 1.2 * max(d, s)) * 100),
            "DCGM_FI_DEV_FB_USED": 61440 + gpu,
            "DCGM_FI_DEV_POWER_USAGE": 120 + 500 * d + rng.normal(),
        }
        if profiling:
            out |= {"DCGM_FI_PROF_DRAM_ACTIVE": d, "DCGM_FI_PROF_SM_ACTIVE": s}
        return out

    return gpu_series(metrics_frame(times, values, gpus=gpus))


def verdict(series: pd.DataFrame) -> roofline.StepVerdict:
    return step_verdicts(series, TIMELINE)[0]


# --- each regime, clean ---------------------------------------------------------------------------------------


def test_memory_bound_decode_with_its_interval_and_the_diagnosis_sentence():
    v = verdict(dcgm(0.82, 0.31))
    assert v.regime == MEMORY_BOUND
    assert v.dram.low < 0.82 < v.dram.high and v.dram.half_width < 0.02
    assert v.sm.low < 0.31 < v.sm.high and v.gpus[0].readings == 30
    line = roofline.regime_line(v, "16 users", {"kv_cache_usage_max": 0.62})
    assert line.startswith("At 16 users decode is memory-bandwidth-bound: DRAM active 0.82 [0.8")
    assert ", SM active 0.3" in line and line.endswith("; the KV cache has room (peak 62%).")
    assert "the KV cache is full too (peak 97%)" in roofline.regime_line(v, "16 users", {"kv_cache_usage_max": 0.97})


def test_compute_bound_and_neither():
    compute = verdict(dcgm(0.30, 0.96))
    assert compute.regime == COMPUTE_BOUND
    assert "compute-bound: SM active 0.96" in roofline.regime_line(compute, "64 users")
    idle = verdict(dcgm(0.05, 0.08))
    assert idle.regime == NEITHER
    assert "neither memory- nor compute-bound" in roofline.regime_line(idle, "1 users")


def test_the_bands_between_the_thresholds_are_not_called():
    def iv(value, half):
        return roofline.Interval(value, value - half, value + half, 30)

    assert judge(iv(0.85, 0.02), iv(0.95, 0.02))[0] == UNTOLD  # both at their limits: the counters cannot tell
    assert "busy" in judge(iv(0.2, 0.02), iv(0.7, 0.02))[1]  # SMs busy, DRAM low: neither saturated nor idle
    assert judge(iv(0.52, 0.04), iv(0.3, 0.02))[0] == UNTOLD  # DRAM's interval straddles its threshold
    assert judge(iv(0.56, 0.04), iv(0.3, 0.02))[0] == MEMORY_BOUND  # ... and clears it


# --- disturbed data ------------------------------------------------------------------------------------------


def test_spikes_do_not_flip_a_memory_bound_step():
    spikes = {103.0, 111.0, 122.0}  # three scrapes that caught the GPU between two engine steps

    def dram(gpu, t):
        return 0.0 if t in spikes else 0.82

    def sm(gpu, t):
        return 1.0 if t in (107.0, 119.0) else 0.31

    v = verdict(dcgm(dram, sm))
    assert v.regime == MEMORY_BOUND, v.why
    assert v.dram.value == pytest.approx(0.82 * 27 / 30, abs=0.01)
    assert v.dram.low >= 0.5 and v.sm.high < 0.9


def test_a_gpu_idle_for_most_of_the_step_is_not_called_neither():
    # Busy (memory-bound) for the first 40 % of the window, idle after: the means (DRAM 0.34, SM 0.13) are both low.
    def dram(gpu, t):
        return 0.82 if t < 112 else 0.02

    def sm(gpu, t):
        return 0.31 if t < 112 else 0.01

    series = dcgm(dram, sm)
    v = verdict(series)
    assert v.dram.value < 0.5 and v.sm.value < 0.5
    # A t-interval over the raw readings, as if they were independent, calls it idle with confidence:
    raw = roofline.readings(series)
    naive = judge(*(roofline._clip(t_interval(raw[f])) for f in ("dram_active", "sm_active")))
    assert naive[0] == NEITHER
    # The batch-means interval sees the readings move together and does not.
    assert v.regime == UNTOLD and "straddles" in v.why
    assert v.dram.high > 0.5
    assert "cannot be told: an interval straddles a threshold" in roofline.regime_line(v, "16 users")


def test_one_gpu_of_four_busy_names_the_busy_gpus_regime_and_the_imbalance():
    def dram(gpu, t):
        return 0.85 if gpu == 0 else 0.02

    def sm(gpu, t):
        return 0.35 if gpu == 0 else 0.01

    v = verdict(dcgm(dram, sm, gpus=4))
    assert [g.regime for g in v.gpus] == [MEMORY_BOUND, NEITHER, NEITHER, NEITHER]
    # The mean over the four reads idle (DRAM 0.23): judged on it, the step would be "neither".
    assert v.dram.value == pytest.approx((0.85 + 3 * 0.02) / 4, abs=0.01)
    assert judge(v.dram, v.sm)[0] == NEITHER
    assert v.regime == MEMORY_BOUND
    line = roofline.regime_line(v, "16 users")
    assert "memory-bandwidth-bound on 1 of 4 GPUs (node-1/0; the other 3 idle" in line
    assert "DRAM active 0.85 [" in line  # the busy GPU's numbers, not the mean's


def test_gpus_that_disagree_leave_the_regime_untold():
    def dram(gpu, t):
        return 0.85 if gpu == 0 else 0.2

    def sm(gpu, t):
        return 0.35 if gpu == 0 else 0.97

    v = verdict(dcgm(dram, sm, gpus=2))
    assert v.regime == UNTOLD and v.why.startswith("the GPUs disagree: node-1/0 memory_bound, node-1/1 compute_bound")


def test_readings_the_exporter_did_not_refresh_are_not_samples():
    # dcgm-exporter's default collect interval is 30 s: scraped every second, it serves the same reading 10 times
    # over (every field equal). Three readings are no interval, and no verdict.
    refreshed = np.arange(100.0, 130.0, 10.0)
    base = dcgm(0.82, 0.31, times=refreshed)
    held = []
    for t in T:
        latest = base[base["timestamp"] == refreshed[refreshed <= t].max()].assign(timestamp=t)
        held.append(latest)
    v = verdict(pd.concat(held, ignore_index=True))
    assert v.gpus[0].readings == 3
    assert v.regime == UNTOLD and v.why.startswith("too few distinct readings in the window (3")
    assert math.isnan(v.dram.low)


def test_without_profiling_counters_the_regime_is_missing_never_guessed():
    series = dcgm(0.82, 0.31, profiling=False)
    v = verdict(series)
    assert v.regime == UNTOLD and v.why == NO_PROFILING
    assert math.isnan(v.dram.value) and math.isnan(v.sm.value)
    line = roofline.regime_line(v, "16 users")
    assert "no profiling counters" in line and "GPU utilisation (a kernel running) 0.9" in line
    row = roofline_table(series, TIMELINE).iloc[0]
    assert pd.isna(row["gpu_regime"]) and row[VERDICT_COLUMNS[1:]].isna().all()


# --- the interval -------------------------------------------------------------------------------------------


def test_the_interval_covers_the_mean_of_autocorrelated_readings():
    """AR(1) readings (phi 0.6: a gauge that drifts), 30 per step: the interval covers the true mean at least 90 % of
    the time; a t-interval over the readings, as if independent, falls well short."""
    rng = np.random.default_rng(20)
    covered = naive = 0
    reps, phi = 400, 0.6
    for _ in range(reps):
        e = rng.normal(0, 0.05, 30)
        x = np.empty(30)
        x[0] = e[0] / math.sqrt(1 - phi**2)
        for i in range(1, 30):
            x[i] = phi * x[i - 1] + e[i]
        x += 0.6
        covered += series_mean_interval(x).contains(0.6)
        naive += t_interval(x).contains(0.6)
    assert covered / reps >= 0.90
    assert naive / reps < 0.85


def test_fewer_than_five_readings_have_no_interval():
    iv = series_mean_interval([0.8, 0.81, 0.79, 0.8])
    assert iv.value == pytest.approx(0.8) and math.isnan(iv.low) and iv.note == "too few samples"


# --- steps.csv ------------------------------------------------------------------------------------------------


def records(n: int = 40, step: int = 0, start: float = 100.0) -> pd.DataFrame:
    rows = [
        dict(request_id=f"{step}-{i}", step=step, users=16, warmup=False, status="ok", error_type=None,
             start_time=start + i * 0.5, duration_s=1.0, ttft_s=0.05, e2e_s=1.0, tpot_s=0.95 / 19, output_tokens=20,
             chunk_offsets_s=[0.05, 1.0], chunk_tokens=[1, 19])
        for i in range(n)
    ]  # fmt: skip
    return pd.DataFrame(rows)


def test_steps_csv_ends_with_the_verdict_columns(monkeypatch):
    use_gpu_series(monkeypatch)

    def values(gpu, t):
        return {"DCGM_FI_PROF_DRAM_ACTIVE": 0.82 + 0.001 * (t % 3), "DCGM_FI_PROF_SM_ACTIVE": 0.31,
                "DCGM_FI_DEV_POWER_USAGE": 400 + t % 7}  # fmt: skip

    metrics = metrics_frame(T, values)
    table = compute_table(records(), TIMELINE, metrics, None)
    after = names(ENERGY) + names(LORA) + names(SPEC)  # issue 35's sections after the GPU section
    gpu_end = len(table.columns) - len(after)
    assert list(table.columns[gpu_end - len(VERDICT_COLUMNS) : gpu_end]) == VERDICT_COLUMNS
    assert list(table.columns[gpu_end - len(names(GPU)) : gpu_end]) == names(GPU)
    assert list(table.columns[gpu_end:]) == after
    row = table.iloc[0]
    assert row["gpu_regime"] == MEMORY_BOUND
    assert row["gpu_dram_active_ci_low"] < 0.821 < row["gpu_dram_active_ci_high"]
    # A run without GPU metrics: the columns are there, empty.
    plain = compute_table(records(), TIMELINE, None, None)
    plain_end = len(plain.columns) - len(after)
    assert list(plain.columns[plain_end - len(VERDICT_COLUMNS) : plain_end]) == VERDICT_COLUMNS
    assert plain[names(ENERGY)].isna().all().all()
    assert plain[VERDICT_COLUMNS].isna().all().all()


def test_a_step_without_gpu_samples_is_empty_and_samples_outside_windows_are_not_counted():
    timeline = [*TIMELINE, {"step": 1, "users": 32, "start_time": 130.0, "measure_start": 135.0, "end_time": 160.0}]
    series = dcgm(0.82, 0.31)  # all before step 1's window
    table = roofline_table(series, timeline)
    assert [None if pd.isna(v) else v for v in table["gpu_regime"]] == [MEMORY_BOUND, None]
    assert list(step_verdicts(series, timeline)) == [0]
