"""`python -m embedded_vllm demo --capacity`: the demo's server with a capacity search instead of its steps."""

from __future__ import annotations

import argparse

import pytest
from vllm_loadtest.embedded_vllm.__main__ import main
from vllm_loadtest.embedded_vllm.demo import DEFAULT_CAPACITY_SLO, load_args
from vllm_loadtest.locustfiles.options import DEFAULT_STEPS, check_capacity

pytestmark = pytest.mark.unit


def test_the_demo_help_documents_the_capacity_search(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["demo", "--help"])
    assert exit_.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--capacity" in out and "--find-capacity users" in out
    assert f"(default {DEFAULT_CAPACITY_SLO})" in out


def test_capacity_replaces_the_steps_with_a_users_search_the_suite_accepts():
    steps = argparse.Namespace(capacity=False, steps="1,2,4", slo=DEFAULT_CAPACITY_SLO)
    assert load_args(steps) == ["--steps", "1,2,4"]
    search = argparse.Namespace(capacity=True, steps="1,2,4", slo="ttft_p95=150ms")
    args = load_args(search)
    assert args == ["--find-capacity", "users", "--slo", "ttft_p95=150ms"] and "--steps" not in args
    # What the demo passes is what the suite's own check accepts (no --steps beside --find-capacity).
    check_capacity(
        argparse.Namespace(
            find_capacity="users", slo=args[3], steps=DEFAULT_STEPS, rates="", start_users=1, start_rate="1",
            max_rate="", capacity_resolution="10%", max_users=1000,
        )
    )  # fmt: skip
