"""The capacity search's pure side (analysis/capacity.py) on data with known answers: the next probe's load, the
verdict of one objective from its interval, the result and its console sentence, the live record of the running
probe, and whole searches against synthetic servers whose limit is known (the real runs: tests/test_capacity_run.py).
"""

from __future__ import annotations

import math

import numpy as np
import orjson
import pandas as pd
import pytest
from vllm_loadtest.analysis import capacity
from vllm_loadtest.analysis.capacity import (
    FAIL,
    FEW,
    LIMIT_MAX,
    LIMIT_SLO,
    LIMIT_THROUGHPUT,
    PASS,
    RATE,
    UNCERTAIN,
    USERS,
    Check,
    Probe,
    ProbeRecords,
    capacity_line,
    check,
    check_probe,
    next_load,
    parse_load,
    parse_resolution,
    result,
    wilson_interval,
)
from vllm_loadtest.analysis.records import parse_lines
from vllm_loadtest.analysis.slo import parse_slo
from vllm_loadtest.analysis.uncertainty import Interval

from tests.helpers.badinput import first_error

pytestmark = pytest.mark.unit

TTFT = parse_slo("ttft_p95=100ms")[0]


def probes(mode_loads: list[tuple[float, str]], tok: dict[float, tuple[float, float, float]] | None = None):
    """Probes in run order from (load, verdict) pairs; tok/s (value, low, high) per load where given."""
    out = []
    for n, (load, verdict) in enumerate(mode_loads, start=1):
        value, low, high = (tok or {}).get(load, (math.nan, math.nan, math.nan))
        out.append(Probe(n, n - 1, float(load), verdict, [], value, low, high, 100))
    return out


def run_search(mode, verdict_at, start, maximum, resolution, tok_at=None, limit=200):
    """Drive next_load to its end: `verdict_at(load)` is the server's verdict; returns (probes, why it stopped)."""
    done: list[Probe] = []
    for _ in range(limit):
        load, why = next_load(mode, done, start, maximum, resolution)
        if load is None:
            return done, why
        verdict = verdict_at(load)
        tok = tok_at(load) if tok_at else (math.nan, math.nan, math.nan)
        done.append(Probe(len(done) + 1, len(done), load, verdict, [], *tok, 100))
    raise AssertionError(f"the search did not end in {limit} probes: {[p.load for p in done]}")


# next_load: doubling


def test_the_first_probe_is_the_start_capped_at_the_maximum():
    assert next_load(USERS, [], 3, 64, 0.1) == (3, None)
    assert next_load(USERS, [], 3, 2, 0.1) == (2, None)
    assert next_load(RATE, [], 1.5, None, 0.1) == (1.5, None)


def test_loads_double_while_every_probe_passes_and_stop_at_the_maximum():
    path = probes([(1, PASS), (2, PASS), (4, PASS), (8, PASS)])
    assert next_load(USERS, path, 1, 64, 0.1) == (16, None)
    assert next_load(USERS, path, 1, 10, 0.1) == (10, None)  # capped, not skipped
    capped = probes([(1, PASS), (2, PASS), (4, PASS), (8, PASS), (10, PASS)])
    assert next_load(USERS, capped, 1, 10, 0.1) == (None, LIMIT_MAX)
    rate = probes([(1.5, PASS), (3, PASS)])
    assert next_load(RATE, rate, 1.5, None, 0.1) == (6, None)  # no maximum: doubling goes on


def test_a_doubling_that_adds_no_throughput_stops_the_search():
    tok = {4: (800.0, 760.0, 840.0), 8: (820.0, 790.0, 830.0)}  # 8 users: even its high is under 4's low + 10 %
    path = probes([(4, PASS), (8, PASS)], tok)
    assert next_load(USERS, path, 4, 64, 0.1) == (None, LIMIT_THROUGHPUT)


def test_a_previous_probe_that_read_high_by_chance_does_not_stop_the_search():
    # 4 users read 900 with an interval down to 700: 8 users' 940 (high 980) is not shown to be flat against it.
    tok = {4: (900.0, 700.0, 1100.0), 8: (940.0, 900.0, 980.0)}
    assert next_load(USERS, probes([(4, PASS), (8, PASS)], tok), 4, 64, 0.1) == (16, None)


