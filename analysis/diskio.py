"""Writing the run directory when its disk may fill: a write is complete lines or nothing (`LineFile`), a replaced
file is the whole new one or the old one (`replace_file`), a failed write is one sentence with its fix
(`WriteFailure`), and the space a run needs (`record_bytes`, `fill_forecast`).

Why: a disk that filled mid-run (3 MiB, 8 users) left one torn half-line at the end of a records file, 5,166
tracebacks and a run that went on sending load it could no longer record. Every writer of the run directory goes
through here, so each failure is said once, in the same words, and no reader meets half a record.

Pure: no Locust; the forecast is a function of the samples it is given.
"""

from __future__ import annotations

import errno
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

# The size of a record line, measured in a demo-like run (8 users, 256-token answers streamed one token per chunk,
# as vLLM streams, against tests/fakeserver.py): 150 records of 6,459 bytes each, 865 bytes of fields and 21.9 bytes
# per chunk (orjson writes each chunk's offset as a float of up to 17 digits, ~19.9 bytes with its comma, and its
# token count, 2). A fit over 50,708 records of shorter answers gave 883 + 20.9 per chunk (their offsets are shorter
# numbers). Rounded up: the estimate is a warning's, better early than late; 256 tokens: 6.5 KB, the issue's "about
# 6 KB per 256-token request in the demo".
RECORD_HEAD_BYTES = 900
RECORD_CHUNK_BYTES = 22

_REASONS = {
    errno.ENOSPC: "disk full",
    errno.EDQUOT: "disk quota exceeded",
    errno.EFBIG: "file too large",
    errno.EROFS: "read-only file system",
    errno.EIO: "I/O error",
}


def reason(error: OSError) -> str:
    """A write error in a few words: 'disk full', 'file too large', or the system's own message."""
    return _REASONS.get(error.errno) or error.strerror or f"{type(error).__name__}: {error}"


def fix(error: OSError) -> str:
    """What to do about a write error, as the end of its line."""
    if error.errno == errno.EFBIG:
        return "raise the file size limit (ulimit -f), or pass --run-dir on a file system that allows larger files"
    if error.errno == errno.EROFS:
        return "remount it writable, or pass --run-dir on a writable disk"
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return "free space, or pass --run-dir on a larger disk"
    return "check the disk, or pass --run-dir on another disk"


class WriteFailure(OSError):
    """A file of the run directory could not be written: its path, the error, and how many lines it keeps (each a
    complete one). `str()` is the sentence: 'disk full writing records/x.jsonl after 1,514 records'."""

    def __init__(self, path: Path, error: OSError, kept: int | None = None, unit: str = "records") -> None:
        super().__init__(error.errno, error.strerror)
        self.path = Path(path)
        self.kept = kept
        self.unit = unit
        self.torn = False  # a partial last line could not be truncated away (the readers skip and count it)

    def __str__(self) -> str:
        after = "" if self.kept is None else f" after {self.kept:,} {self.unit}"
        return f"{reason(self)} writing {self.path}{after}"

    @property
    def fix(self) -> str:
        return fix(self)


