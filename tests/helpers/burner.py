"""Run a command while another process keeps one core busy: `python -m tests.helpers.burner [-n N] -- CMD ...`.

`make test-stress` runs the whole suite this way (tests/README.md): a test that a busy machine breaks is a broken
test. The burner is a plain spinning process at normal priority, as another job on a shared CI runner would be; it
is stopped when the command ends, and the command's exit code is returned. The wall time goes to stderr.
"""

from __future__ import annotations

import argparse
import multiprocessing
import subprocess
import sys
import time


def spin() -> None:
    x = 0
    while True:
        x = (x + 1) & 0xFFFF


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.helpers.burner", description=__doc__.splitlines()[0])
    p.add_argument("-n", "--cores", type=int, default=1, help="busy cores (default 1)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    a = p.parse_args(argv)
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command:
        p.error("no command: give it after --")
    burners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(a.cores)]
    for b in burners:
        b.start()
    started = time.monotonic()
    try:
        code = subprocess.call(command)
    except KeyboardInterrupt:
        code = 130
    finally:
        for b in burners:
            b.terminate()
    print(
        f"{' '.join(command)}: exit code {code} after {time.monotonic() - started:.0f} s "
        f"with {a.cores} core(s) kept busy",
        file=sys.stderr,
    )
    return code


if __name__ == "__main__":
    sys.exit(main())
