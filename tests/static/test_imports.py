"""No import cycle inside the grpo_deploy package, counting imports inside functions (a function-level import only
hides a cycle: the two modules still need each other)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "grpo_deploy"
KNOWN: set[frozenset[str]] = set()


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    out = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imported(name: str, path: Path, node: ast.Import | ast.ImportFrom, known: dict[str, Path]) -> set[str]:
    """The package's modules that *node* (in module *name*) imports: `from . import x` names module x."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names} & set(known)
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    base = ".".join(here[: len(here) - node.level + 1]) if node.level else (node.module or "")
    if node.level and node.module:
        base = f"{base}.{node.module}"
    return {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names} & set(known)


def graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    known = modules(package)
    edges: dict[str, set[str]] = {}
    for name, path in known.items():
        nodes = [n for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                 if isinstance(n, (ast.Import, ast.ImportFrom))]
        edges[name] = set().union(*(imported(name, path, n, known) for n in nodes)) - {name}
    return edges


def cycles(edges: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected groups of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: set[frozenset[str]] = set()
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = {stack.pop()}
                    while node not in group:
                        group.add(stack.pop())
                    if len(group) > 1:
                        found.add(frozenset(group))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                work.append((child, iter(sorted(edges[child]))))
            elif child in stack:
                low[node] = min(low[node], index[child])
    return found


def test_the_finder_sees_a_cycle_hidden_in_a_function(tmp_path):
    pkg = tmp_path / "grpo_deploy"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("from .b import f\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from . import a\n")
    (pkg / "c.py").write_text("from .sub import a\n")
    assert cycles(graph(pkg)) == {frozenset({"grpo_deploy.sub.a", "grpo_deploy.sub.b"})}


def test_no_import_cycle_in_the_package():
    found = cycles(graph())
    assert found <= KNOWN, f"import cycles: {sorted(sorted(c) for c in found - KNOWN)}"
    assert KNOWN <= found, f"cut, remove from KNOWN: {sorted(sorted(c) for c in KNOWN - found)}"
