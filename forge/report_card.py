"""The run's report card: one page that says what this run made and whether it may be served.

    runs/<run>/report.md, report.html   tables and plots (under runs/<run>/report/)
    runs/<run>/report.json              the same numbers, machine-readable

Built from the stage manifests and reports already on disk (nothing is recomputed), so it can be written after any
stage, including a pipeline that stopped early: missing stages show as "not run". `forge pipeline` writes it at the
end of every invocation, logs it to the run's MLflow parent run and tags the registered version with its location.
"""

from __future__ import annotations

import os
import platform
import shutil
from pathlib import Path
from typing import Any

from forge import render
from forge.config import ForgeConfig
from forge.io import atomic_write_json, atomic_write_text, read_json_object
from forge.lineage import read_manifest
from forge.machine import usable_cores
from forge.paths import run_dir
from forge.render import fmt
from forge.stages import RUN_LAYOUT, stage_file

DOMAIN_METRICS = ("bits_per_byte", "qa_f1", "qa_exact_match", "mc_acc", "mc_acc_norm", "mc_acc_pmi")
# The stages whose plots are copied next to the report, so the page is self-contained.
PLOTTING_STAGES = ("data", "pretrain", "eval")


def hardware() -> dict[str, Any]:
    import torch

    cuda = torch.cuda.is_available()
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else []
    try:
        mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem_gib = None
    return {"cpu": platform.processor() or platform.machine(), "cores": usable_cores(),
            "memory_gib": round(mem_gib, 1) if mem_gib else None, "gpus": gpus, "python": platform.python_version(),
            "torch": torch.__version__}  # fmt: skip


def collect(cfg: ForgeConfig, outcome: dict[str, Any]) -> dict[str, Any]:
    """Every number the card shows, from the run directory. `outcome`: what the pipeline knows (wall time, stop)."""
    run = run_dir(cfg)
    manifests = {name: read_manifest(run / name) or {} for name in RUN_LAYOUT}
    evals = {t: read_json_object(stage_file(run, "eval", t)) or {} for t in ("pretrain", "sft")}
    return {
        "format": "forge-report-card/1",
        "run": cfg.run_name,
        "outcome": outcome,
        "hardware": hardware(),
        "stages": {
            n: {
                k: m.get(k)
                for k in ("status", "duration_s", "config_hash", "inputs", "git_commit", "finished_at", "error")
            }
            for n, m in manifests.items()
        },  # fmt: skip
        "metrics": {n: m.get("metrics", {}) for n, m in manifests.items()},
        "eval": {t: {m["name"]: m for m in e.get("metrics", [])} for t, e in evals.items()},
        "flags": {t: {f["name"]: f for f in e.get("flags", [])} for t, e in evals.items()},
        "qa": read_json_object(stage_file(run, "qa", "report")) or {},
        "model": model_facts(read_json_object(stage_file(run, "plan", "plan"))),
        "quantize": (read_json_object(stage_file(run, "quantize", "report")) or {}).get("artifacts", {}),
        "gate": read_json_object(stage_file(run, "promote", "decision")),
        "version": read_json_object(stage_file(run, "register", "version")),
    }


# ----------------------------------------------------------------------------------------------------------------
# tables


def tables(card: dict[str, Any]) -> list[render.Table]:
    """The card's tables in page order, each (title, header, rows), shared by the markdown and the HTML."""
    m = card["metrics"]
    return [
        ("Summary", ["", ""], summary_rows(card)),
        ("Corpus (forge data)", ["", ""], corpus_rows(m["data"])),
        *qa_section(card["qa"]),
        ("Tokenizer", ["", ""], tokenizer_rows(m["tokenizer"])),
        ("Model, token budget and pretraining", ["", ""], model_rows(m["pretrain"], m["plan"], card.get("model", {}))),
        ("Evaluation before and after SFT", ["metric", "pretrained", "fine-tuned", "random init", "chance"],
         eval_rows(card["eval"])),
        ("Red flags", ["flag", "pretrained", "fine-tuned"], flag_rows(card["flags"])),
        ("Quantization", ["artifact", "size MB", "test perplexity", "drift vs HF", "decode tok/s"],
         quantization_rows(card["quantize"])),
        ("Gate", ["check", "result", "value", "interval", "n", "limit", "detail"], gate_rows(card["gate"])),
        ("Lineage", ["stage", "status", "config sha256", "input sha256", "git commit", "seconds"],
         lineage_rows(card["stages"])),
    ]  # fmt: skip