def test_a_light_load_with_a_wide_interval_does_not_stop_the_search():
    # 2 users measured barely more than 1 (noisy), but the interval reaches well above: not shown to be flat.
    tok = {1: (185.0, 150.0, 220.0), 2: (190.0, 100.0, 400.0)}
    assert next_load(USERS, probes([(1, PASS), (2, PASS)], tok), 1, 64, 0.1) == (4, None)


def test_noisy_throughput_that_still_grows_does_not_stop_the_search():
    # A noisy previous value above the true one: the next's interval reaches beyond 10 % more, so it goes on.
    tok = {4: (800.0, 500.0, 1100.0), 8: (760.0, 600.0, 1000.0)}
    assert next_load(USERS, probes([(4, PASS), (8, PASS)], tok), 4, 64, 0.1) == (16, None)


def test_missing_throughput_never_stops_the_search():
    tok = {4: (math.nan, math.nan, math.nan), 8: (800.0, 790.0, 810.0)}
    assert next_load(USERS, probes([(4, PASS), (8, PASS)], tok), 4, 64, 0.1) == (16, None)


def test_a_flat_throughput_without_an_interval_is_judged_on_its_value():
    tok = {4: (800.0, math.nan, math.nan), 8: (850.0, math.nan, math.nan)}
    assert next_load(USERS, probes([(4, PASS), (8, PASS)], tok), 4, 64, 0.1) == (None, LIMIT_THROUGHPUT)


# next_load: bisection


def test_bisection_in_users_mode():
    path = probes([(1, PASS), (2, PASS), (4, PASS), (8, PASS), (16, FAIL)])
    assert next_load(USERS, path, 1, 64, 0.1) == (12, None)
    path += probes([(12, FAIL)])
    assert next_load(USERS, path, 1, 64, 0.1) == (10, None)
    path += probes([(10, FAIL)])
    assert next_load(USERS, path, 1, 64, 0.1) == (9, None)
    path += probes([(9, FAIL)])
    assert next_load(USERS, path, 1, 64, 0.1) == (None, LIMIT_SLO)  # 8 and 9: one user apart


def test_bisection_ends_within_the_resolution_of_the_passing_load():
    # 100 passes, 200 fails: 10 % of 100 is 10 users.
    path = probes([(100, PASS), (200, FAIL), (150, FAIL), (125, FAIL), (112, FAIL)])
    assert next_load(USERS, path, 100, 1000, 0.1) == (106, None)  # 12 apart: one more
    path += probes([(106, FAIL)])
    assert next_load(USERS, path, 100, 1000, 0.1) == (None, LIMIT_SLO)  # 6 apart, within 10


def test_never_finer_than_one_user():
    path = probes([(2, PASS), (4, FAIL), (3, FAIL)])
    assert next_load(USERS, path, 2, 64, 0.01) == (None, LIMIT_SLO)


def test_rate_mode_bisects_to_midpoints():
    path = probes([(8, PASS), (16, PASS), (32, PASS), (64, FAIL)])
    assert next_load(RATE, path, 8, None, 0.1) == (48, None)
    path += probes([(48, FAIL), (40, FAIL), (36, FAIL)])
    assert next_load(RATE, path, 8, None, 0.1) == (34, None)
    path += probes([(34, PASS)])
    assert next_load(RATE, path, 8, None, 0.1) == (None, LIMIT_SLO)  # 34 and 36: within 3.4


def test_rate_mode_midpoints_are_not_rounded_to_whole_numbers():
    path = probes([(1, PASS), (2, FAIL)])
    assert next_load(RATE, path, 1, None, 0.1) == (1.5, None)
    path += probes([(1.5, PASS)])
    assert next_load(RATE, path, 1, None, 0.1) == (1.75, None)


