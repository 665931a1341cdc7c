"""`forge eval`: bits per byte, domain tasks, generations and red flags for one model; eval.json + report.md/html.

    forge eval --config configs/tiny-cpu.yaml --target pretrain        # runs/<run>/pretrain/model -> eval-pretrain/
    forge eval --config configs/tiny-cpu.yaml --target sft             # runs/<run>/sft/model      -> eval-sft/
    forge eval --config configs/tiny-cpu.yaml --target runs/tiny-cpu/quantize/model-q4_k_m.gguf
    forge eval --config configs/tiny-cpu.yaml --target pretrain --benchmarks forge_qa_mc,arc_easy

Reads the model (an HF directory or a GGUF file), the data stage's TEXT (runs/<run>/data/<split>-NNNNN.parquet:
test for bits per byte, generation prompts and memorisation, train for memorisation and the unigram floor; see
evaluation/text.py), tokenized by each model's own tokenizer, the reference model's too, and the held-out Q&A of the
qa stage (runs/<run>/qa/qa_eval.jsonl, never trained on; eval-pretrain and eval-sft measure the same pairs).
Writes into runs/<run>/eval-<target>/ (a path target: eval-<name>-<hash>/):
  eval.json            one entry per metric and per red flag, each with the artifact's sha256 (evaluation/report.py)
  report.md, report.html, plots/*.png
  qa_eval.jsonl        the held-out Q&A used; qa_predictions.jsonl, mc_items.jsonl, mc_predictions.jsonl
  samples.json         the seeded generations
  lm_eval/             with --benchmarks: the lm-eval task files and lm-eval's results
The eval.json and report are also logged to the MLflow run of the stage that produced the model.

Bits per byte (models/perplexity.py has the exact rule) is what is compared across models: the report, the red
flags (drift against the reference, incoherence against the unigram floor, untrained) and the gate. Per-token
perplexity is reported beside it, labelled with its tokenizer. The random-init floor is a twin of the model's
architecture with its tokenizer, scored on the same text through the same batched path, and on a quarter of the
Q&A and multiple-choice items (RANDOM_SHARE, a stable subset): a floor needs no more, an untrained model never stops
before max_new_tokens (its generations would cost more than the model's), and its scores sit at chance on any subset.
The gate compares multiple choice with chance itself and bits per byte with the twin's on every test document.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evaluation import red_flags, tasks
from evaluation.report import write_report
from evaluation.text import SplitText, split_id, test_text, train_text
from forge import ForgeError
from forge.config import EvalConfig, ForgeConfig
from forge.hashing import hash_inputs, sha256_tree
from forge.io import atomic_write_jsonl, atomic_write_text, read_jsonl, remove_path
from forge.lineage import Stage, candidate_model, read_manifest, require_reads, run_stage
from forge.paths import run_dir
from models.access import Backend, HFBackend, is_chat_model, open_model
from models.gguf import check_gguf
from models.perplexity import TextScore

log = logging.getLogger("forge.eval")
RANDOM_SHARE = 0.25  # of the Q&A and multiple-choice items the model answers, the share its random-init twin does

STAGE_TARGETS = ("pretrain", "sft")
OUTPUTS = (
    "eval.json", "report.md", "report.html", "plots", "qa_eval.jsonl", "qa_predictions.jsonl", "mc_items.jsonl",
    "mc_predictions.jsonl", "samples.json", "lm_eval",
)  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------
# inputs


def resolve_target(cfg: ForgeConfig, target: str) -> tuple[Path, str, Path | None]:
    """(model path, stage name, the producing stage's directory or None)."""
    if target in STAGE_TARGETS:
        stage_dir = run_dir(cfg) / target  # complete: run() checked it (require_reads)
        model = stage_dir / "model"
        if not (model / "config.json").is_file():
            raise ForgeError(f"no {target} model at {model} (no config.json); re-run `forge {target} --force`")
        return model, f"eval-{target}", stage_dir
    path = Path(target)
    if not path.exists():
        raise ForgeError(f"--target {target}: not found; use pretrain, sft, a model directory or a .gguf file")
    if path.is_dir() and not (path / "config.json").is_file():
        raise ForgeError(f"--target {target}: {path} is not a model directory (no config.json)")
    if path.is_file() and path.suffix != ".gguf":
        raise ForgeError(f"--target {target}: a file target must be a .gguf file")
    if path.is_file():
        check_gguf(path)  # a damaged GGUF is refused before any stage directory is written
    resolved = path.resolve()
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", "-".join(resolved.parts[-2:])).strip("-.") or "model"
    digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:8]
    producer = resolved.parent if read_manifest(resolved.parent) else None
    return path, f"eval-{slug}-{digest}", producer


