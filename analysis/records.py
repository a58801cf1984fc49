"""The per-request record: written once per finished request, one JSON line per record, one file per process.

`requests.parquet` is the merge of every process's `records/*.jsonl` file. JSON lines are appended and
flushed one record at a time, so a Ctrl-C, a crash or a killed process loses at most the line being written; a
write that fails (a full disk) is truncated away (analysis/diskio.py), and a line cut off anyway is skipped and
counted by every reader.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from .diskio import LineFile, WriteFailure, replace_parquet

logger = logging.getLogger(__name__)

RECORDS_DIR = "records"
RECEIVED_DIR = "received"  # inside RECORDS_DIR: the copies workers shipped to the master
REQUESTS_FILE = "requests.parquet"
# merge_records' DataFrame.attrs key: the unreadable record lines it skipped (cut off by a crash, or torn).
UNREADABLE_LINES = "unreadable_lines"
# Where a serialized record's per-chunk lists begin (RequestRecord's field order): the controller's live views cut a
# shipped line there and parse only its head, since the lists are most of a long answer's bytes.
LISTS_MARKER = b',"chunk_offsets_s"'
_TOKENS_KEY = b',"chunk_tokens":['


def without_lists(data: bytes, start: int = 0, end: int | None = None) -> bytes:
    """The record line data[start:end] without its two per-chunk lists (the fields before and after them kept):
    parsed in under half the whole line's time for a 256-chunk record, and the line itself never copied whole; the
    line as it is when it is not shaped so."""
    end = len(data) if end is None else end
    cut = data.find(LISTS_MARKER, start, end)
    if cut < 0 or not data.startswith(b":[", cut + len(LISTS_MARKER), end):
        return data[start:end]
    # Offsets are numbers and tokens integers: the first "]" closes the offsets, the next one the tokens.
    first = data.find(b"]", cut, end)
    if first < 0 or not data.startswith(_TOKENS_KEY, first + 1, end):
        return data[start:end]
    second = data.find(b"]", first + 1 + len(_TOKENS_KEY), end)
    if second < 0:
        return data[start:end]
    return data[start:cut] + data[second + 1 : end]


def parse_lines(lines: bytes, lists: bool = False) -> list[dict]:
    """Records as JSON lines (what workers ship and writers append), each parsed once: without its per-chunk lists
    (most of its bytes) unless `lists`. A line that is not a JSON object is skipped: the merge at the end of the run
    counts it as unreadable."""
    rows, pos, size = [], 0, len(lines)
    while pos < size:
        nl = lines.find(b"\n", pos)
        if nl < 0:
            nl = size
        line = lines[pos:nl] if lists else without_lists(lines, pos, nl)
        pos = nl + 1
        if not line.strip():
            continue
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


@dataclass(slots=True)
class RequestRecord:
    request_id: str
    worker: str
    step: int
    users: int
    warmup: bool
    start_time: float
    endpoint: str
    model: str
    status: str = "ok"
    error_type: str | None = None
    error: str | None = None
    http_status: int | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    tpot_s: float | None = None
    duration_s: float | None = None
    output_tokens: int | None = None
    output_tokens_estimated: bool | None = None
    prompt_tokens: int | None = None
    chunks: int = 0
    finish_reason: str | None = None
    chunk_offsets_s: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    # Added with prompt sources (--dataset); older records read them as missing.
    dataset: str | None = None  # the --dataset spec the prompt came from, e.g. "synthetic:128"
    max_tokens: int | None = None  # the max_tokens this request asked for (--max-tokens or --max-tokens-dist)
    reference_output_tokens: int | None = None  # the dataset's own answer length (sharegpt), else missing
    # Open-loop runs (--rates) only; None in a closed loop. Last, so the columns of earlier versions keep their place.
    intended_start_time: float | None = None
    schedule_lag_s: float | None = None
    # Conversations (--turns) and trace replay (--trace); None where they do not apply.
    session_id: str | None = None  # the conversation this request is a turn of
    turn: int | None = None  # 1-based turn of its conversation
    history_tokens: int | None = None  # prompt tokens that repeat the conversation so far (see the glossary)
    cached_prompt_tokens: int | None = None  # the server's usage.prompt_tokens_details.cached_tokens, when sent
    trace_row: int | None = None  # --trace: the 0-based row of the trace file this request replays
    # Reasoning models and tool calls (analysis/sse.py tells the deltas apart); see the glossary.
    reasoning_tokens: int | None = None  # output tokens that came in reasoning deltas
    ttfo_s: float | None = None  # time to first output token: the first answer or tool-call token
    tool_call_chunks: int | None = None  # token-carrying chunks with delta.tool_calls
    answer_tpot_s: float | None = None  # TPOT over the answer only (after the first output token)
    # What a batch kind's request carried (analysis/kinds.py) and images (--images); None where they do not apply.
    inputs: int | None = None  # embeddings: the inputs the request carried (--batch-size)
    documents: int | None = None  # rerank: the documents the request carried (--documents)
    images: int | None = None  # chat with --images: the images the request carried
    # Whether the step table counts it (analysis/steps.py measured_column): decided at the merge, from the run's
    # timeline, so None in records/*.jsonl and True/False in requests.parquet.
    measured: bool | None = None
    # Speculative decoding (issue 35): output_tokens / chunks, set at the stream's end; None without usage or chunks.
    tokens_per_chunk: float | None = None


SCHEMA = pa.schema(
    [
        ("request_id", pa.string()),
        ("worker", pa.string()),
        ("step", pa.int32()),
        ("users", pa.int32()),
        ("warmup", pa.bool_()),
        ("start_time", pa.float64()),
        ("endpoint", pa.string()),
        ("model", pa.string()),
        ("status", pa.string()),
        ("error_type", pa.string()),
        ("error", pa.string()),
        ("http_status", pa.int32()),
        ("ttft_s", pa.float64()),
        ("e2e_s", pa.float64()),
        ("tpot_s", pa.float64()),
        ("duration_s", pa.float64()),
        ("output_tokens", pa.int64()),
        ("output_tokens_estimated", pa.bool_()),
        ("prompt_tokens", pa.int64()),
        ("chunks", pa.int32()),
        ("finish_reason", pa.string()),
        ("chunk_offsets_s", pa.list_(pa.float64())),
        ("chunk_tokens", pa.list_(pa.int32())),
        ("dataset", pa.string()),
        ("max_tokens", pa.int64()),
        ("reference_output_tokens", pa.int64()),
        ("intended_start_time", pa.float64()),
        ("schedule_lag_s", pa.float64()),
        ("session_id", pa.string()),
        ("turn", pa.int32()),
        ("history_tokens", pa.int64()),
        ("cached_prompt_tokens", pa.int64()),
        ("trace_row", pa.int64()),
        ("reasoning_tokens", pa.int64()),
        ("ttfo_s", pa.float64()),
        ("tool_call_chunks", pa.int32()),
        ("answer_tpot_s", pa.float64()),
        ("inputs", pa.int32()),
        ("documents", pa.int32()),
        ("images", pa.int32()),
        ("measured", pa.bool_()),
        ("tokens_per_chunk", pa.float64()),
    ]
)
assert [f.name for f in fields(RequestRecord)] == SCHEMA.names, "RequestRecord and SCHEMA must list the same columns"
# Every column but the per-chunk lists: one value per request (10 M chunk records are ~40 k requests).
REQUEST_COLUMNS = [name for name in SCHEMA.names if name not in ("chunk_offsets_s", "chunk_tokens")]

# pyarrow's C++ reader parses a records file in blocks on every core, about 6x faster than a Python parse per line
# and without a Python object per chunk (10 M chunk records: ~2 s). One line must fit in one block: 16 MiB holds a
# record of ~700 k chunks; a longer line fails the fast reader and its file is read line by line.
_BLOCK_SIZE = 16 << 20
# Keys that are not in SCHEMA are dropped, as pa.Table.from_pylist(rows, schema=SCHEMA) drops them.
_PARSE_OPTIONS = pa_json.ParseOptions(explicit_schema=SCHEMA, unexpected_field_behavior="ignore")


def single_model(records: pd.DataFrame) -> str | None:
    """The model every record asked for, or None when there are several (or none, or no model column)."""
    if "model" not in records.columns:
        return None
    models = records["model"].dropna().unique()
    return str(models[0]) if len(models) == 1 else None


class RecordWriter:
    """Appends records to one JSON-lines file; each record reaches the OS before `write` returns, whole or not at all
    (analysis/diskio.LineFile: a failed write is truncated away and raised once as a WriteFailure)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        # Unbuffered binary: each record is one write() straight to the OS, so a crash cannot leave it in a buffer.
        self._file = LineFile(self.path, unit="records")

    @property
    def count(self) -> int:
        """The records in the file, each a complete line."""
        return self._file.lines

    @property
    def dropped(self) -> int:
        """Records not written: the one whose write failed, and every one after it."""
        return self._file.dropped

    @property
    def failure(self) -> WriteFailure | None:
        return self._file.failure

    def write(self, record: RequestRecord) -> bytes:
        """Append one record; return its line (a worker also ships it to the master). Raises WriteFailure when the
        write fails; after that, records are counted in `dropped` and not written."""
        line = serialize(record)
        self._file.write(line)
        return line

    def write_line(self, line: bytes) -> bool:
        """Append one serialized record (serialize()); False when the file failed before. Raises WriteFailure."""
        return self._file.write(line)

    def close(self) -> None:
        """fsync and close; raises WriteFailure when the flush fails."""
        self._file.close()


