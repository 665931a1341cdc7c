"""The lock files (docker/lock.sh) agree with what they lock: every requirement of pyproject.toml and of the images'
docker/requirements-*.txt is pinned in its lock at a version the requirement allows, with a sha256 for each pin, so
`pip install --require-hashes -r LOCK` installs what the ranges promise; a range changed without `make lock` fails."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
INSTALLED_FIRST = {"torch", "llama-cpp-python"}  # outside every lock, installed on their own first (docker/lock.sh)


def _pins(lock: Path) -> dict[str, str]:
    """name -> version of each pin; every pin must carry at least one --hash."""
    text = lock.read_text()
    blocks = re.split(r"\n(?=[A-Za-z0-9])", text)
    pins = {}
    for block in blocks:
        found = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", block)
        if found:
            assert "--hash=sha256:" in block, f"{lock.name}: {found.group(0)} has no hash"
            pins[canonicalize_name(found.group(1))] = found.group(2)
    return pins


def _project_requirements(extras: list[str]) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted, seen, out = list(extras), set(), [Requirement(r) for r in project["dependencies"]]
    while wanted:
        extra = wanted.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for text in project["optional-dependencies"][extra]:
            req = Requirement(text)
            if canonicalize_name(req.name) == "forge-slm":  # the dev extra names the others through the project
                wanted += sorted(req.extras)
            else:
                out.append(req)
    return out


def _file_requirements(*names: str) -> list[Requirement]:
    lines = [line.split("#")[0].strip() for name in names for line in (ROOT / "docker" / name).read_text().splitlines()]
    return [Requirement(line) for line in lines if line]


CASES = {
    "requirements.lock": lambda: _project_requirements(["dev"]),
    "docker/requirements-train.lock": lambda: _project_requirements(["ray", "benchmarks", "cjk"]),
    "docker/requirements-serve-cpu.lock": lambda: _file_requirements("requirements-serve.txt", "requirements-chat.txt"),
    "docker/requirements-mlflow.lock": lambda: _file_requirements("requirements-mlflow.txt"),
}
GPU_LOCK = "docker/requirements-serve-gpu.lock"  # vLLM's own torch and transformers: not the dev lock's versions


def test_the_gpu_image_lock_pins_vllm_its_torch_and_the_serving_requirements():
    pins = _pins(ROOT / GPU_LOCK)
    for req in _file_requirements("requirements-serve-gpu.txt", "requirements-serve.txt"):
        name = canonicalize_name(req.name)
        assert name in pins and req.specifier.contains(pins[name], prereleases=True), f"{GPU_LOCK}: {req}: make lock"
    assert "torch" in pins and "uvicorn" in pins and "httpx" in pins  # vLLM's torch; what the gateway runs on


@pytest.mark.parametrize("lock", sorted(CASES))
def test_every_requirement_is_pinned_with_hashes_within_its_range(lock):
    pins = _pins(ROOT / lock)
    for req in CASES[lock]():
        name = canonicalize_name(req.name)
        if name in INSTALLED_FIRST:
            assert name not in pins, f"{lock}: {name} is installed on its own first, not from the lock"
            continue
        assert name in pins, f"{lock}: {req} is not locked: run `make lock`"
        assert req.specifier.contains(pins[name], prereleases=True), f"{lock}: {name}=={pins[name]} not in {req}"


def test_the_image_locks_run_the_dev_locks_versions():
    dev = _pins(ROOT / "requirements.lock")
    for lock in sorted(CASES):
        differ = {name: version for name, version in _pins(ROOT / lock).items() if dev.get(name) != version}
        assert not differ, f"{lock} pins other versions than requirements.lock: {differ}"
