"""Reading timestamped request traces (`--trace`): Mooncake JSONL, the Azure LLM inference CSV, generic JSONL.

    mooncake  one JSON object a line: {"timestamp": ms, "input_length": N, "output_length": N, "hash_ids": [...]}
              (kvcache-ai/Mooncake FAST25-release/traces/*.jsonl; hash_ids are 512-token prefix blocks)
    azure     CSV with the header TIMESTAMP,ContextTokens,GeneratedTokens; TIMESTAMP a date and time such as
              "2023-11-16 18:15:46.6805900" (2023) or "2024-05-10 00:00:00.009930+00:00" (2024)
    jsonl     one JSON object a line: a time ("timestamp_s" seconds, "timestamp_ms" milliseconds, or "timestamp":
              milliseconds when every value in the file is a JSON integer, seconds when any has a decimal point or
              an exponent), "prompt" (text, sent as given) or "input_length" (tokens), and "output_length"

A trace is loaded whole, sorted by time (stable: rows with the same time keep their file order), sliced in the
trace's own time (--trace-start, --trace-duration) and scaled by --trace-speed. Each kept row keeps its 0-based
index among the file's data rows (the record's `trace_row`). Pure: no Locust, no network.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass

import numpy as np
import orjson
import pandas as pd

FORMATS = ("mooncake", "azure", "jsonl")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
JSONL_TIME_KEYS = ("timestamp_s", "timestamp_ms", "timestamp")


class TraceError(ValueError):
    """Bad trace input; the message is one line naming the file and line (or the flag) and the fix."""


@dataclass(frozen=True)
class Trace:
    """The selected rows of a trace file, sorted by their intended send time."""

    path: str
    format: str
    rows: np.ndarray  # int64: each row's 0-based index among the file's data rows (trace_row)
    offsets_s: np.ndarray  # float64, ascending: (timestamp - (first timestamp + start_s)) / speed
    input_tokens: np.ndarray  # int64; -1 where the row gives its prompt text instead
    output_tokens: np.ndarray  # int64
    hash_ids: list[tuple[int, ...]] | None  # mooncake's, per selected row; None for other formats
    prompts: list[str | None] | None  # generic jsonl rows that give a `prompt`; else None
    # Added to the agreed interface (defaults, at the end):
    total_rows: int = 0  # data rows in the file, before slicing
    time_unit: str = ""  # how the file's timestamps were read: "ms", "s" or "datetime"
    notes: tuple[str, ...] = ()  # one-line remarks for the log and run.json (e.g. how "timestamp" was read)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def duration_s(self) -> float:
        """Offset of the last selected row (0 for an empty slice)."""
        return float(self.offsets_s[-1]) if len(self.offsets_s) else 0.0

    def shard(self, rank: int, processes: int) -> np.ndarray:
        """Positions i (into the arrays) with i % processes == rank: every row sent by exactly one process."""
        if processes < 1 or not 0 <= rank < processes:
            raise ValueError(f"shard({rank}, {processes}): rank must be in 0..processes-1")
        return np.arange(rank, len(self.rows), processes, dtype=np.int64)


def _open_error(path: str, e: OSError) -> TraceError:
    return TraceError(f"--trace {path}: {e.strerror or e}; pass a readable trace file")


def detect_format(path: str) -> str:
    """The format from the content's first non-empty line: a CSV header naming TIMESTAMP or ContextTokens is
    azure, a JSON object with hash_ids is mooncake, any other JSON object is jsonl."""
    try:
        with open(path, "rb") as f:
            if f.read(2) == b"\x1f\x8b":
                raise TraceError(f"--trace {path} is gzip-compressed; decompress it first (gunzip -k {path})")
            f.seek(0)
            for lineno, raw in enumerate(f, 1):
                line = raw.strip()
                if lineno == 1:
                    line = line.removeprefix(b"\xef\xbb\xbf").strip()
                if not line:
                    continue
                if line.startswith(b"{"):
                    try:
                        obj = orjson.loads(line)
                    except orjson.JSONDecodeError as e:
                        raise TraceError(
                            f"{path}:{lineno}: not JSON ({e}); fix the line or pass --trace-format"
                        ) from None
                    return "mooncake" if isinstance(obj, dict) and "hash_ids" in obj else "jsonl"
                columns = {c.strip().strip('"') for c in line.decode("utf-8", "replace").split(",")}
                if "TIMESTAMP" in columns or "ContextTokens" in columns:
                    return "azure"
                break
            else:
                raise TraceError(f"--trace {path} is empty; pass a trace file with at least one row")
    except OSError as e:
        raise _open_error(path, e) from None
    raise TraceError(
        f"{path}:{lineno}: not a known trace format (expected a JSON object per line or the CSV header "
        f"{','.join(AZURE_COLUMNS)}); pass --trace-format {'|'.join(FORMATS)} or convert the file"
    )


def _number(path: str, lineno: int, obj: dict, key: str, example: str) -> float:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        what = "missing" if value is None else f"{value!r} is not a non-negative number"
        raise TraceError(f'{path}:{lineno}: "{key}" {what}; each line needs e.g. {example}')
    return value


def _count(path: str, lineno: int, obj: dict, key: str, example: str, minimum: int = 1) -> int:
    value = obj.get(key)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        what = "missing" if value is None else f"{value!r} is not an integer >= {minimum}"
        raise TraceError(f'{path}:{lineno}: "{key}" {what}; each line needs e.g. {example}')
    return value


MOONCAKE_EXAMPLE = '{"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47]}'
JSONL_EXAMPLE = (
    '{"timestamp_s": 1.5, "input_length": 128, "output_length": 64} or '
    '{"timestamp_s": 1.5, "prompt": "Hi", "output_length": 64}'
)


def _json_lines(path: str):
    """(line number, parsed object) of every non-empty line; TraceError on a line that is not a JSON object."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise _open_error(path, e) from None
    # Line by line, not the whole file at once: a 100,000-row trace's bytes and lines would double the peak memory.
    with f:
        if f.read(2) == b"\x1f\x8b":
            raise TraceError(f"--trace {path} is gzip-compressed; decompress it first (gunzip -k {path})")
        f.seek(0)
        for lineno, line in enumerate(f, 1):
            if lineno == 1:
                line = line.removeprefix(b"\xef\xbb\xbf")
            if not line.strip():
                continue
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError as e:
                raise TraceError(f"{path}:{lineno}: not JSON ({e}); each line must be one JSON object") from None
            if not isinstance(obj, dict):
                raise TraceError(f"{path}:{lineno}: not a JSON object; each line must be one object, e.g. {{...}}")
            yield lineno, obj


