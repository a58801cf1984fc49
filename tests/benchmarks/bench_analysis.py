"""Analysis at scale: `python -m analysis report` on a generated one-hour run. Run on demand, prints figures.

    .venv/bin/python -m tests.benchmarks.bench_analysis [--chunks 10000000] [--chunks-per-request 256]
        [--received] [--cut-line] [--reference] [--keep DIR [--reuse]]
    .venv/bin/python -m tests.benchmarks.bench_analysis --small   # small, with received/ copies and a cut line;
                                                                  # the fast path against the reference

The generated run directory is what a distributed run with 4 load-generating worker processes leaves behind:
records/<host>-<pid>.jsonl serialized exactly as RecordWriter does (with --received also the master's copies in
records/received/, the last worker's without its last 3 records), run.json with the step timeline and the workers
as the plugin writes them, metrics.jsonl (one scrape a second, counters consistent with the records) and
generator/*.jsonl (one self-check row a second per worker). The server is simulated: closed-loop users at 1 … 256
users, TTFT and time per token growing with the load, 5 % of the chunks carrying 2 or 3 tokens, a few failed
requests, the last step's in-flight requests cut off.

Figures: wall time and peak RSS of the `python -m analysis report RUN_DIR` child process (its own rusage, from
wait4), and the sizes of report.html and of the records. With --reference (implied by --small) a copy of the run
directory is also analysed by the reference implementation, `python -m analysis report` as it was before the fast
path (below: stdlib json per line, a Python loop per chunk for ITL, every point of every CDF and of the TTFT
timeline, the records read twice), timed the same way; requests.parquet, steps.csv and summary.json must be
identical (exit status 1 otherwise).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from vllm_loadtest.analysis import glossary
from vllm_loadtest.analysis.generator import GENERATOR_DIR, sample_line
from vllm_loadtest.analysis.records import RECEIVED_DIR, RECORDS_DIR, REQUESTS_FILE, SCHEMA, RequestRecord
from vllm_loadtest.analysis.sse import CONNECTION_ERROR, CUT_OFF

ROOT = Path(__file__).resolve().parents[2]
MODEL = "bench-model"
T0 = 1_800_000_000.0
TOKENS_PER_CHUNK = (np.array([1, 2, 3]), np.array([0.95, 0.04, 0.01]))
MEAN_TOKENS_PER_CHUNK = float((TOKENS_PER_CHUNK[0] * TOKENS_PER_CHUNK[1]).sum())
HTTP_500_RATE, BROKEN_STREAM_RATE = 0.003, 0.002
STOP_DELAY_S = 0.02  # from the last step's end until the stop reaches the users still streaming
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Shape:
    chunks: int = 10_000_000  # token-carrying chunks over the whole run (approximately: closed-loop users)
    chunks_per_request: int = 256
    workers: int = 4
    steps: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    received: bool = False  # also the master's copies of every worker's file, in records/received/
    cut_line: bool = False  # the first worker's own file ends in a line cut by a crash
    seed: int = 0


SMALL = Shape(chunks=30_000, chunks_per_request=32, steps=(1, 2, 4, 8, 16), received=True, cut_line=True)


def ttft_model_s(users: int) -> float:
    return 0.03 * (1 + (users / 64) ** 2)


def tpot_model_s(users: int) -> float:
    return 0.005 * (1 + users / 48)


def step_duration_s(shape: Shape) -> float:
    """Each step's length so that the run holds about shape.chunks chunks (a GPU-like server: ~1 hour for 10 M)."""
    n = shape.chunks_per_request
    # The means of the lognormal jitters in _request: exp(sigma^2 / 2).
    ttft_jitter, gap_jitter = math.exp(0.3**2 / 2), math.exp(0.25**2 / 2)
    per_s = sum(
        users
        * n
        / (ttft_jitter * ttft_model_s(users) + (n - 1) * MEAN_TOKENS_PER_CHUNK * gap_jitter * tpot_model_s(users))
        for users in shape.steps
    )
    return shape.chunks / per_s