def serialize(record: RequestRecord) -> bytes:
    """A record as its JSON line."""
    # orjson serializes the dataclass directly: ~15 µs for a 256-token record, against ~1.8 ms for
    # json.dumps(asdict(...)), which would block every other user's greenlet for that long.
    return orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)


def read_jsonl(path: Path) -> tuple[list[dict], int]:
    """Rows of one records file, and the number of unreadable lines (a line cut by a crash)."""
    rows, bad = [], 0
    with open(path, "rb") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                rows.append(orjson.loads(line))
            except orjson.JSONDecodeError:
                bad += 1
    return rows, bad


def read_records_fast(path: Path) -> pa.Table:
    """One records file parsed by pyarrow's C++ JSON reader; raises pa.ArrowInvalid on a line it cannot read."""
    if Path(path).stat().st_size == 0:  # a process that finished no request (the reader rejects an empty file)
        return SCHEMA.empty_table()
    return pa_json.read_json(
        path, read_options=pa_json.ReadOptions(block_size=_BLOCK_SIZE), parse_options=_PARSE_OPTIONS
    )


def read_records_tolerant(path: Path) -> tuple[pa.Table, int]:
    """One records file read line by line, and the number of unreadable lines it skipped."""
    rows, bad = read_jsonl(path)
    return pa.Table.from_pylist(rows, schema=SCHEMA), bad