def _read_mooncake(path: str):
    times, inputs, outputs, hashes, lines = [], [], [], [], []
    for lineno, obj in _json_lines(path):
        times.append(_number(path, lineno, obj, "timestamp", MOONCAKE_EXAMPLE))
        inputs.append(_count(path, lineno, obj, "input_length", MOONCAKE_EXAMPLE))
        outputs.append(_count(path, lineno, obj, "output_length", MOONCAKE_EXAMPLE))
        ids = obj.get("hash_ids")
        if not isinstance(ids, list) or not all(type(h) is int for h in ids) or min(ids, default=0) < 0:
            what = "missing" if ids is None else "is not a list of non-negative integers"
            raise TraceError(f'{path}:{lineno}: "hash_ids" {what}; each line needs e.g. {MOONCAKE_EXAMPLE}')
        hashes.append(tuple(ids))
        lines.append(lineno)
    # Mooncake's timestamps are milliseconds from the trace's start.
    return np.asarray(times, dtype=np.float64) / 1000.0, inputs, outputs, hashes, None, lines, "ms", []


def _read_jsonl(path: str):
    times, inputs, outputs, prompts, lines = [], [], [], [], []
    key = None
    integers = True
    for lineno, obj in _json_lines(path):
        if key is None:
            key = next((k for k in JSONL_TIME_KEYS if k in obj), None)
            if key is None:
                raise TraceError(f"{path}:{lineno}: no timestamp_s, timestamp_ms or timestamp; e.g. {JSONL_EXAMPLE}")
        elif key not in obj:
            raise TraceError(
                f'{path}:{lineno}: "{key}" missing (the first row uses it, so every row must); e.g. {JSONL_EXAMPLE}'
            )
        t = _number(path, lineno, obj, key, JSONL_EXAMPLE)
        integers = integers and isinstance(t, int)
        times.append(t)
        prompt = obj.get("prompt")
        if prompt is not None:
            if not isinstance(prompt, str) or not prompt:
                raise TraceError(f'{path}:{lineno}: "prompt" must be non-empty text; e.g. {JSONL_EXAMPLE}')
            inputs.append(-1)
        elif "input_length" in obj:
            inputs.append(_count(path, lineno, obj, "input_length", JSONL_EXAMPLE))
        else:
            raise TraceError(f'{path}:{lineno}: neither "prompt" nor "input_length"; e.g. {JSONL_EXAMPLE}')
        prompts.append(prompt)
        outputs.append(_count(path, lineno, obj, "output_length", JSONL_EXAMPLE))
        lines.append(lineno)
    notes = []
    if key == "timestamp_s" or (key == "timestamp" and not integers):
        unit, scale = "s", 1.0
    else:
        unit, scale = "ms", 1000.0
    if key == "timestamp":
        how = "milliseconds (every value is an integer)" if unit == "ms" else "seconds (a value has a decimal point)"
        notes.append(f'{path}: "timestamp" read as {how}; write "timestamp_s" or "timestamp_ms" to say the unit')
    return (
        np.asarray(times, dtype=np.float64) / scale,
        inputs,
        outputs,
        None,
        prompts if any(p is not None for p in prompts) else None,
        lines,
        unit,
        notes,
    )


