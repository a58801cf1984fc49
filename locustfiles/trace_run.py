"""Trace replay (--trace): every row of a timestamped trace sent once, open loop, at its offset from the replay's
start, by the pool of --max-users users; the run ends when the last row has been answered (or at --run-time).

The trace is read (analysis/trace.py) and its prompts synthesized (locustfiles/trace_prompts.py) the same way in
every load process, from the same options, so all of them hold the same rows and the same texts. The replay is
cut into windows of --step-duration of replay time; each window is a step whose rate is the rows scheduled in it
per second, so the step table, its open-loop columns and the report's per-step charts show the trace's load over
time. Every process sends only its shard of the rows (`Trace.shard(rank, processes)`, the ranks the controller
gave), so each row is sent by exactly one process.

The sequence, on the controller (the master, or the only process of a local run): the pool of users is spawned;
each load process builds its replay (the trace, its prompts, the first request bodies) and says it is ready; the
controller starts the replay (`StepTracker.begin_trace`: the windows' timeline, and the ranks sent to the
workers); each process reports when all of its rows have been answered; when all have, the shape ends the run.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import gevent
import numpy as np
from gevent.event import Event

from ..analysis.trace import Trace, TraceError, ideal_prefix_hit_rate, load_trace
from ..analysis.trace import summary as trace_summary
from . import options as opts_mod
from . import request_options
from .declare import option
from .trace_prompts import TracePrompts

logger = logging.getLogger("vllm_loadtest")


@dataclass(frozen=True)
class TraceOptions:
    """--trace: a trace file's arrivals and lengths replayed."""

    GROUP: ClassVar[str] = "Load plan"

    trace: str = option(
        "--trace",
        "",
        "Replay a timestamped trace instead of --steps/--rates: each row sent once, open loop, at its time",
    )
    trace_format: str = option(
        "--trace-format",
        "auto",
        "With --trace: mooncake (JSONL: timestamp ms, input_length, output_length, hash_ids), azure (CSV: "
        "TIMESTAMP, ContextTokens, GeneratedTokens) or jsonl (timestamp s or ms, prompt or input_length, "
        "output_length); auto detects it from the content",
        choices=["auto", "mooncake", "azure", "jsonl"],
    )
    trace_speed: float = option(
        "--trace-speed",
        1.0,
        "With --trace: replay speed (2 = twice as fast: every gap between rows halved)",
    )
    trace_start: str = option(
        "--trace-start",
        "0s",
        "With --trace: replay from this offset into the trace (e.g. 10m), in the trace's own time",
    )
    trace_duration: str = option(
        "--trace-duration",
        "",
        "With --trace: replay only this much of the trace from --trace-start (e.g. 5m), in the trace's own "
        "time. Default: to the end",
    )
    trace_block_tokens: int = option(
        "--trace-block-tokens",
        512,
        "With --trace: tokens per hash_id block (Mooncake's 512): rows sharing a hash_id share that text block",
    )


READY_MESSAGE = "vllm_loadtest_trace_ready"  # worker -> master: {"error": str | None}
BEGIN_MESSAGE = "vllm_loadtest_trace_begin"  # master -> worker: {"ranks", "window_s", "warmup_s", "users"}
DONE_MESSAGE = "vllm_loadtest_trace_done"  # worker -> master: {"rows": answered}
# Request bodies built ahead of the schedule by each process, in its rows' order: a prompt synthesized at send time
# (a long text joined and serialized) would delay its send stamp. Bounded (a 12,000-token prompt is ~60 KB), so a
# long trace holds no copy of every body in memory.
LOOKAHEAD_ROWS = 256
USERS_WAIT_S = 10.0  # the replay starts once the pool is spawned, or after this long with the users there are


def active(options) -> bool:
    """The run replays a trace (--trace given)."""
    return bool(str(options.trace or "").strip())


def slice_of(options) -> tuple[float, float | None, float]:
    """(--trace-start s, --trace-duration s or None, --trace-speed) from the options; raises ValueError."""
    start = opts_mod.parse_duration(options.trace_start or "0s", "--trace-start", allow_zero=True)
    text = str(options.trace_duration or "").strip()
    duration = opts_mod.parse_duration(text, "--trace-duration") if text else None
    try:
        speed = float(options.trace_speed)
    except (TypeError, ValueError):
        raise ValueError(f"--trace-speed {options.trace_speed!r} is not a number; use e.g. --trace-speed 2") from None
    if not math.isfinite(speed) or speed <= 0:
        raise ValueError(f"--trace-speed {options.trace_speed} must be positive; use e.g. --trace-speed 2")
    return start, duration, speed


