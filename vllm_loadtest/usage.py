"""What `vllm-loadtest --help` and `--version` print, and the check of a command line's options before Locust starts.

The help lists the suite's options by their declared group (each feature's options class has a GROUP), with their
defaults, from the same declarations as the parser (locustfiles/settings.py), then the few Locust options a run
needs; Locust's own help stays one flag away (`--help-locust`), since Locust prints it before loading the
locustfile that adds the suite's options.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from difflib import get_close_matches

USAGE = """\
usage: vllm-loadtest [run] --host URL [options]       a load test (the web UI at :8089 unless --headless)
       vllm-loadtest report RUN_DIR [--compare RUN_DIR ...]
                                                      rebuild a run's steps.csv, summary.json and report.html
       vllm-loadtest compare RUN_DIR OTHER_RUN_DIR    RUN_DIR's report with OTHER_RUN_DIR compared step by step
       vllm-loadtest serve | demo                     the embedded vLLM (CPU build, a tiny model) | the demo
       vllm-loadtest glossary [--docs]                every metric and column, its unit and formula

Load-tests an OpenAI-compatible LLM server (vLLM, SGLang, TGI, ...) at stepped user counts or open-loop rates,
stamping every streamed chunk: TTFT, TPOT, ITL and tokens/s per step with their intervals, where the server
saturates and why (KV cache, compute), and whether it meets your SLOs. Results: the run directory's steps.csv,
summary.json and report.html (--run-dir).

  vllm-loadtest --host http://127.0.0.1:8000 --headless --steps 1,2,4,8 --step-duration 30s
  vllm-loadtest --host http://127.0.0.1:8000 --headless --find-capacity --slo ttft_p95=500ms"""

# Locust's options a run needs, shown in the suite's help under the group they belong to (their help is Locust's).
LOCUST_SHOWN = {
    "Run": ("--host", "--headless", "--config", "--web-port"),
    "Distributed": ("--processes", "--master", "--worker", "--master-host", "--expect-workers"),
}
# The suite's groups (locustfiles/settings.py's GROUP_ORDER) after Locust's "Run" options; Locust's "Distributed"
# ones after the suite's own.
TAIL = """\
Every option is also read from a config file (--config FILE, or ./locust.conf: `steps = 1,2,4`) and from its
LOCUST_* environment variable (LOCUST_STEPS=1,2,4), as Locust's own are; the command line wins.
Locust's own options (-u, -t, --web-host, --csv, --loglevel, ...): vllm-loadtest --help-locust
Every option with its variable: docs/reference/options.md; exit codes: 0 ok, 1 errors or a broken SLO,
2 the tool crashed, 3 bad input or an unreachable server, 4 a result file could not be written,
5 every worker went missing and the run was cut short."""


def _default_text(field: dataclasses.Field) -> str:
    default = field.default
    if default in (None, "", False, []) or re.search(r"\bdefault\b", field.metadata["help"], re.IGNORECASE):
        return ""
    return f" (default: {default})".replace("%", "%%")


def _locust_actions() -> dict[str, argparse.Action]:
    from locust.argument_parser import get_parser

    return {s: a for a in get_parser(default_config_files=())._actions for s in a.option_strings}


def help_text() -> str:
    """The suite's --help: usage, then every suite option by group with its default, then where the rest is."""
    from vllm_loadtest.locustfiles import declare, settings

    parser = argparse.ArgumentParser(
        prog="vllm-loadtest", usage=argparse.SUPPRESS, add_help=False, formatter_class=_Formatter
    )
    order = ("Run", *dict.fromkeys((*settings.GROUP_ORDER, "Distributed")))  # the suite's own Distributed ones too
    groups = {title: parser.add_argument_group(f"{title} options") for title in order}
    locust = _locust_actions()
    for title in ("Run",):
        for flag in LOCUST_SHOWN[title]:
            _add_locust(groups[title], locust[flag])
    for cls in settings.OPTION_CLASSES:
        group = groups[cls.GROUP]
        for f in declare.declared(cls):
            meta = f.metadata
            kwargs = {"help": meta["help"] + _default_text(f)}
            if str(f.type) == "bool":
                kwargs["action"] = "store_true"
            else:
                kwargs["metavar"] = "X" if meta["choices"] is None else "{" + ",".join(meta["choices"]) + "}"
            group.add_argument(meta["flag"], **kwargs)
    for flag in LOCUST_SHOWN["Distributed"]:
        _add_locust(groups["Distributed"], locust[flag])
    return f"{USAGE}\n\n{parser.format_help().strip()}\n\n{TAIL}"


