"""eval.json, report.md, report.html and the plots of one evaluation.

eval.json (format "forge-eval/2"):
  artifact    {"path", "kind": "hf" | "gguf", "sha256"}: the evaluated model (sha256 of the file, or of the
              directory's sorted (path, sha256) list as in forge.lineage.sha256_tree)
  tokenizer   {"name", "vocab_size", "sha256"} of the evaluated model's tokenizer (the unit of its perplexity)
  reference   {"path", "sha256", "tokenizer"} of the reference model (eval.reference, model.init_from's base for a
              continued-pretraining run, the base of a fine-tune), or null
  data        what was measured: test_text_sha256 (sha256 of the test shards' "name sha256" listing, see
              evaluation/text.py), test_shards (each shard's sha256 as the data stage recorded it), test_items (the
              pieces of test text scored, evaluation/text.py), test_item_bytes (their largest size), test_bytes,
              qa_sha256 (the held-out Q&A file's sha256), qa_source
  passed      false if any red flag failed, else true (flags that could not run, passed=null, do not count)
  metrics     one entry per metric: {"name", "value", "higher_is_better", "group", "artifact_sha256",
              "random_init" (the same metric for a random-init model of the same shape, when measured),
              "chance" (multiple choice), "tokenizer" (per-token metrics), "details"}; group "domain" holds the
              headline metrics, "domain_by_type" the same per question type ("qa_f1.describe", "mc_acc.members").
              The names the gate and the report compare across models are stable:
                bits_per_byte              test text, in bits per UTF-8 byte (models/perplexity.py); lower is better
                bits_per_byte_random_init  the random-init twin's, on the same text (HF targets)
                bits_per_byte_unigram      the unigram floor: the train text's token frequencies, same tokenizer
                bits_per_byte_reference    the reference model's, through its own tokenizer (when there is one)
              and per tokenizer only (group "per_tokenizer", each with its "tokenizer" label): perplexity,
              perplexity_unigram, perplexity_reference
  flags       one entry per red flag: {"name", "passed", "value", "threshold", "evidence", "artifact_sha256", ...}
  benchmarks  lm-eval scores: {"task", "metric", "value", "stderr", "artifact_sha256"} (null when not run)
  samples     the seeded generations: {"prompt", "seed", "text"}
  items       per item, what the gate's intervals and paired comparisons are computed from (registry/gate.py):
              lists as long as their ids, mc {ids, correct, correct_norm, correct_pmi} and its chance (one number),
              qa {ids, f1, exact_match}, text {ids, bytes, bits, bits_random_init, bits_unigram, bits_reference}
              (one entry per test item). ids are sha256 prefixes of the question, answer and choices (of the item's
              text), so two evaluations of the same items pair up
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from forge import render
from forge.config import ForgeConfig
from forge.io import atomic_write_json, atomic_write_text
from forge.render import fmt

FORMAT = "forge-eval/2"
DOMAIN = [  # (metric, higher is better, key path in a measure() result)
    ("bits_per_byte", False, ("text", "bits_per_byte")),
    ("qa_f1", True, ("qa", "qa_f1")),
    ("qa_exact_match", True, ("qa", "qa_exact_match")),
    ("mc_acc", True, ("mc", "mc_acc")),
    ("mc_acc_norm", True, ("mc", "mc_acc_norm")),
    ("mc_acc_pmi", True, ("mc", "mc_acc_pmi")),
]


def _get(result: dict[str, Any] | None, path: tuple[str, str]) -> float | None:
    if result is None:
        return None
    return result[path[0]][path[1]]


def build_eval(
    *,
    target: str,
    artifact_kind: str,
    sha256: str,
    result: dict[str, Any],
    baseline: dict[str, Any] | None,
    flags: list[dict[str, Any]],
    benchmarks: list[dict[str, Any]] | None,
    memorisation: dict[str, Any],
    reference: dict[str, Any] | None,
    data: dict[str, Any],
    document_ids: list[str],
) -> dict[str, Any]:
    """eval.json's content (see the module docstring); `result` and `baseline` are measure()'s."""
    metrics = [
        *domain_metrics(sha256, result, baseline),
        *floor_metrics(sha256, result, baseline, reference),
        *by_type_metrics(sha256, result, baseline),
        *count_metrics(sha256, result, memorisation),
        *[metric(sha256, k, v, None, f"flag:{f['name']}") for f in flags if isinstance(f["value"], dict)
          for k, v in f["value"].items()],
        *[metric(sha256, f"{b['task']}/{b['metric']}", b["value"], True, "benchmark") for b in benchmarks or []],
    ]  # fmt: skip
    return {
        "format": FORMAT,
        "artifact": {"path": target, "kind": artifact_kind, "sha256": sha256},
        "tokenizer": result["text"]["tokenizer"],
        "reference": None if reference is None else {k: reference[k] for k in ("path", "sha256", "tokenizer")},
        "data": data,
        "chat": result["chat"],
        "passed": not any(f["passed"] is False for f in flags),
        "metrics": metrics,
        "flags": [{**f, "artifact_sha256": sha256} for f in flags],
        "benchmarks": None if benchmarks is None else [{**b, "artifact_sha256": sha256} for b in benchmarks],
        "samples": [{k: s[k] for k in ("prompt", "seed", "text")} for s in result["samples"]],
        "items": item_evidence(result, baseline, reference, document_ids),
    }


def metric(sha256: str, name: str, value: Any, higher: bool | None, group: str, **extra: Any) -> dict[str, Any]:
    """One entry of eval.json's metrics, of the artifact with this sha256."""
    return {"name": name, "value": value, "higher_is_better": higher, "group": group, "artifact_sha256": sha256,
            **extra}  # fmt: skip


