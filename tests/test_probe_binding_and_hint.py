"""The capacity's sentence, on what the real vLLM showed on a shared 2-core machine.

An uncertain capacity says how to lengthen its probes: --step-duration auto for fixed probes, a longer
--max-step-duration for adaptive ones that straddled their limit until their maximum ("at 24 users ttft_p95 was
310 ms (CI 160-642 ms)" after 30 s of --step-duration auto). What binds at the first failing probe is the server's
resource when its own metrics show it at its limit, even where the load generator's lag probe flagged the step too
(then the sentence says so); the load generator only when the server had room."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from vllm_loadtest.analysis import capacity
from vllm_loadtest.analysis.diagnosis import BATCH_SLOTS, KV_CACHE, LOAD_GENERATOR, binding_resource

pytestmark = pytest.mark.unit

SPEC = "ttft_p95=300ms"


def probes() -> list[capacity.Probe]:
    ok = capacity.Check("ttft_p95", 0.3, 0.07, 0.064, 0.09, capacity.PASS)
    straddles = capacity.Check("ttft_p95", 0.3, 0.31, 0.16, 0.642, capacity.UNCERTAIN)
    return [
        capacity.Probe(1, 0, 22, capacity.PASS, [ok], 4792.0, 3809.0, 5775.0, 465),
        capacity.Probe(2, 1, 24, capacity.UNCERTAIN, [straddles], 2372.0, 1198.0, 3545.0, 217),
    ]


def table(end_reason: str) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "step": [0, 1], "users": [22, 24], "end_reason": [end_reason, end_reason],
            "kv_cache_usage_max": [1.0, 1.0], "waiting_max": [3.0, 5.0], "preemptions": [692.0, 435.0],
            "waiting_mean": [0.5, 1.0], "running_max": [22.0, 24.0],
        }
    )  # fmt: skip


@pytest.mark.parametrize(
    ("end_reason", "hint"),
    [("max_duration", "raise --max-step-duration"), ("fixed", "--step-duration auto"), ("", "--step-duration auto")],
)
def test_the_uncertain_line_names_what_lengthens_its_probes(end_reason, hint):
    out = capacity.result(capacity.USERS, probes(), SPEC, table(end_reason), {1: "KV cache"}, capacity.LIMIT_SLO)
    assert out["uncertain"] and out["max_users"] == 22
    assert out["first_failing"]["end_reason"] == (end_reason or None)
    assert out["line"].startswith("Capacity: uncertain between 22 users and 24 users: 22 users meets ttft_p95<=300ms")
    assert "at 24 users ttft_p95 was 310 ms (CI 160-642 ms)" in out["line"]
    assert f"too close to its limit to tell (lengthen the probes: {hint});" in out["line"]
    assert out["line"].endswith(
        "what binds there: KV cache (100 % KV cache used, up to 5 requests waiting, 435 preempted)"
    )


def test_a_run_without_end_reasons_keeps_the_auto_hint():
    t = table("fixed").drop(columns=["end_reason"])
    t.loc[1, "kv_cache_usage_max"] = math.nan
    out = capacity.result(capacity.USERS, probes(), SPEC, t, {}, capacity.LIMIT_SLO)
    assert out["first_failing"]["end_reason"] is None
    assert "(lengthen the probes: --step-duration auto)" in out["line"]


FLAGGED_TOO = "; the load generator was flagged there too (its latencies may read high)"


@pytest.mark.parametrize(
    ("kv", "waiting", "preempted", "generator", "diagnosis", "resource"),
    [
        (1.0, 7.0, 952.0, True, KV_CACHE, KV_CACHE),  # the demo's 15-user probe, lag p99 2.9 ms
        (0.6, 0.0, 12.0, True, KV_CACHE, KV_CACHE),  # preempting: the cache is at its limit
        (0.5, 4.0, 0.0, True, BATCH_SLOTS, BATCH_SLOTS),  # waiting with cache to spare
        (0.3, 0.0, 0.0, True, LOAD_GENERATOR, LOAD_GENERATOR),  # the server had room: the generator binds
        (1.0, 7.0, 952.0, False, KV_CACHE, KV_CACHE),
    ],
)
def test_the_server_resource_is_named_when_its_metrics_show_it_at_its_limit(
    kv, waiting, preempted, generator, diagnosis, resource
):
    t = table("fixed")
    t.loc[1, ["kv_cache_usage_max", "waiting_max", "preemptions"]] = [kv, waiting, preempted]
    t["generator_bound"] = [False, generator]
    # The diagnosis's own binding_resource names the server's limit before a flagged load generator; the result
    # repeats it (derived once) and says the generator was flagged too.
    assert binding_resource(t.iloc[1]) == diagnosis
    out = capacity.result(capacity.USERS, probes(), SPEC, t, {1: diagnosis}, capacity.LIMIT_SLO)
    assert out["binding"]["resource"] == resource and out["binding"]["load_generator_bound"] is generator
    assert f"what binds there: {resource} (" in out["line"]
    assert out["line"].endswith(FLAGGED_TOO) == (generator and resource != LOAD_GENERATOR)