def summary_rows(card: dict[str, Any]) -> list[list[str]]:
    """The run, its result, the registered version, the gate's decision, time, hardware and software."""
    out, hw, gate = card["outcome"], card["hardware"], card["gate"]
    version = card["version"] or {}
    decision = "not reached" if gate is None else ("PASS" if gate["passed"] else "REFUSED")
    if gate and not gate["passed"]:
        decision += f" ({', '.join(c['name'] for c in gate['checks'] if not c['passed'])})"
    return [
        ["run", card["run"]],
        ["result", out.get("result", "-")],
        ["registered version", f"{version.get('name', '-')} v{version.get('version', '-')}"],
        ["gate", decision],
        ["wall-clock, this invocation", f"{out.get('wall_s', 0):.0f} s"],
        ["stage time, all stages", f"{sum(s.get('duration_s') or 0 for s in card['stages'].values()):.0f} s"],
        ["hardware", f"{hw['cpu']}, {hw['cores']} cores, {fmt(hw['memory_gib'])} GiB, GPUs: {hw['gpus'] or 'none'}"],
        ["software", f"Python {hw['python']}, torch {hw['torch']}"],
    ]


def corpus_rows(data: dict[str, Any]) -> list[list[str]]:
    """Documents in and kept, and what each filter removed (the biggest first)."""
    removed = sorted(((k.removeprefix("removed_").removesuffix("_docs"), v) for k, v in data.items()
                      if k.startswith("removed_") and k.endswith("_docs")), key=lambda kv: -kv[1])  # fmt: skip
    return [["raw documents", fmt(data.get("raw_docs"))], ["kept documents", fmt(data.get("kept_docs"))],
            ["removed characters", f"{fmt(data.get('removed_pct_chars'))} %"],
            *[[f"removed by {name}", fmt(n)] for name, n in removed if n]]  # fmt: skip


def tokenizer_rows(tok: dict[str, Any]) -> list[list[str]]:
    keys = ("vocab_size", "tokens_per_word", "chars_per_token", "compression_warning", "tokens_train", "tokens_val",
            "tokens_test")  # fmt: skip
    return [[k, fmt(tok.get(k))] for k in keys]


def model_facts(plan: dict[str, Any] | None) -> dict[str, Any]:
    """The model's family and where the plan's figures come from (plan.json), or {} before the plan has run."""
    model = (plan or {}).get("model") or {}
    keys = ("family", "shape_source", "parameters_source", "activations_source")
    return {k: model[k] for k in keys if k in model}


def model_rows(pre: dict[str, Any], plan: dict[str, Any], model: dict[str, Any]) -> list[list[str]]:
    """The family, parameters and tokens as trained (as planned, before pretraining has run), where the figures
    come from, and how pretraining went."""
    params, tokens = pre.get("parameters") or plan.get("parameters"), pre.get("tokens") or plan.get("tokens_planned")
    ratio = (pre["final_val_loss"] / pre["initial_val_loss"]) if pre.get("initial_val_loss") else None
    source = f" ({model['parameters_source']})" if params and model.get("parameters_source") else ""
    return [["family", model.get("family", "-")], ["parameters", fmt(params) + source],
            ["tokens trained", fmt(tokens)],
            ["tokens per parameter (guidance 20-100)", fmt(tokens / params if params and tokens else None)],
            ["planned peak memory (GiB)", fmt(plan.get("memory_peak_gib"))
             + (f" (activations per layer: {model['activations_source']})" if model.get("activations_source") else "")],
            ["initial -> final val loss", f"{fmt(pre.get('initial_val_loss'))} -> {fmt(pre.get('final_val_loss'))}"
             f" ({fmt(ratio)} of initial)"],
            ["best val perplexity", fmt(pre.get("best_val_ppl"))], ["tokens/s", fmt(pre.get("tokens_per_s"))],
            ["MFU (%)", fmt(pre.get("mfu"))]]  # fmt: skip