def _undecodable_line(path: str) -> int:
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                return lineno
    return 1


def _read_azure(path: str):
    try:
        f = open(path, encoding="utf-8-sig", newline="")
    except OSError as e:
        raise _open_error(path, e) from None
    with f:
        reader = csv.reader(f)
        try:
            header = None
            for header in reader:
                if header:
                    break
            if not header:
                raise TraceError(f"--trace {path} is empty; pass a trace file with at least one row")
            names = [h.strip() for h in header]
            missing = [c for c in AZURE_COLUMNS if c not in names]
            if missing:
                raise TraceError(
                    f"{path}:{reader.line_num}: no column {', '.join(missing)}; the Azure header is "
                    f"{','.join(AZURE_COLUMNS)}"
                )
            it, ic, ig = (names.index(c) for c in AZURE_COLUMNS)
            width = max(it, ic, ig) + 1
            stamps, contexts, generated, lines = [], [], [], []
            for row in reader:
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                if len(row) < width:
                    raise TraceError(
                        f"{path}:{reader.line_num}: {len(row)} column(s), the header has {len(names)}; "
                        "every row needs TIMESTAMP,ContextTokens,GeneratedTokens"
                    )
                stamps.append(row[it].strip())
                contexts.append(row[ic].strip())
                generated.append(row[ig].strip())
                lines.append(reader.line_num)
        except UnicodeDecodeError:
            raise TraceError(f"{path}:{_undecodable_line(path)}: not UTF-8 text; save the CSV as UTF-8") from None
        except csv.Error as e:
            raise TraceError(f"{path}:{reader.line_num}: not CSV ({e}); fix the row") from None
    if not lines:
        return np.zeros(0), [], [], None, None, [], "datetime", []

    def integers(values: list[str], column: str, minimum: int) -> np.ndarray:
        numbers = pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").to_numpy(dtype=np.float64)
        bad = ~(np.isfinite(numbers) & (numbers >= minimum) & (numbers == np.floor(numbers)))
        if bad.any():
            i = int(np.argmax(bad))
            raise TraceError(
                f"{path}:{lines[i]}: {column} {values[i]!r} is not an integer >= {minimum}; fix or drop the row"
            )
        return numbers.astype(np.int64)

    contexts_a = integers(contexts, "ContextTokens", 1)
    generated_a = integers(generated, "GeneratedTokens", 1)
    # ISO8601 takes both releases (7 fractional digits in 2023, "+00:00" in 2024); naive times are taken as UTC.
    when = pd.to_datetime(pd.Series(stamps), format="ISO8601", utc=True, errors="coerce")
    nat = when.isna().to_numpy()
    if nat.any():
        i = int(np.argmax(nat))
        raise TraceError(
            f"{path}:{lines[i]}: TIMESTAMP {stamps[i]!r} is not a date and time; write e.g. 2023-11-16 18:15:46.6805900"
        )
    ns = when.to_numpy(dtype="datetime64[ns]").astype(np.int64)
    # Seconds from the earliest row, computed in integer ns so a day-long trace keeps sub-microsecond precision.
    seconds = (ns - ns.min()).astype(np.float64) / 1e9
    return seconds, contexts_a, generated_a, None, None, lines, "datetime", []


READERS = {"mooncake": _read_mooncake, "azure": _read_azure, "jsonl": _read_jsonl}


