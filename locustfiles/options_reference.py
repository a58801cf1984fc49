"""docs/reference/options.md, generated from the options' declarations (each feature's options class, composed in
settings.py) and the parser they make, so that the page lists every option with the group, default, variable and
choices the code has, and a test notices when they part.

python -m vllm_loadtest.locustfiles.options_reference                                   # print the page
python -m vllm_loadtest.locustfiles.options_reference --write docs/reference/options.md # write it
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import declare, settings

DOCS_FILE = "docs/reference/options.md"
DOCS_COMMAND = f"python -m vllm_loadtest.locustfiles.options_reference --write {DOCS_FILE}"
HEAD = f"""# Options

Generated from the options' declarations (each feature's options class, composed in `locustfiles/settings.py`); do
not edit by hand: regenerate with `{DOCS_COMMAND}`. `vllm-loadtest --help` prints the same options by group.

Every option is read, in this order of precedence, from the command line, from its environment variable (the
Variable column: Locust's `LOCUST_` + the flag's name), from a config file (`--config FILE`, else `./locust.conf`,
`~/.locust.conf` or `pyproject.toml`'s `[tool.locust]`: one `name = value` per line, the flag's name without its
dashes: `steps = 1,2,4`; a switch: `headless = true`), and otherwise takes its default, exactly as Locust's own options
are. Locust's own options (`-u`, `-t`, `--web-port`, `--processes`, ...): `vllm-loadtest --help-locust`. What each
group is for, and how its options combine: [../explanation/options-in-depth.md](../explanation/options-in-depth.md)."""


def suite_actions() -> list[argparse.Action]:
    """The suite's options, in the order settings.add_arguments declares them."""
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


def _row(a: argparse.Action) -> str:
    flag = " ".join(f"`{s}`" for s in a.option_strings)
    env = f"`{a.env_var}`" if getattr(a, "env_var", None) else "-"
    choices = ", ".join(f"`{c}`" for c in a.choices) if a.choices else "-"
    return f"| {flag} | {_default(a)} | {env} | {choices} | {_cell(a.help or '')} |"


def reference_table() -> str:
    """Per group (the classes' GROUP, in their order), one row per option: flag, default, variable, choices, help."""
    actions = {a.option_strings[0]: a for a in suite_actions()}
    groups: dict[str, list[str]] = {group: [] for group in settings.GROUP_ORDER}
    for cls in settings.OPTION_CLASSES:
        groups.setdefault(cls.GROUP, []).extend(f.metadata["flag"] for f in declare.declared(cls))
    out = []
    for group, flags in groups.items():
        out += [f"## {group}", "", "| Option | Default | Variable | Choices | What it does |", "|---|---|---|---|---|"]
        out += [_row(actions[flag]) for flag in flags]
        out.append("")
    return "\n".join(out).rstrip("\n")


def page() -> str:
    """The whole page."""
    return f"{HEAD}\n\n{reference_table()}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_loadtest.locustfiles.options_reference")
    parser.add_argument("--write", type=Path, metavar="PATH", help=f"write the page to PATH ({DOCS_FILE})")
    args = parser.parse_args(argv)
    if args.write is None:
        print(page(), end="")
        return 0
    args.write.write_text(page(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
