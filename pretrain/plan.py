"""`forge plan`: the compute, memory, token and disk budget of a run, before anything runs.

    forge plan --config configs/125m.yaml                      # the config's plan.hardware (rtx4090)
    forge plan --config configs/1b.yaml --hardware rtx4090 --json
    forge plan --config configs/350m.yaml --set plan.hardware=custom --set plan.memory_gb=48 --set plan.peak_tflops=180

The estimate, per GPU, of what `forge pretrain` runs (train.sharding=ddp: every GPU holds the whole training state;
fsdp: see the last point):

* Training state, bytes per parameter. fp32: weights 4 + gradients 4 + AdamW m and v 8 = 16. Mixed precision
  the way torch autocast (and so Accelerate) does it: the parameters stay fp32 and are the master copy (4), autocast
  keeps a bf16 copy of each weight from the forward to the backward (2), gradients are fp32 (4), AdamW m and v (8):
  18. The often quoted "optimizer state" of mixed-precision training (Rajbhandari et al., ZeRO) is master + m + v =
  12 bytes per parameter; the whole state without activations is what the usual "2-3 GB for a 125M model" means.
* Activations per micro-batch of b sequences of s tokens, per layer: the per-layer estimate of Korthikanti et al.
  (2022), s*b*h*(34 + 5*a*s/h) bytes for 16-bit activations, re-derived for what Hugging Face's Llama and GPT-2 keep
  for the backward (counted with autograd saved-tensor hooks, see tests/test_plan.py):

      llama  fp32  b*s*(40*h + 16*ff)        mixed  b*s*(34*h + 8*ff)
      gpt2   fp32  b*s*(40*h + 20*ff)        mixed  b*s*(24*h + 10*ff)     (+6*b*s*h in mixed with dropout)

  minus 8 (fp32) or 4 (mixed) bytes * b*s*(h - kv_dim) with grouped-query attention under sdpa. SDPA's fused
  kernels keep no s x s matrix; where attention runs the math path (eager attention, or dropout on the CPU) the
  probabilities cost a*s*s*b * (4 fp32 / 6 mixed eager, 12 with dropout) bytes more per layer. Outside the layers:
  the fp32 log-softmax of the loss (4*b*s*V), the logits themselves (2 or 4 * b*s*V) and, in the backward, two fp32
  b*s*V gradients: the output layer, not the transformer, dominates small models with large vocabularies.
  Gradient checkpointing keeps each layer's input (4*b*s*h) and recomputes one layer at a time, after the loss's
  tensors are gone (the recomputed layer counts only where it is larger than them).
* Time: 6*N + 12*L*h*s flops per token (Kaplan et al. 2020, PaLM's attention term), N the matmul parameters,
  at an assumed model-flops utilisation (plan.mfu); checkpointing recomputes the forward (x 8/6).
* Sharding (train.sharding=fsdp, FSDP2 / ZeRO-3 over plan.num_gpus > 1): each GPU keeps 1/num_gpus of the fp32
  weights, gradients and AdamW states; the 16-bit compute copies exist only for the wrap unit being computed (a
  decoder layer, or the embeddings and head), gathered with the next one prefetched, plus that unit's full fp32
  gradient before its reduce-scatter: unit x (2 x 2 + 4) bytes mixed, unit x (2 x 4 + 4) fp32. Activations are
  not sharded (they scale with the micro-batch, as under DDP).
* A base (model.init_from) of any family is read off the model (models/shape.py): its shape from its config, its
  parameters by part counted on a meta-device instance, its layers from its `_no_split_modules`. Its activations
  are llama's formula on its sizes (unless it is a llama or gpt2): an estimate. The plan names the family and the
  source of each figure: "counted on the model (meta device)", or "formula (models/families.py)" from scratch.
* Disk: about 4 bytes of raw text per token (10B tokens ~ 40 GB), token shards 2 bytes per token (uint16 ids
  while the vocabulary is below 65,536), a resumable checkpoint 4 (fp32 weights) + 8 (AdamW) bytes per parameter.

pretrain/memory.py computes the memory terms; this module puts the plan together, its verdict and its advice.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from forge import ForgeError
from forge.config import ForgeConfig, TrainConfig
from forge.io import atomic_write_json, atomic_write_text
from forge.lineage import Stage, completed_manifest, run_stage
from forge.paths import run_dir
from models.shape import ModelShape, Shape
from pretrain.hardware import GIB, Hardware, hardware_profile, resolve_precision
from pretrain.hardware import flops_per_token as training_flops_per_token
from pretrain.memory import activation_breakdown, activation_source, memory_estimate, state_bytes_per_param
from pretrain.model import count_parameters, model_config, parameter_breakdown, parameters_source, validate

GB = 1e9
TEXT_BYTES_PER_TOKEN = 4.0  # the usual rule of thumb for English text with a BPE tokenizer (~4 characters a token)
# 20-100 training tokens per parameter: from compute-optimal (Chinchilla, Hoffmann et al. 2022) to the "train
# longer" regime small models use; the plan and the tokenizer stage's check both judge a run against it
TOKENS_PER_PARAM = (20, 100)
HEADROOM = 0.92  # the share of device memory a plan may fill (allocator fragmentation, spikes)


# ----------------------------------------------------------------------------------------------------------------
# the plan


def tokenizer_metrics(cfg: ForgeConfig) -> dict[str, Any]:
    """The metrics of the run's complete tokenizer stage, or {} when it has not run."""
    manifest = completed_manifest(run_dir(cfg) / "tokenizer")
    return (manifest or {}).get("metrics") or {}


