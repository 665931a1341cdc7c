"""`forge qa`: build the run's Q&A set from `qa.source`; `forge sft` and `forge eval` read it through `qa_set`.

    forge qa --config configs/tiny-cpu.yaml
    forge qa --set data.inputs='[manual/]' --set qa.source=corpus

Reads the data stage's outputs (runs/<run>/data/: the kept documents by split, and for the embedded set the split of
every document, removed ones included) or the user's JSONL; writes runs/<run>/qa/ (see pretrain/qa/__init__.py).
"""

from __future__ import annotations

import json
import logging
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from forge import ForgeError, render
from forge.config import BUILTIN_CORPUS, ForgeConfig
from forge.io import atomic_write_json, atomic_write_jsonl, atomic_write_text, read_json_object, read_jsonl
from forge.lineage import Stage, completed_manifest, require_reads, run_stage
from forge.paths import run_dir
from forge.stages import STAGES
from pretrain.qa import builtin, records
from pretrain.qa.corpus import corpus_pairs
from pretrain.qa.dedup import split_held_out

log = logging.getLogger("forge.qa")

SAMPLES_PER_KIND = 10
OUTPUTS = ("qa_train.jsonl", "qa_eval.jsonl", "report.json", "report.md", "pairs_by_kind.png")


# ----------------------------------------------------------------------------------------------------------------
# which set, and the one rule about domains


def embedded_corpus(cfg: ForgeConfig) -> bool:
    return list(cfg.data.inputs) == [BUILTIN_CORPUS]


def source_kind(cfg: ForgeConfig) -> tuple[str, Path | None]:
    """(builtin | corpus | file, the file) that `qa.source` asks for."""
    source = cfg.qa.source
    if source == "auto":
        return ("builtin", None) if embedded_corpus(cfg) else ("corpus", None)
    if source in ("builtin", BUILTIN_CORPUS):
        return "builtin", None
    if source == "corpus":
        return "corpus", None
    return "file", Path(source).expanduser()


def refuse_wrong_domain(cfg: ForgeConfig, kind: str | None) -> None:
    """The embedded Python Q&A set with any other corpus would fine-tune and judge a model of that corpus on Python
    questions: refused, naming the two ways out."""
    if kind == "builtin" and not embedded_corpus(cfg):
        raise ForgeError(
            f"the Q&A set is the embedded Python standard-library one (qa.source={cfg.qa.source!r}) but the corpus "
            f"is not the embedded corpus (data.inputs={cfg.data.inputs}): SFT and eval would train and judge the "
            "wrong domain. Either generate Q&A from your corpus (--set qa.source=corpus, or leave it at auto) or give "
            "your own JSONL of {question, answer} lines (--set qa.source=PATH), then run `forge qa`"
        )


@dataclass(frozen=True)
class QASet:
    train: Path  # qa_train.jsonl
    held_out: Path  # qa_eval.jsonl
    kind: str


def qa_set(cfg: ForgeConfig) -> QASet:
    """The run's Q&A set for sft and eval, after checking it is of the run's domain and built with this config."""
    refuse_wrong_domain(cfg, source_kind(cfg)[0])
    stage_dir = run_dir(cfg) / "qa"  # the reading stage checked that it completed (forge.lineage.require_reads)
    manifest = completed_manifest(stage_dir) or {}
    kind = ((read_json_object(stage_dir / "report.json") or {}).get("source") or {}).get("kind")
    refuse_wrong_domain(cfg, kind)
    if manifest.get("config_hash") != cfg.section_hash(*STAGES["qa"].settings):
        raise ForgeError(
            f"{stage_dir} holds a Q&A set built with other qa or data settings than this config (qa.source="
            f"{cfg.qa.source!r} now); run `forge qa` with the same --config first"
        )
    out = QASet(stage_dir / "qa_train.jsonl", stage_dir / "qa_eval.jsonl", kind or "")
    for path in (out.train, out.held_out):
        if not path.is_file():
            raise ForgeError(f"{path} is missing; re-run `forge qa --force` with the same --config")
    return out


