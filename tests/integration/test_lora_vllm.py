"""LoRA adapters on the real vLLM: the embedded server with `serve --lora` (the tiny model and two tiny generated
adapters, tiny-lora-a and tiny-lora-b, embedded_vllm/tiny_lora.py; tests/helpers/fleet.py's `lora_vllm`). vLLM lists
each adapter as a model of its own whose parent is the base model, streams a completion asked of an adapter, and a
short run with `--lora-mix` over both adapters and the base model records every request under the model it asked
for, the per-model shares (models.csv) and vLLM's `vllm:lora_requests_info`. Select with `-m vllm`."""

from __future__ import annotations

import json
import urllib.request

import pandas as pd
import pytest

from tests.helpers.runs import locust

pytestmark = [pytest.mark.vllm, pytest.mark.contract]

ADAPTERS = ("tiny-lora-a", "tiny-lora-b")
MIX = ("tiny-lora-a", "tiny-lora-b", "tiny")


def test_vllm_lists_each_adapter_with_the_base_model_as_parent(lora_vllm):
    with urllib.request.urlopen(lora_vllm.url + "/v1/models", timeout=10) as r:
        models = {m["id"]: m for m in json.loads(r.read())["data"]}
    assert set(models) == set(MIX), models
    assert all(models[name]["parent"] == "tiny" for name in ADAPTERS)


@pytest.mark.parametrize("model", ADAPTERS)
def test_a_completion_asked_of_an_adapter_streams_its_tokens(lora_vllm, model):
    body = {"model": model, "prompt": "Hello!", "max_tokens": 8, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    request = urllib.request.Request(
        lora_vllm.url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as r:
        events = [line[6:] for line in r.read().decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["model"] for c in chunks} == {model}
    assert chunks[-1]["usage"]["completion_tokens"] == 8


def test_a_lora_mix_run_records_each_requests_model_and_vllms_adapters(lora_vllm, tmp_path):
    run_dir = tmp_path / "run"
    proc = locust(
        "--host", lora_vllm.url, "--lora-mix", ",".join(f"{m}:1" for m in MIX),
        "--steps", "4,8", "--step-duration", "4s", "--step-warmup", "1s", "--max-tokens", "8", "--ignore-eos",
        "--scrape-interval", "0.5", "--stop-timeout", "30", "--no-report", "--run-dir", str(run_dir),
        timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = pd.read_parquet(run_dir / "requests.parquet")
    assert len(records) > 0 and (records["status"] == "ok").all(), records["error_type"].value_counts().to_dict()
    # Each request drawn from the three, equal weights: with tens of requests each model is drawn (a model missing
    # from 30 draws has probability 3 x (2/3)^30 < 1e-5).
    assert set(records["model"]) == set(MIX), records["model"].value_counts().to_dict()
    models = pd.read_csv(run_dir / "models.csv")
    assert {"step", "model", "requests", "share", "share_low", "share_high"} <= set(models.columns)
    assert set(models["model"]) == set(MIX)
    assert models.groupby(["step", "model"]).size().max() == 1  # one row per (step, model)
    metrics = pd.read_parquet(run_dir / "metrics.parquet")
    lora = metrics[metrics["metric"] == "vllm:lora_requests_info"]
    assert len(lora) > 0, sorted(metrics["metric"].unique())
