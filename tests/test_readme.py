"""The README's map of the code (its Layout block) matches the folders on disk, both ways."""

from __future__ import annotations

import re
from pathlib import Path

from test_imports import LAYERS

REPO = Path(__file__).resolve().parent.parent


def layout_folders() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    return re.findall(r"^(\S+)/\s", block, re.M)


def test_every_folder_in_the_readme_map_exists_and_every_package_is_in_it():
    listed = layout_folders()
    assert listed, "no Layout block in README.md"
    assert [f for f in listed if not (REPO / f).is_dir()] == []
    tracked_dirs = {p.name for p in REPO.iterdir() if p.is_dir() and not p.name.startswith(".")}
    packages = {d for d in tracked_dirs if (REPO / d / "__init__.py").is_file()}
    assert packages - set(listed) == set(), "packages missing from the README's Layout"
    existing = [layer for layer in LAYERS if (REPO / layer).is_dir()]
    assert [f for f in listed if f in LAYERS] == existing, "the Layout lists the packages lowest first"