def test_an_uncertain_probe_counts_as_not_passing():
    path = probes([(1, PASS), (2, PASS), (4, PASS), (8, UNCERTAIN)])
    assert next_load(USERS, path, 1, 64, 0.1) == (6, None)  # bisects below it, not doubles past it
    assert next_load(USERS, probes([(4, PASS), (5, UNCERTAIN)]), 1, 64, 0.1) == (None, LIMIT_SLO)


@pytest.mark.parametrize("verdict", [FAIL, UNCERTAIN])
@pytest.mark.parametrize("mode", [USERS, RATE])
def test_even_the_first_probe_failing_ends_the_search_with_none(mode, verdict):
    assert next_load(mode, probes([(1, verdict)]), 1, 64, 0.1) == (None, LIMIT_SLO)


def test_a_passing_probe_above_a_failing_one_is_not_a_lower_bound():
    # A path judged again on complete records can turn non-monotonic: 8 passed after 4 failed.
    path = probes([(1, PASS), (2, PASS), (4, FAIL), (8, PASS)])
    assert next_load(USERS, path, 1, 64, 0.1) == (3, None)


@pytest.mark.parametrize("mode", [USERS, RATE])
@pytest.mark.parametrize("resolution", [0.01, 0.1, 0.25, 0.5])
@pytest.mark.parametrize("start", [1, 3, 5])
def test_a_search_never_repeats_a_load_and_ends_within_its_resolution(mode, resolution, start):
    for limit in (1, 2, 7, 8, 13, 33.3, 100, 500):
        path, why = run_search(mode, lambda load, lim=limit: PASS if load <= lim else FAIL, start, 1000, resolution)
        loads = [p.load for p in path]
        assert len(loads) == len(set(loads)), loads
        passing = [p.load for p in path if p.passed]
        if not passing:
            assert why == LIMIT_SLO and limit < start and len(path) == 1
            continue
        assert why == LIMIT_SLO
        lo, hi = max(passing), min(p.load for p in path if not p.passed)
        assert lo <= limit < hi, (loads, limit)
        if mode == USERS:
            assert all(load == int(load) for load in loads)
            assert hi - lo <= max(resolution * lo, 1), loads
        else:
            # A midpoint is rounded to 3 significant digits, so a very fine resolution may end a little wider.
            assert hi - lo <= max(resolution * lo, 0.01 * hi), loads


# check(): one objective's verdict


def test_check_is_decided_by_the_interval():
    assert check(TTFT, Interval(0.09, 0.08, 0.1)).verdict == PASS  # high at the limit: met
    assert check(TTFT, Interval(0.12, 0.101, 0.13)).verdict == FAIL
    straddles = check(TTFT, Interval(0.095, 0.09, 0.11))
    assert straddles.verdict == UNCERTAIN and straddles.note is None
    # The value under the limit does not decide when the interval reaches above it.
    assert check(TTFT, Interval(0.07, 0.05, 0.12)).verdict == UNCERTAIN


def test_without_an_interval_the_value_decides_and_says_so():
    passed = check(TTFT, Interval(0.05, n=20, note="too few samples"))
    failed = check(TTFT, Interval(0.15, n=20, note="too few samples"))
    assert (passed.verdict, passed.note) == (PASS, FEW)
    assert (failed.verdict, failed.note) == (FAIL, FEW)
    assert "(too few samples for an interval)" in failed.text(TTFT)


def test_no_data_is_a_fail():
    c = check(TTFT, Interval(math.nan, n=0, note="no samples"))
    assert c.verdict == FAIL and c.note == "no data"
    assert c.to_dict()["value"] is None


def test_check_probe_on_requests_with_known_ttft():
    # 200 requests of 50 ms and 20 of 300 ms: the p95 lies among the slow ones, far above 100 ms.
    ok = pd.DataFrame({"ttft_s": [0.05] * 200 + [0.3] * 20, "tpot_s": 0.01, "e2e_s": 0.5})
    (ttft,) = check_probe(ok, 0, [TTFT])
    assert ttft.verdict == FAIL and ttft.value == pytest.approx(0.3)
    (fast,) = check_probe(ok.assign(ttft_s=0.05), 0, [TTFT])
    assert fast.verdict == PASS and fast.low == pytest.approx(0.05) and fast.high == pytest.approx(0.05)


