"""--server-type end to end: real headless `locust` processes against the fake server, one strict as OpenAI's API
(an unknown request field is an HTTP 400; no /metrics, /version or /tokenize)."""

import json
import logging
import subprocess

import pandas as pd
import pytest
from vllm_loadtest.analysis.records import load_records
from vllm_loadtest.locustfiles.openai_user import OpenAIStreamingUser

from tests.helpers.inprocess import run_in_process
from tests.helpers.runs import locust


def run(host: str, run_dir, *args: str) -> subprocess.CompletedProcess:
    """One 2 s step of 2 users and 8-token requests."""
    return locust(
        "--host", host, "--steps", "2", "--step-duration", "2s", "--step-warmup", "0s", "--max-tokens", "8",
        "--run-dir", str(run_dir), "--no-report", *args,
    )  # fmt: skip


def finished(run_dir) -> pd.DataFrame:
    """The records of requests the run did not cut off when it stopped."""
    records = pd.read_parquet(run_dir / "requests.parquet")
    return records[records["error_type"].fillna("") != "cut_off"]


@pytest.mark.contract
def test_openai_server_type_passes_against_a_strict_server_and_vllm_fails_with_400s(fake_server, tmp_path):
    server = fake_server("--strict", "--ttft-ms", "10", "--itl-ms", "2")
    proc = run(server.url, tmp_path / "openai", "--server-type", "openai")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Server type: openai (generic OpenAI-compatible API), given (--server-type openai)" in proc.stderr
    records = finished(tmp_path / "openai")
    assert len(records) > 0 and (records["status"] == "ok").all()
    assert (records["output_tokens"] == 8).all()  # from the final usage: no per-chunk usage was asked for
    run_json = json.loads((tmp_path / "openai" / "run.json").read_text())
    assert run_json["options"]["server_type"] == "openai"
    assert run_json["server_profile"]["name"] == "openai" and run_json["server_profile"]["decided"] == "given"
    assert run_json["server_version"] is None and not (tmp_path / "openai" / "metrics.jsonl").exists()
    assert "Integrity check not available: a generic OpenAI-compatible API server has no counter" in proc.stdout

    proc = run(server.url, tmp_path / "vllm", "--server-type", "vllm")
    assert proc.returncode == 1, proc.stderr[-3000:]
    records = finished(tmp_path / "vllm")
    assert len(records) > 0 and (records["error_type"] == "http_400").all()
    assert records["error"].str.contains("stream_options.continuous_usage_stats").all()


@pytest.mark.contract
def test_auto_detects_the_generic_profile_on_a_strict_server_and_vllm_on_the_fake_vllm(fake_server, tmp_path):
    strict = fake_server("--strict", "--ttft-ms", "10", "--itl-ms", "2")
    proc = run(strict.url, tmp_path / "strict", "--endpoint", "chat")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Server type: openai" in proc.stderr
    assert "fallback: neither /metrics names nor /version recognised" in proc.stderr
    entry = json.loads((tmp_path / "strict" / "run.json").read_text())["server_profile"]
    assert entry["name"] == "openai" and entry["decided"] == "detected"
    assert (finished(tmp_path / "strict")["status"] == "ok").all()

    vllm_like = fake_server("--ttft-ms", "10", "--itl-ms", "2")
    proc = run(vllm_like.url, tmp_path / "vllm", "--dataset", "synthetic:16", "--num-prompts", "4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("Server type: vllm (vLLM), detected from /metrics") == 1  # one line, before any load
    run_json = json.loads((tmp_path / "vllm" / "run.json").read_text())
    assert run_json["options"]["server_type"] == "auto" and run_json["server_profile"]["decided"] == "detected"
    assert run_json["server_version"] == "0.0-fake" and run_json["dataset"]["tokenizer"] == "/tokenize"
    metrics = pd.read_parquet(tmp_path / "vllm" / "metrics.parquet")
    assert "vllm:generation_tokens_total" in set(metrics["metric"])
    assert "Requests: the" in proc.stdout  # the integrity check ran against the fake's vLLM counters


@pytest.mark.contract
def test_ignore_eos_with_a_server_without_it_is_refused_before_any_load(fake_server, tmp_path):
    strict = fake_server("--strict")
    for args in (["--server-type", "openai", "--ignore-eos"], ["--ignore-eos"]):  # given, and detected
        proc = run(strict.url, tmp_path / "r", *args)
        assert proc.returncode == 3, (args, proc.stderr[-2000:])
        assert "--ignore-eos cannot be sent to a generic OpenAI-compatible API server" in proc.stderr
        assert "Traceback" not in proc.stderr
    assert strict.get("/stats")["requests"] == 0
    proc = run(strict.url, tmp_path / "r", "--server-type", "bogus")
    assert proc.returncode == 3 and "--server-type" in proc.stderr


class User(OpenAIStreamingUser):
    pass


@pytest.mark.unit
def test_auto_is_decided_at_test_start_without_a_preflight(fake_server, tmp_path, caplog):
    """As in the web UI: no preflight ran, so the profile is detected when the test starts, before any request."""
    caplog.set_level(logging.INFO, logger="vllm_loadtest")
    server = fake_server("--strict", "--ttft-ms", "5", "--itl-ms", "1")
    env = run_in_process(User, server.url, tmp_path, "--max-tokens", "4", users=2, seconds=2, min_records=2)
    assert env.parsed_options.server_profile == "openai"
    records = load_records(tmp_path)
    assert len(records) > 0 and (records[records["error_type"] != "cut_off"]["status"] == "ok").all()
    assert len([r for r in caplog.records if r.getMessage().startswith("Server type: openai")]) == 1
    assert json.loads((tmp_path / "run.json").read_text())["server_profile"]["decided"] == "detected"


@pytest.mark.contract
def test_a_strict_server_refuses_a_pooling_request_field_it_does_not_know(fake_server):
    import urllib.error

    strict = fake_server("--strict")
    bodies = {
        "/v1/embeddings": {"model": "m", "input": ["hello"]},
        "/v1/rerank": {"model": "m", "query": "hello", "documents": ["hello world", "bye"]},
    }
    for path, body in bodies.items():
        assert strict.post(path, body)["usage"]["prompt_tokens"] > 0, path  # the known fields: answered
        with pytest.raises(urllib.error.HTTPError) as refused:
            strict.post(path, {**body, "bogus": 1, "also": 2})
        assert refused.value.code == 400
        message = json.loads(refused.value.read())["error"]["message"]
        assert message == "Unrecognized request argument supplied: also, bogus", path
