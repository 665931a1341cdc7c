"""The sha256 check `forge serve` runs on every file it is about to serve, every time it starts: a deploy bundle's
files against its manifest, a registry version's cached files (runs/.registry/NAME/vN) against the digests the
registry recorded when the version was registered (its forge.sha256.* tags). A file changed on disk after it was
checked once (a flipped byte, an edit, a swapped model) is refused, not served.

Hashing is sequential reads through hashlib (about 0.1 s per 100 MB here; bench/serve_load.py --hash-mb measures
it), cheap next to loading the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from forge import ForgeError
from forge.hashing import sha256_tree


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


def registry_tag(name: str) -> str:
    """The version tag holding the sha256 of a file of a registry version directory: `model` (the HF directory)
    or gguf/model-TYPE.gguf (serve/registry.py writes them at registration)."""
    return "forge.sha256.model" if name == "model" else f"forge.sha256.gguf.{Path(name).stem.removeprefix('model-')}"


def verify_registry_files(root: Path, names: list[str], tags: Mapping[str, str], label: str) -> None:
    """Refuse (ForgeError) unless each of `names` under the version directory `root` has the sha256 its registry
    tag recorded; `label` names the version (NAME vN) in the message."""
    problems = sha256_problems(root, {name: tags.get(registry_tag(name)) for name in names})
    if problems:
        raise ForgeError(
            f"refusing to serve {label} from {root}: {'; '.join(problems)} against the sha256 the registry recorded "
            f"at registration; delete {root} and `forge serve` downloads the version again"
        )