def check(options, traces: Traces | None = None) -> None:
    """The --trace options, and the trace itself (read here, before any load); raises ValueError with a one-line
    fix. Without --trace, the other --trace-* flags changed from their defaults are refused: they would do
    nothing."""
    if not active(options):
        for name, attr, default in (
            ("--trace-speed", "trace_speed", 1.0),
            ("--trace-start", "trace_start", "0s"),
            ("--trace-duration", "trace_duration", ""),
            ("--trace-block-tokens", "trace_block_tokens", 512),
            ("--trace-format", "trace_format", "auto"),
        ):
            value = getattr(options, attr)
            if str(value).strip() != str(default):
                raise ValueError(f"{name} {value} only applies with --trace; add --trace PATH or drop {name}")
        return
    trace = options.trace
    for given, name in (
        (options.rates, "--rates"),
        (options.find_capacity, "--find-capacity"),
    ):
        if str(given or "").strip():
            raise ValueError(f"--trace {trace} sets the load itself (its rows' times): drop {name} {given}")
    if str(options.turns).strip() != "1":
        raise ValueError(f"--trace {trace} replays single requests, not conversations: drop --turns {options.turns}")
    if options.steps != opts_mod.DEFAULT_STEPS:
        raise ValueError(f"--trace {trace} sets the load itself (its rows' times): drop --steps {options.steps}")
    if str(options.step_duration).strip().lower() == "auto":
        raise ValueError(
            f"--step-duration auto does not apply to --trace: the steps are fixed windows of the replay; give e.g. "
            f"--step-duration {opts_mod.DEFAULT_STEP_DURATION}"
        )
    if str(options.dataset or "fixed").strip() != "fixed":
        raise ValueError(f"--trace {trace} gives the prompts (its rows' lengths): drop --dataset {options.dataset}")
    if str(options.max_tokens_dist or "").strip():
        raise ValueError(
            f"--trace {trace} gives each request's max_tokens (its rows' output lengths): drop --max-tokens-dist "
            f"{options.max_tokens_dist}"
        )
    try:
        blocks = int(options.trace_block_tokens)
    except (TypeError, ValueError):
        raise ValueError(f"--trace-block-tokens {options.trace_block_tokens!r} is not a number of tokens") from None
    if blocks < 1:
        raise ValueError(f"--trace-block-tokens {blocks} must be at least 1 (Mooncake's traces use 512)")
    if options.max_users < 1:
        raise ValueError(f"--max-users {options.max_users} must be at least 1")
    trace = load(options, traces)
    # The warm-up applies to the first window, which is shorter than --step-duration when the replay is.
    warmup = opts_mod.parse_duration(options.step_warmup, "--step-warmup", allow_zero=True)
    first = min(opts_mod.parse_duration(options.step_duration, "--step-duration"), span_s(trace, options))
    if warmup > 0 and warmup >= first:
        raise ValueError(
            f"--step-warmup {options.step_warmup} covers the replay's whole first window ({first:g} s of "
            f"{len(trace)} rows): nothing of it would be measured; give --step-warmup 0s or a shorter one"
        )


