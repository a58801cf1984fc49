"""The `vllm-loadtest` command: the suite's own front door, with Locust underneath.

    vllm-loadtest [run] --host URL --steps 1,2,4 --headless   # a load test (Locust with the bundled locustfile)
    vllm-loadtest report RUN_DIR [--compare RUN_DIR ...]      # rebuild a run's results (python -m analysis report)
    vllm-loadtest compare RUN_DIR OTHER [...]                 # RUN_DIR's report with the others compared
    vllm-loadtest serve | demo                                # the embedded vLLM (python -m embedded_vllm)
    vllm-loadtest glossary [--docs]                           # the metrics (python -m analysis glossary)

`--help` lists the suite's options by group (vllm_loadtest/usage.py), `--help-locust` Locust's own, `--version` the
suite's version with Locust's (and the server's when --host answers). An option neither the suite nor Locust knows
is one `error:` line with the closest known option, exit code 3, before anything starts.
"""

from __future__ import annotations

import sys
from pathlib import Path

# The subcommands and what each runs; anything else is a load test's command line (`run` may be left out).
ANALYSIS_COMMANDS = ("report", "steps", "glossary", "snapshot")
EMBEDDED_COMMANDS = ("serve", "demo")
COMMANDS = ("run", "compare", *ANALYSIS_COMMANDS, *EMBEDDED_COMMANDS)
EXIT_BAD_INPUT = 3  # locustfiles/exitcodes.py's EXIT_SETUP_ERROR, without importing Locust for it


def locustfile() -> Path:
    """The bundled locustfile, wherever the package lives (site-packages or a checkout)."""
    from vllm_loadtest import locustfiles

    return Path(locustfiles.__file__).resolve().parent / "vllm_streaming.py"


def _error(message: str) -> int:
    sys.stderr.write(f"error: {message}\n")
    return EXIT_BAD_INPUT


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and not argv[0].startswith("-") else "run"
    if argv and argv[0] == command:
        argv = argv[1:]
    if command not in COMMANDS:
        from difflib import get_close_matches

        close = get_close_matches(command, COMMANDS, n=1)
        hint = f"did you mean `vllm-loadtest {close[0]}`?" if close else f"the commands: {', '.join(COMMANDS)}"
        return _error(f"unknown command {command!r}: {hint} (vllm-loadtest --help lists them)")
    if command in ANALYSIS_COMMANDS:
        from vllm_loadtest.analysis.__main__ import main as analysis_main

        return analysis_main([command, *argv])
    if command == "compare":
        if len(argv) < 2 or any(a.startswith("-") for a in argv):
            return _error("compare takes two or more run directories: vllm-loadtest compare RUN_DIR OTHER_RUN_DIR")
        from vllm_loadtest.analysis.__main__ import main as analysis_main

        return analysis_main(["report", argv[0], "--compare", *argv[1:]])
    if command in EMBEDDED_COMMANDS:
        from vllm_loadtest.embedded_vllm.__main__ import main as embedded_main

        return embedded_main([command, *argv])
    return run(argv)


def run(argv: list[str]) -> int:
    """A load test: the suite's help, version and option check, then Locust with the bundled locustfile."""
    from vllm_loadtest import usage

    if any(a in ("-h", "--help") for a in argv):
        print(usage.help_text())
        return 0
    if any(a in ("-V", "--version") for a in argv):
        print(usage.version_text(argv))
        return 0
    locust_help = "--help-locust" in argv
    argv = ["--help" if a == "--help-locust" else a for a in argv]
    if not locust_help:
        unknown = usage.unknown_option(argv)
        if unknown is not None:
            return _error(unknown)
    # A -f of the user's own (a custom locustfile that installs the plugin) takes precedence over the bundled one.
    given = any(a in ("-f", "--locustfile") or a.startswith(("--locustfile=", "-f=")) for a in argv)
    sys.argv = ["vllm-loadtest", *([] if given else ["-f", str(locustfile())]), *argv]
    from locust.main import main as locust_main

    return locust_main()


if __name__ == "__main__":
    sys.exit(main())
