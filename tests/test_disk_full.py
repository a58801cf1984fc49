"""A disk that fills, a run directory that cannot be made (issue 22), in this process and in small subprocesses
(no Locust): a failed write leaves complete lines only and is raised once, a replaced file stays whole, a torn line
is skipped, counted in the integrity check and warned about once, the run directory is created and written before
any load, and the free space is forecast from the plan and from the rate it drops at.

The real runs (a file size limit, a small tmpfs, a master, a worker without its own copy) are in
tests/test_disk_full_run.py."""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import orjson
import pytest
from vllm_loadtest.analysis import diskio
from vllm_loadtest.analysis.diskio import LineFile, WriteFailure, fill_forecast, record_bytes, replace_file
from vllm_loadtest.analysis.integrity import integrity
from vllm_loadtest.analysis.records import (
    RECORDS_DIR,
    UNREADABLE_LINES,
    RecordWriter,
    merge_records,
    read_records_file,
    serialize,
)
from vllm_loadtest.analysis.run import RUN_FILE, read_run, write_run
from vllm_loadtest.locustfiles import diskspace
from vllm_loadtest.locustfiles.preflight import PROBE_PREFIX, RunDirError, check_run_dir, remove_created

from tests.helpers.disk import file_size_limit
from tests.helpers.paths import ROOT
from tests.helpers.records import make_record

pytestmark = pytest.mark.unit


class FillingFile:
    """A file object whose disk fills after `room` bytes: the write that crosses it is short (as the kernel's), the
    next one raises ENOSPC."""

    def __init__(self, real, room: int) -> None:
        self.real, self.room = real, room

    def write(self, data) -> int:
        if self.room <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        part = bytes(data[: self.room])
        self.room -= len(part)
        return self.real.write(part)

    def fileno(self) -> int:
        return self.real.fileno()

    @property
    def closed(self) -> bool:
        return self.real.closed

    def close(self) -> None:
        self.real.close()


def test_a_write_the_disk_cuts_is_truncated_away_and_raised_once(tmp_path):
    path = tmp_path / RECORDS_DIR / "w.jsonl"
    writer = RecordWriter(path)
    lines = [serialize(make_record(i)) for i in range(5)]
    room = len(lines[0]) * 2 + len(lines[2]) // 2  # two records fit, the third is cut in the middle
    writer._file._file = FillingFile(writer._file._file, room)
    assert writer.write_line(lines[0]) and writer.write_line(lines[1])
    with pytest.raises(WriteFailure) as raised:
        writer.write_line(lines[2])
    failure = raised.value
    assert str(failure) == f"disk full writing {path} after 2 records" and not failure.torn
    assert failure.errno == errno.ENOSPC and failure.fix == "free space, or pass --run-dir on a larger disk"
    # Later records are not written (never a line after a gap), nor raised again: counted.
    assert writer.write_line(lines[3]) is False and writer.write_line(lines[4]) is False
    assert (writer.count, writer.dropped, writer.failure) == (2, 3, failure)
    writer.close()
    assert path.read_bytes() == lines[0] + lines[1]  # the half line is gone
    table, bad = read_records_file(path)
    assert table.num_rows == 2 and bad == 0


def test_a_short_write_is_continued_when_the_rest_fits():
    class Short:
        def __init__(self):
            self.data = b""

        def write(self, data):
            part = bytes(data[:3])
            self.data += part
            return len(part)

    f = object.__new__(LineFile)
    f.path, f.unit, f.lines, f.dropped, f.failure, f._end = "x", "records", 0, 0, None, 0
    f._file = Short()
    assert f.write(b"0123456789\n") and f._file.data == b"0123456789\n" and f.lines == 1


def test_the_file_size_limit_makes_writes_fail_whole_in_a_real_process(tmp_path):
    """RLIMIT_FSIZE (SIGXFSZ ignored) as a full disk: the kernel's short write at the limit, then EFBIG."""
    path = tmp_path / RECORDS_DIR / "k.jsonl"
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from tests.helpers.records import make_record
        from vllm_loadtest.analysis.diskio import WriteFailure
        from vllm_loadtest.analysis.records import RecordWriter
        w = RecordWriter({str(path)!r})
        try:
            for i in range(1000):
                w.write(make_record(i))
        except WriteFailure as e:
            print(e.errno, e.kept, w.count, w.write(make_record(9999)) is not None, w.dropped)
            print(e)
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, preexec_fn=file_size_limit(10_000)
    )
    assert proc.returncode == 0, proc.stderr
    first, sentence = proc.stdout.splitlines()
    code, kept, count, _, dropped = first.split()
    assert int(code) == errno.EFBIG and int(kept) == int(count) > 0 and int(dropped) == 2
    assert sentence == f"file too large writing {path} after {int(kept):,} records"
    data = path.read_bytes()
    assert len(data) <= 10_000 and data.endswith(b"\n") and data.count(b"\n") == int(kept)
    assert all(orjson.loads(line)["status"] == "ok" for line in data.splitlines())


