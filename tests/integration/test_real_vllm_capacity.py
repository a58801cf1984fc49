"""--find-capacity users against the embedded real vLLM (CPU build, tiny model, 128 KV blocks): the search runs
its probes, stops at its resolution and names what binds where it broke, from that probe's own metrics.

The server starts once per session (tests/conftest.py). The objective, TTFT p95 <= 200 ms with 256 output tokens
(--ignore-eos), is one only a queue breaks on a quiet machine: the first failing probe is past the KV cache's limit
(the recorded search in tests/test_recorded_runs.py proves that verdict). In the parallel suite the embedded
server, at a lower CPU weight than the tests (embedded_vllm.server.lower_priority), ran 8 users at 174 tok/s in a
fresh clone (1,600 on its own): then even 8 users break the objective, and this test checks that the search says
so honestly. Starts at 8 users, 50 % resolution, 10 s probes (2 s warm-up): under a minute.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
from vllm_loadtest.analysis.diagnosis import binding_resource

from tests.helpers.runs import locust

pytestmark = [pytest.mark.vllm, pytest.mark.contract]

SLO_S = 0.2


def test_users_capacity_search_stops_at_its_resolution_and_names_what_binds(vllm_server, tmp_path):
    run_dir = tmp_path / "run"
    proc = locust(
        "--host", vllm_server.url, "--find-capacity", "users", "--slo", f"ttft_p95={SLO_S * 1000:.0f}ms",
        "--step-duration", "10s", "--step-warmup", "2s", "--max-tokens", "256", "--ignore-eos",
        "--start-users", "8", "--max-users", "64", "--capacity-resolution", "50%",
        "--run-dir", str(run_dir), "--no-report", "--only-summary",
        timeout=900,
    )  # fmt: skip
    print(proc.stdout[-5000:])  # the tables, the diagnosis and the Capacity section, shown when an assertion fails
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
    assert failing is not None and "ttft_p95" in failing["objectives"], cap
    line = next(s for s in proc.stdout.splitlines() if s.startswith("- Capacity: "))
    assert line == f"- {cap['line']}" and proc.stdout.count("- Probe ") == len(probes)
    if best is None:  # a server slowed by everything else on the machine broke the objective at the first probe
        assert proc.returncode == 1 and failing["users"] == 8, proc.stderr[-3000:]
        assert line.startswith("- Capacity: none: even 8 users breaks ttft_p95<=200ms"), line
    else:
        assert proc.returncode == 0, proc.stderr[-3000:]
        # Bisected down to the resolution: 50 % of the capacity, never finer than 1 user.
        assert failing["users"] > best and failing["users"] - best <= max(1, 0.5 * best), loads
        if cap["uncertain"]:
            assert line.startswith(f"- Capacity: uncertain between {best} users and {failing['users']} users"), line
        else:
            assert line.startswith(f"- Capacity: {best} user"), line
            assert f"at {failing['users']} users ttft_p95 was" in line, line

    # The verdict is on the same requests as the step table's p95. A probe none of whose requests finished inside
    # its window (the server slowed by a busy machine) has no data: a fail, not a pass.
    broke = failing["objectives"]["ttft_p95"]
    row = steps.loc[failing["step"]]
    assert broke["verdict"] in ("fail", "uncertain") and cap["uncertain"] == (broke["verdict"] == "uncertain")
    if broke["value"] is None:
        assert pd.isna(row["ttft_p95_s"]) and broke["verdict"] == "fail", (broke, row)
    else:
        assert broke["value"] == pytest.approx(row["ttft_p95_s"]), (broke, row)
        assert broke["verdict"] == "uncertain" or broke["value"] > SLO_S, broke

    # What binds there is named from that probe's own row of vLLM's metrics, by the diagnosis' rule, with the
    # numbers that show it. Which resource it is depends on how fast the machine let the server run: on a quiet one
    # the KV cache (tests/test_recorded_runs.py proves that verdict on a recorded search).
    binding = cap["binding"]
    assert binding["step"] == failing["step"] and binding["resource"] == binding_resource(row), (binding, row)
    assert summary["diagnosis"]["binding"][str(failing["step"])] == binding_resource(row)
    assert binding["kv_cache_usage_max"] == pytest.approx(row["kv_cache_usage_max"])
    assert binding["waiting_max"] == pytest.approx(row["waiting_max"])
    assert binding["preemptions"] == pytest.approx(row["preemptions"])
    assert binding["load_generator_bound"] is bool(row["generator_bound"]), binding
    assert f"what binds there: {binding['resource']} (" in line and "% KV cache used" in line, line
