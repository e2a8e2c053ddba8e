"""The package's shape, checked: the layers of pyproject.toml's import-linter contract, no import
cycle (type-hint imports included), sizes, six modules at the root, no unreferenced code.

Each rule is one test, so that a failure names the rule; the rules and why: issue 22 and
``pyproject.toml`` (``[tool.importlinter]``).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "mlabench"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
#: Modules the root of the package may hold besides __init__.py and __main__.py: the nouns
#: everything imports.
MAX_ROOT_MODULES = 6
#: Functions over MAX_FUNCTION_LINES that this rule does not yet hold, and why (none now).
LONG_FUNCTIONS: set[str] = set()
#: The most modules one chain of imports may pass through, from ``mlabench.__main__`` down to
#: ``mlabench.errors``, imports inside functions and under TYPE_CHECKING included (issue 36: 26 when
#: counted first, through the report's sections, the tuning figures' data, the tuner's run and worker
#: pool, sweep's check and three backend modules).
MAX_IMPORT_CHAIN = 15


def test_packages_keep_their_layers():
    """``lint-imports`` over pyproject.toml's contracts: a package imports only those below it."""
    pytest.importorskip("importlinter", reason="import-linter is in the test extra: pip install -e .[test]")
    from importlinter.cli import lint_imports

    cwd = os.getcwd()
    os.chdir(REPO)  # the contracts are read from ./pyproject.toml, the package from sys.path
    sys.path.insert(0, str(REPO))
    try:
        assert lint_imports(no_cache=True, no_logo=True) == 0, "an import breaks a layer (details above)"
    finally:
        sys.path.remove(str(REPO))
        os.chdir(cwd)


def test_no_module_imports_itself_through_others():
    """No import cycle between modules, imports under ``if TYPE_CHECKING`` included (grimp's graph,
    Tarjan's strongly connected components)."""
    grimp = pytest.importorskip("grimp", reason="grimp comes with import-linter (the test extra)")
    graph = grimp.build_graph("mlabench", cache_dir=None)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(module: str) -> None:  # recursion depth is the import depth: a few dozen
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in graph.find_modules_directly_imported_by(module):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == module:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    assert not cycles, f"modules that import each other: {cycles}"


def longest_import_chain(graph) -> list[str]:
    """The longest chain ``a -> b -> ...`` of mlabench modules each importing the next, in ``graph``
    (grimp's, acyclic: :func:`test_no_module_imports_itself_through_others`)."""
    longest: dict[str, list[str]] = {}

    def chain(module: str) -> list[str]:  # recursion depth is the chain's length: about 15
        if module not in longest:
            below = [chain(m) for m in sorted(graph.find_modules_directly_imported_by(module))]
            longest[module] = [module, *max(below, key=len, default=[])]
        return longest[module]

    return max((chain(m) for m in sorted(graph.modules)), key=len)


def test_import_chains_are_short():
    """No chain of imports (inside functions too) passes through more than MAX_IMPORT_CHAIN modules: a
    module imports what it needs from a module of its own concern, not through a longer one."""
    grimp = pytest.importorskip("grimp", reason="grimp comes with import-linter (the test extra)")
    chain = longest_import_chain(grimp.build_graph("mlabench", cache_dir=None))
    assert len(chain) <= MAX_IMPORT_CHAIN, f"{len(chain)} modules: {' -> '.join(chain)}"


def python_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("path", python_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_modules_and_functions_are_short(path):
    """At most 400 lines a module and 60 a function (its signature and docstring included)."""
    text = path.read_text()
    lines = len(text.splitlines())
    assert lines <= MAX_MODULE_LINES, f"{path.relative_to(REPO)}: {lines} lines"
    rel = path.relative_to(REPO).as_posix()
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines)" for node in ast.walk(ast.parse(text))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES and f"{rel}:{node.name}" not in LONG_FUNCTIONS]
    assert not long, f"{rel}: {', '.join(long)}"


def test_the_root_holds_the_nouns_only():
    modules = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert len(modules) <= MAX_ROOT_MODULES, modules


def test_every_function_and_class_is_referenced():
    """vulture finds no unused function, method or class in mlabench/ (the tests and scripts count as
    users).  Decorators that register what they decorate, and pydantic's hooks, are names vulture
    cannot follow: they are listed here; anything else unused is in tests/vulture_whitelist.py with
    the reason."""
    pytest.importorskip("vulture", reason="vulture is in the test extra: pip install -e .[test]")
    registering = "@register,@field_validator,@model_validator,@model_serializer,@app.callback"
    out = subprocess.run(
        [sys.executable, "-m", "vulture", "mlabench", "tests", "scripts", "--min-confidence", "60",
         "--ignore-decorators", registering, "--ignore-names", "model_post_init"],
        cwd=REPO, capture_output=True, text=True).stdout
    unused = [line for line in out.splitlines() if line.startswith("mlabench/")
              and any(f"unused {kind}" in line for kind in ("function", "method", "class", "property"))]
    assert not unused, "\n".join(unused)