def measured_mfu(cfg: ForgeConfig) -> tuple[float | None, str]:
    """The MFU the run's pretrain stage measured (metric "mfu" in its manifest), when it has one."""
    value = ((completed_manifest(run_dir(cfg) / "pretrain") or {}).get("metrics") or {}).get("mfu")
    if isinstance(value, (int, float)) and 0 < value <= 1:
        return float(value), "measured by the pretrain stage"
    return None, ""


def corpus_tokens(cfg: ForgeConfig) -> tuple[int | None, int | None, str]:
    """(train tokens, trained vocabulary size, source) from the tokenizer stage's manifest, when it has run."""
    metrics = tokenizer_metrics(cfg)
    if not metrics:
        return None, None, "unknown (the tokenizer stage has not run)"
    tokens = next((metrics[k] for k in ("tokens_train", "train_tokens", "tokens") if k in metrics), None)
    vocab = metrics.get("vocab_size")
    source = "tokenizer manifest" if tokens is not None else "unknown (no token count in the tokenizer manifest)"
    return (int(tokens) if tokens is not None else None), (int(vocab) if vocab is not None else None), source


def estimate(cfg: ForgeConfig, hardware: str | None = None, attention: str = "sdpa") -> dict[str, Any]:
    """The whole plan as a JSON-ready dict (sizes in bytes, times in seconds)."""
    m, t = model_config(cfg), cfg.train  # with model.init_from: the base's shape, from its config
    hw = hardware_profile(cfg.plan, hardware)
    train_tokens, trained_vocab, tokens_source = corpus_tokens(cfg)
    # a base's vocabulary is its embedding rows (its tokenizer may have fewer tokens; the logits have every row)
    vocab = m.vocab_size if isinstance(m, ModelShape) else trained_vocab or cfg.tokenizer.vocab_size
    warnings = validate(m, vocab)
    precision = resolve_precision(t.precision, hw)
    if hw.kind == "cpu" and precision != "fp32":
        warnings.append(f"train.precision={t.precision} on the CPU: mixed precision is slow there; planned as given")
    n = count_parameters(m, vocab)
    tokens = token_budget(cfg, m, n, train_tokens, tokens_source)
    warnings += token_warnings(tokens, n)
    if t.sharding == "fsdp" and cfg.plan.num_gpus == 1:
        warnings.append("train.sharding=fsdp on plan.num_gpus=1: nothing to shard, forge pretrain trains unsharded "
                        "there (planned as ddp); plan the GPUs you will shard over with plan.num_gpus")  # fmt: skip
    return {
        "run": cfg.run_name, "hardware": asdict(hw), "model": model_summary(m, vocab, n), "tokens": tokens,
        "memory": memory_plan(cfg, Workload(m, vocab, hw, precision, attention, fsdp_shards(cfg))),
        "time": time_estimate(cfg, m, vocab, hw, tokens["planned"]),
        "disk": disk_estimate(cfg, vocab, n, train_tokens, tokens["planned"]), "warnings": warnings,
    }  # fmt: skip