def test_a_torn_last_line_is_skipped_counted_in_the_integrity_check_and_warned_once(tmp_path, caplog):
    path = tmp_path / RECORDS_DIR / "w.jsonl"
    writer = RecordWriter(path)
    for i in range(3):
        writer.write(make_record(i))
    writer.close()
    with open(path, "ab") as f:  # a process killed in the middle of a write (or a truncation that failed)
        f.write(serialize(make_record(3))[:100])
    with caplog.at_level(logging.WARNING):
        records = merge_records(tmp_path)
    assert len(records) == 3 and records.attrs[UNREADABLE_LINES] == 1
    said = [r.getMessage() for r in caplog.records]
    assert said.count(f"{path}: skipped 1 unreadable line(s) (cut off by a crash?)") == 1
    check = integrity(records, None, unreadable=records.attrs[UNREADABLE_LINES])
    assert check["unreadable_lines"] == 1 and not check["available"]
    assert check["text"][-1].startswith("Unreadable records: 1 record line(s) could not be read")
    assert integrity(records, None)["unreadable_lines"] == 0 and len(integrity(records, None)["text"]) == 1


def test_a_replaced_file_is_whole_or_the_previous_one(tmp_path, monkeypatch):
    write_run(tmp_path, {"timeline": [1]})

    def full(*_a, **_kw):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(diskio.os, "replace", full)
    with pytest.raises(WriteFailure) as raised:
        write_run(tmp_path, {"timeline": [1, 2]})
    assert str(raised.value) == f"disk full writing {tmp_path / RUN_FILE}"
    assert read_run(tmp_path) == {"timeline": [1]} and sorted(p.name for p in tmp_path.iterdir()) == [RUN_FILE]
    with pytest.raises(WriteFailure):
        replace_file(tmp_path / "new.csv", "a,b\n")
    assert not (tmp_path / "new.csv").exists() and not (tmp_path / "new.csv.tmp").exists()


@pytest.mark.parametrize(
    ("code", "words", "fix"),
    [
        (errno.ENOSPC, "disk full", "free space, or pass --run-dir on a larger disk"),
        (errno.EDQUOT, "disk quota exceeded", "free space, or pass --run-dir on a larger disk"),
        (errno.EFBIG, "file too large", "raise the file size limit (ulimit -f)"),
        (errno.EROFS, "read-only file system", "remount it writable"),
        (errno.EIO, "I/O error", "check the disk"),
        (errno.EACCES, os.strerror(errno.EACCES), "check the disk"),
    ],
)
def test_each_write_error_is_said_in_a_few_words_with_its_fix(code, words, fix):
    failure = WriteFailure("reports/r/records/h-1.jsonl", OSError(code, os.strerror(code)), 1514)
    assert str(failure) == f"{words} writing reports/r/records/h-1.jsonl after 1,514 records"
    assert failure.fix.startswith(fix) and isinstance(failure, OSError) and failure.errno == code


def test_the_run_directory_is_created_and_written_before_any_load(tmp_path):
    created = check_run_dir(tmp_path / "a" / "b" / "run")
    assert created == [tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "run"]
    assert (tmp_path / "a" / "b" / "run").is_dir() and not list((tmp_path / "a" / "b" / "run").iterdir())
    assert check_run_dir(tmp_path / "a") == []  # it exists: nothing created, still probed
    remove_created(created)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/proc/nope/run", "cannot create run directory /proc/nope/run (/proc/nope: No such file or directory)"),
        ("/dev/null/run", "cannot create run directory /dev/null/run (Not a directory)"),
    ],
)
def test_a_run_directory_that_cannot_be_made_is_refused_in_one_line(path, expected):
    with pytest.raises(RunDirError) as raised:
        check_run_dir(path)
    message = str(raised.value)
    assert message == f"{expected}; pass a writable --run-dir" and "\n" not in message


