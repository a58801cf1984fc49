"""Server profiles (analysis/servers): each profile's mapping on metrics text written from its documentation,
detection from metrics names and version bodies, the request bodies and tokenizer calls per profile."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import gevent
import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families
from vllm_loadtest.analysis import servers
from vllm_loadtest.analysis.integrity import integrity
from vllm_loadtest.analysis.prometheus_text import parse_samples
from vllm_loadtest.analysis.server_metrics import (
    GENERATION_TOKENS,
    KV_CACHE,
    QUEUE_HISTOGRAM,
    RUNNING,
    SUCCESS,
    TTFT_HISTOGRAM,
    WAITING,
    merge_scrapes,
    scrape_line,
    step_server_table,
)

from tests.conftest import FIXTURES, parse_options
from tests.helpers.runs import wait_until

pytestmark = pytest.mark.unit

REAL_VLLM = (FIXTURES / "vllm-0.32-cpu-metrics.txt").read_text()
M = "meta-llama/Llama-3.1-8B-Instruct"


# --- metrics text, written from each server's documentation / metric-registration source -------------------------
def sglang_text(
    running=3, queue=1, usage=0.28, requests=10, gen=640, prompt=1000, cached=250, retracted=0, aborted=None
) -> str:
    """As SGLang's collector registers them (python/sglang/srt/metrics/collector.py), prometheus_client's format."""
    lab = f'model_name="{M}"'
    ttft = [(0.1, requests // 2), (0.2, requests), (float("inf"), requests)]
    queue_b = [(0.1, requests), (float("inf"), requests)]

    def hist(name: str, buckets, total: float) -> str:
        lines = [f"# HELP {name} Histogram.", f"# TYPE {name} histogram"]
        for le, n in buckets:
            bound = "+Inf" if math.isinf(le) else repr(le)
            lines.append(f'{name}_bucket{{le="{bound}",{lab}}} {float(n)}')
        lines += [f"{name}_count{{{lab}}} {float(buckets[-1][1])}", f"{name}_sum{{{lab}}} {total}"]
        return "\n".join(lines) + "\n"

    return (
        "# HELP sglang:num_running_reqs The number of running requests.\n# TYPE sglang:num_running_reqs gauge\n"
        f"sglang:num_running_reqs{{{lab}}} {float(running)}\n"
        "# HELP sglang:num_queue_reqs The number of requests in the waiting queue.\n"
        f"# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{{{lab}}} {float(queue)}\n"
        "# HELP sglang:token_usage The token usage.\n# TYPE sglang:token_usage gauge\n"
        f"sglang:token_usage{{{lab}}} {usage}\n"
        "# HELP sglang:cache_hit_rate The prefix cache hit rate.\n# TYPE sglang:cache_hit_rate gauge\n"
        f"sglang:cache_hit_rate{{{lab}}} 0.25\n"
        "# HELP sglang:gen_throughput The generation throughput (token/s).\n# TYPE sglang:gen_throughput gauge\n"
        f"sglang:gen_throughput{{{lab}}} 120.5\n"
        "# HELP sglang:prompt_tokens_total Number of prefill tokens processed.\n"
        f"# TYPE sglang:prompt_tokens_total counter\nsglang:prompt_tokens_total{{{lab}}} {float(prompt)}\n"
        "# HELP sglang:generation_tokens_total Number of generation tokens processed.\n"
        f"# TYPE sglang:generation_tokens_total counter\nsglang:generation_tokens_total{{{lab}}} {float(gen)}\n"
        "# HELP sglang:cached_tokens_total Number of cached prompt tokens.\n"
        f"# TYPE sglang:cached_tokens_total counter\nsglang:cached_tokens_total{{{lab}}} {float(cached)}\n"
        "# HELP sglang:num_requests_total Number of requests processed.\n"
        f"# TYPE sglang:num_requests_total counter\nsglang:num_requests_total{{{lab}}} {float(requests)}\n"
        "# HELP sglang:num_retracted_requests_total Total number of retracted requests.\n"
        "# TYPE sglang:num_retracted_requests_total counter\n"
        f"sglang:num_retracted_requests_total{{{lab}}} {float(retracted)}\n"
        + (
            "# HELP sglang:num_aborted_requests_total Number of requests aborted.\n"
            f"# TYPE sglang:num_aborted_requests_total counter\nsglang:num_aborted_requests_total{{{lab}}} {aborted}\n"
            if aborted is not None
            else ""  # a labelled counter appears once it has been incremented
        )
        + hist("sglang:time_to_first_token_seconds", ttft, 0.12 * requests)
        + hist("sglang:queue_time_seconds", queue_b, 0.01 * requests)
    )


def tgi_text(batch=4, queue=2, success=10, gen=640) -> str:
    """As TGI's router registers them (router/src/server.rs, metrics-exporter-prometheus' format: no labels)."""
    return (
        f"# TYPE tgi_request_count counter\ntgi_request_count {success + 1}\n"
        f"# TYPE tgi_request_success counter\ntgi_request_success {success}\n"
        f"# TYPE tgi_queue_size gauge\ntgi_queue_size {queue}\n"
        f"# TYPE tgi_batch_current_size gauge\ntgi_batch_current_size {batch}\n"
        "# TYPE tgi_batch_current_max_tokens gauge\ntgi_batch_current_max_tokens 4096\n"
        "# TYPE tgi_request_queue_duration histogram\n"
        f'tgi_request_queue_duration_bucket{{le="0.005"}} {success // 2}\n'
        f'tgi_request_queue_duration_bucket{{le="0.05"}} {success}\n'
        f'tgi_request_queue_duration_bucket{{le="+Inf"}} {success}\n'
        f"tgi_request_queue_duration_sum {0.01 * success}\ntgi_request_queue_duration_count {success}\n"
        "# TYPE tgi_request_generated_tokens histogram\n"
        f'tgi_request_generated_tokens_bucket{{le="64"}} {success}\n'
        f'tgi_request_generated_tokens_bucket{{le="+Inf"}} {success}\n'
        f"tgi_request_generated_tokens_sum {gen}\ntgi_request_generated_tokens_count {success}\n"
    )


def llamacpp_text(processing=2, deferred=1, predicted=640, kv=0.25) -> str:
    """As llama-server renders them with --metrics (tools/server/server.cpp, the README's GET /metrics)."""
    items = [
        ("prompt_tokens_total", "counter", 6886),
        ("prompt_seconds_total", "counter", 29.03),
        ("tokens_predicted_total", "counter", predicted),
        ("tokens_predicted_seconds_total", "counter", 35.44),
        ("n_decode_total", "counter", 700),
        ("prompt_tokens_seconds", "gauge", 237.1),
        ("predicted_tokens_seconds", "gauge", 18.1),
        ("kv_cache_usage_ratio", "gauge", kv),
        ("kv_cache_tokens", "gauge", 1024),
        ("requests_processing", "gauge", processing),
        ("requests_deferred", "gauge", deferred),
        ("n_busy_slots_per_decode", "gauge", 1.5),
    ]
    return "".join(f"# HELP llamacpp:{n} .\n# TYPE llamacpp:{n} {t}\nllamacpp:{n} {v}\n" for n, t, v in items)


def names_of(text: str) -> set[str]:
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def two_scrapes(tmp_path, first: list, second: list, t0: float = 100.0) -> pd.DataFrame:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(scrape_line(t0, first) + scrape_line(t0 + 10, second))
    return merge_scrapes(tmp_path, write=False)


def records(ok: int, tokens_each: int) -> pd.DataFrame:
    return pd.DataFrame(
        {"status": ["ok"] * ok, "output_tokens": [tokens_each] * ok, "ttft_s": [0.1] * ok, "start_time": [105.0] * ok}
    )


TIMELINE = [{"step": 0, "measure_start": 100.0, "end_time": 111.0}]


# --- vLLM: exactly today's behaviour ------------------------------------------------------------------------------
def test_vllm_profile_parses_the_real_capture_exactly_as_before_profiles():
    def old_parse(text: str, model=None):  # the parser before profiles, verbatim in behaviour
        aliases = {
            "vllm:gpu_cache_usage_perc": "vllm:kv_cache_usage_perc",
            "vllm:cpu_cache_usage_perc": "vllm:kv_cache_usage_perc",
            "vllm:gpu_prefix_cache_queries_total": "vllm:prefix_cache_queries_total",
            "vllm:gpu_prefix_cache_hits_total": "vllm:prefix_cache_hits_total",
        }
        out = []
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if not s.name.startswith("vllm:") or s.name.endswith("_created"):
                    continue
                if model is not None and s.labels.get("model_name", model) != model:
                    continue
                out.append((aliases.get(s.name, s.name), dict(s.labels), float(s.value)))
        return out

    old_names = REAL_VLLM.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    for text in (REAL_VLLM, old_names):
        assert parse_samples(text, profile="vllm") == old_parse(text) == parse_samples(text)
        assert parse_samples(text, model="tiny", profile="vllm") == old_parse(text, "tiny")
    assert servers.detect(names_of(REAL_VLLM))[0].name == "vllm"


# --- SGLang ---------------------------------------------------------------------------------------------------------
def test_sglang_series_land_on_the_canonical_names(tmp_path):
    samples = parse_samples(sglang_text(), profile="sglang")
    by_name = {name: value for name, _, value in samples}
    assert by_name[RUNNING] == 3 and by_name[WAITING] == 1 and by_name[KV_CACHE] == 0.28
    assert by_name[SUCCESS] == 10 and by_name[GENERATION_TOKENS] == 640
    assert by_name[TTFT_HISTOGRAM + "_count"] == 10 and by_name[QUEUE_HISTOGRAM + "_sum"] == pytest.approx(0.1)
    assert "sglang:gen_throughput" in by_name and "sglang:num_running_reqs" not in by_name  # unmapped: own name
    assert parse_samples(sglang_text(), profile="vllm") == []  # the vLLM profile keeps none of them

    before = parse_samples(sglang_text(requests=0, gen=0, prompt=0, cached=0), profile="sglang")
    after = parse_samples(sglang_text(running=5, requests=10, gen=640, prompt=1000, cached=250, retracted=2),
                          profile="sglang")  # fmt: skip
    table = step_server_table(two_scrapes(tmp_path, before, after), TIMELINE, model=M, records=records(10, 64))
    row = table.iloc[0]
    assert row["running_max"] == 5 and row["waiting_max"] == 1 and row["kv_cache_usage_max"] == 0.28
    assert row["preemptions"] == 2
    assert row["prefix_cache_hit_rate"] == pytest.approx(0.25)  # cached / prompt tokens
    assert row["server_ttft_mean_s"] == pytest.approx(0.12) and row["server_queue_time_mean_s"] == pytest.approx(0.01)
    assert math.isnan(row["waiting_capacity_max"]) and math.isnan(row["waiting_deferred_max"])  # missing, never 0

    metrics = two_scrapes(tmp_path, before, after)
    check = integrity(records(10, 64), metrics, M, "sglang")
    assert check["available"] and check["server_finished"] == 10 and check["server_generated_tokens"] == 640
    assert not check["mismatch"]
    # Two streams cut off at the end of the run: SGLang counts them finished, and aborted.
    cut = parse_samples(sglang_text(requests=12, gen=640, aborted=2.0), profile="sglang")
    check = integrity(records(10, 64), two_scrapes(tmp_path, before, cut), M, "sglang")
    assert check["server_finished"] == 10 and check["requests_match"]
    # The same samples under the vLLM profile: its finished_reason filter finds no normal end.
    assert not integrity(records(10, 64), metrics, M, "vllm")["available"]


# --- TGI ------------------------------------------------------------------------------------------------------------
def test_tgi_series_land_on_the_canonical_names_and_the_rest_is_missing(tmp_path):
    by_name = {name: value for name, _, value in parse_samples(tgi_text(), profile="tgi")}
    assert by_name[RUNNING] == 4 and by_name[WAITING] == 2 and by_name[SUCCESS] == 10
    assert by_name[GENERATION_TOKENS] == 640 and by_name[QUEUE_HISTOGRAM + "_count"] == 10
    assert "tgi_request_count_total" in by_name and KV_CACHE not in by_name and TTFT_HISTOGRAM + "_count" not in by_name

    before = parse_samples(tgi_text(success=0, gen=0), profile="tgi")
    after = parse_samples(tgi_text(batch=6, success=10, gen=640), profile="tgi")
    metrics = two_scrapes(tmp_path, before, after)
    row = step_server_table(metrics, TIMELINE, records=records(10, 64)).iloc[0]
    assert row["running_max"] == 6 and row["waiting_max"] == 2
    assert row["server_queue_time_mean_s"] == pytest.approx(0.01)
    # p99 lies in TGI's (5 ms, 50 ms] bucket: too wide for a value, so its bounds are what is known.
    assert (row["server_queue_time_p99_low_s"], row["server_queue_time_p99_high_s"]) == (0.005, 0.05)
    for missing in ("kv_cache_usage_max", "preemptions", "prefix_cache_hit_rate", "server_ttft_mean_s",
                    "ttft_gap_mean_s"):  # fmt: skip
        assert math.isnan(row[missing]), missing
    check = integrity(records(10, 64), metrics, None, "tgi")
    assert check["available"] and check["requests_match"] and check["tokens_match"]


# --- llama.cpp ------------------------------------------------------------------------------------------------------
def test_llamacpp_series_land_on_the_canonical_names_and_integrity_says_why_not(tmp_path):
    by_name = {name: value for name, _, value in parse_samples(llamacpp_text(), profile="llamacpp")}
    assert by_name[RUNNING] == 2 and by_name[WAITING] == 1 and by_name[KV_CACHE] == 0.25
    assert by_name[GENERATION_TOKENS] == 640 and "llamacpp:n_decode_total" in by_name
    metrics = two_scrapes(tmp_path, parse_samples(llamacpp_text(predicted=0), profile="llamacpp"),
                          parse_samples(llamacpp_text(processing=4), profile="llamacpp"))  # fmt: skip
    row = step_server_table(metrics, TIMELINE).iloc[0]
    assert row["running_max"] == 4 and row["kv_cache_usage_max"] == 0.25
    assert math.isnan(row["server_ttft_mean_s"]) and math.isnan(row["preemptions"])
    check = integrity(records(10, 64), metrics, None, "llamacpp")
    assert not check["available"] and "finished requests" in check["text"][0]


def test_openai_profile_keeps_no_metrics_and_has_no_integrity_check():
    assert parse_samples(REAL_VLLM, profile="openai") == []
    check = integrity(records(1, 8), None, None, "openai")
    assert not check["available"] and "no counter" in check["reason"]


# --- detection ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [(REAL_VLLM, "vllm"), (sglang_text(), "sglang"), (tgi_text(), "tgi"), (llamacpp_text(), "llamacpp")],
)
def test_detection_from_metric_names(text, expected):
    profile, how = servers.detect(names_of(text), None)
    assert profile.name == expected and "/metrics" in how


