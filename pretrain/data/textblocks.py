"""The Markdown-like text every document reader writes (formats.py, pdf.py), and how a reader says it cannot read.

The same form HTML extraction writes (html.render_blocks) and the Q&A stage parses (pretrain/qa/structure.py): a
heading as a "#" line, paragraphs apart by a blank line, list items as "- item", table rows as "cell | cell", code
between ``` fences.
"""

from __future__ import annotations

import re

FENCE = "```"  # the line that opens and closes a code block

# Styles that mark code in word processors (Word's "HTML Preformatted", LibreOffice's "Preformatted Text", pandoc's
# "Source Code") and the monospace fonts a code run is set in.
CODE_STYLE = re.compile(r"preformatted|source|code|verbatim|listing", re.I)
MONOSPACE = re.compile(r"mono|courier|consol|menlo|typewriter|fixed|\btt\b|inconsolata|code", re.I)


class Unreadable(Exception):
    """A document Forge cannot read: `reason` (scanned, encrypted, damaged) and `detail` say why and what to do."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


def heading(level: int, text: str) -> str:
    return f"{'#' * max(1, min(level, 6))} {' '.join(text.split())}"


def code_block(lines: list[str]) -> str:
    return "\n".join([FENCE, *(line.rstrip() for line in lines), FENCE])


def join_code(blocks: list[tuple[str, str]]) -> list[str]:
    """(kind, text) blocks in order -> text blocks, consecutive code lines in one fence."""
    out: list[str] = []
    code: list[str] = []
    for kind, text in blocks:
        if kind == "code":
            code.append(text)
            continue
        if code:
            out.append(code_block(code))
            code = []
        out.append(text)
    if code:
        out.append(code_block(code))
    return out
