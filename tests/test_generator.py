"""The load generator's self-checks: the per-step figures on samples with known answers, the diagnosis and the
console (the real runs, an overloaded one and a cluster's, are in tests/test_generator_run.py)."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from vllm_loadtest.analysis.adaptive import STEP_END_COLUMNS
from vllm_loadtest.analysis.batch import BATCH_COLUMNS
from vllm_loadtest.analysis.diagnosis import KV_CACHE, LOAD_GENERATOR, diagnose
from vllm_loadtest.analysis.energy import ENERGY_COLUMNS
from vllm_loadtest.analysis.generator import (
    CPU_BOUND,
    GENERATOR_COLUMNS,
    GENERATOR_DIR,
    GENERATOR_FILE,
    LAG_BOUND_S,
    is_bound,
    merge_generator,
    sample_line,
    step_generator_table,
)
from vllm_loadtest.analysis.gpu import GPU_COLUMNS
from vllm_loadtest.analysis.lora import LORA_COLUMNS
from vllm_loadtest.analysis.reasoning import REASONING_COLUMNS
from vllm_loadtest.analysis.records import RECEIVED_DIR
from vllm_loadtest.analysis.run import compute_table
from vllm_loadtest.analysis.schedule import OPEN_LOOP_COLUMNS
from vllm_loadtest.analysis.spec_decode import SPEC_COLUMNS
from vllm_loadtest.analysis.steps import UNCERTAINTY_COLUMNS, format_table

from tests.helpers.records import TIMELINE, frame, rec

pytestmark = pytest.mark.unit

WINDOWS = [
    {"step": 0, "users": 8, "start_time": 5.0, "measure_start": 10.0, "end_time": 20.0},
    {"step": 1, "users": 8, "start_time": 20.0, "measure_start": 30.0, "end_time": 40.0},
    {"step": 2, "users": 16, "start_time": 40.0, "measure_start": 50.0, "end_time": 60.0},
]


def sample(t, worker, interval, cpu_s, users, lags, intended=8):
    return {
        "timestamp": t,
        "worker": worker,
        "interval_s": interval,
        "cpu_s": cpu_s,
        "cpu_fraction": cpu_s / interval,
        "users_achieved": users,
        "users_intended": intended,
        "lag_s": lags,
    }


SAMPLES = pd.DataFrame(
    [
        sample(9.0, "a", 1.0, 1.0, 0, [0.5]),  # warm-up: outside the window
        sample(11.0, "a", 1.0, 0.5, 2, [0.001, 0.002, 0.003]),
        sample(12.0, "a", 1.0, 0.7, 4, [0.004]),
        sample(15.0, "b", 2.0, 1.8, 5, [0.0005]),
        sample(20.0, "a", 1.0, 1.0, 0, [0.5]),  # at the window's end: outside (the window is [start, end))
        sample(31.0, "a", 1.0, 0.1, 8, [0.0001, 0.0002]),
        # step 2 has no samples
    ]
)


def test_per_step_figures_of_two_processes_are_exact():
    t = step_generator_table(SAMPLES, WINDOWS).set_index("step")
    s0 = t.loc[0]
    assert s0.generator_processes == 2
    # Process a: lags 1, 2, 3, 4 ms -> p50 2.5 ms, p99 3.97 ms, max 4 ms; process b: 0.5 ms. The worst process counts.
    assert s0.generator_lag_p50_s == pytest.approx(0.0025)
    assert s0.generator_lag_p99_s == pytest.approx(0.00397)
    assert s0.generator_lag_max_s == pytest.approx(0.004)
    # CPU: a used 1.2 s in 2 s (0.6), b 1.8 s in 2 s (0.9): the max is b's.
    assert s0.generator_cpu_max == pytest.approx(0.9)
    # Users: a's time-weighted mean (2 and 4 for 1 s each) 3, plus b's 5.
    assert s0.users_achieved_mean == pytest.approx(8.0)
    assert s0.generator_bound is True  # both over their bounds
    s1 = t.loc[1]
    assert s1.generator_processes == 1
    assert s1.generator_lag_p99_s == pytest.approx(0.0001 + 0.99 * 0.0001)
    assert s1.generator_cpu_max == pytest.approx(0.1) and s1.users_achieved_mean == pytest.approx(8.0)
    assert s1.generator_bound is False
    s2 = t.loc[2]  # no samples: missing, never 0, and not flagged
    assert all(math.isnan(s2[c]) for c in GENERATOR_COLUMNS if c != "generator_bound")
    assert s2.generator_bound is None


def test_either_bound_alone_flags_a_step_and_exactly_at_the_bound_does_not():
    assert is_bound(LAG_BOUND_S, CPU_BOUND) is False
    assert is_bound(LAG_BOUND_S * 1.01, 0.1) is True
    assert is_bound(0.0001, CPU_BOUND + 0.01) is True
    assert is_bound(math.nan, CPU_BOUND + 0.01) is True
    assert is_bound(math.nan, math.nan) is None
    lag_only = pd.DataFrame([sample(11.0, "a", 1.0, 0.2, 8, [0.0001] * 98 + [0.01, 0.01])])
    assert step_generator_table(lag_only, WINDOWS).iloc[0].generator_bound is True  # p99 = 10 ms, CPU 20 %


def test_without_samples_every_step_is_missing_and_nothing_is_flagged():
    table = compute_table(frame([rec(1, 0, 1, 3.0, 0.2, 11, 0.01)]), TIMELINE, None, None)
    # The self-check columns, then the later sections (open loop, intervals, step end; no server bounds without
    # metrics): steps.csv only gains columns at its end.
    tail = GENERATOR_COLUMNS + OPEN_LOOP_COLUMNS + UNCERTAINTY_COLUMNS + STEP_END_COLUMNS + REASONING_COLUMNS
    tail += BATCH_COLUMNS + GPU_COLUMNS + ENERGY_COLUMNS + LORA_COLUMNS + SPEC_COLUMNS
    assert list(table.columns[-len(tail) :]) == tail
    assert table["generator_lag_p99_s"].isna().all() and table["generator_bound"].isna().all()
    assert LOAD_GENERATOR not in diagnose(table).binding.values() and "generator" not in format_table(table).lower()


def test_merge_keeps_one_row_per_worker_and_time_from_both_copies(tmp_path):
    local, received = tmp_path / GENERATOR_DIR, tmp_path / GENERATOR_DIR / RECEIVED_DIR
    received.mkdir(parents=True)
    a1 = sample_line(11.0, "a", 1.0, 0.5, 2, 8, [0.001, 0.002])
    a2 = sample_line(12.0, "a", 1.0, 0.7, 4, 8, [0.004])
    b1 = sample_line(11.5, "b", 1.0, 0.3, 4, 8, [0.0005])
    (local / "a.jsonl").write_bytes(a1 + a2)
    (received / "a.jsonl").write_bytes(a1)  # the master's copy of what a shipped before it died
    (received / "b.jsonl").write_bytes(b1 + b'{"timestamp": 12.5, "wor')  # a line cut by a crash
    df = merge_generator(tmp_path)
    assert list(zip(df["worker"], df["timestamp"])) == [("a", 11.0), ("a", 12.0), ("b", 11.5)]
    assert df["lag_s"].map(list).tolist() == [[0.001, 0.002], [0.004], [0.0005]]
    assert df["cpu_fraction"].tolist() == pytest.approx([0.5, 0.7, 0.3])
    assert pd.read_parquet(tmp_path / GENERATOR_FILE).equals(df)


def test_a_run_without_samples_gets_no_generator_file(tmp_path):
    assert merge_generator(tmp_path).empty and not (tmp_path / GENERATOR_FILE).exists()


def table(**generator):
    """Five steps whose server side binds on the KV cache from 8 users on; generator columns as given."""
    n = 5
    base = {
        "step": range(n),
        "users": [1, 2, 4, 8, 16],
        "aggregate_tok_s": [100, 200, 390, 700, 720],
        "kv_cache_usage_max": [0.1, 0.2, 0.5, 1.0, 1.0],
        "waiting_max": [0, 0, 0, 5, 40],
        "preemptions": [0, 0, 0, 3, 90],
        "generator_lag_p99_s": [0.0005] * n,
        "generator_cpu_max": [0.3] * n,
        "users_achieved_mean": [1, 2, 4, 8, 16],
        "generator_bound": [False] * n,
    }
    base.update(generator)
    return pd.DataFrame(base)


def test_the_load_generator_binds_before_the_knee_but_not_before_a_full_kv_cache():
    d = diagnose(table(generator_bound=[False, True, False, False, True], generator_cpu_max=[0.3, 0.95, 0.3, 0.3, 0.9]))
    assert d.knee_step == 3
    # At 16 users the server's cache is full with requests waiting: the client delivered more than the server took,
    # so the server's limit binds; the generator's flag still says the latencies may read high.
    assert d.binding == {1: LOAD_GENERATOR, 3: KV_CACHE, 4: KV_CACHE}
    lines = [t for t in d.text if "load generator binds" in t]
    assert len(lines) == 1 and lines[0].startswith("At 2 users") and "95% CPU, over the 85% bound" in lines[0]
    assert "--processes N, or more workers" in lines[0]
    flagged_too = [t for t in d.text if "The load generator was flagged too" in t]
    assert len(flagged_too) == 1 and flagged_too[0].startswith("At 16 users the KV cache binds")
    assert "--processes N, or more workers" in flagged_too[0]


def test_unflagged_and_unmeasured_steps_are_not_the_load_generator():
    assert LOAD_GENERATOR not in diagnose(table()).binding.values()
    missing = table(generator_bound=[None, None, math.nan, None, None], generator_cpu_max=[math.nan] * 5)
    assert diagnose(missing).binding == {3: KV_CACHE, 4: KV_CACHE}


def test_the_console_marks_a_flagged_step_where_its_numbers_are_read():
    records = frame([rec(1, 0, 1, 3.0, 0.2, 11, 0.01), rec(2, 1, 2, 13.0, 0.2, 11, 0.01)])
    samples = pd.DataFrame([sample(5.0, "a", 1.0, 0.95, 1, [0.001]), sample(15.0, "a", 1.0, 0.2, 2, [0.001])])
    text = format_table(compute_table(records, TIMELINE, None, samples))
    curve = text.split("\n\n")[0].splitlines()
    assert curve[1].split()[-2:] == ["generator", "stable"]  # stable: in every step table
    assert curve[2].split()[-2] == "BOUND" and "BOUND" not in curve[3].split()
    assert "GENERATOR-BOUND steps 0 (1 users)" in text and "--processes N" in text


def test_advice_depends_on_whether_the_load_process_itself_was_busy():
    from vllm_loadtest.analysis.generator import ADVICE, CONTENDED_ADVICE, advice

    busy = pd.Series({"users": 64, "generator_lag_p99_s": 0.004, "generator_cpu_max": 0.93, "generator_bound": True})
    idle = pd.Series({"users": 64, "generator_lag_p99_s": 0.004, "generator_cpu_max": 0.08, "generator_bound": True})
    assert advice(busy) == ADVICE and advice(idle) == CONTENDED_ADVICE
    assert "cores of its own" in diagnose(pd.DataFrame([{**idle, "step": 0, "aggregate_tok_s": 1.0}])).text[-1]