def domain_metrics(sha256: str, result: dict[str, Any], baseline: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The headline metrics (DOMAIN), each beside its random-init twin's and, for multiple choice, chance."""
    metrics = []
    for name, higher, path in DOMAIN:
        extra: dict[str, Any] = {"random_init": _get(baseline, path)}
        if name.startswith("mc_"):
            extra["chance"] = result["mc"]["mc_chance"]
        if name == "bits_per_byte":
            extra["details"] = result["text"]
        metrics.append(metric(sha256, name, _get(result, path), higher, "domain", **extra))
    return metrics


def floor_metrics(
    sha256: str, result: dict[str, Any], baseline: dict[str, Any] | None, reference: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """Per-token perplexity (per tokenizer) and what bits per byte is compared with: the random-init twin, the
    unigram floor and the reference model."""
    text, tokenizer = result["text"], result["text"]["tokenizer"]
    metrics = [metric(sha256, "perplexity", text["ppl"], False, "per_tokenizer", tokenizer=tokenizer,
                      random_init=_get(baseline, ("text", "ppl")), details={"tokens": text["tokens"]})]  # fmt: skip
    if baseline is not None:
        metrics.append(
            metric(sha256, "bits_per_byte_random_init", baseline["text"]["bits_per_byte"], False, "baseline")
        )
    metrics += [
        metric(sha256, "bits_per_byte_unigram", result["unigram"]["bits_per_byte"], False, "baseline"),
        metric(sha256, "perplexity_unigram", result["unigram"]["ppl"], False, "per_tokenizer", tokenizer=tokenizer),
    ]
    if reference is not None:
        summary = {k: v for k, v in reference.items() if k != "documents"}
        metrics += [
            metric(sha256, "bits_per_byte_reference", reference["bits_per_byte"], False, "reference", details=summary),
            metric(sha256, "perplexity_reference", reference["ppl"], False, "per_tokenizer",
                   tokenizer=reference["tokenizer"]),
        ]  # fmt: skip
    return metrics


def by_type_metrics(sha256: str, result: dict[str, Any], baseline: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The Q&A and multiple-choice metrics per question type ("qa_f1.describe"): group domain_by_type. Example
    counts and the best constant answer's scores are context, not scores (higher_is_better None)."""
    metrics = []
    for task in ("qa", "mc"):
        for name, value in result[task].items():
            if "." in name:
                higher = None if name.startswith((f"{task}_examples.", "qa_constant_")) else True
                random_init = None if baseline is None else baseline[task].get(name)
                chance = result["mc"]["mc_chance"] if task == "mc" and higher else None
                metrics.append(metric(sha256, name, value, higher, "domain_by_type", random_init=random_init,
                                      chance=chance))  # fmt: skip
    return metrics


def count_metrics(sha256: str, result: dict[str, Any], memorisation: dict[str, Any]) -> list[dict[str, Any]]:
    """How many items were asked, chance, and the verbatim-continuation rates on train and test text."""
    qa, mc = result["qa"], result["mc"]
    return [
        metric(sha256, "qa_examples", qa["qa_examples"], None, "domain"),
        metric(sha256, "qa_empty_rate", qa["qa_empty_rate"], None, "domain"),
        metric(sha256, "mc_examples", mc["mc_examples"], None, "domain"),
        metric(sha256, "mc_chance", mc["mc_chance"], None, "domain"),
        metric(sha256, "memorisation_train_exact", memorisation["train"]["exact"], None, "memorisation"),
        metric(sha256, "memorisation_test_exact", memorisation["test"]["exact"], None, "memorisation"),
    ]


def item_evidence(
    result: dict[str, Any], baseline: dict[str, Any] | None, reference: dict[str, Any] | None, document_ids: list[str]
) -> dict[str, Any]:
    """The per-item scores behind the headline metrics (see `items` above)."""
    mc, qa, docs = result["mc_predictions"], result["qa_predictions"], result["documents"]
    kept = docs["index"]
    text = {"ids": [document_ids[i] for i in kept], "bytes": docs["bytes"], "bits": docs["bits"],
            "bits_unigram": [result["unigram"]["document_bits"][i] for i in kept]}  # fmt: skip
    for name, other in (("bits_random_init", baseline), ("bits_reference", reference)):
        if other is not None and other["documents"]["index"] == kept:  # the same documents, each scored
            text[name] = other["documents"]["bits"]
    return {
        "mc": {"ids": [r["id"] for r in mc], "chance": result["mc"]["mc_chance"],
               **{k: [int(r[k]) for r in mc] for k in ("correct", "correct_norm", "correct_pmi")}},
        "qa": {"ids": [p["id"] for p in qa], "f1": [p["f1"] for p in qa],
               "exact_match": [p["exact_match"] for p in qa]},
        "text": text,
    }  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------
# plots


def plot_domain(report: dict[str, Any], out: Path) -> bool:
    """Bars: the model against its random-init twin (and chance) on every domain metric."""
    plt = render.pyplot()
    rows = [m for m in report["metrics"] if m["group"] == "domain" and m["higher_is_better"] is not None]
    if not rows:
        return False
    fig, axes = plt.subplots(1, len(rows), figsize=(2.4 * len(rows), 3.2))
    for ax, m in zip(axes, rows, strict=True):
        names, values = ["model"], [m["value"] or 0.0]
        if m.get("random_init") is not None:
            names.append("random init")
            values.append(m["random_init"])
        ax.bar(names, values, color=["tab:blue", "tab:gray"][: len(values)])
        if m.get("chance") is not None:
            ax.axhline(m["chance"], color="tab:red", linestyle="--", linewidth=1, label="chance")
            ax.legend(fontsize=7)
        ax.set_title(f"{m['name']} ({'higher' if m['higher_is_better'] else 'lower'} is better)", fontsize=8)
        ax.tick_params(labelsize=7)
    fig.tight_layout()
    render.save_figure(fig, out)
    return True


def plot_history(flag: dict[str, Any], out: Path) -> bool:
    """Validation perplexity over training, its minimum marked (the val_rise flag's evidence)."""
    history = flag.get("history")
    if not history:
        return False
    plt = render.pyplot()
    fig, ax = plt.subplots(figsize=(6, 3))
    steps = [h["step"] for h in history]
    ax.plot(steps, [h["val_ppl"] for h in history], "o-", markersize=3, label="val perplexity")
    best = min(history, key=lambda h: h["val_ppl"])
    ax.plot([best["step"]], [best["val_ppl"]], "r*", markersize=10, label="minimum")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    render.save_figure(fig, out)
    return True


# ----------------------------------------------------------------------------------------------------------------
# markdown and html


def sections(report: dict[str, Any], plots: list[str]) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) tables shared by the markdown and the HTML."""
    art = report["artifact"]
    verdict = "PASS" if report["passed"] else "FAIL"
    prompting = "chat template" if report["chat"] else "plain (base model)"
    tok, data = report["tokenizer"], report["data"]
    summary = [["artifact", art["path"]], ["kind", art["kind"]], ["sha256", art["sha256"]],
               ["tokenizer", f"{tok['name']} ({tok['vocab_size']} tokens, sha256 {tok['sha256'][:16]})"],
               ["test text", f"{data['test_items']} items of at most {data['test_item_bytes']} bytes "
                             f"({data['test_bytes']} in all), sha256 {data['test_text_sha256'][:16]}"],
               ["held-out Q&A", f"{data['qa_source']} (sha256 {data['qa_sha256'][:16]})"],
               ["prompting", prompting], ["red flags", verdict]]  # fmt: skip
    domain = [
        [m["name"], fmt(m["value"]), fmt(m.get("random_init")), fmt(m.get("chance")),
         "" if m["higher_is_better"] is None else ("higher" if m["higher_is_better"] else "lower"),
         _beats(m)]
        for m in report["metrics"] if m["group"] == "domain"
    ]  # fmt: skip
    typed = [m for m in report["metrics"] if m["group"] == "domain_by_type"]
    counts = {m["name"]: m["value"] for m in typed if m["higher_is_better"] is None}  # "qa_examples.describe": 139
    by_type = []
    for m in sorted(typed, key=lambda m: m["name"].partition(".")[2]):
        if m["higher_is_better"] is not None:  # "qa_f1.describe": task qa, question type describe
            name, _, qtype = m["name"].partition(".")
            examples = counts.get(f"{name.split('_')[0]}_examples.{qtype}")
            floor = m.get("chance") if name.startswith("mc_") else counts.get(f"qa_constant_{name[3:]}.{qtype}")
            by_type.append([qtype, name, fmt(examples), fmt(m["value"]), fmt(m.get("random_init")), fmt(floor),
                            _beats(m)])  # fmt: skip
    per_tokenizer = [
        [m["name"], fmt(m["value"]), fmt(m.get("random_init")), m["tokenizer"]["name"],
         str(m["tokenizer"]["vocab_size"]), m["tokenizer"]["sha256"][:16]]
        for m in report["metrics"] if m["group"] == "per_tokenizer"
    ]  # fmt: skip
    floors = [[m["name"], fmt(m["value"])] for m in report["metrics"] if m["group"] in ("baseline", "reference")]
    flags = [[f["name"], {True: "pass", False: "FAIL", None: "n/a"}[f["passed"]], fmt(f["value"]),
              fmt(f["threshold"]), f["evidence"]] for f in report["flags"]]  # fmt: skip
    out = [
        ("Summary", ["", ""], summary),
        ("Domain metrics", ["metric", "model", "random init", "chance", "better", "model beats random init"], domain),
        ("Bits per byte: floors and reference (the same test text)", ["metric", "bits per byte"], floors),
        (
            "Per-token perplexity (comparable only within one tokenizer)",
            ["metric", "model", "random init", "tokenizer", "vocabulary", "tokenizer sha256"],
            per_tokenizer,
        ),
        ("Red flags", ["flag", "result", "value", "threshold", "evidence"], flags),
    ]
    if by_type:
        # the floor: chance for multiple choice; for exact match, the best constant answer (the commonest reference)
        header = ["question type", "metric", "examples", "model", "random init", "chance / best constant answer",
                  "model beats random init"]  # fmt: skip
        out.insert(2, ("Domain metrics by question type", header, by_type))
    if report["benchmarks"]:
        bench = [[b["task"], b["metric"], fmt(b["value"]), fmt(b.get("stderr"))] for b in report["benchmarks"]]
        out.append(("Benchmarks (lm-evaluation-harness)", ["task", "metric", "value", "stderr"], bench))
    out.append(("Generations (seeded samples)", ["seed", "prompt", "generation"],
                [[str(s["seed"]), s["prompt"], s["text"]] for s in report["samples"]]))  # fmt: skip
    return out


def _beats(m: dict[str, Any]) -> str:
    if m.get("random_init") is None or m["higher_is_better"] is None or m["value"] is None:
        return ""
    better = m["value"] > m["random_init"] if m["higher_is_better"] else m["value"] < m["random_init"]
    return "yes" if better else "no"


def to_markdown(report: dict[str, Any], plots: list[str]) -> str:
    return render.to_markdown(f"Evaluation: {report['artifact']['path']}", sections(report, plots), plots)


def to_html(report: dict[str, Any], plots: list[str]) -> str:
    return render.to_html(f"Evaluation: {report['artifact']['path']}", sections(report, plots), plots)


def write_report(stage_dir: Path, *, cfg: ForgeConfig, **kwargs: Any) -> dict[str, Any]:
    """Write eval.json, the plots, report.md and report.html into `stage_dir`; return the eval.json content."""
    report = build_eval(**kwargs)
    atomic_write_json(stage_dir / "eval.json", report)
    plots = []
    if plot_domain(report, stage_dir / "plots" / "domain.png"):
        plots.append("plots/domain.png")
    val_rise = next((f for f in report["flags"] if f["name"] == "val_rise"), {})
    if plot_history(val_rise, stage_dir / "plots" / "val_ppl.png"):
        plots.append("plots/val_ppl.png")
    atomic_write_text(stage_dir / "report.md", to_markdown(report, plots))
    atomic_write_text(stage_dir / "report.html", to_html(report, plots))
    return report
