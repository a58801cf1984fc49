"""Verdicts on real runs' raw files, kept in tests/fixtures/runs/: the same input gives the same verdict anywhere.

`vllm-saturated`: the embedded vLLM (CPU build, tiny model, 128 KV blocks of 32 tokens, max_num_seqs 64), steps
4,16,32,64 of 30 s (12 s warm-up), 256 tokens with --ignore-eos, recorded in a fresh clone's parallel `make test`
(2026-12-06): a disturbed run, its load generator flagged at every step by the tests beside it, the KV cache full
from 16 users and requests waiting for it from 32. Its raw files as the run left them (records/ and generator/ as
gzip), unpacked and finished again here by the end of run's own pipeline (analysis.finish.compute_run).

`vllm-capacity`: the same server alone on the machine (2026-12-06), `--find-capacity users --slo ttft_p95=200ms`
from 8 users at a 50 % resolution, 10 s probes (2 s warm-up), 256 tokens with --ignore-eos: a clean search, probes
8, 16, 32 and 24 users.
"""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest
from vllm_loadtest.analysis.diagnosis import KV_CACHE, LOAD_GENERATOR
from vllm_loadtest.analysis.finish import compute_run

from tests.helpers.paths import FIXTURES
from tests.helpers.vllm import window_stats

pytestmark = pytest.mark.unit

RUNS = FIXTURES / "runs"


def unpack(name: str, into: Path) -> Path:
    """A run directory as the run left it: run.json, metrics.parquet, records/ and generator/ (one process each)."""
    source, run_dir = RUNS / name, into / name
    for sub in ("records", "generator"):
        (run_dir / sub).mkdir(parents=True)
        with gzip.open(source / f"{sub}.jsonl.gz") as packed:
            (run_dir / sub / "recorded.jsonl").write_bytes(packed.read())
    for file in ("run.json", "metrics.parquet"):
        shutil.copy(source / file, run_dir / file)
    return run_dir


@pytest.fixture(scope="module")
def saturated(tmp_path_factory):
    return compute_run(unpack("vllm-saturated", tmp_path_factory.mktemp("recorded")))


@pytest.fixture(scope="module")
def search(tmp_path_factory):
    return compute_run(unpack("vllm-capacity", tmp_path_factory.mktemp("recorded")))


def test_the_saturated_step_is_the_first_where_requests_waited_for_kv_cache_space(saturated):
    table, diagnosis = saturated.table, saturated.diagnosis
    assert list(table["users"]) == [4, 16, 32, 64] and list(table["requests"]) == [12, 47, 119, 18]
    # 16 users filled the cache (7 preempted) but none waited; at 32, 16 waited: that is the batch limit.
    assert table["kv_cache_usage_max"].iloc[1] == pytest.approx(1.0) and table["waiting_max"].iloc[1] == 0
    assert diagnosis.saturated_users == 32 and diagnosis.saturated_step == 2
    assert "From 32 users the server is past its batch limit: requests waited for KV-cache space" in diagnosis.text[1]


def test_what_binds_is_the_kv_cache_with_the_flagged_generator_said_at_every_step(saturated):
    diagnosis = saturated.diagnosis
    assert diagnosis.binding == {0: LOAD_GENERATOR, 1: KV_CACHE, 2: KV_CACHE, 3: KV_CACHE}
    assert saturated.table["generator_bound"].all()
    for users in (16, 32, 64):
        line = next(t for t in diagnosis.text if t.startswith(f"At {users} users "))
        assert "the KV cache binds" in line and "The load generator was flagged too" in line, line
        assert "has room" not in line and "compute binds" not in line, line
    text = "\n".join(diagnosis.text)
    assert "still had room" not in text and "room to spare" not in text


def test_the_knee_is_where_throughput_stopped_rising_beyond_its_noise(saturated):
    diagnosis, table = saturated.diagnosis, saturated.table
    # 1690 tok/s at 32 users, 1165 at 64 (-31 %): the knee is the last step that rose, at the saturated step.
    assert diagnosis.knee_users == 32 and diagnosis.knee_range == [32, 64]
    assert table["aggregate_tok_s"].iloc[3] < table["aggregate_tok_s"].iloc[2]
    assert diagnosis.text[0].startswith("Aggregate throughput flattens at 32 users: the knee lies between 32 and 64")


def test_the_server_columns_are_the_raw_samples_of_each_measured_window(saturated):
    metrics = saturated.metrics
    for step, row in zip(saturated.run["timeline"], saturated.table.itertuples()):
        for metric, column in (
            ("vllm:kv_cache_usage_perc", "kv_cache_usage"),
            ("vllm:num_requests_running", "running"),
            ("vllm:num_requests_waiting", "waiting"),
        ):
            mean, peak = window_stats(metrics, metric, step["measure_start"], step["end_time"])
            assert getattr(row, f"{column}_mean") == pytest.approx(mean), (step["users"], column)
            assert getattr(row, f"{column}_max") == pytest.approx(peak), (step["users"], column)


def test_the_integrity_check_matches_the_records_with_the_servers_counters(saturated):
    check = saturated.integrity
    assert (check["client_ok"], check["server_finished"]) == (437, 437) and check["requests_match"]
    assert check["client_ok_tokens"] == check["server_generated_tokens"] == 437 * 256 and check["tokens_match"]
    assert not check["mismatch"] and saturated.errors["failed"] == 0
    # The table counts the measured requests: started after the warm-up, finished before the stop (196 of 437).
    assert int(saturated.records["measured"].sum()) == int(saturated.table["requests"].sum()) == 196


def test_the_capacity_search_breaks_past_the_kv_caches_limit_and_names_it(search):
    cap, table = search.capacity, search.table
    assert [p["users"] for p in cap["probes"]] == [8, 16, 32, 24] and list(table["users"]) == [8, 16, 32, 24]
    assert [p["verdict"] for p in cap["probes"]] == ["pass", "pass", "fail", "pass"]
    assert cap["max_users"] == 24 and cap["first_failing"]["users"] == 32 and not cap["uncertain"]
    # TTFT p95 stayed under 100 ms to 24 users and broke at 32 (416 ms), where the cache was full and preempting.
    broke = cap["first_failing"]["objectives"]["ttft_p95"]
    assert broke["value"] == pytest.approx(table["ttft_p95_s"].iloc[2]) and broke["value"] > 0.2
    assert cap["binding"]["resource"] == KV_CACHE and not cap["binding"]["load_generator_bound"]
    assert cap["binding"]["kv_cache_usage_max"] == 1.0 and cap["binding"]["preemptions"] == 353
    assert cap["line"] == (
        "Capacity: 24 users, the highest load meeting ttft_p95<=200ms; at 32 users ttft_p95 was 416 ms (too few "
        "samples for an interval); what binds there: KV cache (100 % KV cache used, up to 9 requests waiting, 353 "
        "preempted)"
    )


def test_the_searchs_probes_are_past_the_batch_limit_from_16_users(search):
    diagnosis = search.diagnosis
    assert diagnosis.saturated_users == 16 and diagnosis.binding == {1: KV_CACHE, 2: KV_CACHE, 3: KV_CACHE}