def _add_locust(group, action: argparse.Action) -> None:
    flags = action.option_strings
    kwargs: dict = {"help": action.help or ""}  # an argparse help string already (its % escaped)
    if action.nargs == 0:
        kwargs["action"] = "store_true"
    else:
        kwargs["metavar"] = "X"
    group.add_argument(*flags, **kwargs)


class _Formatter(argparse.HelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32, width=118)


def version_text(argv: list[str]) -> str:
    """The suite's version with Locust's, and the server's when --host is given and its /version answers."""
    import locust

    from vllm_loadtest.analysis import __version__

    lines = [f"vllm-loadtest {__version__} (Locust {locust.__version__})"]
    host = _value(argv, ("--host", "-H"))
    if host:
        from vllm_loadtest.locustfiles.preflight import fetch_server_version

        server = fetch_server_version(host)
        lines.append(f"server {host}: vLLM {server}" if server else f"server {host}: its /version did not answer")
    return "\n".join(lines)


def _value(argv: list[str], flags: tuple[str, ...]) -> str | None:
    for i, a in enumerate(argv):
        for flag in flags:
            if a == flag and i + 1 < len(argv):
                return argv[i + 1]
            if a.startswith(flag + "="):
                return a.split("=", 1)[1]
    return None


def known_options() -> set[str]:
    """Every option string a run accepts: the suite's and Locust's, and this command's own."""
    from vllm_loadtest.locustfiles import declare, settings

    suite = {f.metadata["flag"] for cls in settings.OPTION_CLASSES for f in declare.declared(cls)}
    return suite | set(_locust_actions()) | {"--help-locust"}


def unknown_option(argv: list[str]) -> str | None:
    """The message for the first option that neither the suite nor Locust knows (None: all known), with the
    closest known one; a value that looks like an option (-1, a negative rate) is not taken for one."""
    known = known_options()
    for a in argv:
        if not a.startswith("-") or re.match(r"^-\d", a) or a == "-":
            continue
        flag = a.split("=", 1)[0]
        if flag in known or (not a.startswith("--") and a[:2] in known):  # -u10: a short option and its value
            continue
        close = get_close_matches(flag, sorted(known), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}?" if close else "vllm-loadtest --help lists the options"
        return f"unknown option {flag}: {hint} (Locust's own: vllm-loadtest --help-locust)"
    return None


DOCS_FILE = "docs/reference/cli.md"
DOCS_COMMAND = f"python -m vllm_loadtest.usage --write {DOCS_FILE}"


def page() -> str:
    """docs/reference/cli.md: what `vllm-loadtest --help` prints, generated from the same declarations."""
    return (
        f"# The command line\n\nGenerated from `vllm_loadtest/usage.py`; do not edit by hand: regenerate with "
        f"`{DOCS_COMMAND}`. What `vllm-loadtest --help` prints (every option with its variable: "
        "[options.md](options.md)):\n\n```text\n" + help_text() + "\n```\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_loadtest.usage")
    parser.add_argument("--write", metavar="PATH", help=f"write the page to PATH ({DOCS_FILE})")
    args = parser.parse_args(argv)
    if args.write:
        with open(args.write, "w", encoding="utf-8") as f:
            f.write(page())
    else:
        print(page(), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
