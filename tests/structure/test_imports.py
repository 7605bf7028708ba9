"""The import graph of ``src`` has no cycle, counting imports inside functions and under
``if TYPE_CHECKING:`` too: a cycle dodged either way is still a cycle (STYLE.md: split the
module, or move the shared type to a lower module, instead).
And the layers of DESIGN.md point downward: ``core`` and ``training`` never import the
services, and nothing below the CLI and the SDK imports them; inside the coordinator, each
folder imports only its own folder and the folders below it (docs/ARCHITECTURE.md)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def _modules() -> dict[str, Path]:
    """Module name -> file; a stub (``.pyi``) with no source beside it is a module too: type
    checkers import it."""
    out: dict[str, Path] = {}
    for path in [*SRC.rglob("*.py"), *SRC.rglob("*.pyi")]:
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out.setdefault(".".join(parts), path)
    return out


def _nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node, ``if TYPE_CHECKING:`` blocks included: an import only a type checker runs
    still ties the two modules together (each must know the other to be read)."""
    return list(ast.walk(tree))


def _graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (anywhere in its body)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in _nodes(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package, up level - 1
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                # `from pkg import sub` imports the submodule when there is one
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for t in targets:
                while t and t not in mods:  # `import a.b.c` of a name inside a module
                    t = t.rpartition(".")[0]
                if t and t != mod:
                    graph[mod].add(t)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_function_level_and_type_checking_imports_count():
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a\ndef f():\n    import b\n")
    names = {a.name for n in _nodes(tree) if isinstance(n, ast.Import) for a in n.names}
    assert names == {"a", "b"}


def test_no_import_cycle_in_src():
    cycles = _cycles(_graph())
    assert cycles == [], "import cycles (function-level and TYPE_CHECKING imports count): " + "; ".join(
        " <-> ".join(c) for c in cycles
    )


LAYERS = {  # a module under the key may not import any module under the values
    "aitbc.core": (
        "aitbc.training",
        "aitbc.storage",
        "aitbc.ledger",
        "aitbc.market",
        "aitbc.sim",
        "aitbc.coordinator",
        "aitbc.worker",
        "aitbc.cli",
        "aitbc_agent_sdk",
        "aitbc.client",
        "aitbc.stack",
    ),
    "aitbc.training": (
        "aitbc.ledger",
        "aitbc.market",
        "aitbc.sim",
        "aitbc.coordinator",
        "aitbc.worker",
        "aitbc.cli",
        "aitbc_agent_sdk",
        "aitbc.client",
        "aitbc.stack",
    ),
    "aitbc.storage": ("aitbc.sim", "aitbc.coordinator", "aitbc.worker", "aitbc.cli", "aitbc_agent_sdk"),
    "aitbc.ledger": ("aitbc.sim", "aitbc.coordinator", "aitbc.worker", "aitbc.cli", "aitbc_agent_sdk", "aitbc.chain"),
    # the EVM backend: a library the coordinator and the CLI call, never calling them
    "aitbc.chain": ("aitbc.sim", "aitbc.coordinator", "aitbc.worker", "aitbc.cli", "aitbc_agent_sdk"),
    "aitbc.market": ("aitbc.sim", "aitbc.coordinator", "aitbc.worker", "aitbc.cli", "aitbc_agent_sdk"),
    "aitbc.sim": ("aitbc.coordinator", "aitbc.worker", "aitbc.cli", "aitbc_agent_sdk"),
    "aitbc.coordinator": ("aitbc.worker", "aitbc.cli", "aitbc_agent_sdk", "aitbc.sim"),
    "aitbc.worker": ("aitbc.coordinator", "aitbc.cli", "aitbc_agent_sdk", "aitbc.sim"),
    "aitbc.units": ("aitbc.coordinator", "aitbc.cli", "aitbc_agent_sdk"),
    # the replies' shapes and the statuses they carry, below the coordinator and its clients
    **dict.fromkeys(
        ("aitbc.replies", "aitbc.states"),
        (
            "aitbc.coordinator",
            "aitbc.worker",
            "aitbc.cli",
            "aitbc_agent_sdk",
            "aitbc.sim",
            "aitbc.client",
            "aitbc.stack",
        ),
    ),
    # plain data in, files out: no HTTP, no service, no simulator
    **dict.fromkeys(
        ("aitbc.reports", "aitbc.trackers"),
        (
            "aitbc.coordinator",
            "aitbc.worker",
            "aitbc.cli",
            "aitbc_agent_sdk",
            "aitbc.client",
            "aitbc.stack",
            "aitbc.sim",
            "httpx",
        ),
    ),
}


def _under(mod: str, prefix: str) -> bool:
    return mod == prefix or mod.startswith(prefix + ".")


def test_layers_point_downward():
    wrong = sorted(
        f"{mod} -> {dep}"
        for mod, deps in _graph().items()
        for layer, banned in LAYERS.items()
        if _under(mod, layer)
        for dep in deps
        if any(_under(dep, b) for b in banned)
    )
    assert wrong == [], "imports a lower layer may not make (LAYERS):\n" + "\n".join(wrong)


# The coordinator's folders and root modules, bottom to top (docs/ARCHITECTURE.md draws them):
# a module imports modules of its own entry and of the entries below it, never above. A new
# folder or root module gets its place here, or the test names it.
COORDINATOR = "aitbc.coordinator"
COORDINATOR_LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "config", "heap"),
    ("chain_backend",),
    ("store",),
    ("transfer",),
    ("observability",),
    ("schemas", "context"),
    ("storage",),
    ("live",),
    ("money",),
    ("workforce",),
    ("verification",),
    ("rounds",),
    ("runs",),
    ("api",),
    ("app", "server"),
)


