"""Where the repository, its test fixtures and its locustfile are."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Real vLLM 0.32 (CPU build) captures, copied from the project's shared fixtures so a clone is self-contained.
FIXTURES = ROOT / "tests" / "fixtures"
LOCUSTFILE = str(ROOT / "locustfiles" / "vllm_streaming.py")
