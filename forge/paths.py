"""Where runs live: every stage of run NAME writes under `runs/NAME/<stage>/` ($FORGE_RUNS_DIR moves `runs/`)."""

from __future__ import annotations

import os
from pathlib import Path

from forge.config import ForgeConfig


def runs_root() -> Path:
    """The directory holding every run: $FORGE_RUNS_DIR, else ./runs."""
    return Path(os.environ.get("FORGE_RUNS_DIR", "runs"))


def run_dir(cfg: ForgeConfig) -> Path:
    return runs_root() / cfg.run_name