def _layer(mod: str, layers: tuple[tuple[str, ...], ...] = COORDINATOR_LAYERS) -> int | None:
    """The index in ``layers`` of a coordinator module's folder or root module; None: unplaced."""
    part = mod.removeprefix(COORDINATOR + ".").partition(".")[0]
    return next((i for i, names in enumerate(layers) if part in names), None)


def _upward(graph: dict[str, set[str]], layers: tuple[tuple[str, ...], ...] = COORDINATOR_LAYERS) -> list[str]:
    """Each import between two placed coordinator modules that points up ``layers``, as a
    readable line (an unplaced module is :func:`test_every_coordinator_module_has_a_layer`'s)."""
    placed = {m: i for m in graph if _under(m, COORDINATOR) and (i := _layer(m, layers)) is not None}

    def where(mod: str) -> str:
        return f"{mod} ({'/'.join(layers[placed[mod]])}, layer {placed[mod]})"

    return sorted(
        f"{where(mod)} imports {where(dep)}"
        for mod in placed
        for dep in graph[mod]
        if dep in placed and placed[dep] > placed[mod]
    )


def test_layer_check_finds_an_upward_import():
    layers = (("errors",), ("store",), ("api",))
    graph = {
        "aitbc.coordinator.store.db": {"aitbc.coordinator.errors", "aitbc.coordinator.store.models"},
        "aitbc.coordinator.store.models": {"aitbc.coordinator.api.deps"},
        "aitbc.coordinator.api.deps": {"aitbc.coordinator.store.db"},
        "aitbc.coordinator.errors": set(),
    }
    assert _upward(graph, layers) == [
        "aitbc.coordinator.store.models (store, layer 1) imports aitbc.coordinator.api.deps (api, layer 2)"
    ]


def test_every_coordinator_module_has_a_layer():
    unplaced = sorted(m for m in _graph() if _under(m, COORDINATOR) and m != COORDINATOR and _layer(m) is None)
    assert unplaced == [], "place these in COORDINATOR_LAYERS: " + ", ".join(unplaced)


def test_coordinator_folders_import_downward():
    wrong = _upward(_graph())
    assert wrong == [], "imports up the coordinator's layers (COORDINATOR_LAYERS):\n" + "\n".join(wrong)