def _request(
    rng: np.random.Generator, shape: Shape, request_id: str, worker: str, step: dict, start: float, stop_at: float
) -> RequestRecord:
    """One request's record as openai_user._finish fills it; cut off when it would end after stop_at."""
    users = step["users"]
    record = RequestRecord(
        request_id=request_id,
        worker=worker,
        step=step["step"],
        users=users,
        warmup=start < step["measure_start"],
        start_time=start,
        endpoint="completions",
        model=MODEL,
        http_status=200,
        prompt_tokens=128,
    )
    fate = rng.random()
    if fate < HTTP_500_RATE:
        record.status, record.error_type, record.error = "error", "http_500", "Internal Server Error"
        record.http_status, record.duration_s = 500, float(rng.uniform(0.002, 0.01))
        return record
    n = shape.chunks_per_request
    tokens = rng.choice(TOKENS_PER_CHUNK[0], size=n, p=TOKENS_PER_CHUNK[1])
    gaps = tpot_model_s(users) * tokens[1:] * rng.lognormal(0.0, 0.25, size=n - 1)
    offsets = ttft_model_s(users) * rng.lognormal(0.0, 0.3) + np.concatenate(([0.0], np.cumsum(gaps)))
    duration = float(offsets[-1]) + 0.0005
    failure = None
    if start + duration > stop_at:
        keep = int(np.searchsorted(offsets, stop_at + STOP_DELAY_S - start))
        failure = (CUT_OFF, "the load generator stopped this user mid-request")
        duration = stop_at + STOP_DELAY_S - start
    elif fate < HTTP_500_RATE + BROKEN_STREAM_RATE:
        keep = int(rng.integers(1, n))
        failure = (CONNECTION_ERROR, "RemoteDisconnected: Remote end closed connection without response")
        duration = float(offsets[keep - 1]) + 0.001
    else:
        keep = n
    offs, toks = offsets[:keep].tolist(), tokens[:keep].tolist()
    output_tokens = int(sum(toks)) if keep else None
    record.ttft_s, record.e2e_s = glossary.ttft_s(offs), glossary.e2e_s(offs)
    record.tpot_s = glossary.tpot_s(record.e2e_s, record.ttft_s, output_tokens)
    record.duration_s = duration
    record.output_tokens = output_tokens
    record.output_tokens_estimated = None if output_tokens is None else False
    record.chunks = keep
    record.chunk_offsets_s, record.chunk_tokens = offs, toks
    if failure is None:
        record.finish_reason = "length"
    else:
        record.status, (record.error_type, record.error) = "error", failure
    return record


def _worker_names(shape: Shape) -> list[str]:
    return [f"bench-{1000 + w}" for w in range(shape.workers)]


def _users_of(worker: int, users: int, workers: int) -> int:
    """Users of one worker when user j runs on worker j % workers."""
    return len(range(worker, users, workers))


