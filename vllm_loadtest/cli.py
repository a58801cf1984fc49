"""The `vllm-loadtest` console script: Locust with the suite's bundled locustfile, or the analysis commands.

vllm-loadtest --host http://127.0.0.1:8000 --steps 1,2,4 --headless   # locust -f <bundled locustfile> ...
vllm-loadtest report RUN_DIR [--compare RUN_DIR ...]                   # python -m analysis report ...
"""

from __future__ import annotations

import sys
from pathlib import Path

# The subcommands of `python -m analysis`; anything else is a Locust command line.
ANALYSIS_COMMANDS = ("report", "steps", "glossary", "snapshot")


def locustfile() -> Path:
    """The bundled locustfile, wherever the package lives (site-packages or a checkout)."""
    from vllm_loadtest import locustfiles

    return Path(locustfiles.__file__).resolve().parent / "vllm_streaming.py"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ANALYSIS_COMMANDS:
        from vllm_loadtest.analysis.__main__ import main as analysis_main

        return analysis_main(argv)
    # A -f of the user's own (a custom locustfile that installs the plugin) takes precedence over the bundled one.
    given = any(a in ("-f", "--locustfile") or a.startswith(("--locustfile=", "-f=")) for a in argv)
    sys.argv = ["vllm-loadtest", *([] if given else ["-f", str(locustfile())]), *argv]
    from locust.main import main as locust_main

    return locust_main()


if __name__ == "__main__":
    sys.exit(main())
