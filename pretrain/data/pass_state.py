"""`forge data` resumes after its last complete pass: an hour of extraction is not lost to a crash in the write pass.

Each pass (extract, clean, dedup, paragraphs) that completes leaves its result and the report's counters at that
point (report.Stats.checkpoint) under `.work/`, then adds its name to `.work/passes.json`, whose `key` is the
stage's skip key (forge/lineage.py: the data settings, the inputs' content hashes, the code's fingerprint). A
re-run whose key matches loads what the completed passes left and runs the rest; any other key, or no
passes.json, starts over with an empty `.work/`. A pass that did not complete is run again from its start: its
spill files are rewritten, and the removal-log segment it had begun is dropped with the counters restored to
the previous pass's. The write pass is the last, so it is always re-run whole. `.work/` goes once the stage
completes.

The saved results are pickles: written by this stage, under its own run directory, read back only by it.
"""

from __future__ import annotations

import json
import logging
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from forge.io import atomic_write_bytes, atomic_write_json, read_json_object
from pretrain.data import report

log = logging.getLogger("forge.data")

T = TypeVar("T")
MARKS = "passes.json"


class Passes:
    def __init__(self, work: Path, key: dict[str, Any]):
        self.work = work
        self.key = json.loads(json.dumps(key, default=str))  # as read back from passes.json
        marks = read_json_object(work / MARKS)
        if marks is None or marks.get("key") != self.key:
            if marks is not None:
                log.info("data: starting over: the settings, inputs or code differ from the interrupted attempt's")
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            marks = {"key": self.key, "done": []}
            atomic_write_json(work / MARKS, marks)
        self.done: list[str] = marks["done"]
        if self.done:
            log.info("data: resuming after pass %r (%s): passes %s were completed by an earlier attempt",
                     self.done[-1], work, ", ".join(self.done))  # fmt: skip

    def stats(self, fresh: Callable[[], report.Stats]) -> report.Stats:
        """The counters as the last completed pass left them, or fresh ones when none completed."""
        if not self.done:
            return fresh()
        return report.Stats.restore((self.work / f"{self.done[-1]}.stats").read_bytes())

    def run(self, name: str, stats: report.Stats, body: Callable[[], T]) -> T:
        """body()'s result, from `.work/` when an earlier attempt completed this pass; else run it and mark it."""
        if name in self.done:
            return pickle.loads((self.work / f"{name}.pickle").read_bytes())
        result = body()
        atomic_write_bytes(self.work / f"{name}.pickle", pickle.dumps(result))
        atomic_write_bytes(self.work / f"{name}.stats", stats.checkpoint())
        self.done.append(name)
        atomic_write_json(self.work / MARKS, {"key": self.key, "done": self.done})  # the mark: written last
        return result

    def finish(self) -> None:
        """The stage completed: nothing to resume."""
        shutil.rmtree(self.work, ignore_errors=True)
