"""`forge bundle`: a CPU deploy bundle of the production model, as a directory and a tarball.

    bundle/
      model-<type>.gguf   the production GGUF (the only weights: no torch in the image)
      manifest.json       registry name/version/alias it came from, the server and UI settings, sha256 of every file
      SHA256SUMS          the same checksums for `sha256sum -c` (run.sh checks them before serving)
      run.sh              verify, then start llama-cpp-python's OpenAI server on $HOST:$PORT
      requirements.txt    llama-cpp-python[server], pinned
      Dockerfile          a slim Python image with llama-cpp-python only

`forge serve --bundle DIR` calls `verify_bundle` first and refuses a bundle whose files changed.
"""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path
from typing import Any

from forge import ForgeError
from forge.config import ServeConfig
from forge.hashing import sha256_file
from forge.io import atomic_write_json

MANIFEST = "manifest.json"
FORMAT = 1

RUN_SH = """#!/bin/sh
# Verify every checksum, then serve the model with llama.cpp's OpenAI-compatible server.
# HOST defaults to 127.0.0.1; set HOST=0.0.0.0 inside a container and {api_key_env} to require an API key.
set -eu
cd "$(dirname "$0")"
sha256sum -c --quiet SHA256SUMS || {{ echo "refusing to serve: bundle files changed (SHA256SUMS)" >&2; exit 2; }}
set -- --model {gguf} --host "${{HOST:-127.0.0.1}}" --port "${{PORT:-{port}}}" --n_ctx {n_ctx} --model_alias {alias}
if [ -n "${{{api_key_env}:-}}" ]; then set -- "$@" --api_key "${{{api_key_env}}}"; fi
exec "${{PYTHON:-python3}}" -m llama_cpp.server "$@"
"""

DOCKERFILE = """# A slim CPU image: llama-cpp-python's server and the GGUF, no torch.
FROM python:3.11-slim
# The compiler only builds llama.cpp and is purged below: any current Debian version will do.
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends build-essential cmake \\
    && rm -rf /var/lib/apt/lists/*
COPY requirements.txt /bundle/requirements.txt
# GGML_NATIVE=OFF: a portable build instead of one tuned to the build machine's CPU.
RUN CMAKE_ARGS="-DGGML_NATIVE=OFF" pip install --no-cache-dir -r /bundle/requirements.txt \\
    && apt-get purge -y build-essential cmake && apt-get autoremove -y
COPY . /bundle
ENV HOST=0.0.0.0 PORT={port}
EXPOSE {port}
USER 65534
CMD ["sh", "/bundle/run.sh"]
"""


def _llama_cpp_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llama_cpp_python")
    except PackageNotFoundError:
        return "0.3.36"


def build_bundle(
    gguf: Path, out_dir: Path, source: dict[str, Any], serve: ServeConfig, n_ctx: int, tarball: bool = True
) -> dict[str, Any]:
    """Write the bundle directory (and `<out_dir>.tar.gz`) from a GGUF and where it came from.

    source: {"name", "version", "alias", ...} of the registry version (anything JSON-serialisable is kept).
    """
    from models.gguf import check_gguf

    gguf, out_dir = Path(gguf), Path(out_dir)
    check_gguf(gguf)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    alias = str(source.get("name") or "forge-model")
    gguf_name = gguf.name if gguf.name.endswith(".gguf") else "model.gguf"
    shutil.copyfile(gguf, out_dir / gguf_name)
    settings = serve.model_dump(mode="json") | {"n_ctx": n_ctx}
    (out_dir / "run.sh").write_text(
        RUN_SH.format(gguf=gguf_name, port=serve.port, n_ctx=n_ctx, alias=alias, api_key_env=serve.api_key_env)
    )
    (out_dir / "run.sh").chmod(0o755)
    (out_dir / "requirements.txt").write_text(f"llama-cpp-python[server]=={_llama_cpp_version()}\nopenai\n")
    (out_dir / "Dockerfile").write_text(DOCKERFILE.format(port=serve.port))
    files = {p.name: sha256_file(p) for p in sorted(out_dir.iterdir()) if p.is_file()}
    (out_dir / "SHA256SUMS").write_text("".join(f"{digest}  {name}\n" for name, digest in files.items()))
    files["SHA256SUMS"] = sha256_file(out_dir / "SHA256SUMS")
    manifest = {
        "format": FORMAT,
        "source": source,
        "alias": alias,
        "gguf": gguf_name,
        "serve": settings,
        "files": files,
    }
    atomic_write_json(out_dir / MANIFEST, manifest)
    if tarball:
        tar_path = out_dir.with_name(out_dir.name + ".tar.gz")
        with tarfile.open(tar_path, "w:gz") as tar:
            tar.add(out_dir, arcname=out_dir.name)
        manifest["tarball"] = str(tar_path)
    return manifest


def verify_bundle(bundle: Path) -> dict[str, Any]:
    """Check every file's sha256 against the manifest; raise ForgeError naming each changed/missing/extra file."""
    bundle = Path(bundle)
    if bundle.is_file() and bundle.name.endswith((".tar.gz", ".tgz")):
        raise ForgeError(f"{bundle} is a tarball: extract it first (tar xzf {bundle.name}) and pass the directory")
    manifest_path = bundle / MANIFEST
    if not manifest_path.is_file():
        raise ForgeError(f"{bundle} is not a Forge bundle: {MANIFEST} not found")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        files: dict[str, str] = manifest["files"]
        gguf_name = manifest["gguf"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ForgeError(f"refusing bundle {bundle}: unreadable {MANIFEST} ({exc})") from None
    problems = []
    for name, digest in files.items():
        path = bundle / name
        if Path(name).name != name:
            problems.append(f"{name} (not a plain file name)")
        elif not path.is_file():
            problems.append(f"{name} (missing)")
        elif sha256_file(path) != digest:
            problems.append(f"{name} (sha256 differs)")
    extra = sorted(p.name for p in bundle.iterdir() if p.name not in files and p.name != MANIFEST)
    problems += [f"{name} (not in the manifest)" for name in extra]
    if gguf_name not in files:
        problems.append(f"{gguf_name} (the model is not checksummed)")
    if problems:
        raise ForgeError(f"refusing to serve tampered bundle {bundle}: {'; '.join(problems)}")
    return manifest
