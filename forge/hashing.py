"""Content hashes: what a stage's skip key, its manifest and the registry's checksums are made of."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

from forge import ForgeError


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


def hash_inputs(inputs: Mapping[str, Path | str]) -> dict[str, str]:
    """Hash each named input: a Path is hashed by content, a str (e.g. a builtin corpus id) by its value."""
    return {
        name: sha256_tree(value) if isinstance(value, Path) else hashlib.sha256(value.encode()).hexdigest()
        for name, value in sorted(inputs.items())
    }