def qa_input(cfg: ForgeConfig) -> Path:
    """The held-out Q&A: the qa stage's qa_eval.jsonl, once it is known to be of the run's domain."""
    from pretrain.qa.stage import qa_set

    return qa_set(cfg).held_out


def load_qa(cfg: ForgeConfig, source: Path) -> list[dict[str, Any]]:
    """The held-out records, each with the prompt the model is asked in (the system prompt SFT trained with)."""
    from pretrain.qa.records import read_held_out

    return read_held_out(source, cfg.sft.system_prompt)


def resolve_reference(cfg: ForgeConfig, target: str, model: Path) -> Path | None:
    """eval.reference; else for pretrain of a model.init_from run the base, for sft the pretrained model, for a
    quantized GGUF the model the quantize stage read."""
    if cfg.eval.reference:
        ref = Path(cfg.eval.reference)
        if not ref.exists():
            raise ForgeError(f"eval.reference={cfg.eval.reference!r}: not found (a model directory or a .gguf file)")
        return ref
    if target == "pretrain" and cfg.model.init_from:
        # continued pretraining: the domain model is compared with the base it started from, which it must beat
        return Path(cfg.model.init_from)
    if target == "sft":
        ref = run_dir(cfg) / "pretrain" / "model"
        return ref if (ref / "config.json").is_file() else None
    if model.suffix == ".gguf" and (read_manifest(model.resolve().parent) or {}).get("stage") == "quantize":
        try:
            return candidate_model(cfg, "auto")[1]
        except ForgeError:
            return None
    return None  # a from-scratch pretrained model has nothing earlier to compare with


def find_history(model: Path) -> Path | None:
    """The training history beside an exported model: pretrain's metrics.jsonl or SFT's train_history.jsonl."""
    if model.suffix == ".gguf":
        return None
    for name in ("metrics.jsonl", "train_history.jsonl"):
        path = model.resolve().parent / name
        if path.is_file():
            return path
    return None


# ----------------------------------------------------------------------------------------------------------------
# the stage


def run(
    cfg: ForgeConfig, force: bool = False, target: str = "sft", benchmarks: list[str] | None = None
) -> dict[str, Any]:
    """Evaluate the target model; write eval.json and the report into the eval stage directory."""
    from pretrain.qa.stage import refuse_wrong_domain, source_kind

    refuse_wrong_domain(cfg, source_kind(cfg)[0])  # first: Q&A of the wrong domain is refused outright
    require_reads(cfg, "eval", ["data", "qa", *([target] if target in STAGE_TARGETS else [])])
    model, name, producer = resolve_target(cfg, target)
    test = test_text(cfg)  # first: an empty test split is an error before any stage directory is written
    qa_source = qa_input(cfg)
    reference = resolve_reference(cfg, target, model)
    history = find_history(model)
    bench = list(cfg.eval.benchmarks if benchmarks is None else benchmarks)
    if bench and model.suffix == ".gguf":
        raise ForgeError("--benchmarks runs lm-eval on an HF model directory, not a .gguf file; pass a model dir")
    inputs: dict[str, Path | str] = {
        "model": model, "test_text": f"sha256:{test.sha256}",
        "train_text": f"sha256:{split_id(cfg, 'train')}", "qa": qa_source,
    }  # fmt: skip
    if reference is not None:
        inputs["reference"] = reference
    if history is not None:
        inputs["history"] = history
    if bench:
        inputs["benchmarks"] = ",".join(bench)
    stage = Stage(name=name, cfg=cfg, inputs=inputs, spec="eval")
    # SFT's default reference is its base model: forgetting some raw-text prediction is expected, a lot is not.
    finetune_vs_base = target == "sft" and not cfg.eval.reference
    drift_bound = cfg.eval.max_finetune_ppl_drift if finetune_vs_base else cfg.eval.max_ppl_drift

    def body(s: Stage) -> dict[str, float]:
        return evaluate(s, model, test, qa_source, reference, history, bench, producer, drift_bound)

    return run_stage(stage, body, force=force)


