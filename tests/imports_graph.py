"""The import graph of curator/ and training/, read from the source (ast), for tests/test_boundaries.py.

Every import counts, at the top of a module or inside a function: a lazy import still makes the
importing module depend on the imported one, and is the usual way a circle hides.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("curator", "training")


@dataclass(frozen=True)
class Edge:
    importer: str
    imported: str
    where: str  # path:line
    names: tuple[str, ...]  # the names taken with `from X import a, b`


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Return {dotted module name: file} of every module of the two packages."""
    found: dict[str, Path] = {}
    for top in PACKAGES:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            found[".".join(parts)] = path
    return found


@cache
def edges(root: Path = ROOT) -> tuple[Edge, ...]:
    """Return every import from one module of the packages to another."""
    mods = modules(root)

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    out: list[Edge] = []
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            where = f"{path.relative_to(root)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                targets = [(a.name, ()) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                # `from pkg import mod` imports the module pkg.mod when there is one
                targets = [(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods else node.module, (a.name,))
                           for a in node.names]
            else:
                continue
            for target, names in targets:
                if target.split(".")[0] not in PACKAGES:
                    continue
                resolved = resolve(target)
                if resolved is not None and resolved != name:
                    out.append(Edge(name, resolved, where, names))
    return tuple(out)


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Return the strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
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
