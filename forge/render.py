"""Reports as people read them: tables rendered to markdown and to standalone HTML, and plots saved atomically.

A report is a title, a list of (heading, header, rows) tables and a list of plot paths relative to the report,
so the eval report and the run's report card render the same way.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from forge.io import atomic_path

Table = tuple[str, list[str], list[list[str]]]  # (heading, header, rows)


def fmt(value: Any) -> str:
    """A cell: 4 significant digits for floats, '-' for missing values."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return ", ".join(f"{k} {fmt(v)}" for k, v in value.items())
    return str(value)


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", "⏎")


def to_markdown(title: str, tables: Sequence[Table], plots: Sequence[str], intro: str = "") -> str:
    lines = [f"# {title}", ""] + ([intro, ""] if intro else [])
    for heading, header, rows in tables:
        lines += [f"## {heading}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
        lines.append("")
    if plots:
        lines += ["## Plots", "", *(f"![{Path(p).stem}]({p})" for p in plots), ""]
    return "\n".join(lines)


def to_html(title: str, tables: Sequence[Table], plots: Sequence[str], intro: str = "") -> str:
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>"
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin-bottom:1.5em}"
        "td,th{border:1px solid #ccc;padding:4px 8px;vertical-align:top;white-space:pre-wrap}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    if intro:
        parts.append(f"<p>{html.escape(intro)}</p>")
    for heading, header, rows in tables:
        parts.append(f"<h2>{html.escape(heading)}</h2><table><tr>")
        parts += [f"<th>{html.escape(h)}</th>" for h in header]
        parts.append("</tr>")
        for row in rows:
            parts.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>")
        parts.append("</table>")
    parts += [f"<h2>{html.escape(Path(p).stem)}</h2><img src='{html.escape(p)}'>" for p in plots]
    parts.append("</body></html>\n")
    return "".join(parts)


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend (no display on servers and in CI)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> None:
    """Write a PNG through a temp file, so a reader never sees half a plot; closes the figure."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    pyplot().close(fig)
