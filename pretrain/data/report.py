"""What `forge data` removed and why: the removal log, report.json, report.md and the charts.

Characters are attributed to the step that removed them: a dropped document's remaining text to the filter that
dropped it, partial edits (page chrome, boilerplate lines, duplicated paragraphs) to their step. HTML markup (tags,
scripts, styles) is counted apart: it was never content, so the percentages of what the filters removed are of the
documents' text (raw characters minus markup), and markup + removed + kept add up to the raw corpus. Tokens are
estimated as words x 1.3 (splits.py says why).
"""

from __future__ import annotations

import heapq
import io
import json
import pickle
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import zstandard

from forge import render
from forge.config import ForgeConfig
from forge.io import atomic_path, atomic_write_json, atomic_write_text
from pretrain.data.splits import TOKENS_PER_WORD, est_tokens
from pretrain.data.words import segmenter_name

LARGEST_PER_RULE = 5
EXCERPT_CHARS = 300
LOG_TEXT_CHARS = 2000  # removed.jsonl.zst keeps this much of each removed document's text
MAX_PLOTTED_RULES = 12
MAX_LISTED = 1000  # unreadable files listed by id in report.json (every one is in removed.jsonl.zst)


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
    """Running counts per filter and rule, the largest dropped documents per rule, and the streamed removal log."""

    def __init__(self, filter_names: tuple[str, ...], log_path: Path, work: Path):
        self.filters = {name: {"docs": 0, "chars": 0, "rules": Counter()} for name in filter_names}
        self.largest: dict[str, list[tuple[int, int, dict[str, Any]]]] = {}  # rule -> min-heap of the largest
        self.clusters: dict[str, dict[str, Any]] = {}
        self.raw_docs = self.raw_chars = self.markup_chars = self.kept_docs = self.kept_chars = 0
        self.by_format: defaultdict[str, Counter[str]] = defaultdict(Counter)
        self.by_language: defaultdict[str, Counter[str]] = defaultdict(Counter)
        self.unreadable: list[dict[str, Any]] = []  # the first MAX_LISTED files that could not be read, and why
        self._seq = 0
        self._log_path, self._work = log_path, work
        self._segments: list[Path] = []  # the removal log, one file per pass under work/ (joined by close())
        self._log: io.TextIOWrapper | None = None
        self._open_segment()

    def _open_segment(self) -> None:
        path = self._work / f"removed-{len(self._segments):02d}.jsonl.zst"
        self._segments.append(path)
        raw = open(path, "wb")  # noqa: SIM115 - closed with the wrapper
        self._log = io.TextIOWrapper(zstandard.ZstdCompressor(level=6).stream_writer(raw), encoding="utf-8")

    def _close_segment(self) -> None:
        if self._log is not None:
            self._log.close()  # closes the zstd frame and the file
            self._log = None

    def checkpoint(self) -> bytes:
        """Everything counted so far, the log cut at this point: restore() continues from here (pass_state.py)."""
        self._close_segment()
        state = pickle.dumps({k: v for k, v in vars(self).items() if k != "_log"})
        self._open_segment()
        return state

    @classmethod
    def restore(cls, state: bytes) -> Stats:
        """The Stats of a checkpoint; the log segment a pass that did not finish had begun is written anew."""
        stats = cls.__new__(cls)
        vars(stats).update(pickle.loads(state), _log=None)
        stats._open_segment()
        return stats

    def count_raw(self, record: dict[str, Any]) -> None:
        self.raw_docs += 1
        self.raw_chars += record["raw_chars"]
        entry = self.by_format[_format_of(record)]
        part = record.get("meta", {}).get("part")
        entry["documents"] += part is None or part.startswith("1/")  # a document's first section counts it
        entry["sections"] += 1
        entry["raw_chars"] += record["raw_chars"]

    def _credit_edits(self, record: dict[str, Any]) -> None:
        for step, chars in record.get("removed", {}).items():
            if step == "markup":
                self.markup_chars += chars
            else:
                self.filters[step]["chars"] += chars

    def drop(self, record: dict[str, Any], name: str, reason: str) -> None:
        self._credit_edits(record)
        entry = self.filters[name]
        entry["docs"] += 1
        entry["chars"] += len(record["text"])
        rule = record.get("rule") or _rule(name, reason)
        entry["rules"][rule] += 1
        if name == "unreadable" and len(self.unreadable) < MAX_LISTED:
            self.unreadable.append({"id": record["id"], "source": record.get("source"), "rule": rule,
                                    "reason": reason})  # fmt: skip
        if lang := record.get("meta", {}).get("lang"):
            self.by_language[lang]["dropped_sections"] += 1
        row = {"id": record["id"], "split": record.get("split"), "source": record.get("source"), "filter": name,
               "rule": rule, "reason": reason, "value": record.get("value"), "chars": len(record["text"])}  # fmt: skip
        if record.get("duplicate_of"):
            row["duplicate_of"] = record["duplicate_of"]
        heap = self.largest.setdefault(f"{name}: {rule}", [])
        self._seq += 1
        item = (len(record["text"]), -self._seq, {**row, "excerpt": record["text"][:EXCERPT_CHARS]})
        (heapq.heappush if len(heap) < LARGEST_PER_RULE else heapq.heappushpop)(heap, item)
        assert self._log is not None, "Stats.drop after close()"
        self._log.write(json.dumps({**row, "text": record["text"][:LOG_TEXT_CHARS]}, ensure_ascii=False) + "\n")

    def keep(self, record: dict[str, Any]) -> None:
        self._credit_edits(record)
        self.kept_docs += 1
        self.kept_chars += len(record["text"])
        entry = self.by_format[_format_of(record)]
        entry["kept_sections"] += 1
        entry["kept_chars"] += len(record["text"])
        language = self.by_language[record.get("meta", {}).get("lang") or "und"]
        language["kept_sections"] += 1
        language["kept_chars"] += len(record["text"])
        language["kept_est_tokens"] += est_tokens(record["text"])

    def close(self) -> None:
        """removed.jsonl.zst: the segments in order, as one zstd frame (a reader need not read across frames)."""
        if self._log is None:
            return
        self._close_segment()
        with (
            atomic_path(self._log_path) as tmp,
            open(tmp, "wb") as raw,
            zstandard.ZstdCompressor(level=6).stream_writer(raw, closefd=False) as joined,
        ):
            for path in self._segments:
                with open(path, "rb") as segment:
                    zstandard.ZstdDecompressor().copy_stream(segment, joined)