def test_a_run_directory_whose_disk_refuses_the_probe_is_refused_and_left_as_found(tmp_path, monkeypatch):
    import builtins

    real_open = builtins.open

    def refusing(file, *a, **kw):
        if PROBE_PREFIX in str(file):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(file))
        return real_open(file, *a, **kw)

    monkeypatch.setattr(builtins, "open", refusing)
    with pytest.raises(RunDirError) as raised:
        check_run_dir(tmp_path / "new" / "run")
    assert str(raised.value).startswith(f"cannot write in run directory {tmp_path / 'new' / 'run'} (")
    assert "Read-only file system" in str(raised.value) and list(tmp_path.iterdir()) == []


def test_the_record_size_is_the_measured_one():
    # Measured: 6,459 bytes per 256-token record in a demo-like run (the issue: "about 6 KB ... in the demo").
    assert 6459 <= record_bytes(256) <= 6600
    assert record_bytes(0) == diskio.RECORD_HEAD_BYTES


def test_the_fill_rate_is_the_drop_of_the_free_space_over_the_last_minute():
    assert fill_forecast([(0.0, 1000)]) is None
    assert fill_forecast([(0.0, 1000), (5.0, 900)]) is None  # under 10 s: a burst, not a rate
    assert fill_forecast([(0.0, 1000), (20.0, 1000)]) is None  # nothing written
    f = fill_forecast([(0.0, 10_000), (10.0, 9_000), (20.0, 8_000)])
    assert (f.free, f.rate_bps, f.span_s, f.full_in_s) == (8_000, 100.0, 20.0, 80.0)
    # Only the last minute counts: the rate grows with the load.
    f = fill_forecast([(0.0, 100_000), (100.0, 99_000), (130.0, 96_000), (160.0, 93_000)])
    assert f.span_s == 60.0 and f.rate_bps == 100.0


def options(**kw) -> SimpleNamespace:
    base = dict(
        steps="1,2", rates="", step_duration="30s", max_step_duration="5m", find_capacity="", trace="",
        max_tokens=256, max_tokens_dist="", endpoint="completions", repeat=1,
    )  # fmt: skip
    base.update(kw)
    return SimpleNamespace(**base)


def test_the_planned_length_of_a_run():
    assert diskspace.planned_seconds(options()) == 60.0
    assert diskspace.planned_seconds(options(step_duration="auto")) == 600.0  # at most --max-step-duration each
    assert diskspace.planned_seconds(options(rates="1,2,4", steps="")) == 90.0
    assert diskspace.planned_seconds(options(find_capacity="users")) is None
    assert diskspace.planned_seconds(options(repeat=3)) == 180.0  # --repeat 3: the whole plan three times


def test_an_open_loop_is_warned_before_the_run_when_its_records_do_not_fit(tmp_path, monkeypatch):
    monkeypatch.setattr(diskspace, "free_bytes", lambda _p: 1_000_000)
    line = diskspace.before_run(options(rates="2,4", steps=""), tmp_path)  # 180 requests x 6.5 KB = 1.2 MB
    assert line.startswith(f"the disk of {tmp_path} has 1.0 MB free, and this run's 180 scheduled requests need ")
    assert "per 256-token request" in line and line.endswith("pass --run-dir on a larger disk")
    assert diskspace.before_run(options(rates="2,4", steps="", max_tokens_dist="uniform:8:24"), tmp_path) is None
    assert diskspace.before_run(options(), tmp_path) is None  # a closed loop: its rate is measured during the run


def test_the_disk_watch_warns_once_when_the_disk_fills_before_the_planned_end(tmp_path, monkeypatch, caplog):
    free = iter([10_000_000, 9_000_000, 8_000_000, 7_000_000, 6_000_000])
    monkeypatch.setattr(diskspace, "free_bytes", lambda _p: next(free))
    watch = diskspace.DiskWatch(tmp_path, planned_s=600.0)
    watch._began = 0.0
    with caplog.at_level(logging.WARNING):
        assert watch.check(0.0) is None and watch.check(5.0) is None  # no rate yet
        line = watch.check(10.0)  # 200 KB/s, 8 MB free: full in 40 s, the run has 590 s to go
        assert watch.check(15.0) is None
    assert line.startswith(f"the disk of {tmp_path} fills in about 40 s at the rate this run writes (200.0 KB/s")
    assert "before the run's planned end in 10 min" in line and [r.getMessage() for r in caplog.records] == [line]


def test_the_disk_watch_is_quiet_when_the_run_ends_first(tmp_path, monkeypatch):
    free = iter([10_000_000, 9_990_000, 9_980_000])
    monkeypatch.setattr(diskspace, "free_bytes", lambda _p: next(free))
    watch = diskspace.DiskWatch(tmp_path, planned_s=60.0)
    watch._began = 0.0
    assert [watch.check(t) for t in (0.0, 10.0, 20.0)] == [None, None, None]  # full in ~5,000 s


