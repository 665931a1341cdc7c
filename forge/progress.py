"""One progress display for every long loop (evaluation, SFT, quantize measurements): a tqdm bar on a terminal,
and a log line every LOG_EVERY_S seconds when stderr is not one (CI logs, `make demo | tee`, a container), where a
redrawn bar would be thousands of carriage returns. A loop done before the first line is due shows nothing.

    for item in progress(items, desc="eval: multiple choice", unit="item"):
        ...
    with progress(total=n, desc="scoring", unit="seq") as bar:
        bar.update(k)
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable
from typing import Any

from tqdm import tqdm

LOG_EVERY_S = 30.0
LOG_FORMAT = "{desc}: {n_fmt}/{total_fmt} {unit} ({percentage:.0f}%), {elapsed} elapsed, {remaining} left{postfix}"
log = logging.getLogger("forge.progress")


class _LogLines:
    """A file-like target for tqdm that turns each refresh into one log line."""

    def __init__(self, logger: logging.Logger):
        self.logger = logger

    def write(self, text: str) -> None:
        text = text.strip("\r\n ")
        if text:
            self.logger.info(text)

    def flush(self) -> None:
        pass


def progress(
    iterable: Iterable[Any] | None = None,
    *,
    total: int | None = None,
    desc: str = "",
    unit: str = "it",
    logger: logging.Logger | None = None,
) -> tqdm:
    """A tqdm over `iterable` (or a manual one with `total`): a bar on a TTY, else periodic log lines."""
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    if sys.stderr.isatty():
        return tqdm(iterable, total=total, desc=desc, unit=unit, dynamic_ncols=True, leave=False, delay=1.0)
    return tqdm(
        iterable, total=total, desc=desc, unit=unit, file=_LogLines(logger or log), mininterval=LOG_EVERY_S,
        maxinterval=LOG_EVERY_S, delay=LOG_EVERY_S, bar_format=LOG_FORMAT,
    )  # fmt: skip
