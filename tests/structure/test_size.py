"""Size limits for ``src``: no module over 600 lines and no function (methods and ``async``
ones included) over 80 lines, so each concept fits in one short file a reader can hold.

Declarative tables are the exception: they are long because they list things, not because
they do many things. Each is named below with why."""

from __future__ import annotations

import ast
from fnmatch import fnmatch
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80

# Paths relative to src (fnmatch patterns), or "path::qualified.function".
ALLOWED = {
    # one schema change per file, each a list of column definitions written once and never edited
    "aitbc/coordinator/**/migrations/versions/*.py",
    "aitbc/coordinator/store/migrations/versions/*.py",
}


def _allowed(key: str) -> bool:
    return any(fnmatch(key, pattern) for pattern in ALLOWED)


def _functions(tree: ast.Module) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function with its qualified name (``Class.method``, ``outer.inner``)."""
    out: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []
    todo: list[tuple[str, ast.AST]] = [("", tree)]
    while todo:
        prefix, node = todo.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    out.append((name, child))
                todo.append((name + ".", child))
            else:
                todo.append((prefix, child))
    return out


def _length(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from the first decorator (or ``def``) to the last line of the body."""
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return (node.end_lineno or node.lineno) - first + 1


def _offenders() -> tuple[list[str], list[str]]:
    modules, functions = [], []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if _allowed(rel):
            continue
        text = path.read_text()
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            modules.append(f"{rel}: {lines} lines")
        for name, node in _functions(ast.parse(text, str(path))):
            n = _length(node)
            if n > MAX_FUNCTION_LINES and not _allowed(f"{rel}::{name}"):
                functions.append(f"{rel}::{name} (line {node.lineno}): {n} lines")
    return modules, functions


def test_function_lengths_count_methods_nested_and_async_ones():
    tree = ast.parse("class A:\n    async def m(self):\n        def inner():\n            pass\n        return 1\n")
    found = {name: _length(node) for name, node in _functions(tree)}
    assert found == {"A.m": 4, "A.m.inner": 2}


def test_no_module_over_the_limit():
    modules, _ = _offenders()
    assert modules == [], f"modules over {MAX_MODULE_LINES} lines:\n  " + "\n  ".join(modules)


def test_no_function_over_the_limit():
    _, functions = _offenders()
    assert functions == [], f"functions over {MAX_FUNCTION_LINES} lines:\n  " + "\n  ".join(functions)
