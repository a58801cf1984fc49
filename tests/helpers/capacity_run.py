"""A synthetic capacity search's run directory with known answers (no Locust), for the report and summary tests.

Probes at 1, 2, 4, 8, 6, 5 users, in that order (doubling, then bisecting between 4 and 8); TTFT is 20 ms up to 5
users and 300 ms from 6, so with --slo ttft_p95=100ms the capacity is 5 users and 6 users fail."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from vllm_loadtest.analysis import capacity
from vllm_loadtest.analysis.records import RecordWriter, RequestRecord

from tests.helpers.records import rec

T0 = 1_700_000_000.0
LOADS = [1, 2, 4, 8, 6, 5]  # the order the probes ran in
STEP_S, WARMUP_S, PER_STEP = 10.0, 1.0, 260  # over 200 measured requests a step: a p95 interval


def ttft_at(users: int) -> float:
    return 0.02 if users <= 5 else 0.3


def write_capacity_run(run_dir: Path, searched: bool = True) -> Path:
    """A finished run directory (records/local.jsonl and run.json): a capacity search's (`searched`), or the same
    steps as a plain --slo run."""
    rng = np.random.default_rng(16)
    writer = RecordWriter(run_dir / "records" / "local.jsonl")
    timeline, i = [], 0
    for step, users in enumerate(LOADS):
        start = T0 + step * STEP_S
        entry = {"step": step, "users": users, "rate_rps": None, "start_time": start,
                 "measure_start": start + WARMUP_S, "end_time": start + STEP_S, "end_reason": "fixed"}  # fmt: skip
        if searched:
            entry["probe"] = step + 1
        timeline.append(entry)
        for t in np.linspace(start + 0.1, start + STEP_S - 1.0, PER_STEP):
            ttft = ttft_at(users) * (1 + 0.05 * rng.random())
            row = rec(i, step, users, float(t), ttft, 8 * users, 0.005, warmup=bool(t < start + WARMUP_S))
            writer.write(RequestRecord(**row))
            i += 1
    writer.close()
    if searched:
        timeline[-1]["capacity_limit"] = capacity.LIMIT_SLO
    options = {"host": "http://fake", "slo": "ttft_p95=100ms", "max_error_rate": "0"}
    if searched:
        options["find_capacity"] = "users"
    run = {"started_at": T0, "finished_at": T0 + len(LOADS) * STEP_S, "timeline": timeline, "options": options}
    (run_dir / "run.json").write_text(json.dumps(run))
    return run_dir
