import os
import signal
import subprocess
import sys
import textwrap

import pandas as pd
import pyarrow.parquet as pq

from analysis.records import RECORDS_DIR, REQUESTS_FILE, SCHEMA, RecordWriter, RequestRecord, merge_records


def make(i: int, **kw) -> RequestRecord:
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


def test_write_merge_roundtrip_with_schema_and_lists(tmp_path):
    w = RecordWriter(tmp_path / RECORDS_DIR / "a.jsonl")
    w.write(make(1))
    w.write(
        make(
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
    RecordWriter(tmp_path / RECORDS_DIR / "b.jsonl").write(make(3, worker="w2"))
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
    w.write(make(1))
    w.write(make(1))
    w.close()
    with open(path, "ab") as f:
        f.write(b'{"request_id":"id9","worker"')
    df = merge_records(tmp_path)
    assert list(df["request_id"]) == ["id1"]


def test_records_survive_sigkill_of_the_writing_process(tmp_path):
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(os.getcwd())!r})
        from tests.test_records import make
        from analysis.records import RecordWriter
        w = RecordWriter({str(tmp_path / RECORDS_DIR / "k.jsonl")!r})
        for i in range(50):
            w.write(make(i))
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=os.getcwd())
    assert proc.returncode == -signal.SIGKILL
    assert len(merge_records(tmp_path)) == 50


def test_a_requests_file_from_before_the_dataset_columns_reads_them_as_missing(tmp_path):
    from analysis.records import REQUEST_COLUMNS, load_records

    RecordWriter(tmp_path / RECORDS_DIR / "a.jsonl").write(make(1))
    merge_records(tmp_path)
    old = pq.read_table(tmp_path / REQUESTS_FILE).drop(["dataset", "max_tokens", "reference_output_tokens"])
    pq.write_table(old, tmp_path / REQUESTS_FILE)
    records = load_records(tmp_path, columns=REQUEST_COLUMNS)
    assert list(records.columns) == REQUEST_COLUMNS and records["dataset"].isna().all()
    assert records["request_id"].tolist() == ["id1"]