def model_summary(m: Shape, vocab: int, n: int) -> dict[str, Any]:
    """The model's family and shape, its n parameters by part, and where each figure comes from."""
    base = isinstance(m, ModelShape)
    return {"architecture": m.architecture, "family": family_line(m), "vocab_size": vocab,
            "hidden_size": m.hidden_size, "num_layers": m.num_layers, "num_attention_heads": m.num_attention_heads,
            "intermediate_size": m.intermediate_size, "context_length": m.context_length,
            "shape_source": "read off the base" if base else "model.* settings",
            "parameters": n, "parameter_breakdown": parameter_breakdown(m, vocab),
            "parameters_source": parameters_source(m), "activations_source": activation_source(m)}  # fmt: skip


def family_line(m: Shape) -> str:
    """The family in words: the transformers model_type, and the class a base loads as."""
    if isinstance(m, ModelShape):
        return f"{m.architecture} ({m.model_class}, a base: model.init_from)"
    return f"{m.architecture} (from scratch: model.architecture)"


def token_budget(cfg: ForgeConfig, m: Shape, n: int, corpus: int | None, source: str) -> dict[str, Any]:
    """The planned tokens (plan.target_tokens, else the steps' worth) against TOKENS_PER_PARAM and the corpus."""
    t = cfg.train
    global_batch_tokens = t.micro_batch_size * t.grad_accum_steps * cfg.plan.num_gpus * m.context_length
    planned = cfg.plan.target_tokens or t.max_steps * global_batch_tokens
    return {
        "recommended_min": TOKENS_PER_PARAM[0] * n, "recommended_max": TOKENS_PER_PARAM[1] * n,
        "planned": planned, "planned_per_param": planned / n, "global_batch_tokens": global_batch_tokens,
        "steps": math.ceil(planned / global_batch_tokens), "corpus_train": corpus, "corpus_source": source,
        "epochs": planned / corpus if corpus else None,
    }  # fmt: skip


def token_warnings(tokens: dict[str, Any], n: int) -> list[str]:
    """An under-trained model, or a corpus repeated beyond what more epochs are worth."""
    planned, warnings = tokens["planned"], []
    if planned < tokens["recommended_min"]:
        warnings.append(
            f"{_count(planned)} planned tokens are {planned / n:.1f} per parameter, below {TOKENS_PER_PARAM[0]}x: "
            f"the model is under-trained for its size; plan {_count(tokens['recommended_min'])}+ tokens "
            "(train.max_steps, plan.target_tokens) or a smaller model"
        )
    if tokens["epochs"] and tokens["epochs"] > 4:
        warnings.append(
            f"{tokens['epochs']:.1f} epochs over the train split: beyond ~4 repeats extra epochs add little and "
            "memorisation grows (Muennighoff et al. 2023); more data or a smaller model"
        )
    return warnings


def fsdp_shards(cfg: ForgeConfig) -> int | None:
    """The GPUs train.sharding=fsdp shards over (None: unsharded, ddp). FSDP shards over the processes; on one there
    is nothing to shard and forge pretrain trains unsharded, so the plan does too."""
    return cfg.plan.num_gpus if cfg.train.sharding == "fsdp" and cfg.plan.num_gpus > 1 else None


@dataclass(frozen=True)
class Workload:
    """What a GPU's peak memory depends on besides the micro-batch size and gradient checkpointing."""

    m: Shape
    vocab: int
    hw: Hardware
    precision: str
    attention: str
    shards: int | None  # FSDP over that many GPUs; None: unsharded (ddp)

    def peak(self, micro_batch: int, checkpointing: bool) -> dict[str, Any]:
        return memory_estimate(self.m, self.vocab, self.hw, self.precision, micro_batch, self.m.context_length,
                               checkpointing, self.attention, self.shards)  # fmt: skip


