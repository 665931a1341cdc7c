"""The import rules of the code base, checked by parsing every import (including those inside functions).

1. No cycle between files.
2. Packages import only downward in the pipeline's order (LAYERS): a stage package never imports a later stage's
   package, and `forge/` (config, lineage, IO, tracking, the CLI) imports no stage package at all: the CLI and the
   pipeline reach stages through the stage table's "module:function" strings.

Run as a script (`python tests/test_imports.py`, also part of `make lint`) to print every violation.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Lowest first: a package may import itself and the packages to its left, nothing to its right.
LAYERS = ("forge", "models", "pretrain", "evaluation", "finetune", "registry", "serve")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for layer in LAYERS if (REPO / layer).is_dir() for p in (REPO / layer).rglob("*.py")}


def imported_modules(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules a file imports: `from a.b import c` counts a.b.c when c is a module, else a.b."""
    this = module_name(path)
    package = this if path.name == "__init__.py" else this.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:  # `import a.b.c` of a package path: the deepest project module
                name = name.rpartition(".")[0]
            if name and name != this:
                found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imported_modules(path, modules) for name, path in modules.items()}


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    return sorted(
        f"{src} imports {dst} ({dst.split('.')[0]} comes after {src.split('.')[0]} in {' < '.join(LAYERS)})"
        for src, targets in graph.items()
        for dst in targets
        if rank[dst.split(".")[0]] > rank[src.split(".")[0]]
    )


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one file (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
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
            if child is None:
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
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_the_checker_sees_a_cycle_and_an_upward_import():
    graph = {"pretrain.a": {"pretrain.b"}, "pretrain.b": {"pretrain.a"}, "forge.cli": {"serve.stage"},
             "serve.stage": set()}  # fmt: skip
    assert cycles(graph) == [["pretrain.a", "pretrain.b"]]
    assert upward_imports(graph) == [
        "forge.cli imports serve.stage (serve comes after forge in forge < models < pretrain < evaluation < finetune"
        " < registry < serve)"
    ]


def test_the_checker_resolves_relative_and_submodule_imports(tmp_path):
    modules = project_modules()
    graph = import_graph()
    assert "forge.lineage" in graph["pretrain.plan"]  # from forge.lineage import ...
    assert "pretrain.data.stage" in modules and "forge.config" in graph["pretrain.data.stage"]
    assert all(dst in modules for targets in graph.values() for dst in targets)


def test_no_import_cycle_between_files():
    assert cycles(import_graph()) == []


def test_no_package_imports_a_later_stage():
    assert upward_imports(import_graph()) == []


if __name__ == "__main__":
    graph = import_graph()
    problems = [f"cycle: {' <-> '.join(c)}" for c in cycles(graph)] + upward_imports(graph)
    print("\n".join(problems) or f"imports: {len(graph)} files, no cycle, no upward import")
    sys.exit(1 if problems else 0)
