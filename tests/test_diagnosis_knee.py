"""The diagnosis on analysis/knee.find_knee, on synthetic step series with known answers: the issue's disturbed demo
curve (knee at 16 users, the 2-user step flagged, through the full text), a server past its batch limit while
throughput still creeps up, a curve that keeps rising, a noisy plateau, an unstable step, and no "compute binds:
throughput is flat" for a step after which throughput rose."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from vllm_loadtest.analysis.diagnosis import COMPUTE, KV_CACHE, LOAD_GENERATOR, diagnose

from tests.test_knee import USERS, curve

pytestmark = pytest.mark.unit

DEMO_TOK_S = [604.7, 662.6, 1755.8, 3453.6, 5512.3, 4999.1, 4686.0]
DEMO_TPOT_MS = [1.5, 3.1, 2.2, 2.2, 2.7, 5.4, 6.8]


def quiet_server(n: int, **over) -> dict:
    """Server columns of a server with room at every step (compute-bound once flat)."""
    base = {"kv_cache_usage_max": [0.1] * n, "waiting_max": [0] * n, "waiting_mean": [0.0] * n,
            "preemptions": [0] * n}  # fmt: skip
    base.update(over)
    return base


def test_the_disturbed_demo_curve_yields_the_knee_at_16_users_and_flags_the_2_user_step():
    d = diagnose(curve(USERS, DEMO_TOK_S, tpot_ms=DEMO_TPOT_MS, **quiet_server(7)))
    assert (d.knee_step, d.knee_users, d.knee_range) == (4, 16, [16, 32])
    assert d.outlier_steps == [1] and d.saturated_step is None
    text = "\n".join(d.text)
    assert d.text[0].startswith("Aggregate throughput flattens at 16 users: the knee lies between 16 and 32 users.")
    assert "5512 ± 165 tok/s to 4999 ± 150 tok/s" in d.text[0]
    flagged = [t for t in d.text if t.startswith("The 2-user step ran slower than the steps around it imply")]
    assert len(flagged) == 1
    assert "something else may have used the server or this machine; rerun it" in flagged[0]
    assert "its TPOT p50 rose to 3.1 ms" in flagged[0]  # the server's own explanation
    # The binding resource only from the knee on: nothing "binds" at 1, 2, 4 or 8 users, where throughput still rose.
    assert d.binding == {4: COMPUTE, 5: COMPUTE, 6: COMPUTE}
    assert not any(t.startswith(("At 1 users", "At 2 users", "At 4 users", "At 8 users")) for t in d.text), text
    assert "flattens at 1 users" not in text and "No knee" not in text


def test_summary_json_keeps_knee_users_and_adds_the_range_and_the_saturated_step():
    d = diagnose(curve(USERS, DEMO_TOK_S, tpot_ms=DEMO_TPOT_MS, **quiet_server(7)))
    out = json.loads(json.dumps(d.to_dict()))
    assert out["knee_users"] == 16 and out["knee_step"] == 4 and out["knee_range"] == [16, 32]
    assert out["saturated_step"] is None and out["outlier_steps"] == [1] and out["unstable_steps"] == []
    assert set(out["binding"]) == {"4", "5", "6"}


def test_a_server_past_its_batch_limit_is_said_so_even_while_throughput_creeps_up():
    """The fast machine of the issue: 3410 -> 6409 -> 7390 tok/s (+15 %) with the KV cache full and 27 requests
    waiting at 64 users: not "the server still had room"."""
    t = curve([4, 16, 32, 64], [1000, 3410, 6409, 7390], waiting_mean=[0, 0, 0.4, 27.0], waiting_max=[0, 0, 3, 40],
              kv_cache_usage_max=[0.2, 0.7, 0.93, 1.0], preemptions=[0, 0, 0, 2847])  # fmt: skip
    d = diagnose(t)
    text = "\n".join(d.text)
    assert d.knee_users is None and (d.saturated_step, d.saturated_users) == (3, 64)
    assert "still had room" not in text and "room to spare" not in text
    assert "From 64 users the server is past its batch limit: requests waited for KV-cache space" in text
    assert "2847 requests were preempted" in text
    assert d.binding == {3: KV_CACHE}


def test_saturation_before_the_flattening_names_the_binding_resource_from_there():
    t = curve([1, 2, 4, 8, 16], [100, 200, 400, 700, 720], waiting_mean=[0, 0, 0, 5, 30], waiting_max=[0, 0, 0, 9, 40],
              kv_cache_usage_max=[0.1, 0.2, 0.5, 1.0, 1.0], preemptions=[0, 0, 0, 3, 90])  # fmt: skip
    d = diagnose(t)
    assert d.knee_users == 8 and d.saturated_users == 8 and d.binding == {3: KV_CACHE, 4: KV_CACHE}
    assert any(line.startswith("From 8 users the server is past its batch limit") for line in d.text)


def test_a_curve_that_keeps_rising_has_no_knee_and_the_server_had_room():
    d = diagnose(curve(USERS, [600, 1150, 2200, 4100, 7000, 10500, 13000], **quiet_server(7)))
    assert d.knee_step is None and d.knee_range is None and d.binding == {} and d.outlier_steps == []
    assert d.text == [
        "No knee: throughput still grew beyond the noise up to the highest step (a later step topped each one by more "
        "than 10 %, outliers left out); the server still had room at the highest step."
    ]


def test_steps_that_sent_no_request_are_no_flat_curve():
    """Steps with no request at all (every load process lost) measured no throughput: their 0 is no plateau."""
    sent = {"requests": [40, 60, 0, 0], "errors": [0, 0, 0, 0], "cut_off": [0, 0, 0, 0]}
    d = diagnose(curve([1, 2, 4, 8], [600, 1190, 0, 0], **quiet_server(4), **sent))
    assert d.knee_step is None and d.knee_range is None
    assert d.text[0] == (
        "Steps 2, 3 sent no request (no throughput measured there, the run's warnings say why): left out of the knee."
    )
    assert d.text[1].startswith("No knee: throughput still grew beyond the noise up to the highest measured step")
    sent = {"requests": [40, 0, 0], "errors": [0, 0, 0], "cut_off": [0, 0, 0]}
    d = diagnose(curve([1, 2, 4], [600, 0, 0], **quiet_server(3), **sent))
    assert d.knee_step is None and not any("flattens" in line for line in d.text)
    assert d.text[0] == (
        "No knee can be judged: steps 1, 2 sent no request, which leaves 1 of 3 steps measured (the run's warnings "
        "say why)."
    )
    # A step whose every request failed did measure: its server answered nothing but errors.
    sent = {"requests": [40, 60, 0], "errors": [0, 0, 30], "cut_off": [0, 0, 0]}
    d = diagnose(curve([1, 2, 4], [600, 1190, 0], **quiet_server(3), **sent))
    assert d.knee_range == [2, 4]


def test_a_noisy_plateau_keeps_the_knee_where_the_curve_flattened():
    d = diagnose(curve(USERS, [600, 1200, 2400, 4000, 4100, 3900, 4400], ci=0.06, **quiet_server(7)))
    assert d.knee_users == 8 and d.knee_range == [8, 16] and d.outlier_steps == []
    # 64 users topped 32 users (3900 -> 4400, beyond both intervals): 32 users is not called flat.
    assert set(d.binding) == {3, 4, 6}


def test_no_compute_binds_for_a_step_after_which_throughput_rose():
    # 32 users dipped (not far enough below the line to be an outlier), 64 users rose again above it.
    t = curve(USERS, [600, 1200, 2400, 4000, 4100, 3800, 4300], ci=0.02, **quiet_server(7))
    d = diagnose(t)
    assert d.knee_users == 8
    assert 5 not in d.binding and not any(t.startswith("At 32 users compute binds") for t in d.text)
    assert d.binding[6] == COMPUTE


def test_an_unstable_step_is_explained_with_its_two_halves():
    t = curve(USERS[:4], [600, 1200, 2400, 4000], **quiet_server(4))
    t["stable"] = [True, True, False, None]
    t["aggregate_tok_s_first_half"] = [600, 1200, 2900, 4000]
    t["aggregate_tok_s_second_half"] = [600, 1200, 1900, 4000]
    d = diagnose(t)
    assert d.unstable_steps == [2]
    line = [x for x in d.text if x.startswith("The 4-user step was not steady")]
    assert len(line) == 1
    assert "its throughput moved from 2900 to 1900 tok/s between the first and second half of its window" in line[0]


def test_a_generator_bound_step_is_named_wherever_it_is():
    t = curve(USERS[:4], [600, 1200, 2400, 4800], **quiet_server(4))
    t["generator_bound"] = [False, True, False, False]
    t["generator_cpu_max"] = [0.2, 0.95, 0.2, 0.2]
    t["generator_lag_p99_s"] = [0.0005] * 4
    d = diagnose(t)
    assert d.knee_users is None and d.binding == {1: LOAD_GENERATOR}


def test_a_rate_run_is_keyed_on_the_rate_with_its_range_and_saturation():
    t = pd.DataFrame({"step": [0, 1, 2, 3], "users": [500] * 4, "rate_rps": [1.0, 2.0, 4.0, 8.0],
                      "aggregate_tok_s": [100.0, 200.0, 400.0, 410.0], "kv_cache_usage_max": [0.1, 0.2, 0.6, 1.0],
                      "waiting_mean": [0, 0, 0, 12.0], "waiting_max": [0, 0, 0, 20],
                      "preemptions": [0, 0, 0, 0]})  # fmt: skip
    d = diagnose(t)
    assert (d.knee_rate_rps, d.knee_range, d.saturated_rate_rps) == (4.0, [4.0, 8.0], 8.0)
    assert "the knee lies between 4 and 8 req/s" in d.text[0]
    assert any(line.startswith("From 8 req/s the server is past its batch limit") for line in d.text)
    assert not math.isnan(d.knee_users)


@pytest.mark.parametrize(("rate", "title", "unit"), [("inputs_per_s", "Embeddings", "inputs/s"),
                                                     ("documents_per_s", "Rerank", "documents/s")])  # fmt: skip
def test_a_batch_kind_curve_is_named_and_counted_in_its_items(rate, title, unit):
    # No output tokens: the curve is the kind's items/s, and the knee's sentence says so in its own unit.
    t = curve(USERS, [math.nan] * 7)
    t[rate] = DEMO_TOK_S
    t[f"{rate}_ci_low"], t[f"{rate}_ci_high"] = t[rate] * 0.97, t[rate] * 1.03
    d = diagnose(t.assign(**quiet_server(7)))
    assert (d.knee_step, d.knee_users) == (4, 16), d.text
    assert d.text[0].startswith(f"{title} throughput ({unit}) flattens at 16 users"), d.text[0]
    assert f"5512 ± 165 {unit}" in d.text[0] and "tok/s" not in d.text[0]
