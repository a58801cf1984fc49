"""--lora-mix (issue 35), the pure parts: the option's form and its errors, the draws (each model's share within its
binomial bounds, the same draws for the same seed), the mix resolved from /v1/models' entries (auto, unknown names),
Wilson's interval on known values, vllm:lora_requests_info read as vLLM writes it, and models.csv's rows on
synthetic records with known answers."""

from __future__ import annotations

import json
import math
import random

import pandas as pd
import pytest
from vllm_loadtest.analysis.lora import (
    format_models,
    lora_states,
    lora_step_table,
    model_table,
    run_models,
)
from vllm_loadtest.analysis.uncertainty import wilson_interval
from vllm_loadtest.locustfiles.lora import Mix, normalised, parse_mix, resolve, user_rng
from vllm_loadtest.locustfiles.preflight import SetupError

from tests.helpers.records import frame, rec

pytestmark = pytest.mark.unit


# --- the option --------------------------------------------------------------------------------------------------
def test_a_mix_is_names_and_positive_weights_normalised():
    assert parse_mix("base:1, a1:1,a2:2") == [("base", 1.0), ("a1", 1.0), ("a2", 2.0)]
    assert parse_mix("org/model:v2:0.5") == [("org/model:v2", 0.5)]  # a served name may hold a colon
    assert parse_mix("") is None and parse_mix("auto") is None and parse_mix(" AUTO ") is None
    mix = normalised(parse_mix("base:1,a1:1,a2:2"))
    assert mix.names == ("base", "a1", "a2") and mix.weights == (0.25, 0.25, 0.5)
    assert mix.info("base:1,a1:1,a2:2")["models"][2] == {"name": "a2", "weight": 0.5}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("base", "is not NAME:WEIGHT"),
        ("base:1,,a1:1", "is not NAME:WEIGHT"),
        (":2", "is not NAME:WEIGHT"),
        ("base:x", "must be a positive number, not 'x'"),
        ("base:0", "must be a positive number"),
        ("base:-1", "must be a positive number"),
        ("base:inf", "must be a positive number"),
        ("base:nan", "must be a positive number"),
        ("base:1,base:2", "named twice"),
    ],
)
def test_a_bad_mix_is_one_line_with_its_fix(text, says):
    with pytest.raises(ValueError, match="--lora-mix") as e:
        parse_mix(text)
    assert says in str(e.value) and "\n" not in str(e.value)


# --- the draws ---------------------------------------------------------------------------------------------------
def test_each_models_share_of_many_draws_lies_within_its_binomial_bounds():
    mix = normalised([("base", 1), ("a1", 1), ("a2", 2)])
    rng = user_rng("42:0:0")  # a fixed seed: the same draws every time, so this cannot flake
    n = 20000
    counts = {name: 0 for name in mix.names}
    for _ in range(n):
        counts[mix.draw(rng)] += 1
    for name, weight in zip(mix.names, mix.weights):
        share = wilson_interval(counts[name], n, confidence=0.999)
        assert share.low <= weight <= share.high, (name, counts)


def test_the_same_seed_draws_the_same_models_and_another_seed_others():
    mix = normalised([("base", 1), ("a1", 1), ("a2", 2)])

    def draws(seed: str) -> list[str]:
        rng = user_rng(seed)
        return [mix.draw(rng) for _ in range(200)]

    assert draws("42:0:3") == draws("42:0:3")
    assert draws("42:0:3") != draws("42:0:4") and draws("42:0:3") != draws("43:0:3")
    # Its own stream: a user's prompt draws (random.Random(seed)) are those of a run without the mix.
    assert user_rng("42:0:3").random() != random.Random("42:0:3").random()


def test_a_mix_of_one_model_always_draws_it():
    mix = Mix(("only",), (1.0,))
    rng = random.Random(1)
    assert {mix.draw(rng) for _ in range(100)} == {"only"}