# ----------------------------------------------------------------------------------------------------------------
# the data stage's outputs


def data_stage_id(cfg: ForgeConfig) -> str:
    """The data stage's identity for the skip key: its recorded input fingerprints and output sha256s (the pages
    are re-read from the inputs, so both matter)."""
    manifest = completed_manifest(run_dir(cfg) / "data") or {}
    return json.dumps({"inputs": manifest.get("inputs"), "outputs": manifest.get("outputs")}, sort_keys=True)


def data_shards(cfg: ForgeConfig) -> dict[str, list[Path]]:
    from pretrain.tokenizer import data_shards as shards_of

    return shards_of(cfg)


HOLD_OUT_FIRST = {"test": 0, "val": 1, "train": 2, "-": 3}


def data_splits(cfg: ForgeConfig) -> dict[str, str]:
    """Document id -> the split the data stage gave it, for every document it read (kept or removed). A document cut
    into sections (`id#section`) is also listed under its own id, in the most held-out split of its sections: none
    of what it says may be trained on when part of it is evaluated."""
    data_dir = run_dir(cfg) / "data"
    splits = {}
    for split, files in data_shards(cfg).items():
        for path in files:
            for doc_id in pq.read_table(path, columns=["id"]).column("id").to_pylist():
                splits[doc_id] = split
    removed = data_dir / "removed.jsonl.zst"
    for row in read_jsonl(removed):
        splits.setdefault(row["id"], row.get("split") or "-")
    for doc_id, split in list(splits.items()):
        whole = doc_id.split("#")[0]
        if whole != doc_id and HOLD_OUT_FIRST[split] < HOLD_OUT_FIRST[splits.get(whole, "-")]:
            splits[whole] = split
    return splits


def train_words(shards: dict[str, list[Path]]) -> int:
    return sum(
        sum(len(t.split()) for t in pq.read_table(f, columns=["text"]).column("text").to_pylist())
        for f in shards["train"]
    )


# ----------------------------------------------------------------------------------------------------------------
# the three sources


def from_builtin(cfg: ForgeConfig) -> tuple[list[dict], list[dict], dict[str, Any]]:
    train, held, report = builtin.build_split(cfg.qa.eval_fraction, data_splits(cfg), cfg.data.dedup, cfg.seed)

    def record(p: dict[str, Any]) -> dict[str, Any]:
        source = {"kind": "builtin", "doc_id": p["doc_id"], "split": p["pretrain_split"], "heading": p["object"],
                  "path": None}  # fmt: skip
        return {"question": p["question"], "answer": p["answer"], "qtype": p["qtype"], "source": source,
                "object": p["object"], "object_kind": p["kind"]}  # fmt: skip

    report["train_words"] = train_words(data_shards(cfg))
    return [record(p) for p in train], [record(p) for p in held], report


def from_file(cfg: ForgeConfig, path: Path) -> tuple[list[dict], list[dict], dict[str, Any]]:
    rows, lines, read = records.read_records(path)
    for row, line in zip(rows, lines, strict=True):
        source = {"kind": "file", "doc_id": None, "split": None, "heading": None, "path": str(path), "line": line}
        if isinstance(row.get("source"), dict):
            source["origin"] = row["source"]  # an edited copy of a generated set keeps where each pair came from
        row["source"] = source
    train, held = split_held_out(rows, cfg.qa.eval_fraction, cfg.data.dedup, cfg.seed)
    report = {"lines": read.lines, "valid": read.valid, "skipped_lines": read.skipped,
              "near_duplicates_removed": len(rows) - len(train) - len(held),
              "skipped": {"invalid line (see skipped_lines)": len(read.skipped)} if read.skipped else {}}  # fmt: skip
    return train, held, report


# ----------------------------------------------------------------------------------------------------------------
# the stage


