"""docs/reference/options.md is generated from the options' declarations, and the explanation's prose
(docs/explanation/options-in-depth.md) names only options that exist, with the defaults the parser has."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from locust.argument_parser import get_parser
from vllm_loadtest.locustfiles import options_reference as ref

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = (ROOT / ref.DOCS_FILE).read_text(encoding="utf-8")
PROSE_FILE = "docs/explanation/options-in-depth.md"
PAGE = (ROOT / PROSE_FILE).read_text(encoding="utf-8")
# Flags of the other programs the page shows: the fake server's and vLLM's own.
OTHER_PROGRAMS = {"--max-running", "--enable-auto-tool-choice", "--tool-call-parser"}


def test_the_reference_is_the_generated_page():
    assert REFERENCE == ref.page(), (
        f"{ref.DOCS_FILE} differs from the declarations: regenerate it with `{ref.DOCS_COMMAND}`"
    )
    table = ref.reference_table()
    for action in ref.suite_actions():
        assert table.count(f"| `{action.option_strings[0]}` |") == 1, action.dest  # each once, in its group
    assert "| `--api-key-env` | `OPENAI_API_KEY` |" in table
    assert "%%" not in table  # argparse's escape is not shown


def test_every_option_the_prose_names_exists():
    parser = get_parser(default_config_files=[])
    known = {s for a in parser._actions for s in a.option_strings}
    known |= {s for a in ref.suite_actions() for s in a.option_strings}
    named = set(re.findall(r"`(--[a-z0-9][a-z0-9-]*[a-z0-9])", PAGE)) - OTHER_PROGRAMS
    assert len(named) > 50  # the prose was read
    assert not named - known, f"{PROSE_FILE} names options that do not exist: {sorted(named - known)}"


def test_the_defaults_the_prose_gives_are_the_parsers():
    defaults = {a.option_strings[0]: a.default for a in ref.suite_actions()}
    said = re.findall(r"`(--[a-z0-9-]+)` \(default `([^`]*)`", PAGE)
    assert len(said) > 20
    for flag, text in said:
        if defaults.get(flag) not in (None, ""):  # an empty default is one the run derives (the prose says how)
            assert text == str(defaults[flag]), f"{PROSE_FILE}: {flag} defaults to {defaults[flag]!r}, not {text!r}"


def test_the_write_command_writes_the_page(tmp_path):
    page = tmp_path / "options.md"
    page.write_text("stale", encoding="utf-8")
    assert ref.main(["--write", str(page)]) == 0 and page.read_text(encoding="utf-8") == ref.page()
