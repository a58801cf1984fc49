"""--slo: parsing, the per-step verdict and goodput on records with known values (the gate in real runs:
tests/test_slo_run.py; a bad --slo: tests/test_bad_input.py)."""

import math

import pandas as pd
import pytest
from vllm_loadtest.analysis.slo import judge_steps, markdown_summary, parse_slo, verdict, verdict_lines

pytestmark = pytest.mark.unit


def test_parse_slo_units_and_names():
    objectives = {o.name: o for o in parse_slo("ttft_p95=500ms, tpot_p95=0.05,e2e_p99=20s,error_rate=1%,itl_mean=8ms")}
    assert objectives["ttft_p95"].threshold == pytest.approx(0.5)
    assert objectives["tpot_p95"].threshold == pytest.approx(0.05)  # bare numbers are seconds
    assert objectives["e2e_p99"].threshold == 20 and objectives["e2e_p99"].statistic == "p99"
    assert objectives["error_rate"].threshold == pytest.approx(0.01) and objectives["error_rate"].metric == "error_rate"
    assert objectives["itl_mean"].metric == "itl" and objectives["itl_mean"].statistic == "mean"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("ttft_p95", "has no '=value'"),
        ("ttft_p95=fast", "not a number"),
        ("latency_p95=1s", "no objective 'latency_p95'"),
        ("ttft_p42=1s", "no objective 'ttft_p42'"),
        ("ttft_p95=5%", "is a time"),
        ("error_rate=150%", "must be a share"),
        ("ttft_p95=1s,ttft_p95=2s", "twice"),
        ("", "is empty"),
    ],
)
def test_bad_slo_specs_say_what_to_fix(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_slo(spec)


def _records() -> tuple[pd.DataFrame, list[dict]]:
    """Step 0: 10 ok requests with TTFT 0.1 .. 1.0 s; step 1: 8 ok with TTFT 2 s and 2 failures; one warm-up
    request and one cut off at the stop, both left out."""
    rows = []
    for i in range(10):
        rows.append(dict(step=0, users=1, warmup=False, status="ok", error_type=None, start_time=100.0 + i,
                         duration_s=1.0, ttft_s=0.1 * (i + 1), tpot_s=0.01, e2e_s=1.0,
                         chunk_offsets_s=[0.1 * (i + 1), 0.1 * (i + 1) + 0.01], chunk_tokens=[1, 1]))  # fmt: skip
    for i in range(8):
        rows.append(dict(step=1, users=2, warmup=False, status="ok", error_type=None, start_time=200.0 + i,
                         duration_s=3.0, ttft_s=2.0, tpot_s=0.02 if i else None, e2e_s=3.0,
                         chunk_offsets_s=[2.0, 2.02], chunk_tokens=[1, 1]))  # fmt: skip
    failed = dict(ttft_s=None, tpot_s=None, e2e_s=None, chunk_offsets_s=[], chunk_tokens=[])
    for i in range(2):
        rows.append(dict(step=1, users=2, warmup=False, status="error", error_type="http_500", start_time=210.0 + i,
                         duration_s=0.1, **failed))  # fmt: skip
    rows.append(dict(step=1, users=2, warmup=True, status="ok", error_type=None, start_time=190.0, duration_s=1.0,
                     ttft_s=50.0, tpot_s=5.0, e2e_s=60.0, chunk_offsets_s=[50.0], chunk_tokens=[1]))  # fmt: skip
    rows.append(dict(step=1, users=2, warmup=False, status="error", error_type="cut_off", start_time=219.0,
                     duration_s=1.0, **failed))  # fmt: skip
    timeline = [
        {"step": 0, "users": 1, "start_time": 90.0, "measure_start": 100.0, "end_time": 190.0},
        {"step": 1, "users": 2, "start_time": 190.0, "measure_start": 195.0, "end_time": 220.0},
    ]
    return pd.DataFrame(rows), timeline


def test_each_step_is_judged_on_its_measured_requests():
    records, timeline = _records()
    objectives = parse_slo("ttft_p95=1s,tpot_p95=50ms,error_rate=10%,itl_p99=25ms")
    judged = judge_steps(records, timeline, objectives)
    first, second = judged.iloc[0], judged.iloc[1]
    assert first["requests"] == 10 and second["requests"] == 10  # warm-up and cut-off left out
    assert first["ttft_p95"] == pytest.approx(0.955)  # numpy's linear interpolation of 0.1 .. 1.0
    assert first["ttft_p95_met"] and first["error_rate"] == 0 and first["meets_all"]
    assert first["goodput"] == 1.0
    assert second["ttft_p95"] == 2.0 and not second["ttft_p95_met"]
    assert second["error_rate"] == pytest.approx(0.2) and not second["error_rate_met"]
    assert second["itl_p99"] == pytest.approx(0.02) and second["itl_p99_met"]
    # No request of step 1 meets TTFT <= 1 s, and failures never meet: goodput 0 of 10.
    assert second["goodput"] == 0.0 and not second["meets_all"]

    result = verdict(judged, objectives)
    assert not result["passed"] and result["highest_users_meeting_all"] == 1
    assert {(b["step"], b["objective"]) for b in result["broken"]} == {(1, "ttft_p95"), (1, "error_rate")}
    text = verdict_lines(result, objectives)
    assert text[0].startswith("SLO gate FAILED") and "Step 1 (2 users): error_rate <= 10.00% (20.00%) not met." in text


def test_goodput_counts_each_request_against_every_objective():
    records, timeline = _records()
    judged = judge_steps(records, timeline, parse_slo("ttft_p99=550ms"))
    assert judged.iloc[0]["goodput"] == pytest.approx(0.5)  # TTFT 0.1 .. 0.5 s of 0.1 .. 1.0 s
    # A one-token answer (no TPOT) is judged on its other objectives.
    judged = judge_steps(records, timeline, parse_slo("tpot_p50=30ms"))
    assert judged.iloc[1]["goodput"] == pytest.approx(8 / 10)


def test_a_step_without_data_for_an_objective_does_not_pass():
    records, timeline = _records()
    timeline.append({"step": 2, "users": 4, "start_time": 220.0, "measure_start": 221.0, "end_time": 230.0})
    judged = judge_steps(records, timeline, parse_slo("ttft_p95=10s"))
    assert judged.iloc[2]["requests"] == 0 and math.isnan(judged.iloc[2]["ttft_p95"])
    assert not judged.iloc[2]["meets_all"] and not verdict(judged, parse_slo("ttft_p95=10s"))["passed"]


def test_markdown_summary_has_the_table_and_the_verdict():
    records, timeline = _records()
    objectives = parse_slo("ttft_p95=1s")
    judged = judge_steps(records, timeline, objectives)
    table = pd.DataFrame(
        {
            "users": [1, 2], "requests": [10, 8], "errors": [0, 2], "aggregate_tok_s": [10.0, math.nan],
            "ttft_p95_s": [0.955, 2.0], "tpot_p95_s": [0.01, 0.02], "e2e_mean_s": [1.0, 3.0],
        }
    )  # fmt: skip
    page = markdown_summary("Load test", table, judged, verdict_lines(verdict(judged, objectives), objectives), [])
    assert "| 1 | 10 | 0 | 10.0 | 955.0 ms | 10.0 ms | 1000.0 ms | 100.0% | met |" in page
    assert "| 2 | 8 | 2 | - | 2000.0 ms" in page and "**broken**" in page
    assert "SLO gate FAILED" in page


def test_markdown_summary_shows_a_step_without_goodput_as_a_dash():
    """A capacity probe in which no request finished has goodput None: the page says "-" (it raised TypeError)."""
    records, timeline = _records()
    objectives = parse_slo("ttft_p95=1s")
    judged = judge_steps(records, timeline, objectives)
    judged["goodput"] = judged["goodput"].astype(object)
    judged.loc[judged.index[1], "goodput"] = None
    table = pd.DataFrame(
        {
            "users": [1, 2], "requests": [10, 0], "errors": [0, 0], "aggregate_tok_s": [10.0, math.nan],
            "ttft_p95_s": [0.955, math.nan], "tpot_p95_s": [0.01, math.nan], "e2e_mean_s": [1.0, math.nan],
        }
    )  # fmt: skip
    page = markdown_summary("Load test", table, judged, verdict_lines(verdict(judged, objectives), objectives), [])
    row = next(line for line in page.splitlines() if line.startswith("| 2 | 0 |"))
    assert "| - |" in row


def test_the_objectives_are_the_glossarys_declarations():
    from vllm_loadtest.analysis import glossary, slo

    declared = {m.objective: m for m in glossary.GLOSSARY.values() if m.objective}
    assert set(slo.METRICS) == set(declared) == {"ttft", "ttfo", "tpot", "itl", "e2e"}
    assert set(slo.STREAMING_ONLY) == {"ttft", "ttfo", "tpot", "itl"}  # e2e: every kind, embeddings and rerank too
    for name in slo.METRICS:
        assert parse_slo(f"{name}_p95=1s")[0].metric == name
    ok = pd.DataFrame({"ttfo_s": [0.5, None, None], "reasoning_tokens": [3, 9, None], "tpot_s": [0.1, None, 0.3]})
    # TTFO's own values: +inf for a request that reasoned and never answered, NaN for one that says nothing.
    values = slo.request_values(ok, "ttfo")
    assert values[0] == 0.5 and values[1] == math.inf and math.isnan(values[2])
    # TPOT: a request without one (a one-token answer) meets its objective; TTFO's never-answered one does not.
    assert list(slo._request_meets(ok, parse_slo("tpot_p95=200ms"))) == [True, True, False]
    assert list(slo._request_meets(ok, parse_slo("ttfo_p95=1s"))) == [True, False, False]
