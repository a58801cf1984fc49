"""--find-capacity users against the embedded real vLLM (CPU build, tiny model, 128 KV blocks): the search stops
where the KV cache binds, and names it.

Select with `-m vllm`; the server starts once per session (tests/conftest.py).

The objective, TTFT p95 <= 200 ms with 256 output tokens (--ignore-eos), is one only a queue breaks: measured on a
loaded 2-core machine, TTFT p95 stayed at 10-35 ms up to 16 users (cache 93 % used), then rose to 83 ms at 24 users,
197 ms at 28 and 331 ms at 32, with the cache full, requests waiting and hundreds preempted. A faster machine moves
that point, not the cause: the first failing probe is past the cache's limit. The search starts at 8 users and stops
at a 50 % resolution (8, 16, 32, then one or two bisections), with 10 s probes (2 s warm-up): under a minute. A
probe's window must outlast a few requests (E2E 1.8 s at 4 users in a fresh clone's parallel suite).
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
from vllm_loadtest.analysis.diagnosis import KV_CACHE, KV_FULL, LOAD_GENERATOR

from tests.helpers.runs import locust

pytestmark = [pytest.mark.vllm, pytest.mark.contract]

SLO_S = 0.2


def test_users_capacity_stops_where_the_kv_cache_binds_and_names_it(vllm_server, tmp_path):
    run_dir = tmp_path / "run"
    proc = locust(
        "--host", vllm_server.url, "--find-capacity", "users", "--slo", f"ttft_p95={SLO_S * 1000:.0f}ms",
        "--step-duration", "10s", "--step-warmup", "2s", "--max-tokens", "256", "--ignore-eos",
        "--start-users", "8", "--max-users", "64", "--capacity-resolution", "50%",
        "--run-dir", str(run_dir), "--no-report", "--only-summary",
        timeout=900,
    )  # fmt: skip
    print(proc.stdout[-5000:])  # the tables, the diagnosis and the Capacity section, shown when an assertion fails
    # 1 would mean even 1 user broke the objective: then the objective, not the server, is wrong.
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    cap = summary["capacity"]
    steps = pd.read_csv(run_dir / "steps.csv").set_index("step")
    probes = cap["probes"]

    # Every probe is a step, in the order it ran, and the search doubled from 8 users until one did not pass.
    assert list(steps["probe"]) == [p["probe"] for p in probes] == list(range(1, len(probes) + 1))
    assert list(steps["users"]) == [p["users"] for p in probes]
    loads = [p["users"] for p in probes]
    doubling = next(i for i, p in enumerate(probes) if not p["passed"])
    assert loads[: doubling + 1] == [8 * 2**i for i in range(doubling + 1)], loads

    assert cap["mode"] == "users" and cap["limit"] == "slo", cap
    best, failing = cap["max_users"], cap["first_failing"]
    assert best >= 1 and failing is not None and failing["users"] > best, cap
    # Bisected down to the resolution: 50 % of the capacity, never finer than 1 user.
    assert failing["users"] - best <= max(1, 0.5 * best), loads
    assert "ttft_p95" in failing["objectives"], failing
    broke = failing["objectives"]["ttft_p95"]
    row = steps.loc[failing["step"]]
    # The verdict is on the same requests as the step table's p95. A probe none of whose requests finished inside its
    # window (the last probe, its queue longer than the window on a loaded machine) has no data: a fail, not a pass.
    assert broke["verdict"] in ("fail", "uncertain") and cap["uncertain"] == (broke["verdict"] == "uncertain")
    if broke["value"] is None:
        assert pd.isna(row["ttft_p95_s"]) and broke["verdict"] == "fail", (broke, row)
    else:
        assert broke["value"] == pytest.approx(row["ttft_p95_s"]), (broke, row)
        assert broke["verdict"] == "uncertain" or broke["value"] > SLO_S, broke

    # Where it broke, vLLM's own metrics show the cache at its limit: full or preempting. (Requests waiting need not
    # show: the gauge is sampled once a second, and a fresh clone's run read 0 at the first failing probe.)
    assert row["kv_cache_usage_max"] >= KV_FULL or row["preemptions"] > 0, row
    binding = cap["binding"]
    assert binding["step"] == failing["step"]
    assert binding["kv_cache_usage_max"] == pytest.approx(row["kv_cache_usage_max"])
    assert binding["waiting_max"] == pytest.approx(row["waiting_max"])
    assert binding["preemptions"] == pytest.approx(row["preemptions"])
    # What binds is the KV cache. On a machine shared with other work the load generator's lag probe can flag the
    # step too (a 3 ms lag p99): the capacity says both, and the diagnosis names the generator first unless the
    # server held more than it could run (requests waiting or preempted).
    generator = bool(row["generator_bound"])
    assert binding["resource"] == KV_CACHE and binding["load_generator_bound"] is generator, binding
    over = row["waiting_max"] > 0 or row["preemptions"] > 0
    expected = LOAD_GENERATOR if generator and not over else KV_CACHE
    assert summary["diagnosis"]["binding"][str(failing["step"])] == expected

    # The console's Capacity section says all of it in one line, then the probe path.
    line = next(s for s in proc.stdout.splitlines() if s.startswith("- Capacity: "))
    assert line == f"- {cap['line']}"
    if cap["uncertain"]:
        assert line.startswith(f"- Capacity: uncertain between {best} users and {failing['users']} users"), line
    else:
        assert line.startswith(f"- Capacity: {best} user"), line
        assert f"at {failing['users']} users ttft_p95 was" in line, line
    assert f"what binds there: {KV_CACHE} (" in line and "% KV cache used" in line and "waiting" in line, line
    assert ("the load generator was flagged there too" in line) is generator, line
    assert proc.stdout.count("- Probe ") == len(probes)