def evaluate(
    stage: Stage,
    model: Path,
    test: SplitText,
    qa_source: Path,
    reference: Path | None,
    history: Path | None,
    benchmarks: list[str],
    producer: Path | None,
    drift_bound: float,
) -> dict[str, float]:
    """The stage's body: score the model (and its twin and reference), check the red flags, write the outputs."""
    import torch

    cfg, ecfg = stage.cfg, stage.cfg.eval
    for old in OUTPUTS:  # a forced re-run must not leave a previous run's files (lm_eval/, plots) behind
        remove_path(stage.dir / old)
    torch.manual_seed(cfg.seed)
    train = train_text(cfg)
    records = load_qa(cfg, qa_source)
    atomic_write_jsonl(stage.dir / "qa_eval.jsonl", records)
    data = data_record(cfg, test, qa_source)
    scores = score_model(cfg, model, test, train, records, reference)
    ref_text = score_reference(cfg, reference, test) if reference is not None else None
    flags = check_red_flags(ecfg, scores, ref_text, reference, history, drift_bound)
    bench_results = None
    if benchmarks:
        from evaluation.benchmarks import run_benchmarks

        items = scores.result["mc_items"]
        bench_results = run_benchmarks(model, benchmarks, items, stage.dir / "lm_eval", ecfg, cfg.seed)
        flags += [red_flags.benchmark_flag(task, bench_results, bound) for task, bound in ecfg.min_benchmark.items()]
    write_predictions(stage.dir, scores.result)
    report = write_report(
        stage.dir, target=str(model), artifact_kind="gguf" if model.suffix == ".gguf" else "hf",
        sha256=sha256_tree(model), result=scores.result, baseline=scores.baseline, flags=flags,
        benchmarks=bench_results, memorisation=scores.memorisation, reference=ref_text, data=data, cfg=cfg,
        document_ids=[tasks.text_id(d) for d in test.documents],
    )  # fmt: skip
    log_to_producer(stage, producer, report)
    for f in flags:
        if f["passed"] is False:
            log.warning("eval: red flag %s: %s", f["name"], f["evidence"])
    return stage_metrics(report, flags)


def data_record(cfg: ForgeConfig, test: SplitText, qa_source: Path) -> dict[str, Any]:
    """eval.json's "data": the test text and held-out Q&A measured, by hash."""
    return {"test_text_sha256": test.sha256, "test_shards": test.shards, "test_items": len(test.documents),
            "test_item_bytes": cfg.eval.text_item_bytes, "test_bytes": test.bytes,
            "qa_sha256": hash_inputs({"qa": qa_source})["qa"], "qa_source": str(qa_source)}  # fmt: skip


@dataclass
class ModelScores:
    """What the evaluated model scored, with its random-init twin's (HF models, eval.random_baseline)."""

    result: dict[str, Any]  # measure()'s, with "chat" (how it was prompted) and "unigram" (the unigram floor)
    baseline: dict[str, Any] | None  # the twin's measure(), on RANDOM_SHARE of the questions, without generations
    memorisation: dict[str, Any]  # {"train": ..., "test": ...}: tasks.verbatim_rate of each split
    vocab: int


def score_model(cfg: ForgeConfig, model: Path, test: SplitText, train: SplitText, records: list[dict[str, Any]],
                reference: Path | None) -> ModelScores:  # fmt: skip
    """Bits per byte, Q&A, multiple choice, generations, the unigram floor and memorisation of the model, and all
    but the last three of its random-init twin."""
    ecfg = cfg.eval
    backend = open_model(model)
    try:
        chat = prompts_as_chat(backend, ecfg.chat, reference)
        log.info("eval: %s (%s, %s model), %d test items (%d bytes), %d held-out Q&A", model, backend.kind,
                 "chat" if chat else "base", len(test.documents), test.bytes, len(records))  # fmt: skip
        window, stride = score_window(backend, ecfg.ppl_window, ecfg.ppl_stride)
        questions = eval_items(cfg, records, chat)
        result = measure(backend, cfg, test.documents, questions, chat, window, stride, share=1.0)
        result["chat"] = chat
        result["unigram"] = tasks.unigram_floor(backend, train.documents, test.documents)
        memorisation = memorisation_rates(backend, cfg, train, test)
        baseline = None
        if ecfg.random_baseline and isinstance(backend, HFBackend):
            random_backend = random_init_backend(backend, cfg.seed)
            baseline = measure(random_backend, cfg, test.documents, questions, chat, window, stride,
                               share=RANDOM_SHARE, generations=False)  # fmt: skip
        return ModelScores(result, baseline, memorisation, backend.vocab_size)
    finally:
        backend.close()


