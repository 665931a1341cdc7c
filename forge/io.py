"""Files written so that a crash never leaves a half-written output under its final name, and read defensively.

Every output goes through `atomic_path` / `atomic_write_*`: written to a temp path beside the target, then renamed
onto it (a rename within one directory is atomic on POSIX).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
from collections.abc import Iterable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_path(final: Path) -> Iterator[Path]:
    """Yield a temp path beside `final` (file or directory); rename it onto `final` only if the block succeeds."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    remove_path(tmp)
    try:
        yield tmp
        if final.is_dir() and tmp.is_dir():
            remove_path(final)
        os.replace(tmp, final)
    finally:
        remove_path(tmp)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def atomic_write_jsonl(path: Path, rows: Iterable[Any]) -> None:
    """One JSON value per line (UTF-8 kept readable), the format of every .jsonl Forge writes."""
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in rows))


def iter_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, value) of each line of a JSONL file, `.zst` ones decompressed on the fly; blank lines are
    skipped, and a line that is not JSON gives its json.JSONDecodeError as the value, so each caller decides:
    skip it, report it with its line number, or refuse the file. The one JSONL reader of the project."""
    with open(path, "rb") as raw:
        stream: Any = raw
        if Path(path).suffix == ".zst":
            import zstandard

            stream = zstandard.ZstdDecompressor().stream_reader(raw)
        for number, line in enumerate(io.TextIOWrapper(stream, encoding="utf-8", errors="replace"), start=1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as exc:
                yield number, exc


def read_jsonl(path: Path) -> list[Any]:
    """The values of a JSONL file Forge wrote, without a torn line (a killed writer may leave one); [] if absent."""
    if not Path(path).is_file():
        return []
    return [value for _, value in iter_jsonl(path) if not isinstance(value, json.JSONDecodeError)]


def remove_path(path: Path) -> None:
    """Remove a file, a symlink or a directory tree; nothing to do when it does not exist."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def read_json_object(path: Path) -> dict[str, Any] | None:
    """A JSON object from a file another stage wrote, or None when it is missing, unreadable or not an object."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def utc_now() -> str:
    """The current time as recorded in manifests and the registry's audit log: ISO 8601, UTC, whole seconds."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