def memory_plan(cfg: ForgeConfig, work: Workload) -> dict[str, Any]:
    """Peak memory per GPU as configured (and without/with checkpointing, under ddp/fsdp), its verdict and advice."""
    t, gpus, usable = cfg.train, cfg.plan.num_gpus, work.hw.memory_gib * GIB * HEADROOM
    micro_batch, checkpointing = t.micro_batch_size, t.gradient_checkpointing
    configured = work.peak(micro_batch, checkpointing)
    without_checkpointing, with_checkpointing = work.peak(micro_batch, False), work.peak(micro_batch, True)
    by_sharding = {name: replace(work, shards=ways).peak(micro_batch, checkpointing)["total"]
                   for name, ways in (("ddp", None), ("fsdp", gpus if gpus > 1 else None))}  # fmt: skip
    fits = configured["total"] <= usable
    return {
        "sharding": "fsdp" if work.shards else "ddp", "num_gpus": gpus, "total_by_sharding": by_sharding,
        "precision": work.precision, "micro_batch_size": micro_batch, "gradient_checkpointing": checkpointing,
        "attention": work.attention, "device_gib": work.hw.memory_gib, "usable_gib": usable / GIB, **configured,
        "activations_without_checkpointing": sum(without_checkpointing["activations"].values()),
        "activations_with_checkpointing": sum(with_checkpointing["activations"].values()),
        "total_without_checkpointing": without_checkpointing["total"],
        "total_with_checkpointing": with_checkpointing["total"],
        "optimizer_state_mixed_precision": 12.0 * configured["parameters"],  # master + m + v, ZeRO's "optimizer states"
        "verdict": "fits" if fits else "OOM",
        "advice": memory_advice(work, t, usable, fits, gpus, by_sharding["fsdp"]),
    }  # fmt: skip


def memory_advice(work: Workload, t: TrainConfig, usable: float, fits: bool, gpus: int, fsdp_peak: float) -> list[str]:
    """What to change so the run fits (FSDP first, where it is enough), or what headroom is left."""
    micro_batch, checkpointing = t.micro_batch_size, t.gradient_checkpointing
    global_seqs = micro_batch * t.grad_accum_steps

    def total(micro: int, recompute: bool) -> float:
        return float(work.peak(micro, recompute)["total"])

    def largest_micro(recompute: bool) -> int:  # the largest power of two up to the global batch that fits; 0: none
        micro = 1
        while micro <= max(global_seqs, 1) and total(micro, recompute) <= usable:
            micro *= 2
        return micro // 2

    advice = []
    if fits:
        room = largest_micro(checkpointing)
        if room > micro_batch:
            advice.append(f"headroom: micro-batch {room} also fits (grad_accum_steps {max(1, global_seqs // room)} "
                          "keeps the global batch)")  # fmt: skip
        if checkpointing and total(micro_batch, False) <= usable:
            advice.append("gradient checkpointing is not needed at this micro-batch: turn it off for ~25% speed")
        return advice
    for recompute in [False, True] if not checkpointing else [True]:
        micro = largest_micro(recompute)
        if micro:
            how = "with train.gradient_checkpointing=true, " if recompute and not checkpointing else ""
            advice.append(
                f"{how}train.micro_batch_size={micro} and train.grad_accum_steps={math.ceil(global_seqs / micro)} "
                f"(same global batch of {global_seqs} sequences): "
                f"{total(micro, recompute) / GIB:.1f} GiB of {usable / GIB:.1f} usable"
            )
    if not advice:
        advice.append(
            f"even micro-batch 1 with gradient checkpointing does not fit: use a smaller model (at most "
            f"~{largest_model(work, usable) / 1e6:.0f}M parameters here), a larger GPU, or shard the state across "
            "GPUs (FSDP/ZeRO)"
        )
    if work.shards is None and gpus > 1 and fsdp_peak <= usable:  # ddp, where sharding the state would fit
        advice.insert(0, f"train.sharding=fsdp (FSDP over the {gpus} GPUs): {fsdp_peak / GIB:.1f} GiB per GPU of "
                         f"{usable / GIB:.1f} usable, same batch")  # fmt: skip
    return advice