def eval_rows(ev: dict[str, dict[str, Any]]) -> list[list[str]]:
    """Each domain metric, then each per-question-type one ("mc_acc.describe"), before and after SFT."""
    by_type = sorted({name for t in ("pretrain", "sft") for name, metric in ev[t].items()
                      if metric.get("group") == "domain_by_type" and metric.get("higher_is_better")})  # fmt: skip
    return [[name, fmt(ev["pretrain"].get(name, {}).get("value")), fmt(ev["sft"].get(name, {}).get("value")),
             fmt(ev["sft"].get(name, {}).get("random_init")), fmt(ev["sft"].get(name, {}).get("chance"))]
            for name in (*DOMAIN_METRICS, *by_type)]  # fmt: skip


def flag_rows(flags: dict[str, dict[str, Any]]) -> list[list[str]]:
    names = dict.fromkeys([*flags["pretrain"], *flags["sft"]])  # each flag once, in the order the evals list them
    return [[name, *(_flag(flags[t].get(name)) for t in ("pretrain", "sft"))] for name in names]


def quantization_rows(artifacts: dict[str, dict[str, Any]]) -> list[list[str]]:
    return [[name, fmt(a.get("size_mb")), fmt(a.get("ppl")), f"{100 * (a.get('ppl_drift') or 0):+.3f} %",
             fmt(a.get("decode_tokens_per_s"))] for name, a in artifacts.items()]  # fmt: skip


def gate_rows(gate: dict[str, Any] | None) -> list[list[str]]:
    """Each check of the promotion gate, with its interval and, where it failed, what to change."""
    rows = []
    for c in (gate or {}).get("checks", []):
        interval = f"[{fmt(c['interval'][0])}, {fmt(c['interval'][1])}]" if c.get("interval") else "-"
        detail = c.get("detail", "") + (f" **What to change:** {c['advice']}" if c.get("advice") else "")
        rows.append([c["name"], c.get("result") or ("pass" if c["passed"] else "FAIL"), fmt(c.get("value")), interval,
                     fmt(c.get("n")), fmt(c.get("limit")), detail])  # fmt: skip
    return rows


def lineage_rows(stages: dict[str, dict[str, Any]]) -> list[list[str]]:
    """Each stage's status, config hash, input hashes, git commit and duration."""
    return [[name, s.get("status") or "not run", (s.get("config_hash") or "")[:12],
             ", ".join(f"{k} {v[:12]}" for k, v in (s.get("inputs") or {}).items()),
             (s.get("git_commit") or "")[:10], fmt(s.get("duration_s"))]
            for name, s in stages.items()]  # fmt: skip


def qa_section(qa: dict[str, Any]) -> list[render.Table]:
    """The domain Q&A set: where it came from, pairs by kind (train / held-out) and the stage's samples of each."""
    if not qa:
        return [("Domain Q&A (forge qa)", ["", ""], [["Q&A set", "not built"]])]
    src = qa.get("source") or {}
    rate = qa.get("pairs_per_1k_train_words")
    head = [["source", f"{src.get('kind')} (qa.source={src.get('setting')})"],
            ["train pairs (SFT)", fmt(qa.get("train_pairs"))], ["held-out pairs (eval)", fmt(qa.get("eval_pairs"))],
            ["train pairs per 1,000 train words", fmt(rate)]]  # fmt: skip
    head += [[f"pairs: {kind}", f"{v['train']} train, {v['held_out']} held-out"]
             for kind, v in (qa.get("by_qtype") or {}).items()]  # fmt: skip
    samples = [[kind, s["question"], " ".join(s["answer"].split())[:240]]
               for kind, rows in (qa.get("samples") or {}).items() for s in rows]  # fmt: skip
    return [("Domain Q&A (forge qa)", ["", ""], head), ("Q&A samples, 10 of each kind", ["kind", "question", "answer"],
                                                        samples)]  # fmt: skip


def _flag(flag: dict[str, Any] | None) -> str:
    if not flag:
        return "-"
    return {True: "pass", False: "FAIL", None: "n/a"}[flag.get("passed")] + f" ({fmt(flag.get('value'))})"


# ----------------------------------------------------------------------------------------------------------------
# plots


