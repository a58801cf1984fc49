"""Where the roofline verdict is read: the diagnosis's line next to the KV-cache verdict, the efficiency ceiling's
bandwidth against the DRAM activity measured, the console's GPU table, and the report's GPU section and step table,
each shown only when a step saw a GPU."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from vllm_loadtest.analysis import roofline
from vllm_loadtest.analysis.ceiling import ceiling_report
from vllm_loadtest.analysis.diagnosis import diagnose
from vllm_loadtest.analysis.report import gpu_html, table_html
from vllm_loadtest.analysis.roofline import MEMORY_BOUND, ceiling_lines, console_lines, step_verdicts

from tests.helpers.gpu import gpu_series, metrics_frame

pytestmark = pytest.mark.unit

USERS = [1, 2, 4, 8, 16, 32]
TOK_S = [100.0, 200.0, 400.0, 800.0, 1000.0, 1010.0]  # flat from 16 users: the knee
TIMELINE = [
    {"step": i, "users": u, "start_time": 100.0 + 40 * i, "measure_start": 105.0 + 40 * i, "end_time": 140.0 + 40 * i}
    for i, u in enumerate(USERS)
]


def table(tok_s=TOK_S, waiting=(0, 0, 0, 0, 4, 12), gpu: bool = True) -> pd.DataFrame:
    rows = []
    for i, (u, y) in enumerate(zip(USERS, tok_s)):
        row = {
            "step": i, "users": u, "requests": 100, "aggregate_tok_s": y, "aggregate_tok_s_ci_low": y * 0.98,
            "aggregate_tok_s_ci_high": y * 1.02, "kv_cache_usage_max": 0.62, "waiting_max": waiting[i],
            "preemptions": 0.0, "tpot_p50_s": 0.02 + 0.002 * i, "stable": True,
        }  # fmt: skip
        if gpu:
            row |= {
                "gpus": 1, "gpu_util_mean": 0.97, "gpu_sm_active_mean": 0.31, "gpu_dram_active_mean": 0.82,
                "gpu_mem_used_max_bytes": 60 * 2**30, "gpu_power_mean_w": 512.0, "gpu_regime": MEMORY_BOUND,
                "gpu_dram_active_ci_low": 0.80, "gpu_dram_active_ci_high": 0.84, "gpu_sm_active_ci_low": 0.29,
                "gpu_sm_active_ci_high": 0.33,
            }  # fmt: skip
        rows.append(row)
    return pd.DataFrame(rows)


def series() -> pd.DataFrame:
    """One GPU, memory-bound throughout the run (DRAM 0.82, SM 0.31, with noise), scraped every second."""
    rng = np.random.default_rng(1)

    def values(gpu, t):
        return {
            "DCGM_FI_DEV_GPU_UTIL": 97, "DCGM_FI_PROF_DRAM_ACTIVE": 0.82 + 0.01 * rng.normal(),
            "DCGM_FI_PROF_SM_ACTIVE": 0.31 + 0.01 * rng.normal(), "DCGM_FI_DEV_FB_USED": 61440,
            "DCGM_FI_DEV_POWER_USAGE": 500 + rng.normal(),
        }  # fmt: skip

    return gpu_series(metrics_frame(np.arange(100.0, 340.0, 1.0), values))


def test_the_diagnosis_names_the_regime_next_to_the_binding_resource():
    verdicts = step_verdicts(series(), TIMELINE)
    d = diagnose(table(), gpu=verdicts)
    assert d.knee_users == 16 and set(d.binding) == {4, 5}
    assert d.gpu_regime == {4: MEMORY_BOUND, 5: MEMORY_BOUND}
    i = next(i for i, t in enumerate(d.text) if t.startswith("At 16 users requests wait"))
    assert d.text[i + 1].startswith("At 16 users decode is memory-bandwidth-bound: DRAM active 0.82 [0.8")
    assert d.text[i + 1].endswith("; the KV cache has room (peak 62%).")
    assert d.to_dict()["gpu_regime"] == {"4": MEMORY_BOUND, "5": MEMORY_BOUND}
    # Without GPU samples the diagnosis reads as before.
    assert diagnose(table(gpu=False)).text == [t for t in d.text if "DRAM active" not in t]


def test_without_a_binding_step_one_line_at_the_highest_load():
    growing = table(tok_s=[100.0 * 2**i for i in range(6)], waiting=(0,) * 6)
    d = diagnose(growing, gpu=step_verdicts(series(), TIMELINE))
    assert d.binding == {} and d.gpu_regime == {5: MEMORY_BOUND}
    assert d.text[-1].startswith("At 32 users decode is memory-bandwidth-bound")


def test_the_ceiling_against_the_dram_activity():
    ceiling = ceiling_report(table().to_dict(orient="records"), 3350.0, 16.4e9, "--gpu h100-sxm")
    assert ceiling["decode_ceiling_tok_s"] == pytest.approx(204.3, abs=0.1)
    lines = ceiling_lines(table(), ceiling)
    # 1 user: TPOT 20 ms = 50 steps/s of 16.4 GB = 0.24 of 3350 GB/s, while DRAM was active 0.82 [0.80, 0.84].
    assert lines[0].startswith("At 1 users the weight reads use 0.24 of the peak bandwidth (1 / TPOT p50 = 50.0")
    assert "DRAM was active 0.82 [0.80, 0.84]: the memory is busy, but far below the ceiling's pace" in lines[0]
    assert lines[1].startswith("At 32 users") and len(lines) == 2
    idle = table().assign(gpu_dram_active_mean=0.15, gpu_dram_active_ci_low=0.12, gpu_dram_active_ci_high=0.18,
                          tpot_p50_s=0.1)  # fmt: skip
    assert "the memory is idle most of the time" in ceiling_lines(idle, ceiling)[0]
    paced = table().assign(gpu_dram_active_mean=0.75, gpu_dram_active_ci_low=0.7, gpu_dram_active_ci_high=0.8,
                           tpot_p50_s=0.008)  # fmt: skip
    assert "decode runs at the memory's pace" in ceiling_lines(paced, ceiling)[0]
    low = table().assign(gpu_dram_active_mean=0.1, gpu_dram_active_ci_low=0.08, gpu_dram_active_ci_high=0.12)
    assert "more than the memory moved" in ceiling_lines(low, ceiling)[0]
    assert ceiling_lines(table(gpu=False), ceiling) == [] and ceiling_lines(table(), None) == []


def test_the_console_shows_the_gpu_table_only_when_a_step_saw_a_gpu():
    lines = console_lines(table())
    assert lines[1].startswith("GPU (dcgm-exporter")
    head = lines[2].split()
    assert head == ["step", "users", "gpus", "util", "SM", "DRAM", "mem", "max", "GiB", "power", "W", "regime"]
    first = lines[3].split()
    assert first[:4] == ["0", "1", "1", "0.97"] and "0.31" in first and "±0.02" in first
    assert "60.0" in first and "512" in first and first[-1] == MEMORY_BOUND
    assert console_lines(table(gpu=False)) == []
    missing = table().assign(gpu_regime=None, gpu_sm_active_mean=math.nan)
    assert console_lines(missing)[3].split()[-1] == "-"


def test_the_report_draws_each_gpu_and_hides_the_gpu_columns_without_one():
    t = table()
    outcome = SimpleNamespace(
        gpu_samples=series(), gpu_verdicts=step_verdicts(series(), TIMELINE), table=t, run={"timeline": TIMELINE},
        run_dir=Path("run"), records=pd.DataFrame({"start_time": [100.0, 130.0]}),
    )  # fmt: skip
    text = gpu_html(outcome)  # the Timeline's origin: the first request's start (100.0)
    assert text.startswith("<h2>GPUs</h2>") and "plotly" in text
    assert text.count("<td>node-1/0</td>") == len(USERS) and "memory_bound" in text
    assert "seconds since the run started" in text  # the Timeline's x axis
    assert gpu_html(SimpleNamespace(**{**vars(outcome), "gpu_samples": roofline.empty_series()})) == ""
    assert "GPU regime" in table_html(t)
    plain = table_html(table(gpu=False).assign(**dict.fromkeys(roofline.VERDICT_COLUMNS, None)))
    assert "GPU regime" not in plain and "DRAM active CI" not in plain
