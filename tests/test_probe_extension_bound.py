"""A capacity probe whose objective straddles its limit is kept on past its interval target, but never past
--max-step-duration: there it ends as max_duration, flagged, and the step lengths say why (against the real vLLM a
straddling 28-user probe once ran 66 s of a 30 s maximum, until the run was stopped)."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest
from vllm_loadtest.analysis import adaptive, capacity
from vllm_loadtest.locustfiles.shape import CapacityShape, StepLength, _Search

pytestmark = pytest.mark.unit

MAX_S = 30.0


class Search(_Search):
    def __init__(self, verdict: str) -> None:
        super().__init__(capacity.USERS, [], 1, 64, 0.1)
        self.verdict = verdict

    def judge(self, tracker, until=None) -> capacity.Probe:
        check = capacity.Check("ttft_p95", 0.2, 0.216, 0.172, 0.241, self.verdict)
        return capacity.Probe(5, 4, 28, self.verdict, [check])


def probe_end(verdict: str, reason: str | None, elapsed_s: float) -> tuple[str | None, dict]:
    shape = CapacityShape()
    shape.search, shape.length = Search(verdict), StepLength(None, MAX_S, 0.5)
    entry = {"step": 4, "users": 28, "end_check": {"reason": reason, "rel_half_width": 0.045}}
    tracker = SimpleNamespace(timeline=[entry])
    return shape._probe_end(tracker, reason, elapsed_s), entry


def test_a_straddling_probe_goes_on_before_its_maximum():
    reason, entry = probe_end(capacity.UNCERTAIN, adaptive.CI_TARGET, MAX_S - 1)
    assert reason is None and entry["end_check"]["reason"] == adaptive.CI_TARGET


def test_a_straddling_probe_ends_at_its_maximum_flagged(caplog):
    reason, entry = probe_end(capacity.UNCERTAIN, adaptive.CI_TARGET, MAX_S)
    assert reason == adaptive.MAX_DURATION
    assert entry["end_check"]["reason"] == adaptive.MAX_DURATION and entry["end_check"]["objective_straddled"]
    assert "Probe 5 (28 users) reached --max-step-duration 30 s with ttft_p95 still straddling" in caplog.text


@pytest.mark.parametrize("verdict", [capacity.PASS, capacity.FAIL])
@pytest.mark.parametrize("reason", [adaptive.CI_TARGET, adaptive.MAX_DURATION, None])
def test_a_decided_probe_or_another_reason_is_left_alone(verdict, reason):
    assert probe_end(verdict, reason, MAX_S + 5)[0] == reason


def test_the_step_lengths_name_the_straddling_objective_not_the_tok_s_interval():
    t0 = 1000.0
    entry = {"step": 0, "users": 28, "start_time": t0, "measure_start": t0 + 4, "end_time": t0 + 30,
             "end_reason": adaptive.MAX_DURATION}  # fmt: skip
    table = pd.DataFrame({"step": [0], "aggregate_tok_s": [6830.0], "aggregate_tok_s_ci_low": [6522.0],
                          "aggregate_tok_s_ci_high": [7138.0]})  # fmt: skip
    records = pd.DataFrame({"step": [0], "status": ["ok"], "warmup": [False], "ttft_s": [0.2]})
    options = {"step_duration": "auto", "max_step_duration": "30s", "ci_target": "50%"}

    def lines(check: dict) -> list[str]:
        run = {
            "options": options,
            "timeline": [{**entry, "end_check": check}],
            "started_at": t0,
            "finished_at": t0 + 31,
        }
        return adaptive.step_lengths_text(run, table, records)

    straddled = lines({"reason": adaptive.MAX_DURATION, "objective_straddled": True})
    assert any(
        line == "MAX: Step 0 (28 users) reached --max-step-duration with an objective's interval still straddling "
        "its limit (aggregate tok/s ±4.5 %) (30.0 s)"
        for line in straddled
    ), straddled
    assert not any("straddling" in line for line in lines({"reason": adaptive.MAX_DURATION}))
