import signal
import subprocess
import sys
import textwrap

import pandas as pd
import pyarrow.parquet as pq
import pytest
from vllm_loadtest.analysis.records import RECORDS_DIR, REQUESTS_FILE, SCHEMA, RecordWriter, merge_records

from tests.helpers.paths import ROOT
from tests.helpers.records import make_record

pytestmark = pytest.mark.unit


def test_write_merge_roundtrip_with_schema_and_lists(tmp_path):
    w = RecordWriter(tmp_path / RECORDS_DIR / "a.jsonl")
    w.write(make_record(1))
    w.write(
        make_record(
            2,
            status="error",
            error_type="http_500",
            error="boom",
            ttft_s=None,
            e2e_s=None,
            tpot_s=None,
            output_tokens=None,
            output_tokens_estimated=None,
            chunks=0,
            chunk_offsets_s=[],
            chunk_tokens=[],
            http_status=500,
        )
    )
    w.close()
    RecordWriter(tmp_path / RECORDS_DIR / "b.jsonl").write(make_record(3, worker="w2"))
    df = merge_records(tmp_path)
    assert pq.read_schema(tmp_path / REQUESTS_FILE).names == SCHEMA.names
    assert sorted(df["request_id"]) == ["id1", "id2", "id3"]
    row = df.set_index("request_id").loc["id1"]
    assert list(row["chunk_tokens"]) == [1] * 9 + [2]
    assert row["chunk_offsets_s"][0] == 0.05
    err = df.set_index("request_id").loc["id2"]
    assert pd.isna(err["ttft_s"]) and err["error_type"] == "http_500" and err["http_status"] == 500


def test_a_line_cut_by_a_crash_and_duplicates_are_dropped(tmp_path):
    path = tmp_path / RECORDS_DIR / "a.jsonl"
    w = RecordWriter(path)
    w.write(make_record(1))
    w.write(make_record(1))
    w.close()
    with open(path, "ab") as f:
        f.write(b'{"request_id":"id9","worker"')
    df = merge_records(tmp_path)
    assert list(df["request_id"]) == ["id1"]


def test_records_survive_sigkill_of_the_writing_process(tmp_path):
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(ROOT)!r})
        from tests.helpers.records import make_record
        from vllm_loadtest.analysis.records import RecordWriter
        w = RecordWriter({str(tmp_path / RECORDS_DIR / "k.jsonl")!r})
        for i in range(50):
            w.write(make_record(i))
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT)
    assert proc.returncode == -signal.SIGKILL
    assert len(merge_records(tmp_path)) == 50


def test_a_requests_file_from_before_the_dataset_columns_reads_them_as_missing(tmp_path):
    from vllm_loadtest.analysis.records import REQUEST_COLUMNS, load_records

    RecordWriter(tmp_path / RECORDS_DIR / "a.jsonl").write(make_record(1))
    merge_records(tmp_path)
    old = pq.read_table(tmp_path / REQUESTS_FILE).drop(["dataset", "max_tokens", "reference_output_tokens"])
    pq.write_table(old, tmp_path / REQUESTS_FILE)
    records = load_records(tmp_path, columns=REQUEST_COLUMNS)
    assert list(records.columns) == REQUEST_COLUMNS and records["dataset"].isna().all()
    assert records["request_id"].tolist() == ["id1"]


def test_requests_parquet_says_which_requests_the_step_table_measured(tmp_path):
    """measured: after the warm-up and finished before the stop; the warm-up's, the one in flight at the stop (its
    TTFT real but outside every step) and a cut-off one are not. records/*.jsonl leave it None."""
    from vllm_loadtest.analysis.records import RequestRecord
    from vllm_loadtest.analysis.run import finalize, write_run

    from tests.helpers.records import rec

    w = RecordWriter(tmp_path / RECORDS_DIR / "a.jsonl")
    rows = [
        rec(1, 0, 2, 100.0, 0.05, 10, 0.01, warmup=True),
        rec(2, 0, 2, 101.0, 0.05, 10, 0.01),
        rec(3, 0, 2, 109.9, 0.05, 10, 0.01),  # finishes at ~110.05, after the stop at 110
        rec(4, 0, 2, 109.95, 0.05, 3, 0.01, status="error", error_type="cut_off", duration=0.02),
        rec(5, 0, 2, 102.0, 0.05, 10, 0.01, status="error", error_type="http_500", duration=0.01),
    ]
    for row in rows:
        w.write(RequestRecord(**row))
    w.close()
    assert b'"measured":null' in (tmp_path / RECORDS_DIR / "a.jsonl").read_bytes()
    write_run(tmp_path, {"timeline": [{"step": 0, "users": 2, "start_time": 100.0, "measure_start": 100.5,
                                       "end_time": 110.0}]})  # fmt: skip
    finalize(tmp_path)
    df = pd.read_parquet(tmp_path / REQUESTS_FILE).set_index("request_id")
    assert df["measured"].to_dict() == {"r1": False, "r2": True, "r3": False, "r4": False, "r5": True}
    steps = pd.read_csv(tmp_path / "steps.csv")
    assert steps.loc[0, "requests"] == 1 and steps.loc[0, "errors"] == 1  # the measured ones, as the column says
