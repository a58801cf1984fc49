"""Request records and step timelines with known answers, for the analysis tests."""

from __future__ import annotations

import pandas as pd
from vllm_loadtest.analysis.records import SCHEMA, RequestRecord


def rec(i, step, users, start, ttft, n, itl, warmup=False, status="ok", error_type=None, duration=None) -> dict:
    """One record row: n one-token chunks, the first at ttft, then one every itl seconds."""
    offs = [ttft + k * itl for k in range(n)]
    r = RequestRecord(
        request_id=f"r{i}",
        worker="w",
        step=step,
        users=users,
        warmup=warmup,
        start_time=start,
        endpoint="completions",
        model="m",
        status=status,
        error_type=error_type,
        ttft_s=offs[0] if status == "ok" else None,
        e2e_s=offs[-1] if status == "ok" else None,
        tpot_s=(offs[-1] - offs[0]) / (n - 1) if status == "ok" and n > 1 else None,
        duration_s=duration if duration is not None else offs[-1] + 0.001,
        output_tokens=n if status == "ok" else None,
        chunks=n if status == "ok" else 0,
        chunk_offsets_s=offs if status == "ok" else [],
        chunk_tokens=[1] * n if status == "ok" else [],
    )
    return {f: getattr(r, f) for f in SCHEMA.names}


def frame(rows) -> pd.DataFrame:
    """Record rows as the records DataFrame (the records schema's dtypes)."""
    import pyarrow as pa

    return pa.Table.from_pylist(rows, schema=SCHEMA).to_pandas()


TIMELINE = [
    {"step": 0, "users": 1, "start_time": 0.0, "measure_start": 2.0, "end_time": 10.0},
    {"step": 1, "users": 2, "start_time": 10.0, "measure_start": 12.0, "end_time": 20.0},
]


def make_record(i: int, **kw) -> RequestRecord:
    """A complete ok record `id<i>` (11 tokens in 10 chunks), fields overridden by kw."""
    base = dict(
        request_id=f"id{i}",
        worker="w1",
        step=0,
        users=1,
        warmup=False,
        start_time=1000.0 + i,
        endpoint="completions",
        model="m",
        ttft_s=0.05,
        e2e_s=0.15,
        tpot_s=0.01,
        duration_s=0.16,
        output_tokens=11,
        output_tokens_estimated=False,
        prompt_tokens=3,
        chunks=10,
        finish_reason="length",
        chunk_offsets_s=[0.05 + 0.01 * k for k in range(10)],
        chunk_tokens=[1] * 9 + [2],
    )
    base.update(kw)
    return RequestRecord(**base)