def _format_of(record: dict[str, Any]) -> str:
    """The file format a record came from (pdf, docx, odt, epub, html, text, jsonl, parquet); "not read" for a file
    of a type the stage does not read (images, stylesheets: the report lists them), which is not text."""
    unread = "not read" if record.get("skip") == "unsupported_type" else "text"
    return str(record.get("meta", {}).get("format") or record.get("format") or unread)


def _rule(name: str, reason: str) -> str:
    """A short key for a rule that did not name itself (dedup, unreadable inputs, boilerplate)."""
    if name in ("exact_dedup", "near_dedup", "decontamination"):
        return "exact copy" if reason.startswith("exact") else "near copy (verified Jaccard)"
    return reason.split(":")[0].split(" (")[0][:60]


# ----------------------------------------------------------------------------------------------------------------
# report.json, report.md, the charts


def write(out: Path, stats: Stats, splits: dict[str, Any], cfg: ForgeConfig, split_plan: dict[str, Any],
          calibration: dict[str, Any]) -> dict[str, float]:  # fmt: skip
    text_chars = max(stats.raw_chars - stats.markup_chars, 1)
    per_filter = {}
    for name, entry in stats.filters.items():
        per_filter[name] = {
            "docs": entry["docs"],
            "chars": entry["chars"],
            "pct_docs": round(100 * entry["docs"] / max(stats.raw_docs, 1), 2),
            "pct_chars": round(100 * entry["chars"] / text_chars, 2),
            "rules": dict(entry["rules"].most_common()),
        }
    kept_chars = sum(s["chars"] for s in splits.values())
    kept_docs = sum(s["docs"] for s in splits.values())
    tokens = sum(s["est_tokens"] for s in splits.values())
    largest = {rule: [row for _, _, row in sorted(heap, reverse=True)] for rule, heap in stats.largest.items()}
    data = {
        "run": cfg.run_name,
        "inputs": cfg.data.inputs,
        "profile": cfg.data.profile,
        "raw": {"docs": stats.raw_docs, "chars": stats.raw_chars},
        "markup": {"chars": stats.markup_chars,
                   "pct_raw_chars": round(100 * stats.markup_chars / max(stats.raw_chars, 1), 2)},
        "text": {"chars": text_chars},
        "kept": {"docs": kept_docs, "chars": kept_chars, "est_tokens": tokens,
                 "pct_text_chars": round(100 * kept_chars / text_chars, 2)},
        "removed_pct_chars": round(100 - 100 * kept_chars / text_chars, 2),  # of the text: markup is not content
        "filters": per_filter,
        "duplicates": stats.clusters,
        "splits": splits,
        "split_plan": split_plan,
        "calibration": calibration,
        "storage": {
            "text_bytes_est": tokens * 4,  # ~4 B of plain text per token (10B tokens ~ 40 GB of text)
            "token_ids_uint16_bytes": tokens * 2,  # tokenized shards, vocab < 65,536
            "token_ids_uint32_bytes": tokens * 4,
        },
        "by_format": {k: dict(v) for k, v in sorted(stats.by_format.items())},
        "by_language": {k: {**v, "words": segmenter_name(k)}
                        for k, v in sorted(stats.by_language.items(), key=lambda kv: -kv[1]["kept_chars"])},
        "unreadable": stats.unreadable,
        "scanned": [u["id"] for u in stats.unreadable if u["rule"] == "scanned"],
        "largest_dropped": largest,
        "tokens_per_word": TOKENS_PER_WORD,
    }  # fmt: skip
    atomic_write_json(out / "report.json", data)
    atomic_write_text(out / "report.md", markdown(data))
    bar_chart(out / "removed_by_filter.png", data)
    calibration_chart(out / "calibration.png", calibration)
    metrics: dict[str, float] = {
        "raw_docs": stats.raw_docs, "kept_docs": kept_docs, "removed_pct_chars": data["removed_pct_chars"],
        "markup_pct_raw_chars": data["markup"]["pct_raw_chars"], "kept_chars": kept_chars, "est_tokens": tokens,
        **{f"{s}_docs": splits[s]["docs"] for s in splits},
        **{f"{s}_est_tokens": splits[s]["est_tokens"] for s in splits},
        **{f"split_ratio_{s}": r for s, r in split_plan["ratios"].items()},
        "calibration_flagged_rules": len(calibration.get("flagged", [])),
        **{f"removed_{k}_docs": v["docs"] for k, v in per_filter.items()},
    }  # fmt: skip
    return metrics


