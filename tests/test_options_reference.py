"""docs/options.md's reference table is generated from the parser, and the page's prose names only options that
exist, with the defaults the parser has."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from locust.argument_parser import get_parser
from vllm_loadtest.locustfiles import options_reference as ref

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / ref.DOCS_FILE).read_text(encoding="utf-8")
# Flags of the other programs the page shows: the fake server's and vLLM's own.
OTHER_PROGRAMS = {"--max-running", "--enable-auto-tool-choice", "--tool-call-parser"}


def test_the_page_holds_the_generated_table():
    assert ref.block() in PAGE, f"{ref.DOCS_FILE} differs from the parser: regenerate it with `{ref.DOCS_COMMAND}`"
    for action in ref.suite_actions():
        assert f"| `{action.option_strings[0]}` |" in ref.block(), action.dest
    assert "| `--api-key-env` | `OPENAI_API_KEY` |" in ref.block()
    assert "%%" not in ref.block()  # argparse's escape is not shown


def test_every_option_the_prose_names_exists():
    parser = get_parser(default_config_files=[])
    known = {s for a in parser._actions for s in a.option_strings}
    known |= {s for a in ref.suite_actions() for s in a.option_strings}
    named = set(re.findall(r"`(--[a-z0-9][a-z0-9-]*[a-z0-9])", PAGE)) - OTHER_PROGRAMS
    assert len(named) > 50  # the prose was read
    assert not named - known, f"{ref.DOCS_FILE} names options that do not exist: {sorted(named - known)}"


def test_the_defaults_the_prose_gives_are_the_parsers():
    defaults = {a.option_strings[0]: a.default for a in ref.suite_actions()}
    said = re.findall(r"`(--[a-z0-9-]+)` \(default `([^`]*)`", PAGE)
    assert len(said) > 20
    for flag, text in said:
        if defaults.get(flag) not in (None, ""):  # an empty default is one the run derives (the prose says how)
            assert text == str(defaults[flag]), f"{ref.DOCS_FILE}: {flag} defaults to {defaults[flag]!r}, not {text!r}"


def test_the_write_command_replaces_only_the_table(tmp_path):
    page = tmp_path / "options.md"
    page.write_text(f"# Options\n\nprose\n\n{ref.BEGIN}\n\nstale\n\n{ref.END}\n\nmore prose\n", encoding="utf-8")
    assert ref.main(["--write", str(page)]) == 0
    text = page.read_text(encoding="utf-8")
    assert text == f"# Options\n\nprose\n\n{ref.block()}\n\nmore prose\n"
    fresh = tmp_path / "new.md"
    assert ref.main(["--write", str(fresh)]) == 0 and ref.block() in fresh.read_text(encoding="utf-8")
