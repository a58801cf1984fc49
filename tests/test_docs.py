"""The README and docs/: a five-minute README, pages sorted by purpose, links that land, generated pages that match
the code, and examples that come from the script (tests/docs_examples.py), not from one remembered run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests import docs_examples
from tests.helpers.paths import ROOT
from vllm_loadtest import usage

pytestmark = pytest.mark.unit

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
# Remarks about one run on one machine: the examples' numbers come from the fake server (make docs) instead.
ONE_RUN = re.compile(r"on this (?:2-core )?machine|one run on|a fresh run printed|what it printed", re.I)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return {slug(m) for m in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def test_the_readme_is_a_five_minute_path():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    for command in ("make demo", "make test", "vllm-loadtest run --headless"):
        assert command in readme


def test_docs_are_sorted_by_purpose():
    top = {p.name for p in (ROOT / "docs").iterdir()}
    assert top == {"README.md", "tutorials", "how-to", "reference", "explanation"}
    index = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    for page in sorted((ROOT / "docs").rglob("*.md")):
        if page.name != "README.md":
            assert f"({page.relative_to(ROOT / 'docs')})" in index, f"docs/README.md does not list {page}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_lands(page):
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    for target in LINK.findall(text):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page.relative_to(ROOT)} links to {target}: no such file"
        if anchor and dest.suffix == ".md":
            assert anchor in anchors(dest), f"{page.relative_to(ROOT)} links to {target}: no such heading"


def test_the_command_line_page_is_generated():
    page = (ROOT / usage.DOCS_FILE).read_text(encoding="utf-8")
    assert page == usage.page(), f"regenerate {usage.DOCS_FILE} with `{usage.DOCS_COMMAND}`"


def test_every_example_comes_from_the_script():
    assert docs_examples.check() == []
    used = {name for p in PAGES for name, _ in docs_examples.blocks(p.read_text(encoding="utf-8"))}
    assert used == set(docs_examples.SCENARIOS)  # each scenario shown somewhere, none unknown
    for p in PAGES:
        for name, body in docs_examples.blocks(p.read_text(encoding="utf-8")):
            assert len(body.splitlines()) > 1, f"{p.relative_to(ROOT)}: example {name} is empty: run `make docs`"


@pytest.mark.parametrize("part", ["README.md", "tutorials", "how-to", "reference"])
def test_no_page_quotes_one_run_on_one_machine(part):
    paths = [ROOT / part] if part.endswith(".md") else sorted((ROOT / "docs" / part).rglob("*.md"))
    for path in paths:
        found = ONE_RUN.findall(path.read_text(encoding="utf-8"))
        assert not found, f"{path.relative_to(ROOT)}: {found}"


def test_the_run_directory_page_names_every_file_the_code_writes():
    import vllm_loadtest.analysis as analysis_pkg

    names = set()
    for path in Path(analysis_pkg.__file__).parent.rglob("*.py"):
        names |= set(re.findall(r'^[A-Z_]+_(?:FILE|DIR) = "([^"/]+)"', path.read_text(encoding="utf-8"), flags=re.M))
    page = (ROOT / "docs" / "reference" / "run-directory.md").read_text(encoding="utf-8")
    assert {"requests.parquet", "steps.csv", "summary.json", "metrics.parquet", "report.html"} <= names
    assert not {n for n in names if n not in page}, "docs/reference/run-directory.md leaves out a file"


def test_ci_runs_exactly_the_readmes_test_command():
    """CI must run what a new user runs: the README's `make test` line, word for word, is a line of .ci/run."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    (command,) = [line for line in readme if line.startswith("make test ")]
    assert command in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
