"""The demo: the embedded vLLM with a small KV cache, a stepped headless Locust run, and the table.

The KV cache is deliberately small (64 blocks of 32 tokens), so at the highest steps it fills up, requests
wait for capacity and get preempted, and aggregate tokens/s flattens: the saturation a user should learn to
recognise. With --capacity the same server gets a capacity search instead of the steps (--find-capacity users
against --slo): the highest number of users meeting the objective, and what binds beyond it (the KV cache).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .server import REPO, EmbeddedVLLM, ServerSettings

# A TTFT p95 only a queue breaks: on a 2-core machine the demo's server keeps it under 100 ms up to 16 users, and
# from about 32 users requests wait for KV-cache space for longer than this.
DEFAULT_CAPACITY_SLO = "ttft_p95=200ms"


def load_args(a) -> list[str]:
    """The load of the run: the demo's --steps, or with --capacity a users capacity search against --slo."""
    if a.capacity:
        return ["--find-capacity", "users", "--slo", a.slo]
    return ["--steps", a.steps]


def run_demo(settings: ServerSettings, a) -> int:
    from vllm_loadtest.locustfiles.plugin import default_run_dir

    run_dir = Path(a.run_dir) if a.run_dir else REPO / default_run_dir()
    with EmbeddedVLLM(settings) as server:
        run_dir.mkdir(parents=True, exist_ok=True)
        # Recorded before the load starts, so even an interrupted demo says what it ran against.
        (run_dir / "server.json").write_text(json.dumps(server.describe(), indent=2))
        cmd = [
            sys.executable, "-m", "locust", "-f", str(REPO / "locustfiles" / "vllm_streaming.py"), "--headless",
            "--host", server.url, *load_args(a), "--step-duration", a.step_duration,
            "--step-warmup", a.step_warmup, "--max-tokens", str(a.max_tokens), "--ignore-eos",
            "--run-dir", str(run_dir), "--only-summary",
        ]  # fmt: skip
        print("$ " + " ".join(cmd), flush=True)
        code = subprocess.call(cmd, cwd=REPO)
    if code == 1 and not a.capacity:
        code = 0  # Locust's "some requests failed": the table shows them; the demo itself worked
    print(
        f"\nDemo results in {run_dir}: steps.csv (the table above), requests.parquet (one row per request), "
        "metrics.parquet (vLLM's /metrics every second), server.json (the server and model)"
    )
    return code
