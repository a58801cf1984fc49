"""The examples in README.md and docs/: each produced by a real run of `vllm-loadtest` against the fake server
(tests/fakeserver.py, whose timing is set exactly), so that no page quotes one remembered run.

    make docs                                  # = python -m tests.docs_examples --write (about 2 minutes)
    python -m tests.docs_examples --check      # every example block names a scenario and shows its command

A block in a page:

    <!-- example NAME: `make docs` writes it (tests/docs_examples.py); do not edit -->
    ```text
    $ vllm-loadtest ...        (the scenario's command, the fake server at http://127.0.0.1:8000)
    ...                        (the lines of its output the scenario keeps)
    ```
    <!-- end example -->

The numbers in a block are the fake server's: a server of 40 ms to the first token and 8 ms per token that admits
at most 8 streams at once (--max-running 8), so the curve has a knee at 8 users whatever machine writes the page.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.paths import ROOT
from tests.helpers.servers import FakeServer

SHOWN_HOST = "http://127.0.0.1:8000"
SERVER = ("--ttft-ms", "40", "--itl-ms", "8", "--max-running", "8")
PAGES = ("README.md", "docs")
BEGIN = re.compile(r"<!-- example (?P<name>[a-z-]+): .*?-->\n```text\n(?P<body>.*?)```\n<!-- end example -->", re.S)


def _between(start: str, end: str | None = None) -> Callable[[str], list[str]]:
    """The output's lines from the first that starts with `start` to before the first after it starting with `end`."""

    def keep(out: str) -> list[str]:
        lines = out.splitlines()
        i = next(k for k, line in enumerate(lines) if line.startswith(start))
        j = next((k for k in range(i + 1, len(lines)) if end is not None and lines[k].startswith(end)), len(lines))
        return lines[i:j]

    return keep


def _step_lines(out: str) -> list[str]:
    """The line per step (its header, then each step) up to the end-of-run tables, without Locust's log lines."""
    lines = [line for line in out.splitlines() if not line.startswith("[")]
    i = next(k for k, line in enumerate(lines) if line.endswith("(latencies in ms)"))
    j = next((k for k in range(i, len(lines)) if not lines[k].strip()), len(lines))
    return lines[i:j]


@dataclass(frozen=True)
class Scenario:
    args: tuple[str, ...]  # after `vllm-loadtest`; {host} is the fake server, {runs} the runs' folder
    keep: Callable[[str], list[str]]
    server: bool = True
    stream: str = "stdout"

    def command(self) -> str:
        return "$ vllm-loadtest " + " ".join(a.format(host=SHOWN_HOST, runs="reports") for a in self.args)


RUN = ("run", "--headless", "--host", "{host}", "--max-tokens", "32", "--step-warmup", "1s")
SCENARIOS: dict[str, Scenario] = {
    "step-lines": Scenario(
        (*RUN, "--steps", "1,2,4,8,16", "--step-duration", "6s", "--run-dir", "{runs}/stepped"), _step_lines
    ),
    "batching-curve": Scenario(
        (*RUN, "--steps", "1,2,4,8,16", "--step-duration", "6s", "--run-dir", "{runs}/stepped"),
        _between("Batching curve", "Server ("),
    ),
    "diagnosis": Scenario(
        (*RUN, "--steps", "1,2,4,8,16", "--step-duration", "6s", "--run-dir", "{runs}/stepped"),
        _between("Diagnosis:", "Integrity check:"),
    ),
    "capacity": Scenario(
        (
            *RUN,
            "--find-capacity",
            "users",
            "--slo",
            "ttft_p95=150ms",
            "--step-duration",
            "5s",
            "--max-users",
            "64",
            "--run-dir",
            "{runs}/capacity",
        ),
        _between("Capacity:", "Step lengths:"),
    ),
    "typo": Scenario(
        ("run", "--host", "{host}", "--step-duratoin", "30s"), lambda out: out.splitlines(), False, "stderr"
    ),
    "not-listening": Scenario(
        ("run", "--headless", "--host", "http://127.0.0.1:9"), lambda out: out.splitlines()[-1:], False, "stderr"
    ),
}


def run(name: str, scenario: Scenario, host: str, runs: Path, cache: dict[tuple, str]) -> str:
    """The scenario's block body: its command, then the lines it keeps (the fake server's port shown as 8000)."""
    args = tuple(a.format(host=host, runs=runs) for a in scenario.args)
    key = (args, scenario.stream)
    if key not in cache:
        proc = subprocess.run(
            [sys.executable, "-m", "vllm_loadtest.cli", *args], cwd=runs.parent, capture_output=True, text=True,
            timeout=600, env={**os.environ, "COLUMNS": "160"},
        )  # fmt: skip
        cache[key] = proc.stdout if scenario.stream == "stdout" else proc.stderr
    text = "\n".join(scenario.keep(cache[key])).replace(host, SHOWN_HOST).replace(str(runs), "reports")
    return f"{scenario.command()}\n{text.rstrip()}\n"


def blocks(page: str) -> list[tuple[str, str]]:
    """(scenario name, body) of every example block of a page."""
    return [(m["name"], m["body"]) for m in BEGIN.finditer(page)]


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def check() -> list[str]:
    """What is wrong with the pages' example blocks: an unknown scenario, or a command that is not the scenario's."""
    problems = []
    for path in pages():
        for name, body in blocks(path.read_text(encoding="utf-8")):
            if name not in SCENARIOS:
                problems.append(f"{path.relative_to(ROOT)}: no scenario {name!r}")
            elif body.split("\n", 1)[0] != SCENARIOS[name].command():
                problems.append(f"{path.relative_to(ROOT)}: example {name} does not start with its command")
    return problems


def write() -> None:
    """Run every scenario a page uses (each command once) and rewrite the blocks."""
    wanted = {name for path in pages() for name, _ in blocks(path.read_text(encoding="utf-8"))}
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp) / "reports"
        runs.mkdir()
        server = FakeServer(list(SERVER))
        try:
            cache: dict[tuple, str] = {}
            bodies = {name: run(name, SCENARIOS[name], server.url, runs, cache) for name in sorted(wanted)}
        finally:
            server.proc.kill()
    for path in pages():
        page = path.read_text(encoding="utf-8")
        new = BEGIN.sub(lambda m: m[0].replace(m["body"], bodies[m["name"]]), page)
        if new != page:
            path.write_text(new, encoding="utf-8")
            print(f"wrote {path.relative_to(ROOT)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.docs_examples")
    parser.add_argument("--write", action="store_true", help="run the scenarios and rewrite the example blocks")
    parser.add_argument("--check", action="store_true", help="only check the blocks' scenarios and commands")
    args = parser.parse_args(argv)
    if args.write:
        write()
    problems = check()
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
