"""Disks that fill, for the tests of issue 22: a file size limit (no root needed) and a small tmpfs (root)."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def file_size_limit(max_bytes: int) -> Callable[[], None]:
    """A subprocess preexec_fn: every file the child (and its children) writes is limited to `max_bytes`, and a write
    beyond it fails with EFBIG, as on a full disk, instead of the SIGXFSZ that would kill the process."""

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # ignored dispositions survive exec: the scraper child too
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, resource.RLIM_INFINITY))

    return limit


@contextmanager
def small_tmpfs(size: str, parent: Path) -> Iterator[Path]:
    """A tmpfs of `size` (e.g. '3m') mounted under `parent`, unmounted afterwards; the test is skipped, with the
    reason, when it cannot be mounted (not root, or a sandbox that refuses mount even to root)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs this test as root)")
    point = parent / f"tmpfs-{uuid.uuid4().hex[:8]}"
    point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        point.rmdir()
        why = mounted.stderr.strip() or f"mount exited {mounted.returncode}"
        pytest.skip(f"this machine refuses to mount a tmpfs even as root: {why}")
    try:
        yield point
    finally:
        subprocess.run(["umount", "-l", str(point)], capture_output=True)
        point.rmdir()


def fill(path: Path, leave_bytes: int) -> Path:
    """A filler file taking the free space of `path`'s disk but about `leave_bytes`; returns it (delete it to free)."""
    filler = path / "filler"
    free = os.statvfs(path).f_bavail * os.statvfs(path).f_frsize
    with open(filler, "wb") as f:
        f.write(b"\0" * max(0, free - leave_bytes))
    return filler
