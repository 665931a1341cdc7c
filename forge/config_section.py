"""The base of every section of the run config (forge/config.py ForgeConfig) and the error for a setting that no
longer exists."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    # Fields that change how a stage runs but not what it produces (worker counts, executors): left out of the skip
    # key, so moving a run to more cores or to a cluster does not redo finished work.
    EXECUTION_ONLY: ClassVar[frozenset[str]] = frozenset()


def refuse_gone(data: Any, section: str, gone: dict[str, str]) -> Any:
    """A setting a config may still carry that no longer exists: an error naming it, its value and where it went."""
    for old, why in gone.items():
        if isinstance(data, dict) and old in data:
            raise ValueError(f"{section}.{old}={data[old]!r}: {why}")
    return data