def test_detection_from_version_bodies_and_the_fallback():
    assert servers.detect(None, {"version": "0.32.0"})[0].name == "vllm"
    assert servers.detect(set(), {"version": "0.32.0"})[0].name == "vllm"
    # Only process/Python series (a proxy's own /metrics): not a server's, so the version decides.
    assert servers.detect({"process_cpu_seconds_total", "python_info"}, None)[0].name == "openai"
    # Not vLLM's shape: TGI's /info, an error body, a list, a number as version.
    for body in ({"version": "2.4.0", "model_id": "x"}, {"detail": "Not Found"}, ["version"], {"version": 3}):
        assert servers.detect(None, body)[0].name == "openai", body
    profile, how = servers.detect(None, None)
    assert profile.name == "openai" and how.startswith("fallback")
    # Names win over the version: an SGLang whose /version a proxy answers.
    assert servers.detect(names_of(sglang_text()), {"version": "0.32.0"})[0].name == "sglang"


def test_run_json_entry_and_the_profile_of_an_old_run():
    entry = servers.run_entry(servers.get("sglang"), "detected from /metrics", given=False)
    assert entry["name"] == "sglang" and entry["decided"] == "detected" and entry["tokenizer"] == "/tokenize"
    assert servers.of_run({"server_profile": entry}).name == "sglang"
    assert servers.of_run({}).name == servers.of_run(None).name == "vllm"  # runs from before profiles
    with pytest.raises(ValueError, match="--server-type"):
        servers.get("bogus")


