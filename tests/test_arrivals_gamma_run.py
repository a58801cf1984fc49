"""Bursty arrivals end to end: real `locust` runs with --rates --arrival gamma against the fake server. The intended
times are the seeded stream exactly; the gaps actually sent are bursty (CV above 1) at --burstiness 0.25 and smooth
(below 1) at 4; the report shows them; two processes together send the one stream.

Tolerances are generous (a shared 2-core machine): the sent gaps carry each send's own few milliseconds of jitter."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pandas as pd
import pytest
from vllm_loadtest.analysis.arrivals import cv, gaps
from vllm_loadtest.analysis.report import REPORT_FILE
from vllm_loadtest.analysis.run import SUMMARY_FILE
from vllm_loadtest.analysis.schedule import arrival_times

from tests.helpers.runs import locust

pytestmark = [pytest.mark.contract]


def run(server, run_dir, *args: str, report: bool = False):
    proc = locust(
        "--host", server.url, "--max-tokens", "8", "--step-warmup", "0s", "--max-users", "60",
        "--run-dir", str(run_dir), *([] if report else ["--no-report"]), *args,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = pd.read_parquet(run_dir / "requests.parquet")
    summary = json.loads((run_dir / SUMMARY_FILE).read_text())
    return proc, records, summary


def seeded_gaps(rate: float, b: float, seed: str, n: int, **kw) -> np.ndarray:
    return np.diff(list(itertools.islice(arrival_times(rate, "gamma", seed, burstiness=b, **kw), n)))


def test_a_bursty_run_sends_gaps_with_a_cv_above_one_and_the_report_shows_them(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "5", "--itl-ms", "1")
    run_dir = tmp_path / "r"
    _, records, summary = run(
        server, run_dir, "--rates", "30", "--arrival", "gamma", "--burstiness", "0.25", "--seed", "3",
        "--step-duration", "6s", report=True,
    )  # fmt: skip
    intended = gaps(records["intended_start_time"])
    # The intended times are the seeded stream (step 0's key), exactly: the burstiness reached the plan.
    assert intended == pytest.approx(seeded_gaps(30.0, 0.25, "3:0", len(intended) + 1), abs=1e-5)
    assert cv(intended) > 1.5  # this seed's stream: 1.83
    sent = gaps(records["start_time"])
    assert cv(sent) > 1.3, f"sent gaps' CV {cv(sent):.2f}: the bursts were smoothed out"
    step = summary["arrivals"]["steps"][0]
    assert summary["arrivals"]["process"] == "gamma" and summary["arrivals"]["burstiness"] == 0.25
    assert summary["arrivals"]["expected_cv"] == 2.0
    assert step["gaps"] == len(sent) and step["cv"] == pytest.approx(cv(sent))
    assert step["cv_low"] < step["cv"] < step["cv_high"] and step["cv_low"] > 1.0
    report = (run_dir / REPORT_FILE).read_text(encoding="utf-8")
    assert "<h2>Inter-arrival times</h2>" in report and "expected: gamma, shape 0.25" in report


def test_a_smooth_run_sends_gaps_with_a_cv_below_one(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "5", "--itl-ms", "1")
    _, records, summary = run(
        server, tmp_path / "r", "--rates", "30", "--arrival", "gamma", "--burstiness", "4", "--seed", "3",
        "--step-duration", "6s",
    )  # fmt: skip
    # The gaps between two consecutive sends of the plan that the run itself recorded as both on time (a busy machine
    # can hold some back, and a late request goes out right behind the one before it: a burst the plan never had).
    # Only consecutive pairs: a gap across a late send left out is two of the plan's gaps, and made a stressed run's
    # CV 1.39.
    plan = records.sort_values("intended_start_time")
    on_time = (plan["schedule_lag_s"] < 0.01).to_numpy()
    pairs = on_time[1:] & on_time[:-1]
    sent = np.diff(plan["start_time"].to_numpy())[pairs]
    assert len(sent) > 50 and cv(sent) < 0.8, f"on-time sent gaps' CV {cv(sent):.2f} of {len(sent)} (asked for 0.5)"
    assert summary["arrivals"]["steps"][0]["cv_high"] < 1.0 or on_time.sum() < len(records)


def test_two_processes_send_the_one_gamma_stream_between_them(fake_server, tmp_path):
    server = fake_server("--ttft-ms", "5", "--itl-ms", "1")
    _, records, summary = run(
        server, tmp_path / "r", "--rates", "20", "--arrival", "gamma", "--burstiness", "0.25", "--seed", "4",
        "--processes", "2", "--step-duration", "5s", "--stop-timeout", "5",
    )  # fmt: skip
    assert records["worker"].nunique() == 2
    shares = [seeded_gaps(20.0, 0.25, "4:0", 200, rank=r, processes=2) for r in range(2)]
    ranks = set()
    for _, own in records.groupby("worker"):
        mine = gaps(own["intended_start_time"])
        # Each worker: every other arrival of the one full-rate stream (its rank's), not a stream of its own.
        matched = [r for r, share in enumerate(shares) if mine == pytest.approx(share[: len(mine)], abs=1e-5)]
        assert len(matched) == 1, mine[:5]
        ranks.add(matched[0])
    assert ranks == {0, 1}
    assert summary["arrivals"]["steps"][0]["cv_intended"] > 1.2  # merged: the bursty stream, not a smoother sum
