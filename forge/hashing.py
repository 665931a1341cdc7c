"""Content hashes: what a stage's skip key, its manifest and the registry's checksums are made of.

Checking them is sequential reads through hashlib (about 0.1 s per 100 MB here; bench/serve_load.py --hash-mb
measures it), cheap next to loading a model: `forge serve` re-checks every file it serves, every time it starts.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

from forge import ForgeError


def hash_share(text: str) -> float:
    """Where `text` falls in [0, 1) by a hash of it: a sample of share s is every text below s, the same whatever
    file or position the text comes in (the tokenizer's training sample, forge qa's documents)."""
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def sha256_tree(path: Path) -> str:
    """sha256 of a file, or of a directory's sorted (relative path, file sha256) list."""
    path = Path(path)
    if path.is_file():
        return sha256_file(path)
    if not path.is_dir():
        raise ForgeError(f"input {path} does not exist")
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(f"{file.relative_to(path).as_posix()}\0{sha256_file(file)}\n".encode())
    return digest.hexdigest()


def sha256_problems(root: Path, expected: Mapping[str, str | None]) -> list[str]:
    """Each entry of `expected` (a path relative to root: a file, or a directory hashed with sha256_tree) that is
    missing, has no recorded digest or whose sha256 differs, as "NAME (why)"; empty when all match."""
    problems = []
    for name, digest in expected.items():
        path = Path(root) / name
        if not path.exists():
            problems.append(f"{name} (missing)")
        elif not digest:
            problems.append(f"{name} (no sha256 recorded)")
        elif sha256_tree(path) != digest:
            problems.append(f"{name} (sha256 differs)")
    return problems


def hash_inputs(inputs: Mapping[str, Path | str]) -> dict[str, str]:
    """Hash each named input: a Path is hashed by content, a str (e.g. a builtin corpus id) by its value."""
    return {
        name: sha256_tree(value) if isinstance(value, Path) else hashlib.sha256(value.encode()).hexdigest()
        for name, value in sorted(inputs.items())
    }
