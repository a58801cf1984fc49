"""The analysis' fast paths (issue 8, "analysis at scale") give the same results as the plain ones.

On a small run from the benchmark's generator (tests/benchmarks/bench_analysis.py): records of 4 worker processes,
the master's received/ copies, and a line cut by a crash.
"""

import logging

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import vllm_loadtest.analysis.records as records_mod
import vllm_loadtest.analysis.report.charts as report_charts
import vllm_loadtest.analysis.steps as steps_mod
from vllm_loadtest.analysis import glossary
from vllm_loadtest.analysis.records import (
    RECEIVED_DIR,
    RECORDS_DIR,
    SCHEMA,
    merge_records,
    read_records_fast,
    read_records_file,
    read_records_tolerant,
)
from vllm_loadtest.analysis.report import CDF_RANKS, cdf_points
from vllm_loadtest.analysis.run import read_run
from vllm_loadtest.analysis.steps import itl_samples, step_table

from tests.benchmarks.bench_analysis import (
    Shape,
    generate_run,
    reference_itl_samples,
    reference_merge_records,
)

pytestmark = pytest.mark.unit

SHAPE = Shape(chunks=6000, chunks_per_request=16, steps=(1, 2, 4), received=True, cut_line=True)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("scale") / "run"
    generate_run(path, SHAPE)
    return path


def record_files(run_dir):
    folder = run_dir / RECORDS_DIR
    return sorted(folder.glob("*.jsonl")) + sorted((folder / RECEIVED_DIR).glob("*.jsonl"))


def test_the_fast_reader_reads_every_intact_file_as_the_line_by_line_reader_does(run_dir):
    cut = run_dir / RECORDS_DIR / "bench-1000.jsonl"
    for path in record_files(run_dir):
        tolerant, bad = read_records_tolerant(path)
        if path == cut:
            with pytest.raises(pa.ArrowInvalid):
                read_records_fast(path)
            assert bad == 1
            assert read_records_file(path)[0].equals(tolerant) and read_records_file(path)[1] == 1
        else:
            assert bad == 0
            assert read_records_fast(path).equals(tolerant), path


def test_merge_with_the_fast_reader_equals_line_by_line_and_the_reference(run_dir, monkeypatch, caplog):
    fast = merge_records(run_dir, write=False)
    assert [r.message for r in caplog.records if r.levelno == logging.WARNING] == [
        f"{run_dir / RECORDS_DIR / 'bench-1000.jsonl'}: skipped 1 unreadable line(s) (cut off by a crash?)"
    ]

    def no_fast_reader(path):
        raise pa.ArrowInvalid("forced: every file line by line")

    monkeypatch.setattr(records_mod, "read_records_fast", no_fast_reader)
    tolerant = merge_records(run_dir, write=False)
    pd.testing.assert_frame_equal(fast, tolerant, check_exact=True)
    pd.testing.assert_frame_equal(fast, reference_merge_records(run_dir, write=False), check_exact=True)
    # One row per request: the received/ copies were duplicates, the cut line is gone.
    assert fast["request_id"].is_unique and "cut-by-a-crash" not in set(fast["request_id"])
    assert len(fast) == sum(1 for p in (run_dir / RECORDS_DIR).glob("*.jsonl") for line in p.open() if "\n" in line)


def test_an_empty_records_file_is_no_fallback(tmp_path):
    path = tmp_path / RECORDS_DIR / "idle-1.jsonl"
    path.parent.mkdir()
    path.touch()
    table = read_records_fast(path)
    assert table.num_rows == 0 and table.schema.equals(SCHEMA)
    assert merge_records(tmp_path, write=False).empty


def test_itl_samples_equal_the_glossary_formula_request_by_request():
    rng = np.random.default_rng(1)
    offsets, tokens = [], []
    for n in [0, 1, 2, *rng.integers(0, 50, size=200).tolist()]:
        offsets.append(np.sort(rng.uniform(0.0, 3.0, size=n)))
        tokens.append(rng.choice([0, 1, 1, 1, 2, 3], size=n).astype(np.int32))
    ok = pd.DataFrame({"chunk_offsets_s": offsets, "chunk_tokens": tokens})
    expected = [x for offs, toks in zip(offsets, tokens) for x in glossary.itl_samples_s(list(offs), list(toks))]
    assert np.array_equal(itl_samples(ok), np.array(expected))
    assert itl_samples(ok.iloc[:0]).size == 0
    assert itl_samples(ok[["chunk_tokens"]]).size == 0  # the live view keeps no per-chunk lists
    with pytest.raises(ValueError, match="differ in length"):
        itl_samples(pd.DataFrame({"chunk_offsets_s": [np.array([0.1, 0.2])], "chunk_tokens": [np.array([1])]}))


def test_the_step_table_of_a_generated_run_equals_the_reference(run_dir, monkeypatch):
    records = merge_records(run_dir, write=False)
    timeline = read_run(run_dir)["timeline"]
    fast = step_table(records, timeline)
    monkeypatch.setattr(steps_mod, "itl_samples", reference_itl_samples)
    pd.testing.assert_frame_equal(fast, step_table(records, timeline), check_exact=True)
    assert fast["itl_p99_s"].notna().all()


def test_cdf_points_are_every_point_of_a_small_sample_and_exact_points_of_a_large_one():
    small = np.sort(np.random.default_rng(2).lognormal(size=500))
    x, y = cdf_points(small)
    assert np.array_equal(x, small) and np.array_equal(y, np.arange(1, 501) / 500)

    n = 200_000
    values = np.sort(np.random.default_rng(3).lognormal(size=n))
    x, y = cdf_points(values)
    assert len(x) < CDF_RANKS + 300
    ranks = np.round(y * n).astype(int) - 1
    assert np.array_equal(x, values[ranks])  # every point drawn is a point of the exact CDF
    assert (x[0], y[0], x[-1], y[-1]) == (values[0], 1 / n, values[-1], 1.0)
    assert np.all(np.diff(y) > 0) and np.diff(y).max() <= 1 / CDF_RANKS + 1 / n
    assert {0, 1, n - 2, n - 1} <= set(ranks)
    assert (ranks >= n - n // 100).sum() >= 50  # the slowest 1 % (p99 … max) keeps its shape


def test_the_ttft_timeline_shows_every_request_up_to_its_limit_and_the_slowest_beyond(monkeypatch):
    ok = pd.DataFrame({"start_time": np.arange(1000.0), "ttft_s": np.random.default_rng(4).lognormal(size=1000)})
    shown, title = report_charts.ttft_points(ok)
    assert shown is ok and title == "TTFT of each request"
    monkeypatch.setattr(report_charts, "TIMELINE_POINTS", 100)
    shown, title = report_charts.ttft_points(ok)
    assert len(shown) <= 100 and shown.index.is_unique
    assert set(ok["ttft_s"].nlargest(10).index) <= set(shown.index)
    assert title == "TTFT: the 10 slowest requests and 1 in 11 of the others (1,000 in all)"
