"""A master that Locust restarts mid-run keeps its run: Locust 2.47's MasterRunner fires test_start again, without
test_stop, when every worker missed its heartbeat at once (check_stopped then reads the workers as stopped and the
shape's next start() begins a "new" test). Starting a second run directory there left the first without results."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
from vllm_loadtest.locustfiles.plugin import RunContext

pytestmark = pytest.mark.unit


def test_a_controller_with_a_run_in_progress_keeps_it_when_test_start_fires_again(caplog, tmp_path):
    # A stand-in with only what the guard reads: had on_test_start gone on, it would touch attributes it lacks.
    ctx = SimpleNamespace(is_controller=True, run_dir=Path(tmp_path / "run"), _stopping=False)
    with caplog.at_level(logging.WARNING):
        RunContext.on_test_start(ctx, environment=None)
    assert ctx.run_dir == tmp_path / "run"
    assert "goes on in" in caplog.text and str(tmp_path / "run") in caplog.text


@pytest.mark.parametrize("state", [{"run_dir": None, "_stopping": False}, {"is_controller": False}])
def test_a_first_start_or_a_worker_starts_as_before(tmp_path, state):
    ctx = SimpleNamespace(**{"is_controller": True, "run_dir": tmp_path / "run", "_stopping": False, **state})
    with pytest.raises(AttributeError):  # it goes on past the guard, into the start the stand-in cannot do
        RunContext.on_test_start(ctx, environment=None)