def largest_model(work: Workload, usable: float) -> float:
    """The parameters whose training state fits beside micro-batch 1 with gradient checkpointing."""
    state_per_param = sum(state_bytes_per_param(work.precision).values()) / (work.shards or 1)
    activations = activation_breakdown(work.m, work.vocab, 1, work.m.context_length, work.precision, True,
                                       work.attention, work.hw.kind)  # fmt: skip
    spare = usable - work.hw.overhead_gib * GIB - sum(activations.values())
    return max(spare, 0) / state_per_param


def time_estimate(cfg: ForgeConfig, m: Shape, vocab: int, hw: Hardware, planned: int) -> dict[str, Any]:
    """Training time at the MFU the pretrain stage measured, else plan.mfu; checkpointing recomputes the forward."""
    flops_per_token = training_flops_per_token(m, vocab)
    recompute = 8 / 6 if cfg.train.gradient_checkpointing else 1.0
    mfu, mfu_source = measured_mfu(cfg)
    if mfu is None:
        mfu, mfu_source = cfg.plan.mfu, "assumed (plan.mfu)"
    throughput = cfg.plan.num_gpus * hw.peak_tflops * 1e12 * mfu
    seconds = planned * flops_per_token * recompute / throughput
    return {
        "flops_per_token": flops_per_token, "total_flops": planned * flops_per_token, "mfu": mfu,
        "mfu_source": mfu_source, "num_gpus": cfg.plan.num_gpus, "peak_tflops": hw.peak_tflops,
        "tokens_per_second": throughput / (flops_per_token * recompute), "seconds": seconds, "hours": seconds / 3600,
    }  # fmt: skip


def disk_estimate(cfg: ForgeConfig, vocab: int, n: int, train_tokens: int | None, planned: int) -> dict[str, Any]:
    """Text, token shards and checkpoints of the train split once tokenized (before: of the planned tokens)."""
    corpus = train_tokens or planned
    text_per_token = float(tokenizer_metrics(cfg).get("bytes_per_token") or TEXT_BYTES_PER_TOKEN)
    token_bytes = 2 if vocab <= 65536 else 4
    checkpoint_bytes = 4 * n + 8 * n  # fp32 weights + AdamW m and v
    kept = cfg.train.keep_checkpoints
    return {
        "corpus_tokens": corpus, "corpus_basis": "train split" if train_tokens else "planned",
        "text_bytes_per_token": text_per_token, "corpus_text_bytes": corpus * text_per_token,
        "token_shard_bytes": corpus * token_bytes, "checkpoint_bytes": checkpoint_bytes,
        "checkpoint_weights_bytes": 4 * n, "checkpoints_kept": kept, "checkpoints_bytes": checkpoint_bytes * kept,
        "export_bf16_bytes": 2 * n,
    }  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------
# text


def _gib(x: float) -> str:
    return f"{x / GIB:.2f} GiB"


def _count(x: float) -> str:
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.2f}{unit}"
    return f"{x:.0f}"


