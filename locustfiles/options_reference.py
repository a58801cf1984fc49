"""docs/options.md's reference table, generated from the parser (settings.add_arguments: the features'
declarations), so that the page lists every option with the default, variable and choices the code has, and a test
notices when they part.

python -m vllm_loadtest.locustfiles.options_reference               # print the table
python -m vllm_loadtest.locustfiles.options_reference --write docs/options.md   # replace the page's table
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import settings

DOCS_FILE = "docs/options.md"
DOCS_COMMAND = f"python -m vllm_loadtest.locustfiles.options_reference --write {DOCS_FILE}"
BEGIN = "<!-- options reference: generated from the options' declarations; regenerate, do not edit by hand -->"
END = "<!-- end of the generated options reference -->"


def suite_actions() -> list[argparse.Action]:
    """The suite's options, in the order options.add_arguments declares them."""
    from locust.argument_parser import LocustArgumentParser

    parser = LocustArgumentParser(add_help=False)
    settings.add_arguments(parser)
    return list(parser._actions)


def _cell(text: object) -> str:
    return str(text).replace("%%", "%").replace("|", "\\|").replace("\n", " ")


def _default(action: argparse.Action) -> str:
    if isinstance(action, argparse._StoreTrueAction):
        return "off"
    if action.default in (None, ""):
        return "(none)"
    return f"`{action.default}`"


def reference_table() -> str:
    """One row per option: its flag, default, environment variable, choices and help text."""
    rows = [
        "| Option | Default | Variable | Choices | What it does |",
        "|---|---|---|---|---|",
    ]
    for a in suite_actions():
        flag = " ".join(f"`{s}`" for s in a.option_strings)
        env = f"`{a.env_var}`" if getattr(a, "env_var", None) else "-"
        choices = ", ".join(f"`{c}`" for c in a.choices) if a.choices else "-"
        rows.append(f"| {flag} | {_default(a)} | {env} | {choices} | {_cell(a.help or '')} |")
    return "\n".join(rows)


def block() -> str:
    """The generated part of docs/options.md, markers included."""
    return f"{BEGIN}\n\n{reference_table()}\n\n{END}"


def replaced(page: str) -> str:
    """`page` with its generated part replaced (appended under a heading when it has none yet)."""
    if BEGIN in page and END in page:
        head, rest = page.split(BEGIN, 1)
        return head + block() + rest.split(END, 1)[1]
    return page.rstrip("\n") + "\n\n## Every option (reference)\n\n" + block() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_loadtest.locustfiles.options_reference")
    parser.add_argument("--write", type=Path, metavar="PATH", help=f"replace the generated table in PATH ({DOCS_FILE})")
    args = parser.parse_args(argv)
    if args.write is None:
        print(reference_table())
        return 0
    page = args.write.read_text(encoding="utf-8") if args.write.exists() else ""
    args.write.write_text(replaced(page), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
