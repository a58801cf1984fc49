"""The load-time half of trace replay: reading a 100,000-row Mooncake trace and synthesizing its prompts. Run on
demand, prints figures (issue 17: a 100,000-row trace must start within 10 s).

.venv/bin/python -m tests.benchmarks.bench_trace_load [--rows 100000] [--mean-input 12000] [--rate 200]

`write_mooncake_trace` is reusable (the replay benchmark sends such a trace to the fake server).
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
from vllm_loadtest.analysis.trace import load_trace
from vllm_loadtest.locustfiles.datasets import Tokenizer
from vllm_loadtest.locustfiles.trace_prompts import TracePrompts

from tests.fakeserver import count_tokens
from tests.helpers.servers import FakeServer


def write_mooncake_trace(
    path: Path, rows: int, rate: float = 200.0, mean_input: int = 12000, seed: int = 0, block: int = 512
) -> Path:
    """A Mooncake-format trace shaped like the FAST'25 conversation trace: Poisson arrivals at `rate`, one system
    prompt block (hash_id 0) shared by every row, conversations whose turns resend the previous turn's blocks and
    add their own, lognormal input lengths of mean `mean_input`, outputs of mean ~340 tokens."""
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1000.0 / rate, rows)).astype(np.int64)
    lengths = np.maximum(block + 1, rng.lognormal(np.log(mean_input) - 0.5, 1.0, rows)).astype(np.int64)
    outputs = np.maximum(1, rng.lognormal(np.log(340) - 0.5, 1.0, rows)).astype(np.int64)
    next_id = 1
    open_conversations: list[list[int]] = []
    with open(path, "w") as f:
        for i in range(rows):
            blocks = -(-int(lengths[i]) // block)
            if open_conversations and rng.random() < 0.6:  # a later turn: the history's blocks first
                history = open_conversations.pop(int(rng.integers(len(open_conversations))))
                ids = history[:blocks]
            else:
                ids = [0]
            fresh = max(0, blocks - len(ids))
            ids = ids + list(range(next_id, next_id + fresh))
            next_id += fresh
            if len(open_conversations) < 1000:
                open_conversations.append(ids)
            row = {"timestamp": int(times[i]), "input_length": int(lengths[i]), "output_length": int(outputs[i]),
                   "hash_ids": ids}  # fmt: skip
            f.write(json.dumps(row) + "\n")
    return path


def write_azure_trace(path: Path, rows: int, rate: float = 200.0, seed: int = 0) -> Path:
    """An Azure-format CSV (the 2023 release's header, CRLF and 7 fractional digits), Poisson arrivals at `rate`."""
    rng = np.random.default_rng(seed)
    start = np.datetime64("2023-11-16T18:15:46.680590000", "ns")
    gaps = np.cumsum(rng.exponential(1e9 / rate, rows)).astype("timedelta64[ns]")
    stamps = np.datetime_as_string(start + gaps, unit="us")
    contexts, generated = rng.integers(1, 8000, rows), rng.integers(1, 500, rows)
    with open(path, "w", newline="") as f:
        f.write("TIMESTAMP,ContextTokens,GeneratedTokens\r\n")
        f.writelines(f"{t.replace('T', ' ')}0,{c},{g}\r\n" for t, c, g in zip(stamps, contexts, generated, strict=True))
    return path


class InProcessTokenizer:
    """tests/fakeserver.py's counting rule without HTTP: the calibration's own cost, not the network's."""

    max_model_len = None

    def __init__(self) -> None:
        self.calls = 0

    def count(self, prompt, special: bool = True) -> int:
        self.calls += 1
        return count_tokens(messages=prompt) if isinstance(prompt, list) else count_tokens(prompt, special=special)


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--mean-input", type=int, default=12_000, help="mean prompt tokens (Mooncake's: 12,035)")
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--build", type=int, default=0, help="build only this many prompts (0: all)")
    a = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.jsonl"
        t0 = time.perf_counter()
        write_mooncake_trace(path, a.rows, a.rate, a.mean_input)
        size = path.stat().st_size / 1e6
        print(f"wrote {a.rows:,} rows ({size:.1f} MB) in {time.perf_counter() - t0:.1f} s")

        t0 = time.perf_counter()
        trace = load_trace(str(path))
        load_s = time.perf_counter() - t0
        distinct = len({h for ids in trace.hash_ids for h in ids})
        print(
            f"load_trace: {load_s:.2f} s ({load_s / len(trace) * 1e6:.1f} us/row); {len(trace):,} rows over "
            f"{trace.duration_s:.0f} s, {distinct:,} distinct hash_ids; max RSS {rss_mb():.0f} MB"
        )

        azure = write_azure_trace(Path(tmp) / "azure.csv", a.rows, a.rate)
        t0 = time.perf_counter()
        rows = len(load_trace(str(azure)))
        print(f"load_trace (azure CSV, {rows:,} rows): {time.perf_counter() - t0:.2f} s")

        for endpoint in ("completions", "chat"):
            t0 = time.perf_counter()
            prompts = TracePrompts(trace, endpoint, 512, 0, InProcessTokenizer(), [])
            setup_s = time.perf_counter() - t0
            print(f"TracePrompts setup ({endpoint}, in-process tokenizer): {setup_s * 1000:.0f} ms, "
                  f"{prompts.info['tokenize_calls']} tokenizer calls")  # fmt: skip

        server = FakeServer([])
        try:
            tok = Tokenizer(server.url, "fake-model")
            assert tok.probe() is None
            t0 = time.perf_counter()
            prompts = TracePrompts(trace, "completions", 512, 0, tok, [])
            setup_s = time.perf_counter() - t0
            tok.close()
            print(f"TracePrompts setup (completions, fake server's /tokenize over HTTP): {setup_s:.2f} s, "
                  f"{prompts.info['tokenize_calls']} calls")  # fmt: skip
        finally:
            server.stop()
        print(f"start (load + setup over HTTP): {load_s + setup_s:.2f} s")

        n = a.build or len(trace)
        t0 = time.perf_counter()
        chars = 0
        slowest = 0.0
        for i in range(n):
            s = time.perf_counter()
            chars += len(prompts.prompt(i))
            slowest = max(slowest, time.perf_counter() - s)
        build_s = time.perf_counter() - t0
        print(
            f"built {n:,} prompts in {build_s:.2f} s: {build_s / n * 1e6:.0f} us each (slowest {slowest * 1e3:.2f} "
            f"ms), {chars / n / 1e3:.0f} kB on average; max RSS {rss_mb():.0f} MB"
        )


if __name__ == "__main__":
    main()
