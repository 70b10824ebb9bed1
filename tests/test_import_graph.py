"""The import graph of ``trimaran/`` has no circle: every module imports only modules below it.

The graph is read with ``ast`` (nothing is imported). An edge is every ``import`` and ``from ...
import`` that names a module of the package, wherever it stands: at the top, under ``if
TYPE_CHECKING:`` (a type names a dependency as much as a call does) or inside a function (a
function-local import that hides a circle still closes it). ``from pkg import name`` is an edge to
``pkg.name`` when that is a module, else to ``pkg``. The implicit import of a package's
``__init__`` when one of its modules is imported is not an edge: it is Python's loading order, not
a choice of the importing module, and the ``__init__`` files hold little.

A strongly connected component of more than one module is a circle; the test names its modules and
the imports between them. The rooms' floors (which package may import which) are in
``tests/admin/test_imports.py``, the machines' purity in ``tests/test_sansio_imports.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_sansio_imports import PACKAGE


def module_name(path: Path) -> str:
    parts = ["trimaran", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str], source: str | None = None) -> set[str]:
    """The package's modules that ``name`` (the file at ``path``, or ``source`` in its place)
    imports, by any import statement anywhere in it."""
    tree = ast.parse(path.read_text() if source is None else source, str(path))
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            for alias in node.names:
                found.add(f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else module)
    return {module for module in found if module in known and module != name}


def import_graph(sources: dict[str, str] | None = None) -> dict[str, set[str]]:
    """module -> the modules it imports; ``sources`` replaces some modules' text (for the tests)."""
    found = modules()
    known = set(found)
    sources = sources or {}
    return {name: imports_of(name, path, known, sources.get(name)) for name, path in found.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
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
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def describe(graph: dict[str, set[str]], component: list[str]) -> str:
    members = set(component)
    return "; ".join(f"{m} -> {', '.join(sorted(graph[m] & members))}" for m in component)


def test_no_import_circle() -> None:
    graph = import_graph()
    found = circles(graph)
    assert not found, "import circles:\n" + "\n".join(describe(graph, c) for c in found)


def test_the_graph_sees_the_package() -> None:
    graph = import_graph()
    assert "trimaran.amqp091.handler" in graph and "trimaran.queue.manager" in graph
    assert "trimaran.queue.manager" in graph["trimaran.amqp091.handler"]


def test_a_circle_under_type_checking_or_inside_a_function_is_found() -> None:
    """Two careless back-references, one typed and one hidden in a function, each close a circle."""
    path = PACKAGE / "broker" / "router.py"
    typed = path.read_text() + (
        "\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from trimaran.broker.core import Broker\n"
    )
    local = path.read_text() + "\ndef _late() -> None:\n    from trimaran.broker import core\n"
    assert not [c for c in circles(import_graph()) if "trimaran.broker.router" in c]
    for careless in (typed, local):
        found = circles(import_graph({"trimaran.broker.router": careless}))
        assert any({"trimaran.broker.core", "trimaran.broker.router"} <= set(c) for c in found)