def test_the_error_rate_is_checked_on_its_wilson_interval():
    (rate,) = parse_slo("error_rate=5%")
    ok = pd.DataFrame({"ttft_s": [0.05] * 97, "tpot_s": 0.01, "e2e_s": 0.5})
    c = check_probe(ok, 3, [rate])[0]  # 3 of 100: 3 %, but the interval reaches past 5 %
    assert c.value == pytest.approx(0.03) and c.verdict == UNCERTAIN
    assert check_probe(ok.iloc[:0], 0, [rate])[0].verdict == FAIL  # no request: no data


def test_wilson_interval_known_values():
    def wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
        p = k / n
        centre, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
        return (centre - half) / (1 + z * z / n), (centre + half) / (1 + z * z / n)

    for k, n in ((0, 10), (5, 10), (3, 100), (100, 100), (1, 2000)):
        ci = wilson_interval(k, n)
        assert ci.value == pytest.approx(k / n) and ci.n == n
        assert (ci.low, ci.high) == pytest.approx(wilson(k, n), abs=1e-9)
    assert wilson_interval(0, 10).high == pytest.approx(0.2775, abs=1e-4)  # the textbook value
    empty = wilson_interval(0, 0)
    assert math.isnan(empty.value) and math.isnan(empty.low)


# parse_resolution, parse_load


def test_parse_resolution():
    assert parse_resolution("10%") == pytest.approx(0.1)
    assert parse_resolution(" 2.5% ") == pytest.approx(0.025)
    assert parse_resolution("0.1") == pytest.approx(0.1)


@pytest.mark.parametrize("text", ["abc", "150%", "0%", "0", "10", "-5%", "100%", "%", "", "nan", "inf%"])
def test_a_bad_resolution_is_one_line_naming_the_option_and_the_fix(text):
    with pytest.raises(ValueError) as e:
        parse_resolution(text)
    message = str(e.value)
    assert "\n" not in message and message.startswith("--capacity-resolution") and "e.g." in message
    assert "10%" in message


def test_parse_load():
    assert parse_load("2.5", "--start-rate") == 2.5
    assert parse_load(" ", "--max-rate") is None


@pytest.mark.parametrize("text", ["x", "0", "-1", "inf", "nan", "1,2"])
@pytest.mark.parametrize("name", ["--start-rate", "--max-rate"])
def test_a_bad_load_is_one_line_naming_the_option_and_the_fix(text, name):
    with pytest.raises(ValueError) as e:
        parse_load(text, name)
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"{name} ") and f"e.g. {name} 2" in message


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--start-users", "9", "--max-users", "8"], "--start-users 9 is above --max-users 8"),
        (["--find-capacity", "rate", "--start-rate", "10", "--max-rate", "5"], "--start-rate 10 is above --max-rate 5"),
        (["--find-capacity", "rate", "--start-rate", " "], "--start-rate is empty; use e.g. --start-rate 1"),
        (["--capacity-resolution", "10"], "--capacity-resolution '10' must be above 0 and below 100%"),
    ],
)
def test_the_search_options_are_checked_before_any_load(args, expected):
    mode = [] if "--find-capacity" in args else ["--find-capacity", "users"]
    assert expected in first_error(*mode, "--slo", "ttft_p95=1s", *args)


@pytest.mark.parametrize("args", [["--max-rate", "5"], ["--capacity-resolution", "5%"], ["--start-rate", "2"]])
def test_search_options_without_the_search_are_refused(args):
    assert f"{args[0]} {args[1]} only applies with --find-capacity" in first_error(*args)


# result() and capacity_line()

SPEC = "ttft_p95=500ms,tpot_p95=50ms"
OBJECTIVES = parse_slo(SPEC)


def judged(n: int, load: float, ttft: tuple[float, float, float], tpot=(0.02, 0.018, 0.022), tok=(1000.0, 950, 1050)):
    """A probe whose checks come from check() on the given (value, low, high) intervals."""
    checks = [check(OBJECTIVES[0], Interval(*ttft, n=500)), check(OBJECTIVES[1], Interval(*tpot, n=500))]
    return capacity.make_probe(n, n - 1, float(load), checks, Interval(*tok), 500)