def plot_eval(card: dict[str, Any], out: Path) -> bool:
    """Bars per domain metric: pretrained, fine-tuned, random init (and chance as a line)."""
    evaluated = {n for t in ("pretrain", "sft") for n in card["eval"][t]}
    rows = [n for n in DOMAIN_METRICS if n != "bits_per_byte" and n in evaluated]
    if not rows:
        return False
    plt = render.pyplot()
    fig, axes = plt.subplots(1, len(rows), figsize=(2.6 * len(rows), 3.2), squeeze=False)
    for ax, name in zip(axes[0], rows, strict=True):
        sft, pre = card["eval"]["sft"].get(name, {}), card["eval"]["pretrain"].get(name, {})
        bars = {"pretrained": pre.get("value"), "fine-tuned": sft.get("value"),
                "random init": sft.get("random_init", pre.get("random_init"))}  # fmt: skip
        ax.bar(list(bars), [v or 0.0 for v in bars.values()], color=["tab:blue", "tab:orange", "tab:gray"])
        chance = sft.get("chance", pre.get("chance"))
        if chance is not None:
            ax.axhline(chance, color="tab:red", linestyle="--", linewidth=1, label="chance")
            ax.legend(fontsize=7)
        ax.set_title(name, fontsize=9)
        ax.tick_params(labelsize=7)
    fig.tight_layout()
    render.save_figure(fig, out)
    return True


def plot_quantization(card: dict[str, Any], out: Path) -> bool:
    """Size against perplexity drift for each artifact: the trade-off an operator picks from."""
    arts = {n: a for n, a in card["quantize"].items() if a.get("size_mb") is not None}
    if not arts:
        return False
    plt = render.pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for name, a in arts.items():
        ax.scatter(a["size_mb"], 100 * (a.get("ppl_drift") or 0.0), s=40)
        ax.annotate(name, (a["size_mb"], 100 * (a.get("ppl_drift") or 0.0)), fontsize=8, xytext=(4, 4),
                    textcoords="offset points")  # fmt: skip
    ax.set_xlabel("size (MB)")
    ax.set_ylabel("test perplexity drift (%)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    render.save_figure(fig, out)
    return True


# ----------------------------------------------------------------------------------------------------------------
# write and attach


def write(cfg: ForgeConfig, outcome: dict[str, Any]) -> Path:
    """Write report.json/.md/.html (and report/*.png) into the run directory; returns the markdown path."""
    run = run_dir(cfg)
    card = collect(cfg, outcome)
    plots = []
    for stage in PLOTTING_STAGES:
        source = stage_file(run, stage, "plot")
        if source.is_file():
            (run / "report").mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, run / "report" / source.name)
            plots.append(f"report/{source.name}")
    if plot_eval(card, run / "report" / "eval_before_after_sft.png"):
        plots.append("report/eval_before_after_sft.png")
    if plot_quantization(card, run / "report" / "quantization.png"):
        plots.append("report/quantization.png")
    title = f"Forge report card: {cfg.run_name}"
    atomic_write_json(run / "report.json", card)
    atomic_write_text(run / "report.md", render.to_markdown(title, tables(card), plots))
    atomic_write_text(run / "report.html", render.to_html(title, tables(card), plots))
    return run / "report.md"


def attach(cfg: ForgeConfig) -> str | None:
    """Log the card to the run's MLflow parent run and, when a version was registered, to that version's run, and
    tag the version with where it lies. Returns the version's report URI (None when nothing was registered)."""
    from forge import tracking

    run = run_dir(cfg)
    files = [run / n for n in ("report.md", "report.html", "report.json")] + sorted((run / "report").glob("*.png"))
    client = tracking.client_for(cfg)
    parent = tracking.parent_run_id(client, cfg, tracking.experiment_id(client, cfg))
    version = read_json_object(stage_file(run, "register", "version"))
    targets = [parent] + ([version["run_id"]] if version else [])
    for run_id in targets:
        for f in files:
            client.log_artifact(run_id, str(f), "report_card" if f.suffix != ".png" else "report_card/report")
    if not version:
        return None
    uri = f"runs:/{version['run_id']}/report_card/report.md"
    client.set_model_version_tag(version["name"], version["version"], "forge.report_card", uri)
    return uri