def test_the_scraper_says_a_failed_write_once_and_keeps_complete_lines(fake_server, tmp_path):
    """The scraper's child process under a file size limit: its metrics.jsonl keeps complete scrapes only, the
    parent is told once (a status line), the scrapes go on for the live view, and nothing is printed."""
    server = fake_server()
    out = tmp_path / "metrics.jsonl"
    child = subprocess.Popen(
        [sys.executable, "-m", "vllm_loadtest.locustfiles.scraper", "--url", f"{server.url}/metrics",
         "--interval", "0.05", "--timeout", "2", "--out", str(out)],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=file_size_limit(8_000),
    )  # fmt: skip
    statuses = []
    try:
        while len(statuses) < 60:  # a scrape of the fake server is ~1 KB: the limit is reached within ~10
            statuses.append(orjson.loads(child.stdout.readline()))
    finally:
        child.stdin.close()
        child.wait(30)
    stderr = child.stderr.read().decode()
    errors = [s for s in statuses if "write_error" in s]
    assert child.returncode == 0 and stderr == "", stderr
    assert len(errors) == 1 and errors[0]["write_error"].startswith(f"file too large writing {out} after ")
    assert errors[0]["fix"].startswith("raise the file size limit")
    assert statuses.index(errors[0]) < len(statuses) - 10  # the scrapes went on after it
    data = out.read_bytes()
    kept = int(errors[0]["write_error"].split(" after ")[1].split()[0])
    assert data.endswith(b"\n") and len(data.splitlines()) == kept and len(data) <= 8_000
    assert all(orjson.loads(line)["samples"] for line in data.splitlines())


def test_the_parent_says_the_scrapers_failed_write_once(caplog):
    from vllm_loadtest.locustfiles.scraper import MetricsScraper, write_error_status

    scraper = MetricsScraper("http://127.0.0.1:1/metrics", 1.0, "/tmp")
    failure = WriteFailure("run/metrics.jsonl", OSError(errno.ENOSPC, "No space left on device"), 3, "scrapes")
    ok = orjson.dumps({"t": 1.0, "error": None, "samples": []}, option=orjson.OPT_APPEND_NEWLINE)
    import gevent.event

    scraper._first = gevent.event.Event()
    scraper._proc = SimpleNamespace(stdout=[write_error_status(failure), ok, ok])
    with caplog.at_level(logging.WARNING):
        scraper._read_status()
    assert [r.getMessage() for r in caplog.records] == [
        "disk full writing run/metrics.jsonl after 3 scrapes: the scrapes go on unrecorded (free space, or pass "
        "--run-dir on a larger disk)"
    ]
    assert scraper.scrapes == 2 and scraper.gaps == 0


def small_run(run_dir, open_step: bool = True) -> None:
    writer = RecordWriter(run_dir / RECORDS_DIR / "w.jsonl")
    for i in range(20):
        writer.write(make_record(i, start_time=1000.0 + i / 4))
    writer.close()
    step = {"step": 0, "users": 1, "start_time": 999.0, "measure_start": 999.0, "end_time": None, "rate_rps": None}
    if not open_step:
        step.update(end_time=1006.0, end_reason="fixed")
    write_run(run_dir, {"started_at": 999.0, "finished_at": None, "timeline": [step], "options": {}})


def test_a_step_left_open_by_a_run_json_that_could_not_be_written_ends_at_its_last_record(tmp_path):
    from vllm_loadtest.analysis.finish import compute_run

    small_run(tmp_path)
    outcome = compute_run(tmp_path)
    (step,) = outcome.run["timeline"]
    assert step["end_time"] == 1000.0 + 19 / 4 + 0.16 and step["end_reason"] == "run_stopped"
    assert outcome.table["aggregate_tok_s"].notna().all()
    assert sorted(p.name for p in tmp_path.iterdir()) == [RECORDS_DIR, RUN_FILE]  # compute_run writes nothing
    small_run(tmp_path / "closed", open_step=False)
    (step,) = compute_run(tmp_path / "closed").run["timeline"]
    assert (step["end_time"], step["end_reason"]) == (1006.0, "fixed")  # a finished run's timeline is its own


def test_the_report_command_on_a_full_disk_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    from vllm_loadtest.analysis.__main__ import main

    small_run(tmp_path)

    def full(*_a, **_kw):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(diskio.os, "replace", full)
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"error: disk full writing {tmp_path / 'requests.parquet'}: the raw files are kept; make room there (or copy "
        f"{tmp_path} to another disk), then run this again"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == [RECORDS_DIR, RUN_FILE]
