"""Bad input found in this process, by the same checks a headless run makes before any load and in their order
(locustfiles/plugin.py at Locust's init): Locust's parser with the suite's arguments, startup.check_options(), the run
directory, and, with --host, the preflight questions to the server. What the run then prints and its exit code 3
are checked by a few real runs (tests/test_bad_input.py)."""

from __future__ import annotations

import io
from contextlib import redirect_stderr
from pathlib import Path

from vllm_loadtest.locustfiles import lora
from vllm_loadtest.locustfiles.preflight import SetupError, check_run_dir, preflight, remove_created
from vllm_loadtest.locustfiles.startup import check_options

from tests.helpers.inprocess import parse_options


def first_error(*args: str) -> str:
    """The one `error: ...` line a headless run with these arguments stops with; fails when there is none."""
    stderr = io.StringIO()
    try:
        with redirect_stderr(stderr):
            options = parse_options("--headless", *args)
    except SystemExit as e:  # the parser's error(): declare.one_line_error
        lines = stderr.getvalue().splitlines()
        assert e.code == 3 and len(lines) == 1 and lines[0].startswith("error: "), (e.code, lines)
        return lines[0]
    created: list[Path] = []
    try:
        check_options(options)
        created = check_run_dir(Path(options.run_dir or "reports"))
        if options.host:
            preflight(options)
            lora.preflight(options)
    except (ValueError, SetupError) as e:
        remove_created(created)  # as the plugin: a refused run leaves no folder it made
        message = str(e)
        assert message and "\n" not in message, repr(message)
        return f"error: {message}"
    raise AssertionError(f"no error for {args}")
