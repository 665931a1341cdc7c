"""The machine a process runs on, as the process sees it."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores this process may run on: a container's cpuset or a `taskset`, not the host's count
    (os.cpu_count() reports 64 on a 64-core host whose container was given 2)."""
    if hasattr(os, "sched_getaffinity"):  # Linux; macOS and Windows have no affinity call
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1
