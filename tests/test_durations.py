"""Durations the options take: whole and decimal, with or without a unit. The default warm-up of a step shorter than
10 s is a fifth of it, written with a decimal ('1.4s' for 7 s), and Locust's own parser takes whole numbers only:
every --step-duration of 6-9 s with the default warm-up was refused at startup."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from vllm_loadtest.locustfiles import options as opts_mod
from vllm_loadtest.locustfiles.options import parse_duration
from vllm_loadtest.locustfiles.startup import fit_default_warmup

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30), ("1.4s", 1.4), ("0.4s", 0.4), ("500ms", 0.5), ("2m", 120), ("1.5m", 90), ("1m30s", 90), ("7", 7),
     ("1h", 3600), (".5s", 0.5)],
)  # fmt: skip
def test_a_duration_reads_in_seconds(text, seconds):
    assert parse_duration(text, "--step-warmup") == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["abc", "1.4x", "s", "1.2.3s", "-1s"])
def test_anything_else_is_one_error_naming_the_option(text):
    with pytest.raises(ValueError, match="--step-warmup"):
        parse_duration(text, "--step-warmup")


@pytest.mark.parametrize(("step", "warmup"), [("7s", 1.4), ("6s", 1.2), ("9s", 1.8), ("2s", 0.4), ("5s", 1.0)])
def test_the_default_warmup_of_a_short_step_is_a_fifth_that_the_options_then_read(step, warmup):
    options = SimpleNamespace(step_warmup=opts_mod.DEFAULT_STEP_WARMUP, step_duration=step)
    assert "a fifth of each" in fit_default_warmup(options)
    assert parse_duration(options.step_warmup, "--step-warmup") == pytest.approx(warmup)