def run(cfg: ForgeConfig, force: bool = False) -> dict[str, Any]:
    """Build qa_train.jsonl and qa_eval.jsonl from qa.source, with the report of what each kind gave."""
    kind, path = source_kind(cfg)
    refuse_wrong_domain(cfg, kind)
    require_reads(cfg, "qa", [] if kind == "file" else ["data"])  # your own JSONL needs no data stage
    inputs: dict[str, Path | str] = {}
    if kind == "file":
        assert path is not None
        if not path.is_file():
            raise ForgeError(
                f"qa.source={cfg.qa.source!r}: file not found; give a JSONL file of question/answer or messages lines, "
                "or use auto, corpus or builtin"
            )
        inputs["file"] = path
    else:
        inputs["data"] = data_stage_id(cfg)
        if kind == "builtin":
            inputs["generator"] = builtin.builtin_id()
    stage = Stage(name="qa", cfg=cfg, inputs=inputs)
    return run_stage(stage, lambda s: build(s, kind, path), force=force)


def build(stage: Stage, kind: str, path: Path | None) -> dict[str, float]:
    cfg = stage.cfg
    for name in OUTPUTS:
        (stage.dir / name).unlink(missing_ok=True)
    if kind == "builtin":
        train, held, details = from_builtin(cfg)
    elif kind == "corpus":
        train, held, details = corpus_pairs(cfg, data_shards(cfg))
    else:
        assert path is not None
        train, held, details = from_file(cfg, path)
    atomic_write_jsonl(stage.dir / "qa_train.jsonl", train)
    atomic_write_jsonl(stage.dir / "qa_eval.jsonl", held)
    report = summary(cfg, kind, path, train, held, details)
    atomic_write_json(stage.dir / "report.json", report)
    atomic_write_text(stage.dir / "report.md", markdown(report))
    if not train:
        hint = ("the documents have no structure to ask about (headings, definition lists, option tables): give your "
                "own JSONL with --set qa.source=PATH") if kind == "corpus" else "check qa.source"  # fmt: skip
        raise ForgeError(f"qa: no training pair from qa.source={cfg.qa.source!r} ({stage.dir / 'report.md'}); {hint}")
    if not held:
        why = "no val/test document gave a pair" if kind == "corpus" else "raise qa.eval_fraction"
        log.warning("qa: no held-out pair: forge eval will have no Q&A to score (%s)", why)
    plot_kinds(report, stage.dir / "pairs_by_kind.png")
    log.info("qa: %d train and %d held-out pairs (%s); report: %s", len(train), len(held),
             ", ".join(f"{k} {v['train']}+{v['held_out']}" for k, v in report["by_qtype"].items()),
             stage.dir / "report.md")  # fmt: skip
    metrics = {"train_pairs": len(train), "eval_pairs": len(held)}
    if report.get("pairs_per_1k_train_words") is not None:
        metrics["pairs_per_1k_train_words"] = report["pairs_per_1k_train_words"]
    return metrics


# ----------------------------------------------------------------------------------------------------------------
# the report


