"""`forge bundle`: a CPU deploy bundle of the production model, as a directory and a tarball.

    bundle/
      model-<type>.gguf   the production GGUF (the only weights: no torch, no Python needed to serve it)
      server/             llama.cpp's llama-server, its libraries and CPU variants, and its BUILD-INFO: the build
                          `forge serve` runs (docker/llama-server.sh)
      manifest.json       registry name/version/alias it came from, the server and UI settings, sha256 of every file
      SHA256SUMS          the same checksums for `sha256sum -c` (run.sh checks them before serving)
      run.sh              verify, then start server/llama-server on $HOST:$PORT with `forge serve`'s flags
      Dockerfile          a slim Debian image with the bundle as it is: no compiler, no Python
      Modelfile           for Ollama (`ollama create NAME -f Modelfile`): FROM the GGUF, a TEMPLATE measured from the
                          model's chat template, its stop tokens (serve/modelfile.py)

`forge serve --bundle DIR` calls `verify_bundle` first, refuses a bundle whose files changed or that holds a file its
manifest does not list, and runs the bundle's own (checked) llama-server in its server/ directory (ggml loads any
libggml-cpu-*.so in the working directory); run.sh refuses the same. `forge bundle --out DIR` writes beside DIR and
renames, and replaces only an empty DIR or an old bundle (check_out_dir): never `--out .` or a folder of other files.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import tarfile
from pathlib import Path, PurePosixPath
from typing import Any

from forge import ForgeError
from forge.config import ServeConfig
from forge.hashing import sha256_file, sha256_problems
from forge.io import atomic_path, atomic_write_json, read_json_object

log = logging.getLogger("forge.bundle")

MANIFEST = "manifest.json"
FORMAT = 2
SERVER_DIR = "server"
SERVER = f"{SERVER_DIR}/llama-server"

RUN_SH = """#!/bin/sh
# Verify every checksum, then serve the model with llama.cpp's OpenAI-compatible llama-server. HOST defaults to
# {host}; set HOST=0.0.0.0 inside a container, and {api_key_env} to require an API key (handed to llama-server in
# its own LLAMA_API_KEY variable, never in the command line). THREADS defaults to the cores this may run on.
set -eu
cd "$(dirname "$0")"
sha256sum -c --quiet SHA256SUMS || {{ echo "refusing to serve: bundle files changed (SHA256SUMS)" >&2; exit 2; }}
# Nothing unlisted either (ggml loads every libggml-cpu-*.so beside llama-server and in the working directory), and
# no name outside the bundle's alphabet (a newline in a name could pass for two listed ones).
extra=$(find . ! -type d | awk 'BEGIN {{ ok["SHA256SUMS"]; ok["{manifest}"] }}
    NR == FNR {{ sub(/^[0-9a-f]+  /, ""); ok[$0]; next }} {{ sub(/^[.][/]/, "") }} !($0 in ok)' SHA256SUMS -)
extra="$extra$(find . -name '*[![:alnum:]._+-]*')"
[ -z "$extra" ] || {{ echo "refusing to serve: files not in SHA256SUMS: $extra" >&2; exit 2; }}
if [ -n "${{{api_key_env}:-}}" ]; then LLAMA_API_KEY="${{{api_key_env}}}"; export LLAMA_API_KEY; fi
exec {command}
"""

DOCKERFILE = """# The bundle's CPU image: llama-server (built on {built_on}; it needs that glibc or newer, as Debian
# bookworm has) picks its CPU variant (AVX2, AVX-512...) at start. No compiler, no Python.
FROM debian:bookworm-slim
COPY . /bundle
ENV HOST=0.0.0.0 PORT={port}
EXPOSE {port}
USER 65534
CMD ["sh", "/bundle/run.sh"]
"""


def server_files() -> tuple[Path, dict[str, str]]:
    """The directory of the llama-server that `forge serve` runs and its BUILD-INFO (docker/llama-server.sh writes
    both: the binary, its libraries, the CPU variants ggml loads from beside it)."""
    from serve.backends import llama_server_binary

    home = Path(os.path.realpath(llama_server_binary())).parent
    info = home / "BUILD-INFO"
    if not info.is_file():
        raise ForgeError(
            f"{info} not found: a bundle carries the llama-server build `forge serve` runs with its libraries, and "
            f"the one in {home} was not built by docker/llama-server.sh (`make install` builds one)"
        )
    return home, dict(line.split("=", 1) for line in info.read_text(encoding="utf-8").splitlines() if "=" in line)


def run_command(gguf_name: str, alias: str, serve: ServeConfig, n_ctx: int) -> str:
    """`forge serve`'s llama-server command line (backends.llama_server_command) as shell words for run.sh: host,
    port and threads from the environment (HOST, PORT, THREADS), everything else fixed."""
    from serve.backends import llama_server_command

    cmd = llama_server_command(Path(gguf_name), alias, n_ctx, serve.parallel, 1, SERVER)
    threads = f'"${{THREADS:-{serve.threads or "$(nproc)"}}}"'
    pairs = zip(cmd, cmd[1:], strict=False)
    words = [f"./{SERVER}"] + [threads if prev == "--threads" else shlex.quote(word) for prev, word in pairs]
    return " ".join([*words, "--host", f'"${{HOST:-{serve.host}}}"', "--port", f'"${{PORT:-{serve.port}}}"'])


def build_bundle(
    gguf: Path, out_dir: Path, source: dict[str, Any], serve: ServeConfig, n_ctx: int, tarball: bool = True
) -> dict[str, Any]:
    """Write the bundle directory (and `<out_dir>.tar.gz`) from a GGUF and where it came from. Both are written under
    temp names beside their final ones and renamed when complete, so a killed run leaves no half bundle that looks
    whole; an existing out_dir is replaced only when check_out_dir says it may be.

    source: {"name", "version", "alias", ...} of the registry version (anything JSON-serialisable is kept).
    """
    from models.gguf import check_gguf

    gguf = Path(gguf)
    check_gguf(gguf)
    check_out_dir(Path(out_dir))
    out_dir = Path(os.path.abspath(out_dir))
    with atomic_path(out_dir) as tmp:
        tmp.mkdir()
        manifest = _write_bundle(gguf, tmp, source, serve, n_ctx)
    if tarball:
        manifest["tarball"] = str(write_tarball(out_dir, _tarball_path(out_dir)))
    return manifest


def check_out_dir(out_dir: Path) -> None:
    """Refuse an --out that replacing would destroy: anything but a missing path, an empty directory, or a bundle this
    module wrote with nothing in it that its manifest does not list."""
    where = Path(os.path.abspath(out_dir))
    fix = "name a new or empty directory (or an old bundle to replace), or move it away yourself"
    cwd = Path.cwd().resolve()
    if where.resolve() in (cwd, *cwd.parents):
        raise ForgeError(f"--out {out_dir} is the working directory or holds it (a bundle replaces --out whole): {fix}")
    if _tarball_path(where).is_dir():
        raise ForgeError(f"--out {out_dir}: {_tarball_path(where)} (where the tarball goes) is a directory: {fix}")
    if not where.exists() and not where.is_symlink():
        return
    if where.is_symlink() or not where.is_dir():
        raise ForgeError(f"--out {out_dir} exists and is not a directory (a bundle replaces --out whole): {fix}")
    if not any(where.iterdir()):
        return
    manifest = read_json_object(where / MANIFEST) or {}
    files = manifest.get("files")
    if manifest.get("format") not in range(1, FORMAT + 1) or not isinstance(files, dict):
        raise ForgeError(f"--out {out_dir} is not empty and not a Forge bundle (no bundle {MANIFEST} in it): {fix}")
    unlisted = [name for name in _bundle_files(where) if name not in files and name != MANIFEST]
    if unlisted:
        shown = ", ".join(unlisted[:5]) + (f" and {len(unlisted) - 5} more" if len(unlisted) > 5 else "")
        raise ForgeError(f"--out {out_dir} is an old bundle with files its {MANIFEST} does not list ({shown}): {fix}")


def write_tarball(src: Path, tar_path: Path) -> Path:
    """`src` as a gzipped tarball (one top directory, src's name) at tar_path, written under a temp name beside it and
    renamed once complete: a killed run never leaves a truncated tarball under the final name."""
    with atomic_path(tar_path) as tmp, tarfile.open(tmp, "w:gz") as tar:  # closed before the rename
        tar.add(src, arcname=src.name)
    return tar_path


def _tarball_path(out_dir: Path) -> Path:
    return out_dir.with_name(out_dir.name + ".tar.gz")


def _write_bundle(gguf: Path, out_dir: Path, source: dict[str, Any], serve: ServeConfig, n_ctx: int) -> dict[str, Any]:
    """The bundle's files in out_dir (an empty directory), checksummed; returns the manifest written there."""
    alias = str(source.get("name") or "forge-model")
    gguf_name = gguf.name if re.fullmatch(r"[\w.+-]+\.gguf", gguf.name, re.ASCII) else "model.gguf"  # run.sh's alphabet
    shutil.copyfile(gguf, out_dir / gguf_name)
    write_modelfile(out_dir / gguf_name)
    settings = serve.model_dump(mode="json") | {"n_ctx": n_ctx}
    home, build = server_files()
    (out_dir / SERVER_DIR).mkdir()
    for path in [home / "llama-server", home / "BUILD-INFO", *sorted(home.glob("lib*.so*"))]:
        shutil.copy2(path, out_dir / SERVER_DIR / path.name)
    command = run_command(gguf_name, alias, serve, n_ctx)
    run_sh = RUN_SH.format(command=command, host=serve.host, api_key_env=serve.api_key_env, manifest=MANIFEST)
    (out_dir / "run.sh").write_text(run_sh)
    (out_dir / "run.sh").chmod(0o755)
    (out_dir / "Dockerfile").write_text(DOCKERFILE.format(built_on=build.get("host", "?"), port=serve.port))
    files = {name: sha256_file(out_dir / name) for name in _bundle_files(out_dir)}
    (out_dir / "SHA256SUMS").write_text("".join(f"{digest}  {name}\n" for name, digest in files.items()))
    files["SHA256SUMS"] = sha256_file(out_dir / "SHA256SUMS")
    manifest = {
        "format": FORMAT,
        "source": source,
        "alias": alias,
        "gguf": gguf_name,
        "serve": settings,
        "llama_server": {k: build.get(k) for k in ("version", "cmake_args", "built", "host")},
        "files": files,
    }
    atomic_write_json(out_dir / MANIFEST, manifest)
    return manifest


def write_modelfile(gguf: Path) -> None:
    """Ollama's Modelfile beside the GGUF (serve/modelfile.py); a chat template it cannot measure is a warning, not
    a failed bundle: llama-server renders the template itself."""
    from serve.modelfile import modelfile

    try:
        (gguf.parent / "Modelfile").write_text(modelfile(gguf), encoding="utf-8")
    except ForgeError as exc:
        log.warning("bundle: no Ollama Modelfile: %s", exc)


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
    inside = {name: digest for name, digest in files.items() if _inside(name)}
    problems = [f"{name} (not a path inside the bundle)" for name in files if name not in inside]
    problems += sha256_problems(bundle, inside)
    extra = [name for name in _bundle_files(bundle) if name not in files and name != MANIFEST]
    problems += [f"{name} (not in the manifest)" for name in extra]
    if gguf_name not in files:
        problems.append(f"{gguf_name} (the model is not checksummed)")
    if problems:
        raise ForgeError(f"refusing to serve tampered bundle {bundle}: {'; '.join(problems)}")
    return manifest


def _bundle_files(root: Path) -> list[str]:
    """Every file under root as a relative POSIX path, sorted (the names SHA256SUMS and the manifest use)."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() or p.is_symlink())


def _inside(name: str) -> bool:
    """A manifest name that stays inside the bundle: relative, no `..`, no empty or dot parts."""
    path = PurePosixPath(name)
    return bool(name) and not path.is_absolute() and all(part not in ("", ".", "..") for part in name.split("/"))