# --- resolved against /v1/models ---------------------------------------------------------------------------------
ENTRIES = [
    {"id": "base", "root": "base", "parent": None},
    {"id": "a1", "root": "/adapters/a1", "parent": "base"},
    {"id": "a2", "root": "/adapters/a2", "parent": "base"},
    {"id": "other", "root": "other", "parent": None},
    {"id": "x1", "root": "/adapters/x1", "parent": "other"},
]


class Opts:
    def __init__(self, lora_mix: str) -> None:
        self.lora_mix = lora_mix


def test_auto_takes_the_base_model_and_the_adapters_listed_under_it_with_equal_weights():
    mix = resolve(Opts("auto"), "http://h", "base", ENTRIES)
    assert mix.names == ("base", "a1", "a2") and mix.how == "auto"
    assert mix.weights == pytest.approx((1 / 3,) * 3)
    assert resolve(Opts(""), "http://h", "base", ENTRIES) is None


def test_auto_without_an_adapter_says_how_to_serve_one():
    with pytest.raises(SetupError) as e:
        resolve(Opts("auto"), "http://h", "a1", ENTRIES)
    assert "lists no adapter under the base model 'a1'" in str(e.value)
    assert "--enable-lora --lora-modules" in str(e.value)
    with pytest.raises(SetupError, match="has no /v1/models"):
        resolve(Opts("auto"), "http://h", "base", None)


def test_a_name_the_server_does_not_serve_is_refused_with_the_served_names():
    with pytest.raises(SetupError) as e:
        resolve(Opts("base:1,nope:1"), "http://h", "base", ENTRIES)
    assert "'nope' not served by http://h (it serves: base, a1, a2, other, x1)" in str(e.value)
    # A server without /v1/models: the names are sent as given.
    assert resolve(Opts("base:1,nope:1"), "http://h", "base", None).names == ("base", "nope")


# --- Wilson's interval ---------------------------------------------------------------------------------------------
def test_wilsons_interval_on_known_values():
    ci = wilson_interval(50, 100)
    assert ci.value == 0.5
    assert (ci.low, ci.high) == pytest.approx((0.40383, 0.59617), abs=1e-5)
    ci = wilson_interval(0, 10)
    assert ci.low == 0.0 and ci.high == pytest.approx(0.27753, abs=1e-5)
    ci = wilson_interval(10, 10)
    assert ci.low == pytest.approx(0.72247, abs=1e-5) and ci.high == pytest.approx(1.0)
    assert math.isnan(wilson_interval(0, 0).value)


# --- vllm:lora_requests_info --------------------------------------------------------------------------------------
def _info(t: float, sets: dict[tuple[str, str], float]) -> list[dict]:
    return [
        {"timestamp": t, "metric": "vllm:lora_requests_info", "value": v, "source": "server",
         "labels": json.dumps({"max_lora": "2", "running_lora_adapters": r, "waiting_lora_adapters": w})}
        for (r, w), v in sets.items()
    ]  # fmt: skip


# vLLM keeps every label set with the time it was last current: each scrape's state is its newest set.
METRICS = pd.DataFrame(
    _info(3.0, {("a", ""): 3.0, ("", ""): 1.0})  # running a
    + _info(5.0, {("a", ""): 3.0, ("", ""): 1.0, ("a,b", ""): 5.0})  # running a and b
    + _info(7.0, {("a", ""): 3.0, ("a,b", ""): 5.0, ("", "b"): 7.0})  # b waiting
    + _info(11.0, {("a", ""): 11.0})  # outside the window of step 0
)
TIMELINE = [{"step": 0, "users": 2, "start_time": 0.0, "measure_start": 2.0, "end_time": 10.0}]


def test_each_scrapes_state_is_its_newest_label_set():
    states = lora_states(METRICS)
    assert states["running"].tolist() == [("a",), ("a", "b"), (), ("a",)]
    assert states["waiting"].tolist() == [(), (), ("b",), ()]
    assert states["max_lora"].tolist() == [2, 2, 2, 2]
    assert lora_states(None).empty and lora_states(METRICS.iloc[:0]).empty