# --- request bodies -------------------------------------------------------------------------------------------------
def payload(*args: str) -> dict:
    from vllm_loadtest.locustfiles.openai_user import build_payload

    return build_payload(parse_options(*args), "m", "hi")


def test_request_extensions_per_profile():
    assert payload()["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}  # auto: vLLM's
    vllm = payload("--server-type", "vllm", "--ignore-eos")
    assert vllm["stream_options"]["continuous_usage_stats"] and vllm["ignore_eos"] is True
    assert "continuous_usage_stats" not in payload("--server-type", "vllm", "--no-continuous-usage")["stream_options"]
    sglang = payload("--server-type", "sglang", "--ignore-eos")
    assert sglang["stream_options"]["continuous_usage_stats"] and sglang["ignore_eos"] is True
    for kind in ("openai", "tgi"):
        body = payload("--server-type", kind)
        assert body["stream_options"] == {"include_usage": True} and "ignore_eos" not in body, kind
    assert payload("--server-type", "llamacpp", "--ignore-eos")["ignore_eos"] is True
    # A detected profile (set by preflight on the options) wins over --server-type auto.
    opts = parse_options()
    opts.server_profile = "openai"
    from vllm_loadtest.locustfiles.openai_user import build_payload

    assert build_payload(opts, "m", "hi")["stream_options"] == {"include_usage": True}


def test_ignore_eos_is_refused_for_a_server_without_it():
    from vllm_loadtest.locustfiles import options as options_mod

    with pytest.raises(ValueError, match="--ignore-eos cannot be sent to a generic OpenAI-compatible API"):
        options_mod.check(parse_options("--server-type", "openai", "--ignore-eos"))
    options_mod.check(parse_options("--server-type", "openai"))
    with pytest.raises(ValueError, match=r"\(detected\)"):
        options_mod.check_server_type(parse_options("--ignore-eos"), "tgi")
    options_mod.check_server_type(parse_options("--ignore-eos"), "vllm")


# --- tokenizer endpoints --------------------------------------------------------------------------------------------
def test_tokenizer_request_and_answer_shapes():
    ep = {p.name: p.tokenizer for p in servers.PROFILES.values()}
    assert servers.tokenize_body(ep["vllm"], "m", "a b", special=False) == {
        "model": "m", "prompt": "a b", "add_special_tokens": False,
    }  # fmt: skip
    assert servers.tokenize_body(ep["vllm"], "m", [{"role": "user", "content": "x"}])["messages"]
    assert servers.tokenize_body(ep["llamacpp"], "m", "a b") == {"content": "a b", "add_special": True}
    assert servers.tokenize_body(ep["tgi"], "m", "a b") == {"inputs": "a b", "add_special_tokens": True}
    with pytest.raises(ValueError):
        servers.tokenize_body(ep["sglang"], "m", [{"role": "user", "content": "x"}])
    assert servers.token_count(ep["vllm"], {"count": 5, "max_model_len": 4096}) == 5
    assert servers.max_model_len(ep["vllm"], {"count": 5, "max_model_len": 4096}) == 4096
    assert servers.token_count(ep["llamacpp"], {"tokens": [1, 2, 3]}) == 3
    assert servers.max_model_len(ep["llamacpp"], {"tokens": [1, 2, 3]}) is None
    assert servers.token_count(ep["tgi"], [{"id": 1, "text": "a"}, {"id": 2, "text": " b"}]) == 2
    with pytest.raises((KeyError, TypeError)):
        servers.token_count(ep["llamacpp"], {"count": 3})
    assert ep["openai"] is None
    v = servers.get("llamacpp").version
    assert servers.version_of(v, {"build_info": "b5000-abc"}) == "b5000-abc" and servers.version_of(v, []) is None


def test_a_profile_without_a_tokenizer_builds_estimates_without_calling_the_server(fake_server):
    from vllm_loadtest.locustfiles.datasets import build_dataset

    server = fake_server()
    opts = parse_options("--host", server.url, "--server-type", "openai", "--dataset", "synthetic:32",
                         "--num-prompts", "3")  # fmt: skip
    dataset = build_dataset(opts.dataset, opts, server.url, "fake-model")
    assert dataset.info["tokenizer"].startswith("none (--server-type openai has no tokenizer endpoint)")
    assert server.get("/prompts")["tokenize_calls"] == 0
    vllm = parse_options("--host", server.url, "--dataset", "synthetic:32", "--num-prompts", "3")
    assert build_dataset(vllm.dataset, vllm, server.url, "fake-model").info["tokenizer"] == "/tokenize"
    assert server.get("/prompts")["tokenize_calls"] > 0


# --- the scraper's child process maps with the profile it is given -----------------------------------------------
def test_the_scraper_process_maps_the_servers_names(tmp_path):
    from vllm_loadtest.locustfiles.scraper import MetricsScraper

    site = tmp_path / "site"
    site.mkdir()
    (site / "metrics").write_text(sglang_text(running=7))
    http = subprocess.Popen(
        [sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1", "--directory", str(site)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        port = int(http.stdout.readline().split(" port ")[1].split()[0])
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        scraper = MetricsScraper(f"http://127.0.0.1:{port}/metrics", 0.2, run_dir, model=M, server="sglang").start()
        assert wait_until(lambda: scraper.scrapes >= 1, 30, sleep=gevent.sleep)
        scraper.stop()
    finally:
        http.terminate()
        http.wait(5)
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert lines and all(line["error"] is None for line in lines)
    assert [v for name, _, v in lines[-1]["samples"] if name == RUNNING] == [7.0]
    assert scraper.last_samples is not None
