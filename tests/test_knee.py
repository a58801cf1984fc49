"""The knee and the suspect steps on synthetic step series with known answers: a disturbed low step, a noisy
plateau, a curve that keeps rising, a real knee, and a server past its batch limit while throughput creeps up."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from vllm_loadtest.analysis.knee import find_knee, first_and_second_half, outliers, saturated, stable

pytestmark = pytest.mark.unit


def curve(users, tok_s, ci=0.03, tpot_ms=None, **server) -> pd.DataFrame:
    t = pd.DataFrame({"step": range(len(users)), "users": users, "aggregate_tok_s": tok_s})
    t["aggregate_tok_s_ci_low"] = t["aggregate_tok_s"] * (1 - ci)
    t["aggregate_tok_s_ci_high"] = t["aggregate_tok_s"] * (1 + ci)
    if tpot_ms is not None:
        t["tpot_p50_s"] = np.array(tpot_ms) / 1000
    for k, v in server.items():
        t[k] = v
    return t


USERS = [1, 2, 4, 8, 16, 32, 64]


def test_the_disturbed_demo_curve_has_its_knee_at_16_and_flags_the_2_user_step():
    """The issue's `make demo` run on a shared machine: the 2-user step ran slow."""
    tok_s = [604.7, 662.6, 1755.8, 3453.6, 5512.3, 4999.1, 4686.0]
    t = curve(USERS, tok_s, tpot_ms=[1.5, 3.1, 2.2, 2.2, 2.7, 5.4, 6.8])
    knee = find_knee(t)
    assert [o.step for o in knee.outliers] == [1]
    assert "TPOT p50 rose to 3.1 ms" in knee.outliers[0].explained_by
    assert knee.load == 16 and knee.range == (16, 32)


def test_a_real_knee_without_disturbance():
    t = curve(USERS, [600, 1190, 2350, 4500, 6000, 6100, 5900])
    knee = find_knee(t)
    assert knee.outliers == [] and knee.load == 16 and knee.range == (16, 32)


def test_a_noisy_plateau_does_not_move_the_knee():
    # +8 % at 64 users is inside the plateau tolerance, and the wide intervals overlap.
    t = curve(USERS, [600, 1200, 2400, 4000, 4100, 3900, 4400], ci=0.06)
    knee = find_knee(t)
    assert knee.load == 8 and knee.outliers == []


def test_a_later_step_clearly_above_the_flat_level_moves_the_knee():
    t = curve(USERS, [600, 1200, 1250, 1260, 2600, 2650, 2600])
    assert find_knee(t).load == 16


def test_a_curve_that_keeps_rising_has_no_knee():
    t = curve(USERS, [600, 1150, 2200, 4100, 7000, 10500, 13000])
    knee = find_knee(t)
    assert knee.step is None and knee.range is None and knee.outliers == []


def test_a_server_past_its_batch_limit_is_saturated_although_throughput_still_creeps_up():
    """The fast machine of the issue: 3410 -> 6409 -> 7390 tok/s (+15 %) at 16/32/64 users while 27 requests waited
    with the KV cache full and 2847 preemptions: no throughput knee, but saturation from 64 users."""
    t = curve(
        [4, 16, 32, 64],
        [1000, 3410, 6409, 7390],
        waiting_mean=[0, 0, 0.4, 27.0],
        kv_cache_usage_max=[0.2, 0.7, 0.93, 1.0],
        preemptions=[0, 0, 0, 2847],
    )
    knee = find_knee(t)
    assert knee.step is None and knee.saturated_load == 64
    assert not saturated(t.iloc[2]) and saturated(t.iloc[3])


def test_a_concave_growth_region_has_no_outliers():
    t = curve(USERS, [600, 1100, 1900, 3000, 4200, 5000, 5200])
    assert outliers(t) == []


def test_stability_compares_the_two_halves_against_their_noise():
    assert stable(1000, 30, 1010, 30) is True
    assert stable(1000, 10, 1200, 10) is False
    assert stable(1000, 300, 1200, 300) is True  # beyond the tolerance, but within the noise
    assert stable(1000, 10, 1080, 10) is True  # beyond the noise, but within the tolerance
    assert stable(float("nan"), 1, 1, 1) is None
    t = np.array([0.5, 1.5, 2.5, 3.5])
    assert first_and_second_half(t, np.array([1.0, 1, 2, 2]), 0.0, 4.0) == (1.0, 2.0)
