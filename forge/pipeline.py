"""`forge pipeline`: every stage in order, the report card, then the server and chat UI when the gate passed.

    plan -> evidence -> data -> qa -> evidence -> tokenizer -> pretrain -> eval(pretrain) -> sft -> eval(sft)
         -> quantize -> register -> promote -> report card (runs/<run>/report.md)
         -> forge serve + forge chat   (--no-serve stops after the card)

The list is PIPELINE in forge/stages.py; evidence runs twice (on the settings alone, then with the held-out pairs
and test text counted) to check that eval will give every gate rule enough items. Each stage skips itself when the
settings it reads, its inputs and its code are unchanged (forge/lineage.py), and pretrain resumes an interrupted
attempt from its newest checkpoint, so re-running after a failure or a kill picks up where the run stopped. A
failed stage or a refused gate stops the pipeline: the report card is still written (what ran, and why it
stopped), the reason is the last line printed, and the exit code is non-zero. Only a refusal (GateRefused) reads
"refused by the gate": an MLflow that fails during promote is a failed stage, reported with MLflow's error and the
tracking URI.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable
from typing import Any

from forge import ForgeError, report_card
from forge.config import ForgeConfig
from forge.paths import run_dir
from forge.stages import PIPELINE, STAGES

log = logging.getLogger("forge.pipeline")


class PipelineStopped(ForgeError):
    """A stage failed or the gate refused; the message names the stage and the reason."""


class GateRefused(ForgeError):
    """The gate judged the version and refused it (raised by registry/promote.py); the message names the failing
    checks. Any other error of the promote stage (MLflow down, no registered version) is a failure, not a refusal."""


def run_stages(cfg: ForgeConfig, force: bool, echo: Callable[[str], None]) -> dict[str, Any]:
    """Run the stages; return the outcome for the report card: result, stopped_at, reason, wall_s."""
    start = time.time()
    for name, options in PIPELINE:
        label = f"{name} {' '.join(f'{k}={v}' for k, v in options.items())}".rstrip()
        echo(f"== {label}")
        try:
            STAGES[name].load()(cfg, force=force, **options)
        except KeyboardInterrupt:
            raise
        except GateRefused as exc:
            return _stopped(label, str(exc), start, result="refused by the gate")
        except ForgeError as exc:
            return _stopped(label, str(exc), start)
        except Exception as exc:  # noqa: BLE001 - a bug in a stage: keep the traceback in the log, stop cleanly
            log.error("%s failed:\n%s", label, traceback.format_exc())
            return _stopped(label, f"{type(exc).__name__}: {exc}", start)
    return {"result": "promoted", "stopped_at": None, "reason": None, "wall_s": time.time() - start}


def _stopped(label: str, reason: str, start: float, result: str | None = None) -> dict[str, Any]:
    return {"result": result or f"stopped at {label}", "stopped_at": label, "reason": reason,
            "wall_s": time.time() - start}  # fmt: skip


def run(cfg: ForgeConfig, force: bool = False, serve: bool = True, echo: Callable[[str], None] = print) -> dict:
    """The whole lifecycle; raises PipelineStopped (after writing the report card) when it cannot finish."""
    outcome = run_stages(cfg, force, echo)
    try:
        card = report_card.write(cfg, outcome)
        where = report_card.attach(cfg)
        echo(f"report card: {card}" + (f" (attached to the registered version: {where})" if where else ""))
    except Exception as exc:  # noqa: BLE001 - the card must never hide why the pipeline stopped
        log.warning("the report card could not be written: %s", exc)
    if outcome["stopped_at"]:
        raise PipelineStopped(
            f"pipeline stopped at {outcome['stopped_at']}: {outcome['reason']}\n"
            f"nothing was served; see {run_dir(cfg) / 'report.md'}, fix the cause and re-run the same command: "
            "finished stages are skipped and an interrupted pretrain resumes from its last checkpoint"
        )
    if serve:
        STAGES["serve"].load()(cfg, chat=True)
    return outcome