def summary(cfg: ForgeConfig, kind: str, path: Path | None, train: list[dict], held: list[dict],
            details: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    kinds = sorted({str(p["qtype"]) for p in train + held})
    by_qtype = {k: {"train": sum(str(p["qtype"]) == k for p in train),
                    "held_out": sum(str(p["qtype"]) == k for p in held)} for k in kinds}  # fmt: skip
    rng = random.Random(cfg.seed)
    samples = {}
    for k in kinds:
        pool = [p for p in train + held if str(p["qtype"]) == k]
        samples[k] = [pool[i] for i in sorted(rng.sample(range(len(pool)), min(SAMPLES_PER_KIND, len(pool))))]
    words = details.get("train_words")
    return {
        "source": {"kind": kind, "setting": cfg.qa.source, "path": str(path) if path else None},
        "corpus": list(cfg.data.inputs),
        "train_pairs": len(train),
        "eval_pairs": len(held),
        "held_out_splits": dict(Counter(str(p["source"].get("split")) for p in held)),
        "by_qtype": by_qtype,
        "train_words": words,
        "pairs_per_1k_train_words": round(1000 * len(train) / words, 3) if words else None,
        "skipped": details.get("skipped", {}),
        "details": {k: v for k, v in details.items() if k != "skipped"},
        "samples": samples,
    }


def markdown(report: dict[str, Any]) -> str:
    src = report["source"]
    intro = (
        f"Source: {src['kind']} (qa.source={src['setting']!r}{', ' + src['path'] if src['path'] else ''}); corpus: "
        f"{', '.join(report['corpus'])}. {report['train_pairs']:,} train pairs (qa_train.jsonl, what SFT trains on), "
        f"{report['eval_pairs']:,} held-out pairs (qa_eval.jsonl, what forge eval scores; by document split: "
        f"{report['held_out_splits'] or 'none'})."
    )
    if report["pairs_per_1k_train_words"] is not None:
        intro += (f" {report['pairs_per_1k_train_words']:.2f} train pairs per 1,000 train words "
                  f"({report['train_words']:,} words).")  # fmt: skip
    kinds = [[k, f"{v['train']:,}", f"{v['held_out']:,}"] for k, v in report["by_qtype"].items()]
    skipped = [[reason, f"{n:,}"] for reason, n in report["skipped"].items()]
    tables: list[render.Table] = [
        ("Pairs by kind (qtype)", ["kind", "train", "held-out"], kinds),
        ("Skipped, and why", ["reason", "count"], skipped or [["nothing skipped", "0"]]),
    ]
    teacher = report["details"].get("teacher")
    if teacher:
        tables.append(
            (
                f"Teacher ({teacher['teacher']}): {teacher['chunks']:,} chunks ({teacher['cached']:,} from the "
                f"cache), {teacher['proposed']:,} pairs proposed, {teacher['kept']:,} kept",
                ["rejected because", "pairs"],
                [[why, f"{n:,}"] for why, n in teacher["rejected"].items()] or [["nothing", "0"]],
            )
        )
        tables.append(
            (
                "Teacher: rejected samples",
                ["question", "answer", "evidence", "why"],
                [
                    [
                        r.get("question", ""),
                        _excerpt(r.get("answer", r.get("reply", ""))),
                        _excerpt(r.get("evidence", "")),
                        r["reason"],
                    ]
                    for r in teacher["rejected_samples"]
                ],
            )
        )
        tables.append(("Teacher: kept samples", ["question", "answer", "evidence"],
                       [[k["question"], _excerpt(k["answer"]), _excerpt(k["source"]["teacher_evidence"])]
                        for k in teacher["kept_samples"]]))  # fmt: skip
    for kind, rows in report["samples"].items():
        tables.append((f"Samples: {kind}", ["question", "answer", "from"],
                       [[s["question"], _excerpt(s["answer"]), _origin(s["source"])] for s in rows]))  # fmt: skip
    return render.to_markdown("Q&A report", tables, ["pairs_by_kind.png"], intro)


def _excerpt(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _origin(source: dict[str, Any]) -> str:
    where = source.get("doc_id") or (f"{source.get('path')}:{source.get('line')}" if source.get("line") else "")
    return f"{where} ({source['split']})" if source.get("split") else where


def plot_kinds(report: dict[str, Any], path: Path) -> None:
    plt = render.pyplot()
    names = list(report["by_qtype"])
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(names) + 1.5))
    y = range(len(names))
    ax.barh([i - 0.2 for i in y], [report["by_qtype"][n]["train"] for n in names], height=0.4, label="train")
    ax.barh([i + 0.2 for i in y], [report["by_qtype"][n]["held_out"] for n in names], height=0.4, label="held-out")
    ax.set_yticks(list(y), names)
    ax.invert_yaxis()
    ax.set_xlabel("Q&A pairs")
    ax.set_title(f"forge qa: {report['train_pairs']:,} train and {report['eval_pairs']:,} held-out pairs by kind")
    ax.legend(loc="lower right")
    fig.tight_layout()
    render.save_figure(fig, path)