def _records() -> pd.DataFrame:
    rows = []
    for i, start in enumerate((3.0, 4.0, 5.0, 6.0)):  # a: 5 tokens each, TPOT 0.2 s
        rows.append({**rec(i, 0, 2, start, 0.1, 5, 0.2), "model": "a"})
    for i, start in enumerate((3.5, 4.5)):  # b: 3 tokens each, TPOT 0.05 s
        rows.append({**rec(10 + i, 0, 2, start, 0.1, 3, 0.05), "model": "b"})
    rows.append({**rec(20, 0, 2, 5.5, 0.1, 1, 0.1, status="error", error_type="http_500", duration=0.2), "model": "b"})
    rows.append({**rec(21, 0, 2, 1.0, 0.1, 5, 0.2, warmup=True), "model": "a"})  # the warm-up's: not counted
    return frame(rows)


RUN = {"lora_mix": {"spec": "a:1,b:1", "how": "given", "models": [{"name": "a", "weight": 0.5},
                                                                   {"name": "b", "weight": 0.5}]}}  # fmt: skip


def test_steps_csv_lora_section_has_the_adapters_running_and_waiting_at_most():
    table = lora_step_table(METRICS, TIMELINE, _records())
    row = table.iloc[0]
    assert (row["lora_models"], row["lora_running_max"], row["lora_waiting_max"], row["lora_max_loras"]) == (2, 2, 1, 2)
    empty = lora_step_table(None, TIMELINE, _records().assign(model="a")).iloc[0]
    assert all(pd.isna(empty[c]) for c in ("lora_models", "lora_running_max", "lora_waiting_max", "lora_max_loras"))


def test_models_csv_rows_on_records_with_known_answers():
    table = model_table(_records(), TIMELINE, RUN, METRICS).set_index("model")
    a, b = table.loc["a"], table.loc["b"]
    assert (a["sent"], b["sent"], a["step_sent"]) == (4, 3, 7)  # the warm-up's request is not sent after it
    assert a["share"] == pytest.approx(4 / 7) and (a["share_low"], a["share_high"]) == pytest.approx(
        (wilson_interval(4, 7).low, wilson_interval(4, 7).high)
    )
    assert (a["expected_share"], b["expected_share"]) == (0.5, 0.5)
    assert (a["requests"], a["errors"], b["requests"], b["errors"]) == (4, 0, 2, 1)
    assert a["aggregate_tok_s"] == pytest.approx(20 / 8) and b["aggregate_tok_s"] == pytest.approx(6 / 8)
    assert a["tpot_p50_s"] == pytest.approx(0.2) and b["tpot_p50_s"] == pytest.approx(0.05)
    assert a["ttft_p99_s"] == pytest.approx(0.1)
    assert "tpot_p99_s" in a["few_samples"] and pd.isna(a["tpot_p99_s_ci_low"])  # 4 samples: no interval
    # In the window's three scrapes: a ran in two, b in one and waited in one; never named: empty.
    assert (a["lora_running_share"], a["lora_waiting_share"]) == pytest.approx((2 / 3, 0.0))
    assert (b["lora_running_share"], b["lora_waiting_share"]) == pytest.approx((1 / 3, 1 / 3))
    alone = model_table(_records(), TIMELINE, RUN, None).set_index("model")
    assert pd.isna(alone.loc["a", "lora_running_share"])  # without the series: missing, never 0


def test_the_whole_run_per_model_and_the_console_table():
    whole = {r["model"]: r for r in run_models(_records(), TIMELINE, RUN)}
    assert (whole["a"]["sent"], whole["a"]["run_sent"], whole["a"]["weight"]) == (4, 7, 0.5)
    assert whole["b"]["requests"] == 2 and whole["b"]["errors"] == 1
    assert whole["a"]["aggregate_tok_s"] == pytest.approx(20 / 8)
    text = format_models(model_table(_records(), TIMELINE, RUN, METRICS))
    assert text.startswith("Per model") and "expected" in text and " 57% " in text  # a's share, 4 of 7
    one = _records().assign(model="a")
    assert format_models(model_table(one, TIMELINE, {}, None)) == ""  # one model: no table
    assert run_models(one, TIMELINE, {}) is None  # neither a mix nor several models