class Traces:
    """The process's trace, read once (the checks, the preflight, the shape and the users all ask); one at a time: a
    100,000-row trace's arrays are not kept twice. Held by the process's RunContext (preflight.Built.traces)."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._trace: Trace | None = None

    def load(self, options) -> Trace:
        key = _trace_key(options)
        if key != self._key or self._trace is None:
            self._trace, self._key = _read(options, key), key
        return self._trace


def _trace_key(options) -> tuple:
    path = str(options.trace)
    try:
        stat = os.stat(path)
        version = (stat.st_mtime_ns, stat.st_size)
    except OSError:
        version = None  # load_trace says what is wrong with it
    return (path, version, options.trace_format or "auto", *slice_of(options))


def load(options, traces: Traces | None = None) -> Trace:
    """The run's trace, its slice and speed applied (read through `traces` when given, else read now); raises
    TraceError (a ValueError) naming the file, the line and the fix."""
    return traces.load(options) if traces is not None else _read(options, _trace_key(options))


def _read(options, key: tuple) -> Trace:
    start, duration, speed = slice_of(options)
    trace = load_trace(options.trace, key[2], start_s=start, duration_s=duration, speed=speed)
    if len(trace) == 0:
        raise TraceError(
            f"--trace {options.trace}: no row in the replayed slice (--trace-start {options.trace_start}, "
            f"--trace-duration {options.trace_duration or 'to the end'}); choose a slice that holds rows"
        )
    return trace


def span_s(trace: Trace, options) -> float:
    """The replay's length (s of replay time): up to its last row, and the whole --trace-duration slice when given
    (its windows then cover the slice asked for, empty ones included)."""
    last = float(trace.offsets_s[-1]) if len(trace) else 0.0
    _, duration, speed = slice_of(options)
    return max(last, duration / speed if duration is not None else 0.0)


def windows(offsets_s: np.ndarray, span: float, window_s: float) -> list[tuple[float, float, int]]:
    """The replay's steps: window k = [k * window_s, min((k + 1) * window_s, span)) of replay time (the last one
    closed, so the last row is in it), with the rows scheduled in it; (start, end, rows) each."""
    n = max(1, math.ceil(span / window_s - 1e-9))
    index = window_of(offsets_s, window_s, n)
    counts = np.bincount(index, minlength=n) if len(index) else np.zeros(n, dtype=np.int64)
    return [(k * window_s, min((k + 1) * window_s, span), int(counts[k])) for k in range(n)]


def window_of(offsets_s: np.ndarray, window_s: float, n: int) -> np.ndarray:
    """The window index of each offset: floor(offset / window_s), the last window holding the replay's end."""
    return np.minimum(np.floor(np.asarray(offsets_s, dtype=float) / window_s).astype(np.int64), n - 1)


def window_rate(start: float, end: float, rows: int, window_s: float) -> float:
    """A window's rate_rps = rows / its length (window_s, shorter for the last; window_s when it is empty)."""
    length = end - start
    return rows / (length if length > 0 else window_s)


def info(trace: Trace, options, prompts: dict | None = None, ideal: float | None = None) -> dict:
    """run.json's and summary.json's `trace`: the file, its format, the slice and speed, the rows replayed, how the
    prompts were built (TracePrompts.info) and the trace's own prefix reuse (analysis.trace.ideal_prefix_hit_rate:
    the hit rate of a cache that never evicts, to read the server's measured one against)."""
    start, duration, speed = slice_of(options)
    return {
        "prompts": prompts,
        "ideal_prefix_hit_rate": None if ideal is None or math.isnan(ideal) else ideal,
        "path": str(trace.path),
        "format": trace.format,
        "rows": len(trace),
        "speed": speed,
        "start_s": start,
        "duration_s": duration,
        "span_s": span_s(trace, options),
        "total_rows": int(getattr(trace, "total_rows", 0) or 0) or None,
        "first_row": int(trace.rows[0]) if len(trace) else None,
        "last_row": int(trace.rows[-1]) if len(trace) else None,
        "block_tokens": int(options.trace_block_tokens),
    }


