"""`forge quantize`: GGUF files for llama.cpp (f16, Q8_0, Q4_K_M or any llama.cpp type by name), bitsandbytes
8-bit and 4-bit (NF4) loading checks, and what each variant costs in quality and buys in size and speed.

    forge quantize --config configs/tiny-cpu.yaml
    run(cfg, target="auto")       # "auto": the SFT model if its stage completed, else the pretrained one

Reads `runs/<run>/sft/model/` (or `runs/<run>/pretrain/model/`) and the test split's token shards
`runs/<run>/tokenizer/shards/test-*.bin`; writes into `runs/<run>/quantize/`:
  model-f16.gguf             llama.cpp's converter for a model.init_from base (serve/gguf_convert.py), else our
                             own export (serve/gguf_export.py); always written: it is the quantizer's input
  model-<type>.gguf          llama.cpp's quantizer (`llama_cpp.llama_model_quantize`), per `quantize.gguf_types`
  quantize.json, report.md   the fidelity and cost report, per artifact: size, test-split perplexity and its drift
                             from the unquantized model (HF fp32) and from f16, greedy-generation agreement with the
                             unquantized model, CPU prompt and decode tokens/s

Every GGUF passes `check_gguf` (header, metadata, tensor table and tensor sizes parsed by gguf.GGUFReader) before
llama.cpp loads it, so a truncated or corrupted file is refused with a clear message instead of crashing.

K-quants (Q4_K_M...) need rows divisible by 256: with other hidden or feed-forward sizes llama.cpp silently falls
back to other types; the report lists each file's tensor types and warns when a K-quant file holds none.

bitsandbytes (`quantize.bitsandbytes`: int8, nf4) is the transformers path and QLoRA's base: the report gives the
in-memory footprint and the same quality and speed figures (bitsandbytes int8 is a memory tool, not a speed tool).
GPU serving does NOT use it: vLLM removed bitsandbytes (`--quantization bitsandbytes` is "Unknown quantization
method" in 0.32/0.33), so a GPU deployment serves the HF model with vLLM's on-the-fly FP8, `--quantization fp8`
(full W8A8 needs compute capability >= 8.9), and a CPU deployment serves the Q4_K_M GGUF with llama.cpp.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from forge import ForgeError
from forge.config import ForgeConfig
from forge.io import atomic_write_json, atomic_write_text
from forge.lineage import Stage, candidate_model, require_reads, run_stage
from forge.machine import usable_cores
from forge.paths import run_dir
from models.access import Backend, GGUFBackend, HFBackend
from models.gguf import check_gguf
from serve.gguf_convert import convert_to_gguf
from serve.gguf_export import export_gguf

log = logging.getLogger("forge.quantize")

PROMPT_TOKENS = 32  # tokens of each test document that prompt the greedy generations
SPEED_PROMPT_TOKENS = 256  # prompt length for the prompt-processing tokens/s (capped by the context)
K_QUANT_TYPES = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
VLLM_NOTE = (
    "vLLM removed bitsandbytes (--quantization bitsandbytes fails with 'Unknown quantization method' in vLLM "
    "0.32/0.33): GPU serving uses vLLM's FP8, `vllm serve <model dir> --quantization fp8`; CPU serving uses the "
    "Q4_K_M GGUF with llama.cpp. bitsandbytes int8/nf4 remain for the transformers path and QLoRA."
)


# ----------------------------------------------------------------------------------------------------------------
# llama.cpp types by name


def gguf_types() -> dict[str, int]:
    """Every llama.cpp file type by lower-case name (f32, f16, bf16, q8_0, q4_k_m, iq4_xs...) -> its ftype."""
    import llama_cpp

    types = {"f32": llama_cpp.LLAMA_FTYPE_ALL_F32}
    for attr in dir(llama_cpp):
        if attr.startswith("LLAMA_FTYPE_MOSTLY_"):
            types[attr.removeprefix("LLAMA_FTYPE_MOSTLY_").lower()] = getattr(llama_cpp, attr)
    return types


def check_types(names: list[str]) -> list[str]:
    """The requested GGUF types, lower-cased, f16 first (the quantizer's input); ForgeError on unknown names."""
    known = gguf_types()
    wanted = [n.lower() for n in names]
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise ForgeError(
            f"quantize.gguf_types: unknown llama.cpp type(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    return list(dict.fromkeys(["f16", *wanted]))


def quantize_gguf(src: Path, dst: Path, type_name: str, threads: int | None = None) -> dict[str, Any]:
    """Quantize an f16/f32 GGUF to `type_name` with llama.cpp's quantizer; the result is checked, then renamed."""
    import llama_cpp

    from forge.io import atomic_path

    check_types([type_name])
    ftype = gguf_types()[type_name.lower()]
    check_gguf(src)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = threads or 0  # 0: all cores
    with atomic_path(Path(dst)) as tmp:
        rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params))
        if rc != 0:
            hint = " (IQ types need an importance matrix, which forge does not compute)" if "iq" in type_name else ""
            raise ForgeError(
                f"llama.cpp could not quantize {src} to {type_name} (return code {rc}, its log above says why){hint}"
            )
        info = check_gguf(tmp)
    info["path"] = str(dst)
    return info