def table(steps: list[int], kv=1.0, waiting=9.0) -> pd.DataFrame:
    return pd.DataFrame(
        {"step": steps, "kv_cache_usage_max": kv, "waiting_mean": waiting / 2, "waiting_max": waiting,
         "preemptions": 0.0, "running_max": 8.0}
    )  # fmt: skip


def test_the_result_and_its_sentence_in_the_issue_shape():
    path = [
        judged(1, 2, (0.1, 0.09, 0.11)),
        judged(2, 4, (0.12, 0.11, 0.13)),
        judged(3, 8, (0.2, 0.19, 0.21)),
        judged(4, 16, (0.812, 0.790, 0.840)),
        judged(5, 12, (0.45, 0.43, 0.47)),
        judged(6, 14, (0.6, 0.55, 0.65)),
        judged(7, 13, (0.52, 0.505, 0.54)),
    ]
    out = result(USERS, path, SPEC, table(list(range(7))), {6: "KV cache"}, LIMIT_SLO)
    assert out["max_users"] == 12 and out["mode"] == USERS and out["limit"] == LIMIT_SLO
    assert out["uncertain"] is False
    assert out["first_failing"]["users"] == 13 and out["first_failing"]["step"] == 6
    assert list(out["first_failing"]["objectives"]) == ["ttft_p95"]  # only the objectives it broke
    assert out["binding"]["resource"] == "KV cache" and out["binding"]["step"] == 6
    assert [p["users"] for p in out["probes"]] == [2, 4, 8, 16, 12, 14, 13]
    assert [p["probe"] for p in out["probes"]] == list(range(1, 8))
    assert [p["passed"] for p in out["probes"]] == [True] * 3 + [False, True, False, False]
    assert out["probes"][3]["objectives"]["ttft_p95"]["value"] == pytest.approx(0.812)
    assert out["line"] == (
        "Capacity: 12 users, the highest load meeting ttft_p95<=500ms and tpot_p95<=50ms; at 13 users ttft_p95 was "
        "520 ms (CI 505-540 ms); what binds there: KV cache (100 % KV cache used, up to 9 requests waiting)"
    )
    orjson.dumps(out)  # summary.json takes it as it is


def test_the_example_sentence_of_the_issue():
    path = [judged(1, 12, (0.3, 0.28, 0.32)), judged(2, 16, (0.812, 0.790, 0.840))]
    out = result(USERS, path, SPEC, table([0, 1]), {1: "KV cache"}, LIMIT_SLO)
    assert out["line"].startswith(
        "Capacity: 12 users, the highest load meeting ttft_p95<=500ms and tpot_p95<=50ms; at 16 users ttft_p95 was "
        "812 ms (CI 790-840 ms); what binds there: KV cache"
    )


def test_an_uncertain_first_failing_probe_says_uncertain_between():
    path = [judged(1, 8, (0.3, 0.28, 0.32)), judged(2, 9, (0.49, 0.45, 0.53))]
    out = result(USERS, path, SPEC, table([0, 1]), {}, LIMIT_SLO)
    assert out["uncertain"] is True and out["max_users"] == 8
    assert out["first_failing"]["verdict"] == UNCERTAIN and out["first_failing"]["users"] == 9
    assert out["line"].startswith("Capacity: uncertain between 8 users and 9 users: 8 users meets ")
    assert "at 9 users ttft_p95 was 490 ms (CI 450-530 ms), too close to its limit to tell" in out["line"]


def test_nothing_passes_capacity_none():
    path = [judged(1, 1, (0.9, 0.85, 0.95), tpot=(0.06, 0.055, 0.065))]
    out = result(USERS, path, SPEC, table([0], kv=0.2, waiting=0.0), {}, LIMIT_SLO)
    assert out["max_users"] is None and out["uncertain"] is False
    assert out["first_failing"]["users"] == 1
    assert set(out["first_failing"]["objectives"]) == {"ttft_p95", "tpot_p95"}
    assert out["line"].startswith("Capacity: none: even 1 user breaks ttft_p95<=500ms and tpot_p95<=50ms: ")
    assert "ttft_p95 was 900 ms (CI 850-950 ms); tpot_p95 was 60 ms (CI 55-65 ms)" in out["line"]
    assert "what binds there: compute" in out["line"]  # KV cache to spare, nothing waiting


