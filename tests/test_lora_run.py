"""--lora-mix end to end (issue 35): a real `locust` process against the fake server serving two adapters under its
base model, each at its own speed (a1 4 times faster than a2), two steps with `--lora-mix base:1,a1:1,a2:2`.

Checked against the server's truth log: every request asked for the model its record says; every model of the mix
was drawn. models.csv: each step's shares count every request sent after the warm-up and lie within a 99.99 % Wilson
interval around the mix's weights (a check that fails once in ten thousand when the draws are right; the file's own
95 % bounds would fail one check in twenty by chance, and the draws depend on the users' timing, so no seed makes
them repeat); its requests add up to steps.csv's; its TPOT is the model's records' own median, and the fake's
slower adapter reads slower. vllm:lora_requests_info: the adapters show as running, the base model never.
Then `--lora-mix auto` takes the fake's adapters, and the bad inputs stop with one `error:` line and exit code 3."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from vllm_loadtest.analysis.uncertainty import wilson_interval

from tests.helpers.badinput import first_error
from tests.helpers.runs import locust
from tests.helpers.servers import FakeServer

pytestmark = [pytest.mark.contract]

MIX = {"base": 0.25, "a1": 0.25, "a2": 0.5}
FAKE = ["--model", "base", "--lora", "a1=5,a2=20", "--ttft-ms", "10", "--itl-ms", "10"]


@pytest.fixture(scope="module")
def fake():
    server = FakeServer(FAKE)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def mix_run(fake, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("lora") / "run"
    proc = locust(
        "--host", fake.url, "--steps", "1,2", "--step-duration", "4s", "--step-warmup", "0s", "--max-tokens", "8",
        "--lora-mix", "base:1,a1:1,a2:2", "--scrape-interval", "0.5", "--run-dir", str(run_dir), timeout=120,
    )  # fmt: skip
    return proc, run_dir, fake.get("/truth")


def test_every_request_asked_for_the_model_its_record_says(mix_run):
    proc, run_dir, truth = mix_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = pd.read_parquet(run_dir / "requests.parquet")
    ok = records[records["status"] == "ok"]
    assert len(ok) >= 40 and (records["status"] == "ok").sum() + (records["error_type"] == "cut_off").sum() == len(
        records
    )
    assert [truth[r]["model"] for r in ok["request_id"]] == ok["model"].tolist()
    assert set(records["model"]) == set(MIX)
    run = json.loads((run_dir / "run.json").read_text())
    assert run["lora_mix"]["how"] == "given" and {m["name"]: m["weight"] for m in run["lora_mix"]["models"]} == MIX
    assert "LoRA mix: base 25%, a1 25%, a2 50%" in proc.stderr


def test_each_steps_shares_lie_within_their_binomial_bounds(mix_run):
    _, run_dir, _ = mix_run
    models = pd.read_csv(run_dir / "models.csv")
    records = pd.read_parquet(run_dir / "requests.parquet")
    assert len(models) == 2 * len(MIX) and set(models["model"]) == set(MIX)
    for step, rows in models.groupby("step"):
        sent = records[(records["step"] == step) & ~records["warmup"]]
        assert (rows["step_sent"] == len(sent)).all() and rows["sent"].sum() == len(sent)
        for r in rows.to_dict(orient="records"):
            assert r["sent"] == (sent["model"] == r["model"]).sum()
            assert r["share"] == pytest.approx(r["sent"] / r["step_sent"])
            assert r["share_low"] <= r["share"] <= r["share_high"] and r["expected_share"] == MIX[r["model"]]
            wide = wilson_interval(r["sent"], r["step_sent"], confidence=0.9999)
            assert wide.low <= MIX[r["model"]] <= wide.high, r


def test_each_models_rows_are_the_step_tables_functions_on_its_records(mix_run):
    _, run_dir, truth = mix_run
    models = pd.read_csv(run_dir / "models.csv")
    steps = pd.read_csv(run_dir / "steps.csv").set_index("step")
    records = pd.read_parquet(run_dir / "requests.parquet")
    for step, rows in models.groupby("step"):
        assert rows["requests"].sum() == steps.loc[step, "requests"]
        assert rows["aggregate_tok_s"].sum() == pytest.approx(steps.loc[step, "aggregate_tok_s"])
        assert steps.loc[step, "lora_models"] == len(MIX)
        for r in rows.to_dict(orient="records"):
            mine = records[(records["step"] == step) & records["measured"] & (records["status"] == "ok")]
            tpot = mine.loc[mine["model"] == r["model"], "tpot_s"].dropna()
            assert r["tpot_p50_s"] == pytest.approx(np.percentile(tpot, 50))
    # The fake's speeds: a2's tokens come 4 times further apart than a1's, on the server and in the client's rows.
    server_tpot = {m: np.median([(t["e2e_s"] - t["ttft_s"]) / (t["tokens"] - 1) for t in truth.values()
                                 if t["model"] == m]) for m in MIX}  # fmt: skip
    assert server_tpot["a2"] > 3 * server_tpot["a1"]
    last = models[models["step"] == models["step"].max()].set_index("model")
    assert last.loc["a2", "tpot_p50_s"] > last.loc["a1", "tpot_p50_s"]


def test_the_servers_adapters_join_and_the_outputs_show_the_mix(mix_run):
    proc, run_dir, _ = mix_run
    steps = pd.read_csv(run_dir / "steps.csv")
    models = pd.read_csv(run_dir / "models.csv")
    assert (steps["lora_max_loras"] == 2).all() and steps["lora_running_max"].max() >= 1
    assert models.loc[models["model"] == "base", "lora_running_share"].isna().all()  # vLLM lists adapters only
    assert models.loc[models["model"] == "a2", "lora_running_share"].notna().any()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [m["model"] for m in summary["per_model"]] == list(MIX) and summary["models"] == sorted(MIX)
    assert summary["lora_mix"]["spec"] == "base:1,a1:1,a2:2"
    assert "Per model (--lora-mix" in proc.stdout and "models.csv" in proc.stdout
    assert "<h2>Adapters</h2>" in (run_dir / "report.html").read_text(encoding="utf-8")


def test_auto_takes_the_adapters_listed_under_the_base_model(fake, tmp_path):
    run_dir = tmp_path / "run"
    proc = locust(
        "--host", fake.url, "--steps", "2", "--step-duration", "2s", "--step-warmup", "0s", "--max-tokens", "4",
        "--lora-mix", "auto", "--no-report", "--run-dir", str(run_dir), timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads((run_dir / "run.json").read_text())
    assert run["lora_mix"]["how"] == "auto" and [m["name"] for m in run["lora_mix"]["models"]] == ["base", "a1", "a2"]
    assert set(pd.read_parquet(run_dir / "requests.parquet")["model"]) <= set(MIX)


def test_a_bad_mix_and_an_unknown_adapter_stop_with_one_line(fake, tmp_path):
    quick = ("--steps", "1", "--step-duration", "1s", "--step-warmup", "0s", "--run-dir", str(tmp_path / "r"))
    line = first_error("--host", fake.url, *quick, "--lora-mix", "base:1,a1:lots")
    assert line == "error: --lora-mix 'base:1,a1:lots': the weight of 'a1' must be a positive number, not 'lots'"
    line = first_error("--host", fake.url, *quick, "--lora-mix", "base:1,a3:1")
    assert "'a3' not served by" in line and "(it serves: base, a1, a2)" in line
    # A real run: the line on its stderr, exit code 3, nothing sent.
    proc = locust("--host", fake.url, *quick, "--lora-mix", "base:1,a3:1", timeout=60)
    errors = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert proc.returncode == 3 and len(errors) == 1 and "'a3' not served by" in errors[0], proc.stderr[-2000:]


def test_auto_against_a_server_without_adapters_says_how_to_serve_them(tmp_path):
    server = FakeServer(["--model", "base"])
    try:
        line = first_error("--host", server.url, "--steps", "1", "--run-dir", str(tmp_path / "r"), "--lora-mix", "auto")
    finally:
        server.stop()
    assert "lists no adapter under the base model 'base'" in line and "--enable-lora --lora-modules" in line


def test_an_embeddings_run_draws_its_models_too(fake, tmp_path):
    run_dir = tmp_path / "run"
    proc = locust(
        "--host", fake.url, "--endpoint", "embeddings", "--dataset", "synthetic:16", "--steps", "1",
        "--step-duration", "2s", "--step-warmup", "0s", "--lora-mix", "a1:1,a2:1", "--no-report",
        "--run-dir", str(run_dir), timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = pd.read_parquet(run_dir / "requests.parquet")
    asked = {p["request_id"]: p["body"]["model"] for p in fake.get("/prompts")["prompts"] if "input" in p}
    assert set(records["model"]) == {"a1", "a2"} and all(asked[i] == m for i, m in zip(records["request_id"],
                                                                                        records["model"]))  # fmt: skip
    models = pd.read_csv(run_dir / "models.csv")
    assert models["sent"].sum() == models["step_sent"].iloc[0] and (models["expected_share"] == 0.5).all()


def test_each_load_process_draws_from_the_same_mix(fake, tmp_path):
    run_dir = tmp_path / "run"
    proc = locust(
        "--host", fake.url, "--processes", "2", "--steps", "2", "--step-duration", "2s", "--step-warmup", "0s",
        "--max-tokens", "4", "--lora-mix", "auto", "--no-report", "--run-dir", str(run_dir), timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = pd.read_parquet(run_dir / "requests.parquet")
    assert records["worker"].nunique() == 2 and set(records["model"]) <= set(MIX)
    assert json.loads((run_dir / "run.json").read_text())["lora_mix"]["how"] == "auto"  # the master resolved it too
