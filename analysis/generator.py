"""The load generator's self-checks: its samples (`generator.parquet`) and the per-step verdict "generator-bound".

Every process that generates load (the local runner, each worker) samples itself about once a second
(`locustfiles/selfcheck.py`): its CPU time, its running users and the raw event-loop lag samples of a probe
greenlet. A step whose lag or CPU shows that the client could not keep up is flagged: its timestamps are late,
so it reports the server slower than it is. Pure: no Locust, no network.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa

from . import glossary
from .diskio import replace_parquet
from .glossary import flagged
from .records import RECEIVED_DIR, read_jsonl
from .thresholds import CPU_BOUND, LAG_BOUND_S, PROBE_INTERVAL_S  # noqa: F401 (re-exported)

logger = logging.getLogger(__name__)

GENERATOR_DIR = "generator"  # <host>-<pid>.jsonl per process, and received/ for the copies workers ship
GENERATOR_FILE = "generator.parquet"
ROW_INTERVAL_S = 1.0  # one row per process about every second
ADVICE = "add worker processes (--processes N, or more workers; one per free core)"
# Lag with a mostly idle load process: it waited for a CPU that other processes held (in the demo, vLLM's CPU
# engine at 32-64 users: lag p99 3-5 ms with the load process at 6-11 % CPU). More workers on the same cores would
# not help; cores of its own would.
CONTENDED_CPU = 0.5
CONTENDED_ADVICE = (
    "its own CPU use was low, so other processes held the CPU it waited for: give the load generator cores of its "
    "own (another host, or taskset/cpusets away from the server)"
)


def advice(row: pd.Series) -> str:
    """What to do about a generator-bound step: more processes, or cores of its own when it was not busy itself."""
    cpu = row.get("generator_cpu_max")
    if cpu is not None and not pd.isna(cpu) and cpu < CONTENDED_CPU:
        return CONTENDED_ADVICE
    return ADVICE


SCHEMA = pa.schema(
    [
        ("timestamp", pa.float64()),
        ("worker", pa.string()),
        ("interval_s", pa.float64()),
        ("cpu_s", pa.float64()),
        ("cpu_fraction", pa.float64()),
        ("users_achieved", pa.int32()),
        ("users_intended", pa.int32()),
        ("lag_s", pa.list_(pa.float64())),
    ]
)

GENERATOR_COLUMNS = glossary.names(glossary.GENERATOR)


def sample_line(
    timestamp: float,
    worker: str,
    interval_s: float,
    cpu_s: float,
    users_achieved: int,
    users_intended: int | None,
    lag_s: list[float],
) -> bytes:
    """One row of generator.parquet as a JSON line (what a process appends to its own file and ships)."""
    row = {
        "timestamp": timestamp,
        "worker": worker,
        "interval_s": interval_s,
        "cpu_s": cpu_s,
        "cpu_fraction": cpu_s / interval_s if interval_s > 0 else None,
        "users_achieved": users_achieved,
        "users_intended": users_intended,
        "lag_s": lag_s,
    }
    return orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE)


def _read_lines(folder: Path) -> list[dict]:
    rows: list[dict] = []
    for path in sorted(folder.glob("*.jsonl")):
        file_rows, bad = read_jsonl(path)
        if bad:
            logger.warning("%s: skipped %d unreadable line(s) (cut off by a crash?)", path, bad)
        rows.extend(file_rows)
    return rows


def merge_generator(run_dir: Path, write: bool = True) -> pd.DataFrame:
    """generator/*.jsonl (each process's own copy) and generator/received/*.jsonl (shipped by workers to the
    master) -> one row per (worker, timestamp), written to generator.parquet."""
    run_dir = Path(run_dir)
    folder = run_dir / GENERATOR_DIR
    rows = _read_lines(folder) + _read_lines(folder / RECEIVED_DIR)
    if not rows:
        # Only the merged file was kept (a copied run directory): rebuilding from nothing would empty it. A run
        # without samples (from before the self-checks) gets no file: missing, not an empty measurement.
        if (run_dir / GENERATOR_FILE).exists():
            return pd.read_parquet(run_dir / GENERATOR_FILE)
        write = False
    df = pa.Table.from_pylist(rows, schema=SCHEMA).to_pandas()
    df = df.drop_duplicates(["worker", "timestamp"]).sort_values(["worker", "timestamp"]).reset_index(drop=True)
    if write:
        replace_parquet(run_dir / GENERATOR_FILE, pa.Table.from_pandas(df, schema=SCHEMA, preserve_index=False))
    return df


def is_bound(lag_p99_s: float, cpu_max: float) -> bool | None:
    """Generator-bound = lag_p99_s > LAG_BOUND_S or cpu_max > CPU_BOUND; None when neither was measured."""
    measured = [v for v in (lag_p99_s, cpu_max) if v is not None and not math.isnan(v)]
    if not measured:
        return None
    return bool((lag_p99_s is not None and lag_p99_s > LAG_BOUND_S) or (cpu_max is not None and cpu_max > CPU_BOUND))


def step_generator_table(samples: pd.DataFrame | None, timeline: list[dict]) -> pd.DataFrame:
    """Per step, from the samples whose timestamp lies in its measured window [measure_start, end_time): each
    process's lag percentiles, CPU (CPU seconds / wall seconds) and time-weighted running users; then the worst
    process's lag and CPU, the sum of the users, and the verdict."""
    rows = []
    for step in timeline:
        start, end = float(step["measure_start"]), float(step["end_time"] or math.inf)
        row: dict = {"step": int(step["step"]), **{c: math.nan for c in GENERATOR_COLUMNS}, "generator_bound": None}
        inside = (
            samples[(samples["timestamp"] >= start) & (samples["timestamp"] < end)]
            if samples is not None and len(samples)
            else None
        )
        if inside is not None and len(inside):
            p50, p99, top, cpu, users = [], [], [], [], []
            for _, g in inside.groupby("worker"):
                lags = np.concatenate([np.asarray(v, dtype=float) for v in g["lag_s"] if v is not None and len(v)])
                if lags.size:
                    p50.append(float(np.percentile(lags, 50)))
                    p99.append(float(np.percentile(lags, 99)))
                    top.append(float(lags.max()))
                wall = float(g["interval_s"].sum())
                if wall > 0:
                    cpu.append(float(g["cpu_s"].sum()) / wall)
                    users.append(float((g["users_achieved"] * g["interval_s"]).sum()) / wall)
            row["generator_processes"] = inside["worker"].nunique()
            row["generator_lag_p50_s"] = max(p50, default=math.nan)
            row["generator_lag_p99_s"] = max(p99, default=math.nan)
            row["generator_lag_max_s"] = max(top, default=math.nan)
            row["generator_cpu_max"] = max(cpu, default=math.nan)
            row["users_achieved_mean"] = sum(users) if users else math.nan
            row["generator_bound"] = is_bound(row["generator_lag_p99_s"], row["generator_cpu_max"])
        rows.append(row)
    return pd.DataFrame(rows, columns=["step", *GENERATOR_COLUMNS])


def bound_steps(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of a step table flagged generator-bound."""
    if "generator_bound" not in table.columns:
        return table.iloc[0:0]
    return table[table["generator_bound"].map(flagged)]


def reasons(row: pd.Series) -> str:
    """Why a step is generator-bound, in words: the measured figures over their bounds."""
    out = []
    lag, cpu = row.get("generator_lag_p99_s"), row.get("generator_cpu_max")
    if lag is not None and not pd.isna(lag) and lag > LAG_BOUND_S:
        out.append(f"event-loop lag p99 {lag * 1000:.1f} ms, over the {LAG_BOUND_S * 1000:.0f} ms bound")
    if cpu is not None and not pd.isna(cpu) and cpu > CPU_BOUND:
        out.append(f"a load process at {cpu:.0%} CPU, over the {CPU_BOUND:.0%} bound")
    achieved = row.get("users_achieved_mean")
    if achieved is not None and not pd.isna(achieved):
        out.append(f"{achieved:.1f} of {int(row['users'])} users running on average")
    return ", ".join(out)


def format_generator(table: pd.DataFrame) -> list[str]:
    """The console's self-check section: per step, lag (ms), CPU, achieved users and the verdict; [] without
    samples."""
    if not glossary.applies(table, glossary.GENERATOR):
        return []
    out = ["", *glossary.console_table(table, glossary.GENERATOR)]
    bound = bound_steps(table)
    if len(bound):
        which = ", ".join(f"{int(r['step'])} ({int(r['users'])} users)" for _, r in bound.iterrows())
        out.append(
            f"GENERATOR-BOUND steps {which}: the load generator could not keep up, so their latencies read high "
            f"and their throughput low; {ADVICE}."
        )
    return out