def test_rate_mode_result_keys_and_text():
    path = [judged(1, 16, (0.1, 0.09, 0.11)), judged(2, 32, (0.2, 0.18, 0.22)), judged(3, 64, (2.0, 1.8, 2.2)),
            judged(4, 48, (0.9, 0.8, 1.0))]  # fmt: skip
    out = result(RATE, path, SPEC, table([0, 1, 2, 3]), {}, LIMIT_SLO)
    assert out["max_rate_rps"] == 32.0 and "max_users" not in out
    assert out["first_failing"]["rate_rps"] == 48.0
    assert [p["rate_rps"] for p in out["probes"]] == [16.0, 32.0, 64.0, 48.0]
    assert out["line"].startswith("Capacity: 32 req/s, the highest load meeting")
    assert "; at 48 req/s ttft_p95 was 900 ms" in out["line"]


def test_a_passing_probe_above_a_failing_one_is_not_the_capacity():
    # Judged again on the complete records, 4 users failed while 8 (probed after it, live) still passed.
    path = [judged(1, 1, (0.1, 0.09, 0.11)), judged(2, 2, (0.2, 0.18, 0.22)), judged(3, 4, (0.6, 0.55, 0.65)),
            judged(4, 8, (0.3, 0.28, 0.32)), judged(5, 16, (1.0, 0.9, 1.1))]  # fmt: skip
    out = result(USERS, path, SPEC, table(list(range(5))), {}, LIMIT_SLO)
    assert out["max_users"] == 2 and out["first_failing"]["users"] == 4
    assert out["line"].startswith("Capacity: 2 users, ") and "at 4 users ttft_p95 was 600 ms" in out["line"]


def test_the_search_stopped_by_throughput_or_its_maximum_says_so():
    path = [judged(1, 4, (0.1, 0.09, 0.11)), judged(2, 8, (0.2, 0.18, 0.22), tok=(1020.0, 990, 1050))]
    flat = result(USERS, path, SPEC, table([0, 1]), {1: "batch slots"}, LIMIT_THROUGHPUT)
    assert flat["max_users"] == 8 and flat["first_failing"] is None and flat["binding"]["step"] == 1
    assert "throughput stopped growing there" in flat["line"] and "what binds there: batch slots" in flat["line"]
    top = result(USERS, path, SPEC, table([0, 1]), {}, LIMIT_MAX)
    assert "the search's maximum (--max-users)" in top["line"]
    assert "(--max-rate)" in result(RATE, path, SPEC, table([0, 1]), {}, LIMIT_MAX)["line"]


def test_a_result_rebuilt_without_the_limit_infers_it():
    path = [judged(1, 4, (0.1, 0.09, 0.11)), judged(2, 8, (0.9, 0.8, 1.0))]
    assert result(USERS, path, SPEC, table([0, 1]), {}, None)["limit"] == LIMIT_SLO


def test_few_samples_are_said_in_the_sentence():
    few = Check("ttft_p95", 0.5, 0.7, math.nan, math.nan, FAIL, FEW)
    ok = Check("tpot_p95", 0.05, 0.02, 0.018, 0.022, PASS)
    path = [judged(1, 1, (0.1, 0.09, 0.11)), capacity.make_probe(2, 1, 2.0, [few, ok], Interval(500.0), 20)]
    out = result(USERS, path, SPEC, table([0, 1]), {}, LIMIT_SLO)
    assert "at 2 users ttft_p95 was 700 ms (too few samples for an interval)" in out["line"]
    assert out["probes"][1]["objectives"]["ttft_p95"]["low"] is None  # NaN is null in summary.json