def prompts_as_chat(backend: Backend, setting: bool | None, reference: Path | None) -> bool:
    """eval.chat; by default whether the model is a chat model. A GGUF with a model directory as its reference is
    one when it has a chat template and its source, the reference, is no raw pretraining export (forge_pretrain.json).
    """
    if setting is not None:
        return setting
    if backend.kind == "gguf" and reference is not None and reference.is_dir():
        return bool(backend.chat_template) and not (reference / "forge_pretrain.json").is_file()
    return is_chat_model(backend)


def memorisation_rates(backend: Backend, cfg: ForgeConfig, train: SplitText, test: SplitText) -> dict[str, Any]:
    """How often the model continues a seen (train) and an unseen (test) document verbatim."""
    ecfg = cfg.eval
    prefix, suffix = ecfg.memorisation_prefix, ecfg.memorisation_suffix
    picked = {name: tasks.pick_documents(backend, split.documents, ecfg.memorisation_docs, prefix + suffix, cfg.seed)
              for name, split in (("train", train), ("test", test))}  # fmt: skip
    return {name: tasks.verbatim_rate(backend, docs, prefix, suffix) for name, docs in picked.items()}


def score_reference(cfg: ForgeConfig, reference: Path, test: SplitText) -> dict[str, Any]:
    """The reference model's bits per byte of the test text, through its own tokenizer and its own window (the
    same rule, cut to its context), with each document's bits for the gate's paired comparisons."""
    backend = open_model(reference)
    try:
        window, stride = score_window(backend, cfg.eval.ppl_window, cfg.eval.ppl_stride)
        score = backend.score_text(test.documents, window, stride, "eval: reference bits per byte")
        return score.as_dict() | {"path": str(reference), "sha256": sha256_tree(reference),
                                  "documents": per_document(score)}  # fmt: skip
    finally:
        backend.close()


def check_red_flags(ecfg: EvalConfig, scores: ModelScores, ref_text: dict[str, Any] | None, reference: Path | None,
                    history: Path | None, drift_bound: float) -> list[dict[str, Any]]:  # fmt: skip
    """Every red flag but the benchmark ones, in eval.json's order."""
    result, text = scores.result, scores.result["text"]
    generations = [s["ids"] for s in result["samples"]]
    history_records = read_jsonl(history) if history else None
    return [
        red_flags.repetition(generations, ecfg),
        red_flags.ppl_drift(text, ref_text, str(reference) if reference else None, drift_bound),
        red_flags.val_rise(history_records, str(history) if history else None, ecfg),
        red_flags.memorisation(scores.memorisation["train"], scores.memorisation["test"], ecfg),
        red_flags.incoherence(text["bits_per_byte"], result["unigram"]["bits_per_byte"], generations, ecfg),
        red_flags.untrained(text, scores.vocab, ecfg),
    ]


def write_predictions(stage_dir: Path, result: dict[str, Any]) -> None:
    """The per-item predictions and the generations, beside eval.json."""
    atomic_write_jsonl(stage_dir / "qa_predictions.jsonl", result["qa_predictions"])
    atomic_write_jsonl(stage_dir / "mc_items.jsonl", result["mc_items"])
    atomic_write_jsonl(stage_dir / "mc_predictions.jsonl", result["mc_predictions"])
    atomic_write_text(stage_dir / "samples.json", json.dumps(result["samples"], indent=2, ensure_ascii=False) + "\n")


def stage_metrics(report: dict[str, Any], flags: list[dict[str, Any]]) -> dict[str, float]:
    """The manifest's metrics: every numeric metric, each flag that ran (1 passed), and the count that failed."""
    metrics = {m["name"]: m["value"] for m in report["metrics"] if isinstance(m["value"], (int, float))}
    metrics |= {f"flag_{f['name']}": float(f["passed"]) for f in flags if f["passed"] is not None}
    metrics["flags_failed"] = float(sum(f["passed"] is False for f in flags))
    return metrics