def _fmt(n: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f}{unit}"
    return str(int(n))


def _cell(text: str, limit: int = 160) -> str:
    return " ".join(str(text).split())[:limit].replace("|", "\\|")


def markdown(data: dict[str, Any]) -> str:
    raw, kept, markup = data["raw"], data["kept"], data["markup"]
    plan, cal = data["split_plan"], data["calibration"]
    lines = [
        f"# Data report: {data['run']}",
        "",
        f"Inputs: {', '.join(map(str, data['inputs']))} (profile: {data['profile']})",
        "",
        f"Raw: {raw['docs']:,} documents, {raw['chars']:,} characters, of which {markup['chars']:,} "
        f"({markup['pct_raw_chars']:.1f}%) were HTML markup (tags, scripts, styles: not content, not counted as "
        f"removed). Text: {data['text']['chars']:,} characters. Kept: {kept['docs']:,} documents, "
        f"{kept['chars']:,} characters (~{_fmt(kept['est_tokens'])} tokens), **{data['removed_pct_chars']:.1f}% "
        "of the text removed** by the filters below (web text typically loses 40-60%).",
    ]
    if cal.get("flagged"):
        lines += ["", f"**Calibration warning**: {len(cal['flagged'])} rule(s) alone would drop more than "
                  f"{100 * cal['max_drop_share']:g}% of the train documents: {', '.join(cal['flagged'])}. "
                  "See [Calibration](#calibration-each-rule-on-the-train-split)."]  # fmt: skip
    lines += format_markdown(data)
    lines += ["", "## Splits", "",
              "Assigned from a stable hash of each document id before any cleaning (pretrain/data/splits.py); "
              f"val and test get at least data.min_eval_tokens={plan['min_eval_tokens']:,} estimated tokens each "
              f"(words x {data['tokens_per_word']}) or their ratio, whichever is larger, up to "
              f"data.max_eval_fraction={plan['max_eval_fraction']:g} of the corpus each.", "",
              "| split | ratio | docs kept | est. tokens assigned (before cleaning) | est. tokens kept | chars kept "
              "| shards |", "|---|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    for split, s in data["splits"].items():
        lines.append(f"| {split} | {plan['ratios'][split]:.4f} | {s['docs']:,} | {plan['assigned_tokens'][split]:,} "
                     f"| {s['est_tokens']:,} | {s['chars']:,} | {len(s['shards'])} |")  # fmt: skip
    for note in plan["notes"]:
        lines += ["", f"**Too small for evaluation**: {note}"]
    lines += [
        "",
        "## Removed, per filter (in pipeline order)",
        "",
        "Characters are credited to the step that removed them (partial edits included); % of the text (markup "
        "excluded). html_extraction counts visible page chrome (navigation, sidebars, footers) and pages with no "
        "main content.",
        "",
        "| filter | docs | % docs | chars | % text chars | rules (docs) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name, f in data["filters"].items():
        rules = ", ".join(f"{k} ({v})" for k, v in list(f["rules"].items())[:4])
        lines.append(f"| {name} | {f['docs']:,} | {f['pct_docs']:.2f} | {f['chars']:,} | {f['pct_chars']:.2f} | "
                     f"{rules} |")  # fmt: skip
    lines += calibration_markdown(cal)
    lines += ["", "## Largest dropped documents, per rule", "",
              "Every removed document, with its reason, is in `removed.jsonl.zst` "
              '(`zstdcat removed.jsonl.zst | grep \'"filter": "language"\'`).']  # fmt: skip
    for rule, rows in data["largest_dropped"].items():
        lines += ["", f"### {rule}", ""]
        for r in rows:
            lines.append(f'- `{r["id"]}` ({r["split"]}, {r["chars"]:,} chars): {r["reason"]} -- '
                         f'"{_cell(r["excerpt"])}"')  # fmt: skip
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
    st = data["storage"]
    lines += [
        "",
        "## Storage estimate",
        "",
        f"~{_fmt(kept['est_tokens'])} tokens: ~{_fmt(st['text_bytes_est'])}B as plain text, "
        f"{_fmt(st['token_ids_uint16_bytes'])}B as uint16 token ids ({_fmt(st['token_ids_uint32_bytes'])}B uint32).",
    ]
    return "\n".join(lines) + "\n"


def format_markdown(data: dict[str, Any]) -> list[str]:
    """Per file format and per language: documents, sections and kept text; the files that could not be read."""
    lines = ["", "## By format and language", "",
             "Long documents are cut into sections before the split (data.max_section_tokens); a section is judged "
             "and kept as a document of its own.", "",
             "| format | documents | sections | sections kept | chars kept |", "|---|---:|---:|---:|---:|"]  # fmt: skip
    for fmt, f in data["by_format"].items():
        lines.append(f"| {fmt} | {f.get('documents', 0):,} | {f.get('sections', 0):,} | "
                     f"{f.get('kept_sections', 0):,} | {f.get('kept_chars', 0):,} |")  # fmt: skip
    lines += ["", "| language | sections kept | chars kept | est. tokens kept | sections dropped | words found by |",
              "|---|---:|---:|---:|---:|---|"]  # fmt: skip
    for lang, f in data["by_language"].items():
        counts = [f"{f.get(k, 0):,}" for k in ("kept_sections", "kept_chars", "kept_est_tokens", "dropped_sections")]
        lines.append(f"| {lang} | {' | '.join(counts)} | {f['words']} |")
    if data["scanned"]:
        listed = ", ".join(f"`{i}`" for i in data["scanned"][:50])
        lines += ["", f"**Scanned PDFs** ({len(data['scanned'])}): no text layer to read; OCR (e.g. `ocrmypdf "
                  f"--sidecar`, Tesseract) would turn them into text first: {listed}"]  # fmt: skip
    other = [u for u in data["unreadable"] if u["rule"] != "scanned"]
    if other:
        lines += ["", f"**Not read** ({len(other)} listed):", ""]
        lines += [f"- `{u['id']}`: {u['reason']}" for u in other[:50]]
    return lines


def calibration_markdown(cal: dict[str, Any]) -> list[str]:
    lines = ["", "## Calibration: each rule on the train split", ""]
    if not cal.get("rules"):
        return lines + ["No rule is switched on."]
    sampled = "" if cal["train_docs_measured"] == cal["train_docs"] else f" (a sample of {cal['train_docs']:,})"
    lines += [
        f"Every rule measured on {cal['train_docs_measured']:,} train documents{sampled}. A rule that alone would "
        f"drop more than {100 * cal['max_drop_share']:g}% of them is flagged (data.calibration_max_drop_share); "
        "calibration only warns, it never changes a threshold (pretrain/data/calibrate.py says why).",
    ]
    for r in cal["rules"]:
        if not r["flagged"]:
            continue
        lines += ["", f"### FLAGGED: {r['rule']} would drop {r['failing_pct']:.1f}% of train ({r['failing']:,} docs)",
                  "", f"Threshold {r['setting']} = {r['threshold']}; {r['dropped']:,} train documents were dropped "
                  f"by it (first rule to fire). To keep 90%: `{r['set']}`. Largest train documents it fails:",
                  ""]  # fmt: skip
        if r.get("languages_failing"):
            lines[-1:-1] = [f"Languages detected on them: {r['languages_failing']} (data.languages lists the "
                            "languages to keep).", ""]  # fmt: skip
        for ex in r["examples"]:
            lines.append(f"- `{ex['id']}` ({ex['chars']:,} chars): value {ex['value']:g}; {ex['dropped_by']}")
    lines += ["", "| rule | setting | threshold | p5 | p50 | p95 | train docs failing | % | dropped (first) | |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    for r in cal["rules"]:
        q = r["quantiles"]
        cells = [f"{q[p]:g}" if p in q else "" for p in ("p5", "p50", "p95")]
        lines.append(f"| {r['rule']} | {r['setting']} | {r['threshold']} | {' | '.join(cells)} | {r['failing']:,} | "
                     f"{r['failing_pct']:.1f} | {r['dropped']:,} | {'FLAGGED' if r['flagged'] else ''} |")  # fmt: skip
    return lines


def bar_chart(path: Path, data: dict[str, Any]) -> None:
    plt = render.pyplot()
    names = list(data["filters"])
    docs = [data["filters"][n]["pct_docs"] for n in names]
    chars = [data["filters"][n]["pct_chars"] for n in names]
    y = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(names) + 1.5))
    ax.barh(y - 0.2, docs, height=0.4, label="% of documents")
    ax.barh(y + 0.2, chars, height=0.4, label="% of text characters")
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    ax.set_xlabel(f"% removed (HTML markup, {data['markup']['pct_raw_chars']:.0f}% of raw characters, not counted)")
    ax.set_title(f"forge data: removed by filter ({data['removed_pct_chars']:.1f}% of the text in total)")
    ax.legend(loc="lower right")
    fig.tight_layout()
    render.save_figure(fig, path)


def calibration_chart(path: Path, cal: dict[str, Any]) -> None:
    """Each rule that fails any train document (flagged ones first): its quantiles and its threshold."""
    plt = render.pyplot()
    shown = sorted((r for r in cal.get("rules", []) if r["failing"] and r["quantiles"]),
                   key=lambda r: (not r["flagged"], -r["failing"]))[:MAX_PLOTTED_RULES]  # fmt: skip
    cols = 3
    rows = max(1, -(-len(shown) // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(11, 2.4 * rows + 0.8), squeeze=False)
    for ax in axes.ravel()[len(shown) :]:
        ax.axis("off")
    if not shown:
        axes[0][0].text(0.5, 0.5, "no rule fails any train document", ha="center", va="center")
    for ax, r in zip(axes.ravel(), shown, strict=False):
        ps = sorted(r["quantiles"].items(), key=lambda kv: int(kv[0][1:]))
        ax.plot([v for _, v in ps], [int(k[1:]) for k, _ in ps], marker="o", color="tab:blue")
        ax.axvline(float(r["threshold"]), color="tab:red", linestyle="--", label="threshold")
        ax.set_title(f"{r['rule']}: {r['failing_pct']:.1f}% fail" + (" (FLAGGED)" if r["flagged"] else ""),
                     fontsize=8, color="tab:red" if r["flagged"] else "black")  # fmt: skip
        ax.set_ylabel("percentile", fontsize=7)
        ax.tick_params(labelsize=7)
    fig.suptitle("forge data calibration: each rule's distribution on the train split (red: threshold)")
    fig.tight_layout()
    render.save_figure(fig, path)