def read_records_file(path: Path) -> tuple[pa.Table, int]:
    """One records file as a table, and the number of unreadable lines skipped (a line cut by a crash)."""
    try:
        return read_records_fast(path), 0
    except pa.ArrowInvalid as e:
        # The fast reader rejects the whole file for one bad line: read this file line by line, so that only the
        # bad lines are lost (and counted), never the file.
        logger.debug("%s: read line by line (%s)", path, e)
        return read_records_tolerant(path)


def load_records(run_dir: Path, columns: list[str] | None = None) -> pd.DataFrame:
    """All records of a run (or only these columns): from requests.parquet if present, else merged from
    records/*.jsonl."""
    run_dir = Path(run_dir)
    parquet = run_dir / REQUESTS_FILE
    if parquet.exists():
        if columns is None:
            return pd.read_parquet(parquet)
        # A requests.parquet written before a column was added (dataset, max_tokens, ...) reads it as missing.
        present = set(pq.read_schema(parquet).names)
        df = pd.read_parquet(parquet, columns=[c for c in columns if c in present])
        for name in columns:
            if name not in present:
                df[name] = None
        return df[columns]
    records = merge_records(run_dir, write=False)
    return records if columns is None else records[columns]


def _read_records(folder: Path) -> tuple[pa.Table, int]:
    """Every records file of a folder, and the unreadable lines skipped (each file's said once, here)."""
    tables, skipped = [SCHEMA.empty_table()], 0
    for path in sorted(folder.glob("*.jsonl")):
        table, bad = read_records_file(path)
        if bad:
            logger.warning("%s: skipped %d unreadable line(s) (cut off by a crash?)", path, bad)
        skipped += bad
        tables.append(table)
    return pa.concat_tables(tables), skipped


def merge_records(
    run_dir: Path, write: bool = True, measured: Callable[[pd.DataFrame], np.ndarray] | None = None
) -> pd.DataFrame:
    """Merge every records/*.jsonl (written by each process) and records/received/*.jsonl (shipped by workers to
    the master) into one table and requests.parquet: one row per request_id, whichever copies exist. `measured`
    (the records -> the step table's mask, analysis/run.py) fills the `measured` column; without it, it stays None."""
    run_dir = Path(run_dir)
    local, bad_local = _read_records(run_dir / RECORDS_DIR)
    received, bad_received = _read_records(run_dir / RECORDS_DIR / RECEIVED_DIR)
    for name, part in (("records/", local), (f"records/{RECEIVED_DIR}/", received)):
        repeated = part.num_rows - pc.count_distinct(part["request_id"], mode="all").as_py()
        if repeated:
            # Within one kind of copy a request_id is unique; a repeat means a file was copied in twice.
            logger.warning("%d repeated request_id(s) in %s of %s", repeated, name, run_dir)
    table = pa.concat_tables([local, received])
    # Only the ids go through pandas; the table (10 M chunks) is filtered once in Arrow and converted once.
    duplicated = table["request_id"].to_pandas().duplicated(keep="first").to_numpy()
    if duplicated.any():
        table = table.filter(pa.array(~duplicated))
    df = table.to_pandas()
    if measured is not None:
        mask = np.asarray(measured(df), dtype=bool)
        df["measured"] = mask
        table = table.set_column(SCHEMA.get_field_index("measured"), "measured", pa.array(mask, pa.bool_()))
    # The integrity check counts them (a torn last line is a request whose record was lost).
    df.attrs[UNREADABLE_LINES] = bad_local + bad_received
    if write:
        replace_parquet(run_dir / REQUESTS_FILE, table)  # a full disk leaves no half file; the records stay
    return df