def k_quant_fallback(type_name: str, tensor_types: dict[str, int]) -> str | None:
    """A warning when a K-quant file holds no K-quant tensor (rows not divisible by 256)."""
    if "_k" not in type_name.lower() or any(t in tensor_types for t in K_QUANT_TYPES):
        return None
    return (
        f"{type_name}: no K-quant tensor in the file (types {tensor_types}): the rows are not divisible by 256, so "
        "llama.cpp fell back to other types; use hidden and intermediate sizes that are multiples of 256"
    )


# ----------------------------------------------------------------------------------------------------------------
# inputs


def eval_token_ids(cfg: ForgeConfig) -> tuple[np.ndarray, np.ndarray]:
    """The test split's ids (capped at quantize.max_eval_tokens) and its document offsets."""
    from pretrain.token_shards import load_split

    shards = run_dir(cfg) / "tokenizer" / "shards"
    if not (shards / "meta.json").is_file():
        raise ForgeError(f"{shards}/meta.json not found: the test split's tokens are needed; run `forge tokenizer`")
    tokens, offsets = load_split(shards, "test")
    if len(tokens) < 2:
        raise ForgeError(f"the test split in {shards} is empty: perplexity cannot be measured; check forge data")
    return np.asarray(tokens[: cfg.quantize.max_eval_tokens], dtype=np.int64), np.asarray(offsets)