def load_trace(
    path: str, fmt: str = "auto", start_s: float = 0.0, duration_s: float | None = None, speed: float = 1.0
) -> Trace:
    """The rows with first_ts + start_s <= ts < first_ts + start_s + duration_s, sorted by ts (stable), each at
    offset (ts - (first_ts + start_s)) / speed; raises TraceError with a one-line fix."""
    if not (isinstance(speed, int | float) and math.isfinite(speed) and speed > 0):
        raise TraceError(f"--trace-speed {speed} must be a positive number (2 = twice as fast)")
    if not (math.isfinite(start_s) and start_s >= 0):
        raise TraceError(f"--trace-start {start_s} must be a non-negative duration (e.g. 10m)")
    if duration_s is not None and not (math.isfinite(duration_s) and duration_s > 0):
        raise TraceError(f"--trace-duration {duration_s} must be a positive duration (e.g. 5m)")
    fmt = (fmt or "auto").strip().lower()
    if fmt == "auto":
        fmt = detect_format(path)
    if fmt not in READERS:
        raise TraceError(f"--trace-format {fmt!r} is not a trace format; use auto or one of {', '.join(FORMATS)}")
    seconds, inputs, outputs, hashes, prompts, lines, unit, notes = READERS[fmt](path)
    total = len(lines)
    if total == 0:
        raise TraceError(f"--trace {path} has no data rows; pass a trace with at least one row")
    seconds = np.asarray(seconds, dtype=np.float64)
    order = np.argsort(seconds, kind="stable")
    if np.any(order != np.arange(total)):
        notes.append(f"{path}: rows are not in time order; replayed sorted by timestamp")
    first = float(seconds[order[0]])
    lo = first + start_s
    sorted_s = seconds[order]
    keep = sorted_s >= lo
    if duration_s is not None:
        keep &= sorted_s < lo + duration_s
    if not keep.any():
        span = float(sorted_s[-1] - first)
        window = f"--trace-start {start_s:g}s" + ("" if duration_s is None else f" --trace-duration {duration_s:g}s")
        raise TraceError(
            f"--trace {path}: {window} selects no row (the trace spans {span:.3f} s of trace time); choose a "
            "slice inside it"
        )
    rows = order[keep].astype(np.int64)
    offsets = (sorted_s[keep] - lo) / float(speed)
    inputs_a = np.asarray(inputs, dtype=np.int64)[rows]
    outputs_a = np.asarray(outputs, dtype=np.int64)[rows]
    return Trace(
        path=path,
        format=fmt,
        rows=rows,
        offsets_s=offsets,
        input_tokens=inputs_a,
        output_tokens=outputs_a,
        hash_ids=None if hashes is None else [hashes[i] for i in rows],
        prompts=None if prompts is None else [prompts[i] for i in rows],
        total_rows=total,
        time_unit=unit,
        notes=tuple(notes),
    )


def check_block_tokens(block_tokens: int) -> None:
    """--trace-block-tokens must be a positive integer; raises TraceError."""
    if isinstance(block_tokens, bool) or not isinstance(block_tokens, int) or block_tokens < 1:
        raise TraceError(f"--trace-block-tokens {block_tokens} must be an integer >= 1 (Mooncake's is 512)")


def ideal_prefix_hit_rate(trace: Trace, block_tokens: int = 512) -> float:
    """The trace's own prefix reuse: tokens of blocks whose hash_id an earlier row (in send order) already had,
    over all input tokens = the prefix-cache hit rate of a cache that never evicts (NaN without hash_ids).
    Block j of a row of L tokens covers min(block_tokens, L - j * block_tokens) tokens."""
    if trace.hash_ids is None or not len(trace):
        return math.nan
    seen: set[int] = set()
    hit = total = 0
    for ids, length in zip(trace.hash_ids, trace.input_tokens.tolist(), strict=True):
        total += length
        for j, h in enumerate(ids):
            covered = min(block_tokens, length - j * block_tokens)
            if covered <= 0:
                break
            if h in seen:
                hit += covered
        seen.update(ids)
    return hit / total if total else math.nan


def summary(trace: Trace, block_tokens: int = 512) -> str:
    """One line for the log: rows, span, mean rate, mean input and output tokens, and the ideal prefix reuse."""
    n = len(trace)
    span = trace.duration_s
    rate = f"{(n - 1) / span:.2f} req/s" if n > 1 and span > 0 else "all at once"
    known = trace.input_tokens[trace.input_tokens >= 0]
    text = f"{trace.path}: {trace.format}, {n:,} of {trace.total_rows or n:,} rows over {span:.1f} s ({rate})"
    if len(known):
        text += f", input {known.mean():.0f} tokens on average"
    if len(known) < n:
        text += f", {n - len(known):,} rows with their own prompt text"
    text += f", output {trace.output_tokens.mean():.0f}"
    reuse = ideal_prefix_hit_rate(trace, block_tokens)
    if not math.isnan(reuse):
        text += f", {reuse:.0%} of input tokens in blocks an earlier row had (hash_ids)"
    return text