def test_capacity_line_without_a_binding_has_no_binding_clause():
    best, failing = judged(1, 4, (0.1, 0.09, 0.11)), judged(2, 8, (0.9, 0.8, 1.0))
    line = capacity_line({"uncertain": False, "binding": None}, USERS, best, failing, OBJECTIVES)
    assert line == (
        "Capacity: 4 users, the highest load meeting ttft_p95<=500ms and tpot_p95<=50ms; at 8 users ttft_p95 was "
        "900 ms (CI 800-1000 ms)"
    )


def test_one_user_is_singular():
    assert capacity.load_text(1, USERS) == "1 user" and capacity.load_text(2, USERS) == "2 users"
    assert capacity.load_text(37.5, RATE) == "37.5 req/s"


def test_thresholds_under_ten_ms_keep_their_digits():
    objectives = parse_slo("itl_p95=0.5ms,tpot_p95=2.5ms")
    best = capacity.make_probe(1, 0, 1.0, [], Interval(1.0), 10)
    line = capacity_line({"uncertain": False, "binding": None, "limit": LIMIT_MAX}, USERS, best, None, objectives)
    assert "itl_p95<=0.5ms and tpot_p95<=2.5ms" in line


# ProbeRecords: the running probe on the controller


def record(step, start, e2e=0.2, ttft=0.02, status="ok", warmup=False, error_type=None, tokens=32):
    return {"step": step, "warmup": warmup, "start_time": start, "status": status, "error_type": error_type,
            "ttft_s": ttft, "tpot_s": 0.005, "e2e_s": e2e, "output_tokens": tokens}  # fmt: skip


def test_probe_records_keep_the_measured_requests_of_the_running_step():
    live = ProbeRecords()
    live.active = True
    live.reset(3)
    lines = [
        record(3, 100.0, warmup=True),  # its warm-up: tok/s only
        record(2, 100.1),  # the previous probe's last: tok/s only
        record(3, 101.0, error_type=capacity.CUT_OFF, status="error"),  # cut off by the pause: nothing
        record(3, 101.2, status="error", error_type="http_500", e2e=None),
        *[record(3, 101.0 + i * 0.1) for i in range(40)],
    ]
    live.add_rows(parse_lines(b"\n".join(orjson.dumps(r) for r in lines) + b"\nnot json\n"))
    assert len(live.rows) == 40 and live.failed == 1 and len(live.tokens) == 42
    probe = live.judge(5, 8.0, parse_slo("ttft_p95=100ms,error_rate=10%"), 101.0, 106.0)
    assert probe.probe == 5 and probe.step == 3 and probe.load == 8.0 and probe.requests == 41
    assert probe.verdict == UNCERTAIN  # 1 of 41 failed: the error rate's interval reaches past 10 %
    ttft, errors = probe.checks
    assert ttft.verdict == PASS and ttft.note == FEW and errors.verdict == UNCERTAIN
    assert probe.tok_s > 0


def test_probe_records_ignore_everything_when_inactive():
    live = ProbeRecords()
    live.reset(0)
    live.add_rows(parse_lines(orjson.dumps(record(0, 1.0))))
    assert live.rows == [] and live.tokens == []


def test_a_probe_without_requests_fails():
    live = ProbeRecords()
    live.active = True
    live.reset(0)
    probe = live.judge(1, 1.0, [TTFT], 0.0, 6.0)
    assert probe.verdict == FAIL and probe.checks[0].note == "no data" and probe.requests == 0


# Whole searches against synthetic servers with a known limit


def slot_server(slots: int = 8, seed: int = 0):
    """A server of `slots` sequences (20 ms TTFT, 5 ms per token, 32 tokens): up to `slots` users wait for nothing;
    beyond, a request waits a whole request (~175 ms) for a slot. Each probe is judged from its own samples, with
    noise, through check_probe; its tok/s grows with the users up to the slots, then stays flat (noisy)."""
    rng = np.random.default_rng(seed)

    def verdict_and_tok(load: float) -> tuple[str, tuple[float, float, float]]:
        users = int(load)
        n = 28 * users  # a 6 s probe of ~200 ms requests
        ttft = 0.020 + rng.exponential(0.002, n)
        if users > slots:
            waiting = rng.random(n) < (users - slots) / users
            ttft[waiting] += 0.175 + rng.normal(0, 0.005, waiting.sum())
        ok = pd.DataFrame({"ttft_s": ttft, "tpot_s": 0.005, "e2e_s": ttft + 0.155})
        verdict = capacity.probe_verdict(check_probe(ok, 0, [TTFT]))
        tok = 185.0 * min(users, slots) * rng.normal(1, 0.03)
        return verdict, (tok, tok * 0.9, tok * 1.1)

    return verdict_and_tok


