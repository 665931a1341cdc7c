"""What `forge data` removed and why: the removal log, report.json, report.md and the bar chart.

Characters are attributed to the step that removed them: a dropped document's remaining text to the filter that
dropped it, partial edits (HTML markup, boilerplate lines, duplicated paragraphs) to their step, so the removed
characters of all filters plus the kept ones add up to the raw corpus. Tokens are estimated at 4 chars per token.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import zstandard

from forge import render
from forge.config import ForgeConfig
from forge.io import atomic_path, atomic_write_json, atomic_write_text

CHARS_PER_TOKEN = 4.0
SAMPLES_PER_FILTER = 5
EXCERPT_CHARS = 300
LOG_TEXT_CHARS = 2000  # removed.jsonl.zst keeps this much of each removed document's text


def est_tokens(chars: int) -> int:
    return int(round(chars / CHARS_PER_TOKEN))


def cluster_stats(sizes: np.ndarray) -> dict[str, Any]:
    """Duplicate clusters (size >= 2): how many, documents in them, removed, size distribution."""
    sizes = np.asarray(sizes, dtype=np.int64)
    hist = Counter(int(s) for s in sizes)
    return {
        "clusters": int(len(sizes)),
        "docs_in_clusters": int(sizes.sum()),
        "docs_removed": int((sizes - 1).sum()),
        "largest": int(sizes.max()) if len(sizes) else 0,
        "mean_size": round(float(sizes.mean()), 2) if len(sizes) else 0.0,
        "size_histogram": {str(k): hist[k] for k in sorted(hist)},
    }


class Stats:
    """Running counts per filter, a few samples per filter, and the streamed removal log."""

    def __init__(self, filter_names: tuple[str, ...], log_path: Path):
        self.filters = {name: {"docs": 0, "chars": 0, "rules": Counter()} for name in filter_names}
        self.samples: dict[str, list[dict[str, Any]]] = {name: [] for name in filter_names}
        self.clusters: dict[str, dict[str, Any]] = {}
        self.raw_docs = self.raw_chars = self.kept_docs = self.kept_chars = 0
        self._log_path = log_path
        self._log_ctx = atomic_path(log_path)
        tmp = self._log_ctx.__enter__()
        self._raw = open(tmp, "wb")  # noqa: SIM115 - closed in close()
        self._zst = zstandard.ZstdCompressor(level=6).stream_writer(self._raw)
        self._log = io.TextIOWrapper(self._zst, encoding="utf-8")

    def count_raw(self, record: dict[str, Any]) -> None:
        self.raw_docs += 1
        self.raw_chars += record["raw_chars"]

    def _credit_edits(self, record: dict[str, Any]) -> None:
        for step, chars in record.get("removed", {}).items():
            self.filters[step]["chars"] += chars

    def drop(self, record: dict[str, Any], name: str, reason: str) -> None:
        self._credit_edits(record)
        entry = self.filters[name]
        entry["docs"] += 1
        entry["chars"] += len(record["text"])
        entry["rules"][_rule(name, reason)] += 1
        row = {"id": record["id"], "split": record.get("split"), "source": record.get("source"), "filter": name,
               "reason": reason, "chars": len(record["text"])}  # fmt: skip
        if len(self.samples[name]) < SAMPLES_PER_FILTER:
            self.samples[name].append({**row, "excerpt": record["text"][:EXCERPT_CHARS]})
        self._log.write(json.dumps({**row, "text": record["text"][:LOG_TEXT_CHARS]}, ensure_ascii=False) + "\n")

    def keep(self, record: dict[str, Any]) -> None:
        self._credit_edits(record)
        self.kept_docs += 1
        self.kept_chars += len(record["text"])

    def close(self) -> None:
        if self._log is None:
            return
        self._log.flush()
        self._log.close()  # closes the zstd frame and the file
        self._log = None  # type: ignore[assignment]
        self._log_ctx.__exit__(None, None, None)  # rename onto removed.jsonl.zst


def _rule(name: str, reason: str) -> str:
    """A short key for the rule that fired, for the per-rule breakdown."""
    if name in ("exact_dedup", "near_dedup", "decontamination"):
        return "exact copy" if reason.startswith("exact") else "near copy (verified Jaccard)"
    if name == "language":
        return reason.split(" ")[0] + (" (low score)" if "score" in reason.split("<")[0] and "<" in reason else "")
    return reason.split(":")[0].split(" (")[0][:60]


# ----------------------------------------------------------------------------------------------------------------
# report.json, report.md, the chart


def write(out: Path, stats: Stats, splits: dict[str, Any], cfg: ForgeConfig) -> dict[str, float]:
    raw_chars = max(stats.raw_chars, 1)
    per_filter = {}
    for name, entry in stats.filters.items():
        per_filter[name] = {
            "docs": entry["docs"],
            "chars": entry["chars"],
            "est_tokens": est_tokens(entry["chars"]),
            "pct_docs": round(100 * entry["docs"] / max(stats.raw_docs, 1), 2),
            "pct_chars": round(100 * entry["chars"] / raw_chars, 2),
            "rules": dict(entry["rules"].most_common()),
        }
    kept_chars = sum(s["chars"] for s in splits.values())
    kept_docs = sum(s["docs"] for s in splits.values())
    tokens = est_tokens(kept_chars)
    data = {
        "run": cfg.run_name,
        "inputs": cfg.data.inputs,
        "raw": {"docs": stats.raw_docs, "chars": stats.raw_chars, "est_tokens": est_tokens(stats.raw_chars)},
        "kept": {
            "docs": kept_docs,
            "chars": kept_chars,
            "est_tokens": tokens,
            "pct_chars": round(100 * kept_chars / raw_chars, 2),
        },  # fmt: skip
        "removed_pct_chars": round(100 - 100 * kept_chars / raw_chars, 2),
        "filters": per_filter,
        "duplicates": stats.clusters,
        "splits": splits,
        "storage": {
            "text_bytes_est": tokens * 4,  # ~4 B of plain text per token (the seeds: 10B tokens ~ 40 GB)
            "token_ids_uint16_bytes": tokens * 2,  # tokenized shards, vocab < 65,536
            "token_ids_uint32_bytes": tokens * 4,
        },
        "samples": stats.samples,
        "chars_per_token": CHARS_PER_TOKEN,
    }
    atomic_write_json(out / "report.json", data)
    atomic_write_text(out / "report.md", markdown(data))
    bar_chart(out / "removed_by_filter.png", data)
    metrics: dict[str, float] = {
        "raw_docs": stats.raw_docs, "kept_docs": kept_docs, "removed_pct_chars": data["removed_pct_chars"],
        "kept_chars": kept_chars, "est_tokens": tokens,
        **{f"{s}_docs": splits[s]["docs"] for s in splits},
        **{f"removed_{k}_docs": v["docs"] for k, v in per_filter.items()},
    }  # fmt: skip
    return metrics


def _fmt(n: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f}{unit}"
    return str(int(n))


def markdown(data: dict[str, Any]) -> str:
    raw, kept = data["raw"], data["kept"]
    lines = [
        f"# Data report: {data['run']}",
        "",
        f"Inputs: {', '.join(map(str, data['inputs']))}",
        "",
        f"Raw: {raw['docs']:,} documents, {raw['chars']:,} characters (~{_fmt(raw['est_tokens'])} tokens). "
        f"Kept: {kept['docs']:,} documents, {kept['chars']:,} characters (~{_fmt(kept['est_tokens'])} tokens), "
        f"**{data['removed_pct_chars']:.1f}% of the raw characters removed** (web text typically loses 40-60%).",
        "",
        "## Removed, per filter (in pipeline order)",
        "",
        "Characters are credited to the step that removed them (partial edits included); tokens at "
        f"{data['chars_per_token']:g} chars/token.",
        "",
        "| filter | docs | % docs | chars | % raw chars | est. tokens | top rules |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for name, f in data["filters"].items():
        rules = ", ".join(f"{k} ({v})" for k, v in list(f["rules"].items())[:4])
        lines.append(f"| {name} | {f['docs']:,} | {f['pct_docs']:.2f} | {f['chars']:,} | {f['pct_chars']:.2f} | "
                     f"{_fmt(f['est_tokens'])} | {rules} |")  # fmt: skip
    lines += ["", "## Duplicates", ""]
    if not data["duplicates"]:
        lines.append("Deduplication was switched off.")
    for kind, c in data["duplicates"].items():
        extra = ""
        if "candidate_pairs" in c:
            extra = f"; {c['candidate_pairs']:,} LSH candidate pairs, {c['verified_pairs']:,} verified"
        lines.append(
            f"- {kind}: {c['clusters']:,} clusters holding {c['docs_in_clusters']:,} documents, "
            f"{c['docs_removed']:,} removed (one kept per cluster); largest {c['largest']}, mean {c['mean_size']}"
            f"{extra}. Sizes: {', '.join(f'{k}x{v}' for k, v in list(c['size_histogram'].items())[:12])}"
        )
    lines += ["", "## Splits", "", "| split | docs | chars | est. tokens | shards |", "|---|---:|---:|---:|---|"]
    for split, s in data["splits"].items():
        lines.append(f"| {split} | {s['docs']:,} | {s['chars']:,} | {_fmt(s['est_tokens'])} | {len(s['shards'])} |")
    st = data["storage"]
    lines += [
        "",
        "## Storage estimate",
        "",
        f"~{_fmt(kept['est_tokens'])} tokens: ~{_fmt(st['text_bytes_est'])}B as plain text, "
        f"{_fmt(st['token_ids_uint16_bytes'])}B as uint16 token ids ({_fmt(st['token_ids_uint32_bytes'])}B uint32).",
        "",
        "## Samples of removed documents",
        "",
        "Every removed document, with its reason, is in `removed.jsonl.zst` "
        '(`zstdcat removed.jsonl.zst | grep \'"filter": "language"\'`).',
    ]
    for name, samples in data["samples"].items():
        if not samples:
            continue
        lines += ["", f"### {name}", ""]
        for s in samples:
            excerpt = " ".join(s["excerpt"].split())[:160].replace("|", "\\|")
            lines.append(f'- `{s["id"]}` ({s["split"]}): {s["reason"]} -- "{excerpt}"')
    return "\n".join(lines) + "\n"


def bar_chart(path: Path, data: dict[str, Any]) -> None:
    plt = render.pyplot()
    names = list(data["filters"])
    docs = [data["filters"][n]["pct_docs"] for n in names]
    chars = [data["filters"][n]["pct_chars"] for n in names]
    y = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(names) + 1.5))
    ax.barh(y - 0.2, docs, height=0.4, label="% of documents")
    ax.barh(y + 0.2, chars, height=0.4, label="% of characters")
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    ax.set_xlabel("% of the raw corpus removed")
    ax.set_title(f"forge data: removed by filter ({data['removed_pct_chars']:.1f}% of characters in total)")
    ax.legend(loc="lower right")
    fig.tight_layout()
    render.save_figure(fig, path)