class LineFile:
    """An append-only file of complete lines: each `write` leaves all of its lines in the file, or none.

    Unbuffered: a write is one write() straight to the OS when it is accepted whole (a crash cannot leave it in a
    buffer). A short write (the disk filled, or the file size limit was reached, in the middle of a line) is
    continued; when the rest fails, the file is truncated back to its last complete line and the failure raised,
    once. After that the file takes nothing more: later writes are counted in `dropped` and return False, so the
    caller says it once and the file never holds a line written after a gap."""

    def __init__(self, path: Path, unit: str = "records") -> None:
        self.path = Path(path)
        self.unit = unit
        self.lines = 0
        self.dropped = 0
        self.failure: WriteFailure | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "ab", buffering=0)
            self._end = os.fstat(self._file.fileno()).st_size
        except OSError as e:  # it cannot even be opened: nothing was kept, nor counted
            raise WriteFailure(self.path, e, None, unit) from None

    def write(self, data: bytes, lines: int = 1) -> bool:
        """Append `data` (`lines` complete lines); False when the file failed before (nothing written). Raises
        WriteFailure when this write fails, with the file truncated back to its last complete line."""
        if self.failure is not None:
            self.dropped += lines
            return False
        done = 0
        try:
            done = self._file.write(data)
            if done != len(data):  # a short write: the rest is tried (it raises, or a gap closed meanwhile)
                view = memoryview(data)
                while done < len(data):
                    n = self._file.write(view[done:])
                    if not n:
                        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                    done += n
        except OSError as e:
            self._fail(e, torn=done > 0)
            self.dropped += lines
            raise self.failure from None
        self._end += len(data)
        self.lines += lines
        return True

    def _fail(self, error: OSError, torn: bool) -> None:
        self.failure = WriteFailure(self.path, error, self.lines, self.unit)
        if not torn:
            return
        try:
            os.ftruncate(self._file.fileno(), self._end)
        except OSError:
            # The file keeps a partial last line: every reader skips it and counts it (analysis/records.py).
            self.failure.torn = True

    def close(self, sync: bool = True) -> None:
        """Flush to the disk (fsync) and close; raises WriteFailure when the flush fails (and none was raised)."""
        if self._file.closed:
            return
        try:
            if sync:
                os.fsync(self._file.fileno())
        except OSError as e:
            if self.failure is None:
                self.failure = WriteFailure(self.path, e, self.lines, self.unit)
                raise self.failure from None
        finally:
            self._file.close()


def replace_file(path: Path, data: bytes | str) -> None:
    """Replace `path` with `data` whole: written beside it, then renamed over it, so a failed write leaves the
    previous version (or none) rather than a part; raises WriteFailure, its partial copy removed."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(tmp, path)
    except OSError as e:
        remove_quietly(tmp)
        raise WriteFailure(path, e) from None


def replace_parquet(path: Path, table) -> None:
    """Replace `path` with the Arrow `table` as Parquet whole (as replace_file); raises WriteFailure."""
    import pyarrow.parquet as pq  # here: the scraper's child process writes lines only, and starts fast

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    except OSError as e:
        remove_quietly(tmp)
        raise WriteFailure(path, e) from None


def remove_quietly(path: Path) -> None:
    """Remove a partial file after a failed write; a failure to remove it too leaves it (a .tmp no reader reads)."""
    try:
        os.unlink(path)
    except OSError:
        pass


def free_bytes(path: Path) -> int | None:
    """The bytes an unprivileged writer can still put on the disk of `path` (its nearest existing ancestor); None
    when the system does not say."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def record_bytes(output_tokens: float) -> float:
    """The estimated size of one record line of a request of `output_tokens` tokens, one token per chunk."""
    return RECORD_HEAD_BYTES + RECORD_CHUNK_BYTES * max(0.0, float(output_tokens))


def size_text(n: float) -> str:
    """Bytes for a reader: '812 KB', '3.1 MB', '2.40 GB' (powers of 1000, as df -H)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            value = n / scale
            return f"{value:.2f} {unit}" if value < 10 and unit == "GB" else f"{value:.1f} {unit}"
    return f"{n:.0f} B"


@dataclass(frozen=True)
class Forecast:
    """The disk at the rate a run writes: what is free, the rate measured over `span_s`, when it would be full."""

    free: int
    rate_bps: float  # bytes per second, the drop of the free space over the span
    span_s: float
    full_in_s: float  # seconds until full at that rate


# The rate is measured over the last minute at most: the load grows step by step, and so does the rate.
FORECAST_WINDOW_S = 60.0
FORECAST_MIN_SPAN_S = 10.0  # less is a burst (a scrape, a step's first answers), not a rate


def fill_forecast(samples: list[tuple[float, int]]) -> Forecast | None:
    """From (time, free bytes) samples, oldest first: the free space now, the rate it drops at over the last
    FORECAST_WINDOW_S (at least FORECAST_MIN_SPAN_S of samples), and when the disk is full at that rate; None
    before there is such a span, or when the free space does not drop."""
    if len(samples) < 2:
        return None
    now, free = samples[-1]
    start = next((s for s in samples if now - s[0] <= FORECAST_WINDOW_S), samples[0])
    span = now - start[0]
    if span < FORECAST_MIN_SPAN_S:
        return None
    rate = (start[1] - free) / span
    if rate <= 0:
        return None
    return Forecast(free=free, rate_bps=rate, span_s=span, full_in_s=free / rate)
