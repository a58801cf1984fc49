"""The efficiency ceiling: bandwidth and size parsing, the arithmetic, and which step is measured."""

import math

import pytest
from vllm_loadtest.analysis.ceiling import (
    GPU_BANDWIDTH_GBS,
    bandwidth_gbs,
    ceiling_report,
    decode_ceiling_tok_s,
    decode_efficiency,
    parse_bytes,
)

pytestmark = pytest.mark.unit


def test_the_issues_example_qwen3_8b_bf16_on_an_h100():
    # ~16.4 GB of BF16 weights; H100 SXM: 3.35 TB/s.
    ceiling = decode_ceiling_tok_s(bandwidth_gbs("H100-SXM", None), parse_bytes("16.4GB"))
    assert ceiling == pytest.approx(204.27, abs=0.01)
    assert decode_efficiency(102.0, 204.0) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("text", "value"),
    [("16GB", 16e9), ("15.3GiB", 15.3 * 2**30), ("16e9", 16e9), ("512 MB", 512e6), ("1tb", 1e12), ("1000", 1000.0)],
)
def test_sizes(text, value):
    assert parse_bytes(text) == pytest.approx(value)


def test_bad_sizes_and_unknown_gpus_say_what_to_write():
    with pytest.raises(ValueError, match=r"e\.g\. --model-bytes 16GB"):
        parse_bytes("sixteen gigs")
    with pytest.raises(ValueError, match="no preset; use one of h200"):
        bandwidth_gbs("tpu-v9", None)
    assert bandwidth_gbs("l4", 123.0) == 123.0  # an explicit bandwidth wins over the preset
    assert bandwidth_gbs(None, None) is None and GPU_BANDWIDTH_GBS["a100-80gb-sxm"] == 2039.0


def test_measured_at_the_step_with_fewest_users():
    rows = [{"users": 4, "tpot_p50_s": 0.02}, {"users": 1, "tpot_p50_s": 0.01}, {"users": 2, "tpot_p50_s": math.nan}]
    r = ceiling_report(rows, 1000.0, 5e9, "test")
    assert r["decode_ceiling_tok_s"] == pytest.approx(200.0)
    assert r["measured_users"] == 1 and r["measured_decode_tok_s"] == pytest.approx(100.0)
    assert r["decode_efficiency"] == pytest.approx(0.5) and "50% of the ceiling" in r["text"][1]


def test_missing_inputs_give_no_ceiling_and_missing_tpot_is_said():
    assert ceiling_report([{"users": 1, "tpot_p50_s": 0.01}], None, 5e9, "x") is None
    assert ceiling_report([{"users": 1, "tpot_p50_s": 0.01}], 1000.0, None, "x") is None
    r = ceiling_report([{"users": 1, "tpot_p50_s": math.nan}], 1000.0, 5e9, "x")
    assert r["measured_decode_tok_s"] is None and r["decode_efficiency"] is None and "missing" in r["text"][1]


def test_bandwidth_from_the_web_ui_form_is_text_and_becomes_a_number():
    from vllm_loadtest.locustfiles.options import check

    from tests.helpers.inprocess import parse_options

    for given, expected in (("3350", 3350.0), ("", None)):
        options = parse_options("--host", "http://127.0.0.1:1")
        options.memory_bandwidth_gbs = given  # what the start form sends back
        check(options)
        assert options.memory_bandwidth_gbs == expected
    options.memory_bandwidth_gbs = "fast"
    with pytest.raises(ValueError, match="not a number of GB/s"):
        check(options)
