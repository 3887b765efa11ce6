"""The ledger's modules import each other without cycles.

Read from the source with ``ast``, so it counts every import: at module
level, inside functions (a lazy import hides a cycle, it does not remove
it) and under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ledgerdash"

MODULES_NAMES = {
    ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
    for p in PACKAGE.rglob("*.py")
    if "migrations" not in p.parts
}
#: Modules everything else builds on: the models, and what the models use to
#: check a tool's configuration. Nothing they import may import them back.
FOUNDATION = {
    "ledgerdash_client.errorcodes",
    "ledgerdash.ledger.models",
    "ledgerdash.ledger.errors",
    "ledgerdash_client.keys",
    "ledgerdash.ledger.canonical",
    "ledgerdash.ledger.providers.base",
    "ledgerdash.ledger.providers.factory",
    "ledgerdash.ledger.providers.http",
    "ledgerdash.ledger.providers.registry",
    *(name for name in MODULES_NAMES if name.startswith("ledgerdash.ledger.providers.presets")),
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path, *, module_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes: Iterator[ast.AST] = iter(tree.body) if module_level_only else ast.walk(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return {n for n in names if n in MODULES and n != name}


def _graph(*, module_level_only: bool) -> dict[str, set[str]]:
    return {name: _imports(name, path, module_level_only=module_level_only) for name, path in MODULES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_is_read() -> None:
    graph = _graph(module_level_only=False)
    assert "ledgerdash.ledger.providers.factory" in graph["ledgerdash.ledger.models"]
    assert "ledgerdash.ledger.models" in graph["ledgerdash.ledger.providers.registry"]
    assert "ledgerdash.ledger.errors" in graph["ledgerdash.ledger.canonical"]


def test_no_cycle_among_module_level_imports() -> None:
    assert _cycles(_graph(module_level_only=True)) == []


def test_no_cycle_through_the_models_and_what_they_build_on() -> None:
    tangled = [cycle for cycle in _cycles(_graph(module_level_only=False)) if FOUNDATION & set(cycle)]
    assert tangled == [], tangled


def test_a_cycle_would_be_found() -> None:
    graph = _graph(module_level_only=False)
    graph["ledgerdash.ledger.errors"] = graph["ledgerdash.ledger.errors"] | {"ledgerdash.ledger.models"}
    assert any("ledgerdash.ledger.errors" in cycle for cycle in _cycles(graph))


def test_the_ledger_and_its_server_import_nothing_of_the_dashboard() -> None:
    """``reviews`` (the dashboard) builds on ``ledgerdash``; nothing in ``ledgerdash`` imports it back,
    lazily or not (the settings name its app and its hooks by string)."""
    upward = {}
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            found = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                found = [node.module or ""]
            bad = [f for f in found if f == "reviews" or f.startswith("reviews.")]
            if bad:
                upward.setdefault(name, []).extend(bad)
    assert upward == {}


STORE = "ledgerdash.ledger.store"


def _store_parts_imported_from_outside() -> dict[str, set[str]]:
    outside = dict(MODULES)
    for path in (ROOT / "reviews").rglob("*.py"):
        if "migrations" not in path.parts:
            outside[".".join(path.relative_to(ROOT).with_suffix("").parts)] = path
    found: dict[str, set[str]] = {}
    for name, path in outside.items():
        if name == STORE or name.startswith(STORE + "."):
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                base = node.module or ""
                names = [base] if base != STORE else [f"{STORE}.{a.name}" for a in node.names]
            parts = {n for n in names if n.startswith(STORE + ".") and f"{STORE}.{n.split('.')[3]}" in MODULES}
            if parts:
                found.setdefault(name, set()).update(parts)
    return found


def test_the_fast_paths_live_in_the_store_and_nothing_outside_knows_its_parts() -> None:
    """The moves, the API and the dashboard use the store's interface
    (``ledgerdash.ledger.store``); how it reads and writes fast (its parts:
    the statements, the chains' general append, the remembered authority)
    is its own business."""
    assert _store_parts_imported_from_outside() == {}
    assert {"ledgerdash.ledger.store.statements", "ledgerdash.ledger.store.memory"} <= set(MODULES)


def test_the_client_imports_nothing_of_the_server() -> None:
    """The agents' client (clients/python) is installed without the server:
    nothing in it imports ``ledgerdash`` or ``reviews`` (the adapters take
    the in-process ledger as an argument)."""
    client = ROOT / "clients" / "python" / "src" / "ledgerdash_client"
    found = {}
    for path in sorted(client.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            server = [n for n in names if n.split(".")[0] in ("ledgerdash", "reviews")]
            if server:
                found[str(path.relative_to(ROOT))] = server
    assert found == {}


def test_the_providers_stand_alone() -> None:
    """The sandbox provider and the replicas import nothing of Django or the
    ledger, as a real provider would import neither."""
    for name, path in MODULES.items():
        if not name.startswith(("ledgerdash.sandbox", "ledgerdash.replicas")):
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        foreign = {
            n for n in imported if n.startswith(("django", "ledgerdash.ledger", "ledgerdash_client", "ledgerdash.ops"))
        }
        assert not foreign, f"{name} imports {sorted(foreign)}"


def test_the_cluster_script_needs_only_the_standard_library() -> None:
    """deploy/ha/cluster runs ledgerdash.ha.cluster with the system's python3, before any install."""
    path = MODULES["ledgerdash.ha.cluster"]
    tree = ast.parse(path.read_text(), filename=str(path))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    outside = {n for n in imported if n.split(".")[0] not in sys.stdlib_module_names and n != "__future__"}
    assert not outside, f"ledgerdash.ha.cluster imports {sorted(outside)}"
