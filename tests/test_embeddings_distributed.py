"""--endpoint embeddings from a master and two workers (`--processes 2`) against the fake server: each worker sends
its own batches and ships its records; the master's requests.parquet holds them all, the step table counts their
inputs, and the integrity check holds (the fake counts each input as a finished request, as vLLM 0.32 does)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.helpers.runs import locust

pytestmark = pytest.mark.contract


def test_two_workers_send_and_ship_their_batches(fake_server, tmp_path):
    server = fake_server("--embed-ms", "5", "--embed-per-input-ms", "1")
    run_dir = tmp_path / "run"
    proc = locust(
        "--host", server.url, "--endpoint", "embeddings", "--batch-size", "3", "--dataset", "synthetic:16",
        "--steps", "4", "--step-duration", "5s", "--step-warmup", "1s", "--processes", "2", "--stop-timeout", "5",
        "--no-report", "--run-dir", str(run_dir),
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = pd.read_parquet(run_dir / "requests.parquet")
    ok = records[records["status"] == "ok"]
    assert ok["worker"].nunique() == 2, ok["worker"].value_counts().to_dict()
    assert (ok["inputs"] == 3).all() and (ok["prompt_tokens"] == 48).all()
    truth = server.get("/truth")
    assert ok["request_id"].isin(truth).all()  # each is a request the server answered, none counted twice
    assert records["request_id"].is_unique
    steps = pd.read_csv(run_dir / "steps.csv")
    assert steps["inputs_per_s"].iloc[0] > 0 and steps["prompt_tok_s"].iloc[0] == pytest.approx(
        16 * steps["inputs_per_s"].iloc[0]
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["integrity"]["available"] and not summary["integrity"]["mismatch"], summary["integrity"]
    assert "Embeddings (inputs/s" in proc.stdout