class Replay:
    """One process's replay: the trace, its prompts, and the request bodies of its rows built ahead of their
    times (`LOOKAHEAD_ROWS` at most), in the order they are due."""

    def __init__(self, trace: Trace, prompts: TracePrompts, notes: list[str]) -> None:
        self.trace = trace
        self.prompts = prompts
        self.notes = notes
        # (prompt, max_tokens) -> the request's JSON body: the user's build_payload with the run's options and model
        self._payload: Callable[[object, int], dict] | None = None
        self._bodies: dict[int, bytes] = {}
        self._order: np.ndarray = np.arange(len(trace))
        self._next = 0  # the next position of _order to build
        self._room = Event()
        self._room.set()
        self._greenlet: gevent.Greenlet | None = None

    def body(self, position: int) -> tuple[bytes, int]:
        """The request body of the row at `position` and its max_tokens (the row's output length): built ahead,
        else now."""
        body = self._bodies.pop(position, None)
        if body is None:
            body = self.build(position)
        self._room.set()
        return body, int(self.trace.output_tokens[position])

    def build(self, position: int) -> bytes:
        prompt = self.prompts.prompt(position)
        return json.dumps(self._payload(prompt, int(self.trace.output_tokens[position]))).encode()

    def prefetch(
        self, positions: np.ndarray, payload: Callable[[object, int], dict], first: int = LOOKAHEAD_ROWS
    ) -> None:
        """From now on, build the bodies of `positions` (this process's rows, in the order they are due) with
        `payload` ahead of their sends; the first `first` are built before this returns."""
        self.stop()
        self._payload = payload
        self._bodies.clear()
        self._order, self._next = np.asarray(positions, dtype=np.int64), 0
        self._fill(min(first, LOOKAHEAD_ROWS))
        self._greenlet = gevent.spawn(self._loop)

    def _fill(self, limit: int) -> None:
        order = self._order
        while self._next < len(order) and len(self._bodies) < limit:
            position = int(order[self._next])
            self._next += 1
            self._bodies[position] = self.build(position)

    def _loop(self) -> None:
        while self._next < len(self._order):
            self._room.wait()
            self._room.clear()
            # A few rows at a time, then yield: the users' sends and reads come first.
            while self._next < len(self._order) and len(self._bodies) < LOOKAHEAD_ROWS:
                self._fill(len(self._bodies) + 8)
                gevent.sleep(0)

    def stop(self) -> None:
        if self._greenlet is not None:
            self._greenlet.kill(block=False)
            self._greenlet = None


def build_replay(options, host: str, model: str, api_key: str | None = None, traces: Traces | None = None) -> Replay:
    """The replay of --trace for this process: the trace and its prompts, synthesized to each row's input length
    with the server's tokenizer (the profile's endpoint, as datasets.build_dataset gets it), estimated with a
    warning without one."""
    from .datasets import server_tokenizer

    trace = load(options, traces)
    tokenizer = server_tokenizer(host, model, api_key, options)
    why = tokenizer.probe()
    notes: list[str] = list(getattr(trace, "notes", ()) or ())
    try:
        # The tokenizer is asked while the prompts are calibrated, never per row.
        prompts = TracePrompts(
            trace, options.endpoint, int(options.trace_block_tokens), int(options.seed or 0),
            tokenizer if why is None else None, notes,
        )  # fmt: skip
    finally:
        tokenizer.close()
    for note in notes:
        logger.warning("%s", note)
    return Replay(trace, prompts, notes)


def replay_key(options, host: str, model: str) -> tuple:
    """Everything a built replay depends on."""
    return (
        _trace_key(options), host, model, options.endpoint, int(options.seed or 0),
        int(options.trace_block_tokens), bool(options.ignore_eos), options.max_tokens, options.temperature,
        options.server_profile, bool(options.no_continuous_usage),
        request_options.tokenize_key(options),  # the prompts are counted with the tools and template arguments
    )  # fmt: skip


def preflight(
    options, host: str, model: str, api_key: str | None, load_only: bool = False, traces: Traces | None = None
) -> Replay | None:
    """Before any load: the trace reads, and (in a load process) its prompts can be built against the server: the
    replay, for the process's users to take (None with load_only); raises ValueError (TraceError, DatasetError) with
    a one-line fix."""
    load(options, traces)
    return None if load_only else build_replay(options, host, model, api_key, traces)


def register(environment, ctx) -> None:
    """run.json's `trace` section (the file, its format, the slice, speed and rows replayed: ProcessResources keeps
    it), first written by the controller as the run starts, from the trace read once here."""
    ctx.sections["trace"] = lambda: ctx.resources.trace_info
    if not ctx.is_controller:
        return

    def on_started(options, **_kw) -> None:
        if not active(options):
            return
        try:
            trace = load(options, ctx.resources.traces)
            blocks = int(options.trace_block_tokens)
            logger.info("Trace: %s", trace_summary(trace, blocks))
            ctx.resources.trace_info = info(trace, options, ideal=ideal_prefix_hit_rate(trace, blocks))
        except ValueError:
            ctx.resources.trace_info = None  # checked before the run: the users say it again

    ctx.run_events.started.add_listener(on_started)