def generation_prompts(ids: np.ndarray, offsets: np.ndarray, n: int, length: int) -> list[list[int]]:
    """The first `length` ids of the first `n` test documents long enough (else of consecutive id spans)."""
    prompts = []
    for start, end in zip(offsets[:-1], offsets[1:], strict=True):
        if end > len(ids):
            break
        if end - start > length:
            prompts.append(ids[start : start + length].tolist())
        if len(prompts) == n:
            return prompts
    step = max(length, (len(ids) - length) // max(n, 1))
    for start in range(0, len(ids) - length, step):
        span = ids[start : start + length].tolist()
        if len(prompts) == n:
            break
        if span not in prompts:
            prompts.append(span)
    return prompts


# ----------------------------------------------------------------------------------------------------------------
# agreement


def greedy_agreement(reference: list[list[int]], outputs: list[list[int]]) -> dict[str, float]:
    """prefix: mean share of each reference generation reproduced before the first difference; token: share of
    positions with the same token; exact: share of prompts with identical generations."""
    prefix, same, exact = [], [], []
    for ref, out in zip(reference, outputs, strict=True):
        n = max(len(ref), 1)
        common = next((i for i, (a, b) in enumerate(zip(ref, out, strict=False)) if a != b), min(len(ref), len(out)))
        prefix.append(common / n)
        same.append(sum(a == b for a, b in zip(ref, out, strict=False)) / n)
        exact.append(float(ref == out))
    return {
        "greedy_prefix_agreement": round(float(np.mean(prefix)), 4),
        "greedy_token_agreement": round(float(np.mean(same)), 4),
        "greedy_exact_match": round(float(np.mean(exact)), 4),
    }


# ----------------------------------------------------------------------------------------------------------------
# the artifacts


class Evaluator:
    """Measures every artifact against the same ids, prompts and reference generations (the first model measured:
    the unquantized HF model)."""

    def __init__(self, cfg: ForgeConfig, ids: np.ndarray, offsets: np.ndarray, context: int):
        q = cfg.quantize
        self.threads = q.threads or usable_cores()
        self.window = min(q.ppl_window or context, context)
        self.stride = q.ppl_stride or max(self.window // 2, 1)
        self.ids = ids
        self.new_tokens = max(1, min(q.max_new_tokens, context - PROMPT_TOKENS))
        self.prompts = generation_prompts(ids, offsets, q.generation_prompts, min(PROMPT_TOKENS, context // 2))
        self.speed_ids = ids[: min(SPEED_PROMPT_TOKENS, context, len(ids))].tolist()
        self.reference: list[list[int]] | None = None
        self.reference_ppl: float | None = None
        self.f16_ppl: float | None = None

    def hf(self, model: HFBackend) -> dict[str, Any]:
        import torch

        torch.set_num_threads(self.threads)
        ppl = model.perplexity(self.ids, self.window, self.stride)
        return {**self._ppl(ppl.ppl), "ppl_tokens": ppl.tokens, **self._generations(model)}

    def gguf(self, path: Path, type_name: str) -> dict[str, Any]:
        n_ctx = max(self.window, PROMPT_TOKENS + self.new_tokens, len(self.speed_ids))
        scorer = GGUFBackend(path, n_threads=self.threads, n_ctx=n_ctx)
        try:
            ppl = scorer.perplexity(self.ids, self.window, self.stride)
        finally:
            scorer.close()
        generator = GGUFBackend(path, n_threads=self.threads, n_ctx=n_ctx, logits_all=False)  # llama.cpp's fast path
        try:
            generations = self._generations(generator)
        finally:
            generator.close()
        out = {**self._ppl(ppl.ppl), "ppl_tokens": ppl.tokens, **generations}
        if type_name == "f16":
            self.f16_ppl = ppl.ppl
        if self.f16_ppl:
            out["ppl_drift_vs_f16"] = round(ppl.ppl / self.f16_ppl - 1, 6)
        return out

    def _generations(self, model: Backend) -> dict[str, Any]:
        """Greedy generations for every prompt: decode tokens/s, prompt tokens/s and agreement with the reference."""
        runs = [model.timed_greedy(prompt, self.new_tokens) for prompt in self.prompts]
        outputs = [r.ids for r in runs]
        decoded = sum(max(len(r.ids) - 1, 0) for r in runs)
        decode_s = sum(r.decode_s for r in runs)
        report: dict[str, Any] = {"decode_tokens_per_s": round(decoded / decode_s, 2) if decode_s > 0 else None}
        if self.reference is None:
            self.reference = outputs
        else:
            report.update(greedy_agreement(self.reference, outputs))
        report["prompt_tokens_per_s"] = round(model.prompt_speed(self.speed_ids), 2)
        return report

    def _ppl(self, ppl: float) -> dict[str, Any]:
        if self.reference_ppl is None:
            self.reference_ppl = ppl
        return {"ppl": round(ppl, 6), "ppl_drift": round(ppl / self.reference_ppl - 1, 6)}


def _build(stage: Stage, model_dir: Path, types: list[str]) -> dict[str, float]:
    import torch

    threads = torch.get_num_threads()
    try:
        return _measure(stage, model_dir, types)
    finally:
        torch.set_num_threads(threads)  # the Evaluator sets quantize.threads for torch


def _measure(stage: Stage, model_dir: Path, types: list[str]) -> dict[str, float]:
    """Measure the HF reference, then every GGUF type, then every bitsandbytes load; write the report."""
    from transformers import AutoConfig

    cfg = stage.cfg
    ids, offsets = eval_token_ids(cfg)
    hf_cfg = AutoConfig.from_pretrained(model_dir)
    context = int(getattr(hf_cfg, "max_position_embeddings", None) or hf_cfg.n_positions)
    ev = Evaluator(cfg, ids, offsets, context)
    warnings: list[str] = []

    artifacts = {"hf-fp32": _measure_reference(ev, model_dir, len(ids))}
    _remove_stale_ggufs(stage.dir, types)
    for type_name in types:
        artifacts[type_name] = _measure_gguf(stage, ev, model_dir, type_name, warnings)
    for kind in cfg.quantize.bitsandbytes:
        artifacts[f"bnb-{kind}"] = _measure_bitsandbytes(ev, model_dir, kind, warnings)

    report = _report(model_dir, hf_cfg.model_type, len(ids), ev, artifacts, warnings)
    atomic_write_json(stage.dir / "quantize.json", report)
    atomic_write_text(stage.dir / "report.md", report_markdown(report))
    for warning in warnings:
        log.warning("quantize: %s", warning)
    return _metrics(artifacts, warnings)


def _measure_reference(ev: Evaluator, model_dir: Path, tokens: int) -> dict[str, Any]:
    """The unquantized HF model in fp32: the first one measured, so every other artifact is compared with it."""
    log.info("quantize: reference HF fp32 model %s (%d test tokens, window %d)", model_dir, tokens, ev.window)
    model = HFBackend(model_dir)
    weights = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
    entry = {
        "kind": "reference",
        "path": str(model_dir),
        "size_bytes": weights,
        "size_mb": round(weights / 1e6, 3),
        **ev.hf(model),
    }
    del model
    gc.collect()
    log.info("quantize: reference measured: perplexity %.4f", entry["ppl"])
    return entry


def _remove_stale_ggufs(stage_dir: Path, types: list[str]) -> None:
    """Delete the GGUFs of types dropped from quantize.gguf_types since the last run."""
    for stale in stage_dir.glob("model-*.gguf"):
        if stale.name.removeprefix("model-").removesuffix(".gguf") not in types:
            stale.unlink()


def _measure_gguf(stage: Stage, ev: Evaluator, model_dir: Path, type_name: str, warnings: list[str]) -> dict[str, Any]:
    """Write model-<type>.gguf (our f16 export, or llama.cpp's quantizer over it) and measure it; a K-quant that
    fell back to other types or a drift from f16 above quantize.max_ppl_drift is appended to `warnings`."""
    path = stage.dir / f"model-{type_name}.gguf"
    start = time.time()
    if type_name == "f16":
        # A published base's family and tokenizer (model.init_from) go through llama.cpp's own converter, which knows
        # every family; Forge's writer stays for the tokenizer Forge trained, whose vocabulary no converter hash knows.
        export = convert_to_gguf if stage.cfg.model.init_from else export_gguf
        export(model_dir, path, outtype="f16", name=f"{stage.cfg.run_name}-f16")
        info = check_gguf(path)
    else:
        info = quantize_gguf(stage.dir / "model-f16.gguf", path, type_name, threads=ev.threads)
    seconds = time.time() - start
    warning = k_quant_fallback(type_name, info["tensor_types"])
    if warning:
        warnings.append(warning)
    log.info("quantize: %s %.2f MB in %.1fs, measuring", path.name, info["size_bytes"] / 1e6, seconds)
    entry = {
        "kind": "gguf",
        "path": path.name,
        "size_bytes": info["size_bytes"],
        "size_mb": round(info["size_bytes"] / 1e6, 3),
        "tensor_types": info["tensor_types"],
        "build_seconds": round(seconds, 3),
        **ev.gguf(path, type_name),
    }
    limit = stage.cfg.quantize.max_ppl_drift.get(type_name)
    if limit is not None:
        entry["max_ppl_drift_vs_f16"] = limit
        entry["drift_ok"] = entry.get("ppl_drift_vs_f16", 0.0) <= limit
        if not entry["drift_ok"]:
            warnings.append(
                f"{type_name}: perplexity {entry['ppl']:.4f} is {entry['ppl_drift_vs_f16']:+.2%} from f16, above "
                f"quantize.max_ppl_drift.{type_name}={limit:.2%}"
            )
    return entry


def _measure_bitsandbytes(ev: Evaluator, model_dir: Path, kind: str, warnings: list[str]) -> dict[str, Any]:
    """The HF model loaded through bitsandbytes `kind` (int8, nf4), measured; a load that fails is reported in the
    entry and `warnings`, never raised."""
    name = f"bnb-{kind}"
    log.info("quantize: bitsandbytes %s", kind)
    try:
        model = HFBackend(model_dir, quantization=kind)
    except Exception as exc:  # no AVX2, no bitsandbytes build for this platform...: report, do not fail
        warnings.append(f"bitsandbytes {kind} could not load the model: {exc}")
        return {"kind": "bitsandbytes", "error": f"{type(exc).__name__}: {exc}"}
    footprint = model.memory_footprint()
    log.info("quantize: %s loaded, measuring", name)
    entry = {
        "kind": "bitsandbytes",
        "size_bytes": footprint,
        "size_mb": round(footprint / 1e6, 3),
        "size_note": "in-memory footprint (bitsandbytes quantizes at load time; nothing is written)",
        **ev.hf(model),
    }
    del model
    gc.collect()
    return entry


def _report(
    model_dir: Path, architecture: str, tokens: int, ev: Evaluator, artifacts: dict[str, Any], warnings: list[str]
) -> dict[str, Any]:
    """quantize.json: what was measured on what, and every artifact's figures."""
    return {
        "model_dir": str(model_dir),
        "architecture": architecture,
        "eval": {
            "split": "test",
            "tokens": tokens,
            "window": ev.window,
            "stride": ev.stride,
            "prompts": len(ev.prompts),
            "prompt_tokens": len(ev.prompts[0]) if ev.prompts else 0,
            "new_tokens": ev.new_tokens,
            "speed_prompt_tokens": len(ev.speed_ids),
            "threads": ev.threads,
            "reference": "hf-fp32",
        },
        "artifacts": artifacts,
        "gpu_serving": VLLM_NOTE,
        "warnings": warnings,
    }


def _metrics(artifacts: dict[str, dict[str, Any]], warnings: list[str]) -> dict[str, float]:
    """The stage's tracked metrics: <artifact>_<field> for every numeric size, perplexity, drift, agreement, speed."""
    metrics: dict[str, float] = {}
    for name, a in artifacts.items():
        key = name.replace("-", "_")
        for field in ("size_mb", "ppl", "ppl_drift", "ppl_drift_vs_f16", "greedy_prefix_agreement"):
            if isinstance(a.get(field), (int, float)):
                metrics[f"{key}_{field}"] = float(a[field])
        for field in ("decode_tokens_per_s", "prompt_tokens_per_s"):
            if isinstance(a.get(field), (int, float)):
                metrics[f"{key}_{field.removesuffix('_per_s')}_per_s"] = float(a[field])
    metrics["warnings"] = float(len(warnings))
    return metrics


def report_markdown(report: dict[str, Any]) -> str:
    e = report["eval"]
    lines = [
        f"# Quantization report: {report['model_dir']} ({report['architecture']})",
        "",
        f"Perplexity on {e['tokens']:,} test-split tokens (window {e['window']}, stride {e['stride']}); greedy "
        f"generations of {e['new_tokens']} tokens after {e['prompts']} prompts of {e['prompt_tokens']} test tokens, "
        f"compared with the unquantized model ({e['reference']}); speeds on {e['threads']} CPU thread(s), prompt "
        f"speed on {e['speed_prompt_tokens']} tokens.",
        "",
        "| artifact | size MB | perplexity | drift vs fp32 | drift vs f16 | greedy prefix agreement | decode tok/s "
        "| prompt tok/s | tensor types |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]

    def fmt(value: Any, spec: str) -> str:
        return format(value, spec) if isinstance(value, (int, float)) else "-"

    for name, a in report["artifacts"].items():
        if "error" in a:
            lines.append(f"| {name} | error: {a['error']} | | | | | | | |")
            continue
        types = ", ".join(f"{k}:{v}" for k, v in a.get("tensor_types", {}).items()) or "-"
        lines.append(
            f"| {name} | {fmt(a.get('size_mb'), '.2f')} | {fmt(a.get('ppl'), '.4f')}"
            f" | {fmt(a.get('ppl_drift'), '+.2%')}"
            f" | {fmt(a.get('ppl_drift_vs_f16'), '+.2%')} | {fmt(a.get('greedy_prefix_agreement'), '.0%')}"
            f" | {fmt(a.get('decode_tokens_per_s'), ',.0f')} | {fmt(a.get('prompt_tokens_per_s'), ',.0f')} | {types} |"
        )
    lines += ["", "bitsandbytes sizes are in-memory footprints.", "", f"GPU serving: {report['gpu_serving']}", ""]
    lines += [f"WARNING: {w}" for w in report["warnings"]]
    return "\n".join(lines).rstrip() + "\n"


# ----------------------------------------------------------------------------------------------------------------
# the stage


def run(cfg: ForgeConfig, force: bool = False, target: str = "auto") -> dict[str, Any]:
    """Export and quantize the run's model, measure every artifact, write quantize.json and report.md."""
    types = check_types(cfg.quantize.gguf_types)
    model_stage, model_dir = candidate_model(cfg, target)
    require_reads(cfg, "quantize", [model_stage, "tokenizer"])  # the test split's token ids measure the drift
    eval_token_ids(cfg)
    from pretrain.token_shards import split_digest

    test_split = split_digest(run_dir(cfg) / "tokenizer" / "shards", "test")  # the test split's token shards
    stage = Stage(
        name="quantize",
        cfg=cfg,
        inputs={"model": model_dir, "test_split": test_split},
        artifact_exclude=("*.gguf",),  # the registry uploads the GGUFs a version carries
    )
    return run_stage(stage, lambda s: _build(s, model_dir, types), force=force)
