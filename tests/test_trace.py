"""Reading traces (analysis/trace.py): the three formats, detection, slicing and speed, sharding, bad input."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
from vllm_loadtest.analysis.trace import (
    FORMATS,
    TraceError,
    check_block_tokens,
    detect_format,
    ideal_prefix_hit_rate,
    load_trace,
    summary,
)

from tests.helpers.paths import FIXTURES

pytestmark = pytest.mark.unit

TRACES = FIXTURES / "traces"
MOONCAKE = str(TRACES / "mooncake.jsonl")
AZURE = str(TRACES / "azure.csv")
GENERIC = str(TRACES / "generic.jsonl")


def write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_bytes(text.encode())
    return str(path)


# --- the formats -----------------------------------------------------------------------------------------------
def test_mooncake_fixture_is_read_field_by_field():
    t = load_trace(MOONCAKE)
    assert (t.format, len(t), t.total_rows, t.time_unit) == ("mooncake", 7, 7, "ms")
    assert t.rows.dtype == np.int64 and t.offsets_s.dtype == np.float64
    assert t.rows.tolist() == list(range(7))
    assert t.offsets_s.tolist() == [0.0, 0.0, 0.25, 0.6, 1.0, 1.5, 2.0]
    assert t.input_tokens.tolist() == [1100, 700, 1600, 300, 1030, 512, 2000]
    assert t.output_tokens.tolist() == [12, 8, 20, 5, 16, 3, 30]
    assert t.hash_ids[0] == (0, 1, 2) and t.hash_ids[6] == (0, 1, 2, 4)
    assert t.prompts is None
    assert t.duration_s == 2.0


def test_mooncake_fixture_is_consistent_with_512_token_blocks():
    # As in Mooncake's own release: one hash_id per started 512-token block of the prompt.
    t = load_trace(MOONCAKE)
    assert [len(h) for h in t.hash_ids] == [-(-n // 512) for n in t.input_tokens.tolist()]


def test_azure_fixture_keeps_sub_millisecond_times():
    # The 2023 release's first rows, CRLF line ends and 7 fractional digits as published.
    assert b"\r\n" in (TRACES / "azure.csv").read_bytes()
    t = load_trace(AZURE)
    assert (t.format, len(t), t.time_unit) == ("azure", 8, "datetime")
    assert t.input_tokens.tolist()[:4] == [374, 396, 879, 91]
    assert t.output_tokens.tolist()[:4] == [44, 109, 55, 16]
    # 18:15:50.9951690 - 18:15:46.6805900
    assert t.offsets_s[1] == pytest.approx(4.314579, abs=1e-9)
    assert t.hash_ids is None and t.prompts is None


def test_azure_2024_release_timestamps(tmp_path):
    path = write(
        tmp_path,
        "azure2024.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2024-05-10 00:00:00+00:00,100,10\n"
        "2024-05-10 00:00:00.009930+00:00,200,20\n"
        "2024-05-10 00:00:01.5+00:00,300,30\n",
    )
    t = load_trace(path)
    assert t.offsets_s.tolist() == pytest.approx([0.0, 0.00993, 1.5])


def test_azure_columns_in_any_order_with_extra_columns(tmp_path):
    path = write(
        tmp_path,
        "azure.csv",
        "GeneratedTokens,Region,TIMESTAMP,ContextTokens\n7,eu,2023-11-16 18:15:46.5,70\n8,us,2023-11-16 18:15:47,80\n",
    )
    t = load_trace(path)
    assert t.input_tokens.tolist() == [70, 80] and t.output_tokens.tolist() == [7, 8]
    assert t.offsets_s.tolist() == pytest.approx([0.0, 0.5])


def test_generic_fixture_mixes_prompts_and_lengths():
    t = load_trace(GENERIC)
    assert (t.format, len(t), t.time_unit) == ("jsonl", 5, "s")
    assert t.offsets_s.tolist() == [0.0, 0.35, 0.8, 1.25, 2.0]
    assert t.input_tokens.tolist() == [200, -1, 64, -1, 500]
    assert t.output_tokens.tolist() == [16, 24, 8, 48, 4]
    assert t.prompts[1] == "Write a haiku about load testing." and t.prompts[0] is None
    assert t.hash_ids is None
    # The unit rule is stated where the user sees it.
    assert any('"timestamp" read as seconds' in n for n in t.notes)


@pytest.mark.parametrize(
    ("key", "times", "unit", "offsets"),
    [
        ("timestamp", "0 1500", "ms", [0, 1.5]),  # every value an integer: milliseconds (as Mooncake's)
        ("timestamp", "0 1.5", "s", [0, 1.5]),  # a value with a decimal point: seconds
        ("timestamp", "0 1e3", "s", [0, 1000]),  # an exponent makes a JSON float too
        ("timestamp_s", "0 2", "s", [0, 2]),
        ("timestamp_ms", "0.5 2.5", "ms", [0, 0.002]),
    ],
)
def test_generic_timestamp_units(tmp_path, key, times, unit, offsets):
    lines = [f'{{"{key}": {t}, "input_length": 5, "output_length": 1}}' for t in times.split()]
    t = load_trace(write(tmp_path, "t.jsonl", "\n".join(lines) + "\n"))
    assert t.time_unit == unit
    assert t.offsets_s.tolist() == pytest.approx(offsets)


def test_generic_jsonl_with_hash_ids_can_be_forced_to_jsonl():
    # A Mooncake file read as generic jsonl: the same rows, without the blocks.
    t = load_trace(MOONCAKE, fmt="jsonl")
    assert t.format == "jsonl" and t.hash_ids is None and t.time_unit == "ms"
    assert t.offsets_s.tolist() == load_trace(MOONCAKE).offsets_s.tolist()


# --- detection ---------------------------------------------------------------------------------------------------
def test_detection_from_content(tmp_path):
    assert detect_format(MOONCAKE) == "mooncake"
    assert detect_format(AZURE) == "azure"
    assert detect_format(GENERIC) == "jsonl"
    # The file name does not matter; leading blank lines and a UTF-8 BOM do not either.
    moved = write(tmp_path, "trace.txt", "\ufeff\n\n" + (TRACES / "mooncake.jsonl").read_text())
    assert detect_format(moved) == "mooncake"
    assert load_trace(moved).rows.tolist() == list(range(7))
    assert set(FORMATS) == {"mooncake", "azure", "jsonl"}


def test_unknown_content_names_the_line(tmp_path):
    path = write(tmp_path, "t.csv", "\n\ntime,tokens\n1,2\n")
    with pytest.raises(TraceError, match=rf"^{path}:3: not a known trace format.*--trace-format"):
        detect_format(path)


# --- order, slicing, speed -------------------------------------------------------------------------------------
def test_rows_out_of_order_are_sorted_stably_and_keep_their_file_index(tmp_path):
    path = write(
        tmp_path,
        "t.jsonl",
        '{"timestamp": 2000, "input_length": 1, "output_length": 1, "hash_ids": [0]}\n'
        '{"timestamp": 1000, "input_length": 2, "output_length": 1, "hash_ids": [1]}\n'
        "\n"
        '{"timestamp": 2000, "input_length": 3, "output_length": 1, "hash_ids": [2]}\n'
        '{"timestamp": 1000, "input_length": 4, "output_length": 1, "hash_ids": [3]}\n',
    )
    t = load_trace(path)
    assert t.rows.tolist() == [1, 3, 0, 2]  # data-row indices: the blank line is not a row
    assert t.input_tokens.tolist() == [2, 4, 1, 3]
    assert t.hash_ids == [(1,), (3,), (0,), (2,)]
    assert t.offsets_s.tolist() == [0.0, 0.0, 1.0, 1.0]
    assert any("not in time order" in n for n in t.notes)


def test_slice_and_speed():
    # Trace time: 0, 0, .25, .6, 1, 1.5, 2. The slice [0.25, 1.25) in trace time, then twice as fast.
    t = load_trace(MOONCAKE, start_s=0.25, duration_s=1.0, speed=2.0)
    assert t.rows.tolist() == [2, 3, 4]
    assert t.offsets_s.tolist() == pytest.approx([0.0, 0.175, 0.375])
    assert t.duration_s == pytest.approx(0.375)
    # Offsets count from first timestamp + start, not from the first kept row.
    t = load_trace(MOONCAKE, start_s=0.2)
    assert t.rows.tolist() == [2, 3, 4, 5, 6]
    assert t.offsets_s[0] == pytest.approx(0.05)
    # The end is exclusive, the start inclusive.
    assert load_trace(MOONCAKE, start_s=0.0, duration_s=0.25).rows.tolist() == [0, 1]
    assert load_trace(MOONCAKE, start_s=2.0).rows.tolist() == [6]


def test_speed_divides_every_gap():
    slow, fast = load_trace(AZURE), load_trace(AZURE, speed=4)
    assert fast.offsets_s.tolist() == pytest.approx((slow.offsets_s / 4).tolist())
    assert fast.rows.tolist() == slow.rows.tolist()


@pytest.mark.parametrize("processes", [1, 2, 3, 4])
def test_shards_cover_every_row_exactly_once(processes):
    t = load_trace(AZURE)
    shards = [t.shard(rank, processes) for rank in range(processes)]
    together = np.concatenate(shards)
    assert sorted(together.tolist()) == list(range(len(t)))
    for rank, shard in enumerate(shards):
        assert all(i % processes == rank for i in shard.tolist())
        assert np.all(np.diff(t.offsets_s[shard]) >= 0)  # each process's rows stay in time order


def test_shard_of_a_slice_and_bad_rank():
    t = load_trace(MOONCAKE, start_s=1.0)
    assert [t.shard(r, 4).tolist() for r in range(4)] == [[0], [1], [2], []]
    with pytest.raises(ValueError):
        t.shard(2, 2)


# --- bad input: one line naming the file and line (or the flag) and the fix -------------------------------
BAD_JSONL = [
    ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n{"timestamp": 1,', 2, "not JSON"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n\n[1, 2]\n', 3, "not a JSON object"),
    ('{"input_length": 5, "output_length": 1, "hash_ids": [1]}\n', 1, '"timestamp" missing'),
    ('{"timestamp": -5, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n', 1, '"timestamp" -5 is not'),
    ('{"timestamp": 0, "input_length": -5, "output_length": 1, "hash_ids": [1]}\n', 1, '"input_length" -5 is not'),
    ('{"timestamp": 0, "input_length": 5, "output_length": 0, "hash_ids": [1]}\n', 1, '"output_length" 0 is not'),
    ('{"timestamp": 0, "input_length": "5", "output_length": 1, "hash_ids": [1]}\n', 1, '"input_length" \'5\''),
    ('{"timestamp": 0, "input_length": 5, "hash_ids": [1]}\n', 1, '"output_length" missing'),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n'
     '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": "1,2"}\n', 2, '"hash_ids" is not a list'),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [3, -1]}\n', 1, '"hash_ids" is not a list'),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1}\n', 1, '"hash_ids" missing'),
]  # fmt: skip


@pytest.mark.parametrize(("text", "line", "what"), BAD_JSONL)
def test_bad_mooncake_lines(tmp_path, text, line, what):
    path = write(tmp_path, "bad.jsonl", text)
    with pytest.raises(TraceError) as e:
        load_trace(path, fmt="mooncake")
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(f"{path}:{line}: ")
    assert what in message
    assert "e.g." in message or "each line" in message  # the fix: what a line must look like


BAD_GENERIC = [
    ('{"timestamp": 0, "output_length": 1}\n', 1, 'neither "prompt" nor "input_length"'),
    ('{"timestamp": 0, "prompt": "", "output_length": 1}\n', 1, '"prompt" must be non-empty text'),
    ('{"time": 0, "input_length": 3, "output_length": 1}\n', 1, "no timestamp_s, timestamp_ms or timestamp"),
    ('{"timestamp_s": 0, "input_length": 3, "output_length": 1}\n{"timestamp": 1, "input_length": 3, '
     '"output_length": 1}\n', 2, '"timestamp_s" missing (the first row uses it'),
]  # fmt: skip


@pytest.mark.parametrize(("text", "line", "what"), BAD_GENERIC)
def test_bad_generic_lines(tmp_path, text, line, what):
    path = write(tmp_path, "bad.jsonl", text)
    with pytest.raises(TraceError) as e:
        load_trace(path)
    assert "\n" not in str(e.value)
    assert str(e.value).startswith(f"{path}:{line}: ") and what in str(e.value)


BAD_AZURE = [
    ("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.6805900,374\n", 1, "no column GeneratedTokens"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\nyesterday,10,10\n", 3,
     "TIMESTAMP 'yesterday' is not a date and time"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:15:46.68,374,44\r\n\r\n2023-11-16 18:15:47,-3,4\r\n",
     4, "ContextTokens '-3' is not an integer >= 1"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,4.5\n", 2,
     "GeneratedTokens '4.5' is not an integer"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374\n", 2, "2 column(s)"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "line", "what"), BAD_AZURE)
def test_bad_azure_rows(tmp_path, text, line, what):
    path = write(tmp_path, "bad.csv", text)
    with pytest.raises(TraceError) as e:
        load_trace(path)
    assert "\n" not in str(e.value)
    assert str(e.value).startswith(f"{path}:{line}: ")
    assert what in str(e.value)


def test_undecodable_bytes_name_their_line(tmp_path):
    csv_path = tmp_path / "latin1.csv"
    csv_path.write_bytes(
        b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6,3,4\n2023-11-16 18:15:47,3,4 \xe9\n"
    )
    with pytest.raises(TraceError, match=rf"^{csv_path}:3: not UTF-8 text; save the CSV as UTF-8$"):
        load_trace(str(csv_path))
    jsonl = tmp_path / "latin1.jsonl"
    jsonl.write_bytes(b'{"timestamp": 0, "input_length": 3, "output_length": 1}\n{"timestamp": 1, "prompt": "caf\xe9", '
                      b'"output_length": 1}\n')  # fmt: skip
    with pytest.raises(TraceError, match=rf"^{jsonl}:2: not JSON"):
        load_trace(str(jsonl))


def test_bad_slices_and_flags(tmp_path):
    cases = [
        (dict(start_s=5.0), "--trace-start 5s selects no row (the trace spans 2.000 s"),
        (dict(start_s=0.3, duration_s=0.2), "--trace-start 0.3s --trace-duration 0.2s selects no row"),
        (dict(speed=0.0), "--trace-speed 0.0 must be a positive number"),
        (dict(speed=-1.0), "--trace-speed -1.0 must be a positive number"),
        (dict(speed=float("nan")), "--trace-speed nan must be a positive number"),
        (dict(start_s=-1.0), "--trace-start -1.0 must be a non-negative duration"),
        (dict(duration_s=0.0), "--trace-duration 0.0 must be a positive duration"),
        (dict(fmt="sharegpt"), "--trace-format 'sharegpt' is not a trace format"),
    ]
    for kwargs, what in cases:
        with pytest.raises(TraceError) as e:
            load_trace(MOONCAKE, **kwargs)
        assert "\n" not in str(e.value) and what in str(e.value), (kwargs, str(e.value))
    for n in (0, -1):
        with pytest.raises(TraceError, match=rf"^--trace-block-tokens {n} must be an integer >= 1"):
            check_block_tokens(n)
    check_block_tokens(1)


def test_crlf_jsonl_and_gzip(tmp_path):
    crlf = write(tmp_path, "crlf.jsonl", (TRACES / "mooncake.jsonl").read_text().replace("\n", "\r\n"))
    assert load_trace(crlf).input_tokens.tolist() == load_trace(MOONCAKE).input_tokens.tolist()
    packed = tmp_path / "t.jsonl.gz"
    packed.write_bytes(gzip.compress((TRACES / "mooncake.jsonl").read_bytes()))
    for fmt in ("auto", "mooncake"):
        with pytest.raises(TraceError, match="is gzip-compressed; decompress it first"):
            load_trace(str(packed), fmt=fmt)


def test_missing_empty_and_wrong_format_files(tmp_path):
    missing = str(tmp_path / "nope.jsonl")
    with pytest.raises(TraceError, match=rf"^--trace {missing}: No such file or directory; pass a readable"):
        load_trace(missing)
    empty = write(tmp_path, "empty.jsonl", "\n  \n")
    with pytest.raises(TraceError, match=rf"^--trace {empty} is empty"):
        load_trace(empty)
    with pytest.raises(TraceError, match=rf"^--trace {empty} has no data rows"):
        load_trace(empty, fmt="mooncake")
    header_only = write(tmp_path, "h.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n")
    with pytest.raises(TraceError, match="has no data rows"):
        load_trace(header_only)
    # An Azure CSV forced to be read as JSONL fails on its first line, naming it.
    with pytest.raises(TraceError, match=rf"^{AZURE}:1: not JSON"):
        load_trace(AZURE, fmt="mooncake")


def test_ideal_prefix_hit_rate_and_summary():
    t = load_trace(MOONCAKE)
    # Seen before, in send order: row 1 block 0 (512 of 700); row 2 blocks 0-2 (1536 of 1600); row 4 blocks 0, 3
    # (512 + 512 of 1030); row 6 all four (2000).
    hit = 512 + 1536 + 1024 + 2000
    assert ideal_prefix_hit_rate(t) == pytest.approx(hit / sum(t.input_tokens.tolist()))
    assert np.isnan(ideal_prefix_hit_rate(load_trace(AZURE)))
    line = summary(t)
    assert "\n" not in line and "mooncake, 7 of 7 rows over 2.0 s (3.00 req/s)" in line
    assert f"{hit / 7242:.0%} of input tokens in blocks an earlier row had" in line
    assert summary(load_trace(GENERIC)).endswith(
        "jsonl, 5 of 5 rows over 2.0 s (2.00 req/s), input 255 tokens on average, 2 rows with their own prompt "
        "text, output 20"
    )
