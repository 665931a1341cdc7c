"""`forge pipeline`: every stage in order, the report card, then the server and chat UI when the gate passed.

    plan -> data -> tokenizer -> pretrain -> eval(pretrain) -> sft -> eval(sft) -> quantize -> register -> promote
         -> report card (runs/<run>/report.md) -> forge serve + forge chat   (--no-serve stops after the card)

Each stage skips itself when its inputs and config are unchanged, and pretrain resumes an interrupted attempt from
its newest checkpoint, so re-running after a failure or a kill picks up where the run stopped. A failed stage or a
refused gate stops the pipeline: the report card is still written (what ran, and why it stopped), the reason is the
last line printed, and the exit code is non-zero.
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
        except ForgeError as exc:
            return _stopped(label, str(exc), start)
        except Exception as exc:  # noqa: BLE001 - a bug in a stage: keep the traceback in the log, stop cleanly
            log.error("%s failed:\n%s", label, traceback.format_exc())
            return _stopped(label, f"{type(exc).__name__}: {exc}", start)
    return {"result": "promoted", "stopped_at": None, "reason": None, "wall_s": time.time() - start}


def _stopped(label: str, reason: str, start: float) -> dict[str, Any]:
    refused = label == "promote"
    return {"result": "refused by the gate" if refused else f"stopped at {label}", "stopped_at": label,
            "reason": reason, "wall_s": time.time() - start}  # fmt: skip


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