def render_text(plan: dict[str, Any]) -> str:
    m, tok, mem, tm, disk = plan["model"], plan["tokens"], plan["memory"], plan["time"], plan["disk"]
    hw = plan["hardware"]
    st, act = mem["state"], mem["activations"]
    state_total = sum(st.values())
    n = m["parameters"]
    mixed = mem["precision"] != "fp32"
    corpus = (f"{_count(tok['corpus_train'])} train tokens ({tok['epochs']:.2f} epochs)" if tok["corpus_train"]
              else tok["corpus_source"])  # fmt: skip
    amp = "FSDP's" if mem["sharding"] == "fsdp" else "torch autocast"  # 16-bit copies of the gathered unit / of all
    lines = [
        f"plan for run {plan['run']} on {hw['label']} x{tm['num_gpus']}",
        "",
        f"family      {m.get('family', m['architecture'])}",
        f"model       hidden {m['hidden_size']}, {m['num_layers']} layers, {m['num_attention_heads']} heads, "
        f"ff {m['intermediate_size']}, context {m['context_length']}, vocab {m['vocab_size']}"
        f"; {m.get('shape_source', 'model.* settings')}",
        f"parameters  {n:,} ({_count(n)}; embeddings {_count(m['parameter_breakdown']['embeddings'])}, "
        f"layers {_count(m['parameter_breakdown']['layers'])}; {m.get('parameters_source', 'formula')})",
        "",
        f"tokens      recommended {_count(tok['recommended_min'])}-{_count(tok['recommended_max'])} "
        f"({TOKENS_PER_PARAM[0]}x-{TOKENS_PER_PARAM[1]}x parameters)",
        f"            planned {_count(tok['planned'])} ({tok['planned_per_param']:.1f} per parameter, "
        f"{tok['steps']:,} steps of {tok['global_batch_tokens']:,} tokens)",
        f"            corpus  {corpus}",
        "",
        f"memory      per device, {mem['precision']}{f' ({amp} mixed precision)' if mixed else ''}, "
        f"micro-batch {mem['micro_batch_size']} x {m['context_length']} tokens, "
        f"gradient checkpointing {'on' if mem['gradient_checkpointing'] else 'off'}"
        + (f", FSDP state sharded {mem['num_gpus']} ways" if mem["sharding"] == "fsdp" else ""),
        f"  weights            {_gib(st['weights'])}  ({'bf16 copies autocast keeps' if mixed else 'fp32'})",
        f"  gradients          {_gib(st['gradients'])}  (fp32)",
        f"  AdamW m + v        {_gib(st['adamw_states'])}  (fp32)",
        f"  fp32 master copy   {_gib(st['fp32_master'])}  " + ("(the fp32 parameters)" if mixed else "(none in fp32)"),
        f"  = training state   {_gib(state_total)}  ({state_total / n:.0f} bytes/parameter; optimizer state proper, "
        f"master + m + v at 12 B/param: {_gib(mem['optimizer_state_mixed_precision'])})",
        f"  activations        {_gib(sum(act.values()))}  (layers {_gib(act['layers'])}, logits and loss "
        f"{_gib(act['logits_and_loss'] + act['loss_backward_transient'])}, embeddings/norm "
        f"{_gib(act['embeddings_and_norm'])}; per layer: {m.get('activations_source', 'formula')})",
        f"     without / with gradient checkpointing: {_gib(mem['activations_without_checkpointing'])} / "
        f"{_gib(mem['activations_with_checkpointing'])}",
        f"  FSDP gathered unit {_gib(mem['fsdp_gathered'])}  (one layer's 16-bit copy + prefetch, its fp32 grads)"
        if mem["fsdp_gathered"]
        else None,
        f"  runtime overhead   {_gib(mem['overhead'])}  (CUDA context, workspaces)" if mem["overhead"] else None,
        f"  = peak             {_gib(mem['total'])} of {mem['device_gib']:g} GiB "
        f"({_gib(mem['usable_gib'] * GIB)} usable at {HEADROOM:.0%})",
        f"verdict     {'fits' if mem['verdict'] == 'fits' else 'OOM: will not fit'}"
        f"  (without checkpointing {_gib(mem['total_without_checkpointing'])}, with "
        f"{_gib(mem['total_with_checkpointing'])})",
        *[f"  -> {a}" for a in mem["advice"]],
        f"sharding    {mem['sharding']} over {mem['num_gpus']} GPU(s); peak per GPU under ddp "
        f"{_gib(mem['total_by_sharding']['ddp'])}, under fsdp {_gib(mem['total_by_sharding']['fsdp'])}",
        "",
        f"time        {tm['hours']:.1f} h for {_count(tok['planned'])} tokens at MFU {tm['mfu']:.0%} of "
        f"{tm['peak_tflops']:g} TFLOP/s x{tm['num_gpus']} ({_count(tm['tokens_per_second'])} tokens/s, "
        f"{_count(tm['flops_per_token'])} flops/token; MFU {tm['mfu_source']})",
        f"disk        {disk['corpus_basis']} {_count(disk['corpus_tokens'])} tokens: "
        f"~{disk['corpus_text_bytes'] / GB:.1f} GB of text "
        f"(~{disk['text_bytes_per_token']:.3g} bytes/token), {disk['token_shard_bytes'] / GB:.1f} GB of token shards",
        f"            checkpoint {disk['checkpoint_bytes'] / GB:.2f} GB (fp32 weights "
        f"{disk['checkpoint_weights_bytes'] / GB:.2f} + AdamW), x{disk['checkpoints_kept']} kept = "
        f"{disk['checkpoints_bytes'] / GB:.2f} GB; bf16 export {disk['export_bf16_bytes'] / GB:.2f} GB",
    ]
    if plan["warnings"]:
        lines += ["", "warnings", *[f"  - {w}" for w in plan["warnings"]]]
    return "\n".join(line for line in lines if line is not None) + "\n"