@pytest.mark.parametrize("start", [1, 2, 3, 5, 7, 8])
@pytest.mark.parametrize("resolution", [0.01, 0.05, 0.1, 0.12])
def test_a_search_of_a_server_of_8_slots_finds_exactly_8(start, resolution):
    server = slot_server()
    cache: dict[float, tuple[str, tuple]] = {}

    def verdict_at(load):
        cache[load] = server(load)
        return cache[load][0]

    path, why = run_search(USERS, verdict_at, start, 1000, resolution, tok_at=lambda load: cache[load][1])
    out = result(USERS, path, "ttft_p95=100ms", table([p.step for p in path]), {}, why)
    assert why == LIMIT_SLO and out["max_users"] == 8, [(p.load, p.verdict) for p in path]
    assert out["first_failing"]["users"] == 9
    assert out["line"].startswith("Capacity: 8 users, the highest load meeting ttft_p95<=100ms; at 9 users ")


def test_the_users_path_of_the_issue():
    server = slot_server(seed=1)
    cache: dict[float, tuple[str, tuple]] = {}

    def verdict_at(load):
        cache[load] = server(load)
        return cache[load][0]

    path, _ = run_search(USERS, verdict_at, 1, 1000, 0.1, tok_at=lambda load: cache[load][1])
    assert [int(p.load) for p in path] == [1, 2, 4, 8, 16, 12, 10, 9]


def test_a_rate_search_of_a_known_ceiling():
    # The rate at which an 8-slot server of 175 ms requests queues without end: 45.7 req/s. Below some rate
    # under it the objective holds; the search lands within 10 % under that rate, and exactly where the issue's
    # run did for a limit between 34 and 36.
    path, why = run_search(RATE, lambda r: PASS if r <= 35 else FAIL, 1, None, 0.1)
    assert [p.load for p in path] == [1, 2, 4, 8, 16, 32, 64, 48, 40, 36, 34]
    out = result(RATE, path, "ttft_p95=100ms", table([p.step for p in path]), {}, why)
    assert out["max_rate_rps"] == 34.0 < 45.7 and out["first_failing"]["rate_rps"] == 36.0


def test_a_probe_stopped_before_it_was_judged_counts_only_on_what_its_data_showed():
    """Ctrl-C 0.1 s into a probe left it with no data: judged again at the end it read FAIL ('no data') and the
    result named it the first failing load. Stopped before its judgment, it counts only as a pass or a fail on
    values; a clear fail on values still counts."""
    table = pd.DataFrame({"step": [0, 1], "users": [1, 2]})
    no_data = Check("ttft_p95", 0.1, math.nan, math.nan, math.nan, FAIL)
    stopped = Probe(2, 1, 2.0, FAIL, [no_data], interrupted=True)
    passed = Probe(1, 0, 1.0, PASS, [Check("ttft_p95", 0.1, 0.02, math.nan, math.nan, PASS)])
    out = result(USERS, [passed, stopped], "ttft_p95=100ms", table, {}, None)
    assert out["max_users"] == 1 and out["first_failing"] is None and out["limit"] is None
    assert out["probes"][1]["interrupted"] is True and out["probes"][1]["counted"] is False
    clear = Probe(2, 1, 2.0, FAIL, [Check("ttft_p95", 0.1, 0.5, 0.4, 0.6, FAIL)], interrupted=True)
    out = result(USERS, [passed, clear], "ttft_p95=100ms", table, {}, None)
    assert out["first_failing"]["step"] == 1 and out["probes"][1]["counted"] is True
