"""The gate's decision as people and MLflow see it: the plain-text table `forge promote` prints, and one MLflow tag
per check (forge.gate.check.*, forge.gate.advice.*) on the judged version. registry/gate.py makes the checks.

    checks = gate.evaluate(policy, evidence)
    print(format_table(checks, "gate: forge-model v3"))
"""

from __future__ import annotations

import re

from registry.gate import Check, brief, failing, passed


def format_table(checks: list[Check], title: str = "") -> str:
    """The decision as a plain-text table: check, result, value, interval, n, limit, detail."""
    rows = [("check", "result", "value", "interval", "n", "limit", "detail")]
    rows += [(c.name, c.result, brief(c.value), interval_text(c), "" if c.n is None else str(c.n), brief(c.limit),
              c.detail) for c in checks]  # fmt: skip
    widths = [min(max(len(r[i]) for r in rows), 48) for i in range(6)]
    lines = [title] if title else []
    for i, row in enumerate(rows):
        lines.append("  ".join(cell[:48].ljust(w) for cell, w in zip(row[:6], widths, strict=True)) + "  " + row[6])
        if i == 0:
            lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 6)
    verdict = "PASS" if passed(checks) else f"FAIL ({len(failing(checks))} failing: {', '.join(failing(checks))})"
    lines += [f"what to change: {c.name}: {c.advice}" for c in checks if c.advice]
    lines.append(f"decision: {verdict}")
    return "\n".join(lines)


def interval_text(check: Check) -> str:
    return "" if check.interval is None else f"[{check.interval[0]:.4g}, {check.interval[1]:.4g}]"


def tag_key(check: Check) -> str:
    """The MLflow tag of a check's row (tag keys allow letters, digits, _ - . / and spaces)."""
    name = check.name.replace(":", ".").replace(">", " above ").replace("<", " below ")
    return "forge.gate.check." + re.sub(r"[^\w.\-/ ]", "_", name)


def advice_tag_key(check: Check) -> str:
    """The MLflow tag holding a failing rule's advice."""
    return tag_key(check).replace("forge.gate.check.", "forge.gate.advice.", 1)


def tag_value(check: Check) -> str:
    n = "" if check.n is None else f" n={check.n}"
    return f"{check.result} {brief(check.value)} {interval_text(check)}{n} limit {brief(check.limit)}: {check.detail}"