def score_window(backend: Backend, window: int | None, stride: int | None) -> tuple[int, int]:
    """(window, stride) in the backend's tokens: eval.ppl_window cut to its context, stride half the window."""
    size = min(window or backend.context, backend.context)
    return size, min(stride or max(size // 2, 1), size)


def eval_items(
    cfg: ForgeConfig, records: list[dict[str, Any]], chat: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The Q&A pairs (with few-shot examples for a base model) and multiple-choice items of one evaluation, built
    once: the model and its random-init twin score the same ones."""
    ecfg = cfg.eval
    shots = 0 if chat else ecfg.base_fewshot
    return tasks.held_out_items(records, shots, ecfg.mc_choices, ecfg.qa_max_examples, ecfg.mc_max_examples, cfg.seed)


def measure(
    backend: Backend,
    cfg: ForgeConfig,
    texts: list[str],
    questions: tuple[list[dict[str, Any]], list[dict[str, Any]]],
    chat: bool,
    window: int,
    stride: int,
    share: float,
    generations: bool = True,
) -> dict[str, Any]:
    """Bits per byte, QA and multiple choice (`share` of `questions`, eval_items' pairs and items) and generations
    of one backend (the model, or its random-init twin)."""
    ecfg = cfg.eval
    text = backend.score_text(texts, window, stride, "eval: bits per byte")
    chosen, items = questions
    chosen = tasks.select_qa(chosen, max(1, math.ceil(share * len(chosen))))
    qa, qa_predictions = tasks.run_qa(backend, chosen, chat, ecfg.max_new_tokens)
    items = tasks.select_qa(items, max(1, math.ceil(share * len(items))))
    mc, mc_predictions = tasks.run_mc(backend, items, chat)
    samples = []
    if generations:
        if ecfg.prompts:
            prompts = [(p, backend.encode(backend.render_chat([{"role": "user", "content": p}]), special=True)
                        if chat else backend.encode(p)) for p in ecfg.prompts]  # fmt: skip
        else:
            doc_prompts = tasks.document_prompts(backend, texts, ecfg.generation_prompts, ecfg.prompt_tokens)
            prompts = [(backend.decode(p), p) for p in doc_prompts]
        samples = tasks.run_generations(backend, prompts, ecfg.max_new_tokens, ecfg.temperature, ecfg.top_k, cfg.seed)
    return {
        "text": text.as_dict(), "qa": qa, "mc": mc, "samples": samples, "qa_predictions": qa_predictions,
        "mc_items": items, "mc_predictions": mc_predictions, "documents": per_document(text),
    }  # fmt: skip


def per_document(score: TextScore) -> dict[str, list[Any]]:
    """Each scored test document's index, bytes and bits: what the gate's paired comparisons read."""
    return {"index": list(score.document_index), "bytes": list(score.document_bytes),
            "bits": [nll / math.log(2) for nll in score.document_nll]}  # fmt: skip


def random_init_backend(backend: HFBackend, seed: int) -> HFBackend:
    """A randomly initialised model of the same architecture and shape, with the same tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(backend.model.config)
    return HFBackend(backend.path, model=model, tokenizer=backend.tokenizer, device=str(backend.device))


def log_to_producer(stage: Stage, producer: Path | None, report: dict[str, Any]) -> None:
    """Log eval.json, the report and the headline metrics on the MLflow run of the stage that made the model."""
    manifest = read_manifest(producer) if producer else None
    run_id = (manifest or {}).get("mlflow_run_id")
    if not run_id or stage.tracker is None:
        return
    from mlflow.entities import Metric

    client = stage.tracker.client
    prefix = stage.name
    try:
        for name in ("eval.json", "report.md", "report.html"):
            if (stage.dir / name).is_file():
                client.log_artifact(run_id, str(stage.dir / name), prefix)
        values = [(m["name"], m["value"]) for m in report["metrics"]]
        values += [(f"flag_{f['name']}", float(f["passed"])) for f in report["flags"] if f["passed"] is not None]
        batch = [Metric(f"{prefix}/{k}", float(v), 0, 0) for k, v in values
                 if isinstance(v, (int, float)) and math.isfinite(v)]  # fmt: skip
        if batch:
            client.log_batch(run_id, metrics=batch)
    except Exception as exc:  # noqa: BLE001 - the producing run may have been deleted; the eval itself stands
        log.warning("eval: could not log to the producing MLflow run %s: %s", run_id, exc)
