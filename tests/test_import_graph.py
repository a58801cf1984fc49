"""No import cycles between the suite's modules (analysis/, locustfiles/, embedded_vllm/), function-level imports
included; an import under `if TYPE_CHECKING:` is fine (it never runs)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers.paths import ROOT

pytestmark = pytest.mark.unit

PACKAGES = ("analysis", "locustfiles", "embedded_vllm")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


NAMESPACE = "vllm_loadtest."  # the distribution's namespace: the same modules as a checkout's analysis.* ...


def absolute(node: ast.ImportFrom, package: str) -> str:
    """The absolute module an ImportFrom names, relative ones resolved against `package`, the namespace dropped."""
    if node.level:
        base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        name = ".".join([*base, *([node.module] if node.module else [])])
    else:
        name = node.module or ""
    return name.removeprefix(NAMESPACE)


def imports(tree: ast.AST, modules: set[str], package: str = "") -> set[str]:
    """The suite's modules a module imports anywhere in its code (module level, in functions, in classes);
    `package` is the module's own package, for relative imports."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking_only(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.add(alias.name.removeprefix(NAMESPACE))
        elif isinstance(node, ast.ImportFrom) and (node.module or node.level):
            module = absolute(node, package)
            found.add(module)
            # `from analysis import report` (or `from . import report`) imports the module analysis.report
            found.update(f"{module}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    # `import analysis.x` also runs the package's __init__, which imports nothing of the suite: keep the module.
    return {name for name in found if name in modules}


def import_graph() -> dict[str, set[str]]:
    paths = [p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))]
    modules = {module_name(p) for p in paths}
    graph = {}
    for path in paths:
        name = module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = imports(ast.parse(path.read_text(encoding="utf-8")), modules, package) - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), as a sorted list of names."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return out


def test_the_cycle_finder_finds_a_lazy_import_cycle_and_ignores_type_checking():
    modules = {"a", "b", "c"}
    lazy = ast.parse("import b\n")
    back = ast.parse("def f():\n    from a import x\n")
    typing_only = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a\n")
    assert cycles({"a": imports(lazy, modules), "b": imports(back, modules)}) == [["a", "b"]]
    assert cycles({"a": imports(lazy, modules), "b": imports(typing_only, modules)}) == []
    # Relative imports and the installed namespace name the same modules as a checkout's absolute names.
    suite = {"analysis.steps", "analysis", "locustfiles.shape"}
    assert imports(ast.parse("from ..analysis import steps\n"), suite, "locustfiles") == {"analysis", "analysis.steps"}
    assert imports(ast.parse("from .shape import X\n"), suite, "locustfiles") == {"locustfiles.shape"}
    assert imports(ast.parse("import vllm_loadtest.analysis.steps as s\n"), suite) == {"analysis.steps"}


def test_the_graph_sees_the_suites_modules():
    graph = import_graph()
    assert "locustfiles.plugin" in graph and "analysis.finish" in graph["locustfiles.plugin"]
    assert "locustfiles.webui" in graph["locustfiles.plugin"]
    assert "analysis.report" in graph["analysis.finish"]  # a function-level import


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(group) for group in found)


def test_webui_and_options_import_neither_plugin_nor_datasets():
    graph = import_graph()
    assert "locustfiles.plugin" not in graph["locustfiles.webui"]
    assert "locustfiles.datasets" not in graph["locustfiles.options"]
    assert "locustfiles.options" not in graph["locustfiles.datasets"]
