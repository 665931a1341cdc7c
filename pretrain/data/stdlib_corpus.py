"""The embedded default corpus: the running Python's standard-library documentation, built with no download.

Documents are the module, class and function docstrings of the stdlib's `.py` sources, read with `ast` (nothing is
imported: importing `antigravity` opens a browser, `this` prints), plus the language-reference topics of
`pydoc_data.topics`. Each docstring document starts with the heading a documentation page gives it (`function
json.dumps(obj, *, skipkeys=False, ...)`, `class json.JSONEncoder`, `module json`): without it a model never learns
which object a description belongs to, and no question about an object can be answered from what it read.
Files are walked in sorted order and every document's id names its module and object, so the corpus and its ids
are the same on every run of the same Python.

    for record in iter_stdlib_records(): ...   # {"id", "text", "source", "meta"}
"""

from __future__ import annotations

import ast
import sys
import sysconfig
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ID_PREFIX = "python-stdlib"
MAX_SIGNATURE_CHARS = 160  # longer signatures are cut at a parameter boundary

# Directories that are test suites, demos or third-party code, not documentation.
SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "turtledemo", "__pycache__", "Tools"}
SKIP_PREFIXES = ("idlelib/", "tkinter/test", "lib2to3/tests", "ctypes/test", "unittest/test", "distutils/tests")


def corpus_id() -> str:
    """What identifies the corpus for the stage's skip key: the Python build (the builder's code is in the data
    stage's skip key already)."""
    return f"{ID_PREFIX}:{sys.version}"


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[Path]:
    root = root or stdlib_root()
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if SKIP_DIRS.intersection(rel.parts[:-1]) or rel.as_posix().startswith(SKIP_PREFIXES):
            continue
        if rel.name.startswith("test_"):
            continue
        files.append(path)
    return files


def module_name(rel: Path) -> str:
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def iter_stdlib_records(root: Path | None = None) -> Iterator[dict[str, Any]]:
    """Yield every docstring of the stdlib sources, then every pydoc topic, in a fixed order."""
    root = root or stdlib_root()
    for path in stdlib_files(root):
        yield from _module_records(path, module_name(path.relative_to(root)))
    yield from _topic_records()


def _module_records(path: Path, module: str) -> Iterator[dict[str, Any]]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escape sequences in old sources
            tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError, OSError):
        return  # a source this Python cannot parse (e.g. lib2to3 test data): not documentation
    for qualname, kind, node in _documented(tree):
        text = ast.get_docstring(node, clean=True)
        if not text or not text.strip():
            continue
        name = f"{module}.{qualname}" if qualname else module
        head = heading(name, kind, node)
        yield {
            "id": f"{ID_PREFIX}:{name}",
            "text": f"{head}\n\n{text}",
            "source": module,
            "meta": {"object": name, "kind": kind, "line": getattr(node, "lineno", 1), "heading": head},
        }


def heading(name: str, kind: str, node: ast.AST) -> str:
    """The page heading of a documented object: kind, qualified name and, for a function, its signature."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        signature = ast.unparse(node.args)
        if len(signature) > MAX_SIGNATURE_CHARS:
            signature = signature[:MAX_SIGNATURE_CHARS].rsplit(",", 1)[0] + ", ..."
        return f"{kind} {name}({signature})"
    return f"{kind} {name}"


def docstring(record: dict[str, Any]) -> str:
    """A record's docstring without the heading it was given (topics have none)."""
    head = record["meta"].get("heading")
    return record["text"].removeprefix(f"{head}\n\n") if head else record["text"]


def _documented(tree: ast.Module) -> Iterator[tuple[str, str, ast.AST]]:
    """(qualified name, kind, node) for the module and every class/function in it, depth first in source order."""
    yield "", "module", tree

    def walk(body: list[ast.stmt], prefix: str) -> Iterator[tuple[str, str, ast.AST]]:
        for node in body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                qualname = f"{prefix}{node.name}"
                yield qualname, "class" if isinstance(node, ast.ClassDef) else "function", node
                yield from walk(node.body, qualname + ".")

    seen: set[str] = set()
    for qualname, kind, node in walk(tree.body, ""):
        # Redefinitions (e.g. per-platform variants under `if`) are not walked; same-name ones keep the first.
        if qualname not in seen:
            seen.add(qualname)
            yield qualname, kind, node


def _topic_records() -> Iterator[dict[str, Any]]:
    try:
        from pydoc_data.topics import topics  # a plain dict of strings: importing it has no side effects
    except ImportError:
        return
    for name in sorted(topics):
        text = topics[name]
        if text.strip():
            yield {
                "id": f"{ID_PREFIX}:pydoc-topic:{name}",
                "text": text.strip(),
                "source": "pydoc_data.topics",
                "meta": {"object": name, "kind": "topic"},
            }
