"""GGUF files: the integrity check every file passes before llama.cpp reads it, metadata, and loading.

    info = check_gguf("model-q4_k_m.gguf")          # ForgeError unless it is whole; its summary otherwise
    gguf_metadata(path, "general.architecture")    # selected metadata values
    context_length(path)                           # the model's context from its metadata
    llm = load_llama(path, n_ctx=512)              # a llama_cpp.Llama over a checked file

llama.cpp may abort the whole process on a damaged file instead of raising, so the check parses the header,
metadata and tensor table with the `gguf` library and checks that every tensor's data lies inside the file first.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from forge import ForgeError
from forge.machine import usable_cores

HEADER_BYTES = 24  # magic, version, tensor count, metadata count


def _reader(path: Path) -> Any:
    """The file's parsed header, metadata and tensor table: parsed once per version of the file. The `gguf` library
    reads every string of a 49k-token vocabulary one by one (~2.5 s for SmolLM2), and one pipeline checks and reads
    the same files a dozen times."""
    stat = path.stat()
    return _parse(str(path), stat.st_ino, stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _parse(path: str, inode: int, size: int, mtime_ns: int) -> Any:  # the key: a rewritten file is parsed again
    import gguf

    return gguf.GGUFReader(path, "r")


def check_gguf(path: Path) -> dict[str, Any]:
    """Refuse (ForgeError) a file that is missing, not GGUF, corrupted or truncated; else return its summary."""
    path = Path(path)
    if not path.is_file():
        raise ForgeError(f"GGUF file {path} not found")
    size = path.stat().st_size
    refuse = f"refusing GGUF file {path} ({size:,} bytes)"
    fix = "re-create it (forge quantize --force)"
    with open(path, "rb") as fh:
        head = fh.read(HEADER_BYTES)
    if len(head) < HEADER_BYTES:
        raise ForgeError(f"{refuse}: truncated, shorter than the {HEADER_BYTES}-byte GGUF header; {fix}")
    if head[:4] != b"GGUF":
        raise ForgeError(f"{refuse}: not a GGUF file (magic {head[:4]!r}, expected b'GGUF'): corrupted; {fix}")
    version = int.from_bytes(head[4:8], "little")
    if version not in (2, 3):
        raise ForgeError(f"{refuse}: GGUF version {version} (expected 2 or 3): corrupted header; {fix}")
    try:
        reader = _reader(path)
    except Exception as exc:  # any parse failure of a damaged file: numpy, enum, unicode, memory errors
        raise ForgeError(
            f"{refuse}: corrupted or truncated, its metadata or tensor table does not parse "
            f"({type(exc).__name__}: {exc}); {fix}"
        ) from None
    for tensor in reader.tensors:
        tensor_end = int(tensor.data_offset) + int(tensor.n_bytes)
        if tensor_end > size:
            raise ForgeError(
                f"{refuse}: truncated, tensor {tensor.name} needs bytes up to {tensor_end:,} "
                f"({tensor_end - size:,} missing); {fix}"
            )
    arch_field = reader.get_field("general.architecture")
    if arch_field is None:
        raise ForgeError(f"{refuse}: no general.architecture in its metadata: corrupted; {fix}")
    types: dict[str, int] = {}
    for tensor in reader.tensors:
        types[tensor.tensor_type.name] = types.get(tensor.tensor_type.name, 0) + 1
    return {
        "path": str(path),
        "size_bytes": size,
        "version": version,
        "architecture": arch_field.contents(),
        "tensors": len(reader.tensors),
        "tensor_types": dict(sorted(types.items())),
        "parameters": int(sum(int(t.n_elements) for t in reader.tensors)),
    }


def gguf_metadata(path: Path, *keys: str) -> dict[str, Any]:
    """Selected metadata values of a GGUF file (None for an absent key)."""
    reader = _reader(Path(path))
    out = {}
    for key in keys:
        field = reader.get_field(key)
        out[key] = None if field is None else field.contents()
    return out


def context_length(path: Path) -> int | None:
    """The training context of the model in a GGUF file (`<architecture>.context_length`), None if absent."""
    arch = gguf_metadata(path, "general.architecture")["general.architecture"]
    if not arch:
        return None
    value = gguf_metadata(path, f"{arch}.context_length")[f"{arch}.context_length"]
    return int(value) if value else None


def load_llama(path: Path, n_ctx: int, n_threads: int | None = None, logits_all: bool = True) -> Any:
    """A llama_cpp.Llama over a GGUF file that passed `check_gguf` (a damaged file is refused, never loaded).

    logits_all keeps the logits of every position (scoring needs them); generation alone is faster without.
    n_threads None: every core (llama-cpp-python's own default is half of them).
    """
    from llama_cpp import Llama

    check_gguf(path)
    n_threads = n_threads or usable_cores()
    return Llama(
        model_path=str(path),
        n_ctx=n_ctx,
        # ids per llama.cpp decode call: a whole 8k context in one would make each call size its buffers (with
        # every position's logits: n_ctx x vocab floats) for 8k ids, however few it is given
        n_batch=min(n_ctx, 512),
        n_ubatch=min(n_ctx, 512),
        n_threads=n_threads,
        n_threads_batch=n_threads,
        logits_all=logits_all,
        verbose=False,
    )
