"""What code a stage runs, and its fingerprint: part of the stage's skip key, so editing the code re-runs the stage.

A stage's code is its module and every project module it imports, directly or through others, found by reading the
import statements (no module is executed). `forge` itself is left out: it is the framework every stage shares
(config, files, lineage), and the values of the config a stage reads are hashed on their own; the exception is
the table of quality rules (STAGE_CODE_IN_FORGE), which is the data stage's logic kept where the config can read
it. The fingerprint hashes each module's syntax tree, so comments and formatting do not re-run anything, and any
change to what the code does does.
"""

from __future__ import annotations

import ast
import functools
import hashlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the directory holding the project's packages
STAGE_PACKAGES = ("pretrain", "finetune", "evaluation", "serve", "registry", "models")
# Modules of forge/ that hold stage logic rather than framework: the quality rules' metrics and directions (their
# thresholds are config values, hashed as such).
STAGE_CODE_IN_FORGE = ("forge.quality_rules",)


def module_file(module: str, root: Path = ROOT) -> Path | None:
    """The source of a project module ("pretrain.data.stage"), or None for a library, `forge`, or no such module."""
    if module.partition(".")[0] not in STAGE_PACKAGES and module not in STAGE_CODE_IN_FORGE:
        return None
    base = root.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def imported_modules(tree: ast.Module, module: str, is_package: bool) -> set[str]:
    """Every module name a module's syntax tree imports, anywhere in it (function-level imports included)."""
    package = module if is_package else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the package this module is in
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, node.module] if node.module else parent)
            else:
                base = node.module or ""
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
    # a module's parent packages run their __init__ first
    return names | {name.rsplit(".", depth)[0] for name in names for depth in range(1, name.count(".") + 1)}


def parsed_closure(module: str, root: Path = ROOT) -> dict[str, tuple[Path, ast.Module]]:
    """The project modules `module` runs, each parsed once: itself and everything it imports, transitively."""
    found: dict[str, tuple[Path, ast.Module]] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        path = module_file(name, root)
        if name in found or path is None:
            continue
        tree = ast.parse(path.read_bytes(), filename=str(path))
        found[name] = (path, tree)
        todo.extend(imported_modules(tree, name, path.name == "__init__.py"))
    return dict(sorted(found.items()))


def code_closure(module: str, root: Path = ROOT) -> dict[str, Path]:
    """The source files of the project modules `module` runs, by module name."""
    return {name: path for name, (path, _) in parsed_closure(module, root).items()}


@functools.cache
def code_fingerprint(module: str, root: Path = ROOT) -> str:
    """sha256 of the syntax trees of the modules `module` runs (comments and layout do not count)."""
    digest = hashlib.sha256()
    for name, (_, tree) in parsed_closure(module, root).items():
        digest.update(f"{name}\0{ast.dump(tree)}\0".encode())
    return digest.hexdigest()