def generate_run(run_dir: Path, shape: Shape = Shape()) -> dict:
    """Write a synthetic run directory; return its figures (requests, chunks, records bytes, duration_s)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True)  # a fresh directory: files of an earlier run would be merged too
    rng = np.random.default_rng(shape.seed)
    names = _worker_names(shape)
    prefixes = [rng.bytes(10).hex() for _ in names]
    counters = [0] * shape.workers
    records_dir = run_dir / RECORDS_DIR
    (records_dir / RECEIVED_DIR).mkdir(parents=True, exist_ok=True)
    files = [open(records_dir / f"{name}.jsonl", "wb") for name in names]
    length = step_duration_s(shape)
    warmup = min(30.0, 0.1 * length)
    timeline = [
        {
            "step": i,
            "users": users,
            "start_time": T0 + i * length,
            "measure_start": T0 + i * length + warmup,
            "end_time": T0 + (i + 1) * length,
        }
        for i, users in enumerate(shape.steps)
    ]
    stop_at = timeline[-1]["end_time"]
    starts, ends, ok, all_tokens, chunks = [], [], [], [], 0
    try:
        for step in timeline:
            lines: list[list[tuple[float, bytes]]] = [[] for _ in names]
            for user in range(step["users"]):
                w = user % shape.workers
                t = step["start_time"] + float(rng.uniform(0.0, 0.05))  # users are spawned one after another
                while t < step["end_time"]:
                    request_id = f"{prefixes[w]}{counters[w]:012x}"
                    counters[w] += 1
                    record = _request(rng, shape, request_id, names[w], step, t, stop_at)
                    end = t + record.duration_s
                    lines[w].append((end, orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)))
                    starts.append(t)
                    ends.append(end)
                    ok.append(record.status == "ok")
                    all_tokens.append(record.output_tokens or 0)
                    chunks += record.chunks
                    if record.error_type == CUT_OFF:
                        break
                    t = end + 0.0002  # closed loop: the next request right after the previous one
            for f, worker_lines in zip(files, lines):
                # A writer appends each record when its request ends.
                f.writelines(line for _, line in sorted(worker_lines, key=lambda x: x[0]))
    finally:
        for f in files:
            f.close()
    if shape.received:
        for i, f in enumerate(files):
            data = Path(f.name).read_bytes()
            if i == len(files) - 1:
                # A worker killed at the end: its last half second never reached the master.
                data = b"".join(data.splitlines(keepends=True)[:-3])
            (records_dir / RECEIVED_DIR / Path(f.name).name).write_bytes(data)
    if shape.cut_line:
        with open(files[0].name, "ab") as f:
            f.write(b'{"request_id":"cut-by-a-crash","worker":"' + names[0].encode() + b'","step":')
    end_time = max(ends)
    _write_metrics(run_dir, np.array(starts), np.array(ends), np.array(ok), np.array(all_tokens), end_time)
    _write_selfchecks(run_dir, shape, timeline, names, rng, end_time)
    run = {
        "started_at": T0 - 0.5,
        "finished_at": end_time + 0.5,
        "locust_version": "2.47.0",
        "suite_version": "0.1.0",
        "server_version": "0.0-bench",
        "options": {
            "host": "http://gpu-box:8000",
            "model": "",
            "endpoint": "completions",
            "max_tokens": shape.chunks_per_request,
            "ignore_eos": True,
            "steps": ",".join(str(u) for u in shape.steps),
            "step_duration": f"{length:.0f}s",
            "step_warmup": f"{warmup:.0f}s",
            "headless": True,
            "master": True,
            "expect_workers": shape.workers,
        },
        "timeline": timeline,
        "workers": [
            {
                "client_id": f"{name}_{prefix[:8]}",
                "worker": name,
                "connected_at": T0 - 2.0,
                "missing_at": None,
                "records_received": n,
                "records_reported": n,
                "final_at": end_time + 0.2,
                "left_at": None,
            }
            for name, prefix, n in zip(names, prefixes, counters)
        ],
    }
    (run_dir / "run.json").write_text(json.dumps(run, indent=2, sort_keys=True), encoding="utf-8")
    return {
        "requests": len(starts),
        "chunks": chunks,
        "records_bytes": sum(p.stat().st_size for p in records_dir.rglob("*.jsonl")),
        "duration_s": end_time - T0,
    }


def _write_metrics(
    run_dir: Path, starts: np.ndarray, ends: np.ndarray, ok: np.ndarray, all_tokens: np.ndarray, end: float
) -> None:
    """metrics.jsonl as the scraper appends it: one scrape a second, the counters consistent with the records."""
    by_start, order = np.sort(starts), np.argsort(ends)
    by_end, ok_cum, all_cum = ends[order], np.cumsum(ok[order]), np.cumsum(all_tokens[order])
    labels = {"engine": "0", "model_name": MODEL}
    with open(run_dir / "metrics.jsonl", "wb") as f:
        for t in np.arange(T0 - 0.5, end + 1.5, 1.0):
            finished = int(np.searchsorted(by_end, t, side="right"))
            running = int(np.searchsorted(by_start, t, side="right")) - finished
            samples = [
                ["vllm:num_requests_running", labels, float(running)],
                ["vllm:num_requests_waiting", labels, 0.0],
                ["vllm:kv_cache_usage_perc", labels, min(1.0, running / 300)],
                ["vllm:num_preemptions_total", labels, 0.0],
                [
                    "vllm:request_success_total",
                    {**labels, "finished_reason": "length"},
                    float(ok_cum[finished - 1]) if finished else 0.0,
                ],
                ["vllm:generation_tokens_total", labels, float(all_cum[finished - 1]) if finished else 0.0],
            ]
            f.write(orjson.dumps({"t": float(t), "samples": samples, "error": None}, option=orjson.OPT_APPEND_NEWLINE))


def _write_selfchecks(
    run_dir: Path, shape: Shape, timeline: list[dict], names: list[str], rng: np.random.Generator, end: float
) -> None:
    """generator/<worker>.jsonl: one self-check row a second per worker, 100 lag samples each."""
    folder = run_dir / GENERATOR_DIR
    folder.mkdir(parents=True, exist_ok=True)
    step_starts = np.array([s["start_time"] for s in timeline])
    for w, name in enumerate(names):
        with open(folder / f"{name}.jsonl", "wb") as f:
            for t in np.arange(T0 + 1.0, end, 1.0):
                users = timeline[max(int(np.searchsorted(step_starts, t, side="right")) - 1, 0)]["users"]
                mine = _users_of(w, users, shape.workers)
                interval = float(rng.uniform(0.999, 1.003))
                cpu = min(0.95, 0.05 + 0.6 * mine / 64) * interval
                lag = rng.lognormal(math.log(0.0003), 0.5, size=100).tolist()
                f.write(sample_line(float(t), name, interval, cpu, mine, users, lag))


# --- the reference: the merge and the ITL samples as they were before the fast path --------------------------


def reference_read_jsonl(path: Path) -> tuple[list[dict], int]:
    rows, bad = [], 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except ValueError:
                bad += 1
    return rows, bad


def _reference_read_records(folder: Path) -> list[dict]:
    rows: list[dict] = []
    for path in sorted(folder.glob("*.jsonl")):
        file_rows, bad = reference_read_jsonl(path)
        if bad:
            logger.warning("%s: skipped %d unreadable line(s) (cut off by a crash?)", path, bad)
        rows.extend(file_rows)
    return rows


def reference_merge_records(run_dir: Path, write: bool = True) -> pd.DataFrame:
    """analysis.records.merge_records before the fast path: stdlib json per line, pa.Table.from_pylist."""
    run_dir = Path(run_dir)
    local = _reference_read_records(run_dir / RECORDS_DIR)
    received = _reference_read_records(run_dir / RECORDS_DIR / RECEIVED_DIR)
    table = pa.Table.from_pylist(local + received, schema=SCHEMA)
    df = table.to_pandas()
    if len(df) and df["request_id"].duplicated().any():
        df = df.drop_duplicates("request_id", keep="first").reset_index(drop=True)
        table = pa.Table.from_pandas(df, schema=SCHEMA, preserve_index=False)
    if write:
        tmp = run_dir / (REQUESTS_FILE + ".tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, run_dir / REQUESTS_FILE)
    return df


def reference_itl_samples(ok: pd.DataFrame) -> np.ndarray:
    """analysis.steps ITL samples before the fast path: the glossary's formula, request by request."""
    return np.array(
        [
            x
            for offs, toks in zip(ok["chunk_offsets_s"], ok["chunk_tokens"])
            for x in glossary.itl_samples_s(list(offs), list(toks))
        ],
        dtype=float,
    )