def training_budget(cfg: ForgeConfig, vocab_size: int, tokens_train: int) -> dict[str, Any]:
    """Tokens per parameter of the model the run trains, on the train split as tokenized, against the
    TOKENS_PER_PARAM rule: the pretrain stage logs it (the plan can only estimate the tokens before the data)."""
    try:
        m = model_config(cfg)
        params = count_parameters(m, m.vocab_size or vocab_size)
    except ForgeError as exc:
        return {"warning": f"parameter count unavailable: {exc}"}
    ratio = tokens_train / params
    low, high = TOKENS_PER_PARAM
    out: dict[str, Any] = {"parameters": params, "tokens_train": tokens_train, "tokens_per_parameter": round(ratio, 4)}
    if cfg.model.init_from is not None:
        out["note"] = (
            f"continued pretraining of {cfg.model.init_from}: the {low}-{high}x rule is for training from scratch"
        )
    elif ratio < low:
        out["warning"] = (
            f"the train split has {ratio:.2f} tokens per parameter of the configured model ({params:,} parameters), "
            f"below {low} tokens per parameter: one epoch under-trains it; add data, plan several epochs or use a "
            "smaller model"
        )
    elif ratio > high:
        out["note"] = f"{ratio:.1f} tokens per parameter, above {high}x: a bigger model could use this data"
    return out


# ----------------------------------------------------------------------------------------------------------------
# the stage


def run(cfg: ForgeConfig, force: bool = False, hardware: str | None = None, **options: Any) -> dict[str, Any]:
    """Write plan.json and plan.txt into runs/<run>/plan/; returns the manifest (the plan under "plan")."""
    if hardware:
        cfg = cfg.model_copy(deep=True)
        cfg.plan.hardware = hardware
    plan = estimate(cfg)  # a bad profile or vocabulary fails here, before the stage (and its tracking) starts
    inputs: dict[str, Path | str] = {}
    tokenizer_manifest = run_dir(cfg) / "tokenizer" / "manifest.json"
    if tokenizer_manifest.is_file():
        inputs["tokenizer_manifest"] = tokenizer_manifest
    pretrain_manifest = run_dir(cfg) / "pretrain" / "manifest.json"
    if measured_mfu(cfg)[0] is not None:
        inputs["pretrain_manifest"] = pretrain_manifest
    inputs["train_sharding"] = cfg.train.sharding  # execution-only for pretrain (out of the config hash), not here
    stage = Stage(name="plan", cfg=cfg, inputs=inputs)

    def body(stage: Stage) -> dict[str, float]:
        atomic_write_json(stage.dir / "plan.json", plan)
        atomic_write_text(stage.dir / "plan.txt", render_text(plan))
        return {
            "parameters": plan["model"]["parameters"],
            "memory_peak_gib": round(plan["memory"]["total"] / GIB, 3),
            "fits": 1.0 if plan["memory"]["verdict"] == "fits" else 0.0,
            "hours": round(plan["time"]["hours"], 3),
            "tokens_planned": plan["tokens"]["planned"],
        }

    manifest = run_stage(stage, body, force=force)
    manifest["plan"] = json.loads((stage.dir / "plan.json").read_text(encoding="utf-8"))
    manifest["plan_text"] = (stage.dir / "plan.txt").read_text(encoding="utf-8")
    return manifest