def reference_cdf_points(sorted_values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """analysis.report's CDF charts before the fast path: every point."""
    return sorted_values, np.arange(1, len(sorted_values) + 1) / len(sorted_values)


def reference_report(run_dir: Path) -> None:
    """`python -m analysis report RUN_DIR` as it was before the fast path, in this process: the reference merge,
    ITL samples and CDF points, and a TTFT marker for every request (the rest is analysis.finish's)."""
    import vllm_loadtest.analysis.report
    import vllm_loadtest.analysis.run
    import vllm_loadtest.analysis.steps
    from vllm_loadtest.analysis.__main__ import main as analysis_main

    with contextlib.ExitStack() as patches:
        for module, name, value in (
            (vllm_loadtest.analysis.run, "merge_records", reference_merge_records),
            (vllm_loadtest.analysis.steps, "itl_samples", reference_itl_samples),
            (vllm_loadtest.analysis.report, "cdf_points", reference_cdf_points),
            (vllm_loadtest.analysis.report, "TIMELINE_POINTS", math.inf),
        ):
            patches.enter_context(mock.patch.object(module, name, value))
        with contextlib.redirect_stdout(io.StringIO()):  # the same table as the fast run's, printed once is enough
            status = analysis_main(["report", str(run_dir)])
    if status != 0:
        raise RuntimeError(f"the reference report of {run_dir} failed")


# --- measuring -----------------------------------------------------------------------------------------------


def timed(command: list[str], run_dir: Path) -> dict:
    """Wall time and peak RSS of one child process analysing run_dir, and the size of the report it wrote."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        proc = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=err)
        # wait4: the resource usage of this child alone (RUSAGE_CHILDREN would be the largest child's so far).
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({proc.returncode}):\n{stderr[-3000:]}")
    return {
        "wall_s": wall,
        "peak_rss_mib": usage.ru_maxrss / 1024,  # KiB on Linux
        "report_mib": (run_dir / "report.html").stat().st_size / 2**20,
        "stdout": stdout,
        "stderr": stderr,
    }


def timed_report(run_dir: Path) -> dict:
    """`python -m analysis report RUN_DIR`, timed."""
    return timed([sys.executable, "-m", "analysis", "report", str(run_dir)], run_dir)


def timed_reference_report(run_dir: Path) -> dict:
    """The same with the reference implementation, timed."""
    return timed([sys.executable, "-m", "tests.benchmarks.bench_analysis", "--reference-report", str(run_dir)], run_dir)


def compare_runs(fast: Path, reference: Path) -> list[str]:
    """Differences between two analysed copies of one run: requests.parquet, steps.csv, summary.json."""
    out = []
    if not pq.read_table(fast / REQUESTS_FILE).equals(pq.read_table(reference / REQUESTS_FILE)):
        out.append("requests.parquet differs")
    if (fast / "steps.csv").read_bytes() != (reference / "steps.csv").read_bytes():
        out.append("steps.csv differs")
    summaries = [json.loads((d / "summary.json").read_text()) for d in (fast, reference)]
    for s in summaries:
        s.pop("run_dir")
    for key in sorted(set(summaries[0]) | set(summaries[1])):
        if summaries[0].get(key) != summaries[1].get(key):
            out.append(f"summary.json {key!r} differs")
    return out


def _print_generated(shape: Shape, figures: dict, seconds: float) -> None:
    print(
        f"generated in {seconds:.1f} s: {figures['requests']:,} requests, {figures['chunks']:,} chunk records "
        f"({shape.chunks_per_request} per request, {shape.workers} worker files"
        f"{' + received/ copies' if shape.received else ''}), {figures['records_bytes'] / 2**20:.0f} MiB of JSON "
        f"lines, a {figures['duration_s'] / 60:.0f}-minute run at {','.join(map(str, shape.steps))} users"
    )


def _print_report(name: str, figures: dict) -> None:
    print(
        f"{name}: {figures['wall_s']:.1f} s wall, peak RSS {figures['peak_rss_mib']:.0f} MiB, "
        f"report.html {figures['report_mib']:.1f} MiB"
    )
    for line in figures["stderr"].splitlines():  # its warnings, e.g. the line cut by a crash
        print(f"  {line}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chunks", type=int, default=Shape.chunks, help="chunk records to generate (default 10 M)")
    ap.add_argument("--chunks-per-request", type=int, default=Shape.chunks_per_request)
    ap.add_argument("--workers", type=int, default=Shape.workers, help="worker files")
    ap.add_argument("--received", action="store_true", help="also the master's copies in records/received/")
    ap.add_argument("--cut-line", action="store_true", help="the first worker's file ends in a line cut by a crash")
    ap.add_argument("--reference", action="store_true", help="also time the reference implementation and compare")
    ap.add_argument("--small", action="store_true", help="a small run with a cut line and received/ copies; implies "
                    "--reference")  # fmt: skip
    ap.add_argument("--keep", type=Path, help="generate into DIR/run and keep it (default: a temp dir)")
    ap.add_argument("--reuse", action="store_true", help="with --keep: analyse the run generated there before")
    ap.add_argument("--reference-report", type=Path, help=argparse.SUPPRESS)  # the reference's child process
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.reference_report is not None:
        reference_report(args.reference_report)
        return 0
    if args.small:
        shape = SMALL
    else:
        shape = Shape(
            chunks=args.chunks,
            chunks_per_request=args.chunks_per_request,
            workers=args.workers,
            received=args.received,
            cut_line=args.cut_line,
        )
    base = Path(tempfile.mkdtemp(prefix="bench_analysis_")) if args.keep is None else args.keep
    try:
        run_dir = base / "run"
        if args.reuse and (run_dir / "run.json").exists():
            print(f"analysing the run generated before in {run_dir}")
        else:
            t = time.perf_counter()
            figures = generate_run(run_dir, shape)
            _print_generated(shape, figures, time.perf_counter() - t)
        reference = base / "reference"
        if args.small or args.reference:
            shutil.rmtree(reference, ignore_errors=True)
            shutil.copytree(run_dir, reference)
        _print_report("python -m analysis report", timed_report(run_dir))
        if not (args.small or args.reference):
            return 0
        _print_report("the reference implementation", timed_reference_report(reference))
        diffs = compare_runs(run_dir, reference)
        print(
            "fast path against the reference: "
            + ("; ".join(diffs) if diffs else "requests.parquet, steps.csv and summary.json identical")
        )
        return 1 if diffs else 0
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
