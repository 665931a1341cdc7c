"""`forge plan`: the design's sizing rules, the stage, the CLI, and the memory estimate checked against reality."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from forge import ForgeError
from forge.config import ModelConfig, load_config
from forge.io import atomic_write_json
from forge.paths import run_dir
from pretrain.hardware import PROFILES, gpu_profile, hardware_profile
from pretrain.memory import layer_activation_bytes, memory_estimate
from pretrain.plan import (
    GB,
    GIB,
    estimate,
    render_text,
    run,
    training_budget,
)

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs"
# The 125M model: configs/125m.yaml with 14 layers (124.6M parameters with a 32k vocabulary).
M125 = ["model.num_layers=14"]


def plan_for(name: str, *overrides: str, hardware: str | None = None) -> dict:
    return estimate(load_config(CONFIGS / f"{name}.yaml", list(overrides)), hardware)


# ----------------------------------------------------------------------------------------------------------------
# the sizing rules the plan is built on (the usual figures for a 125M model)


def test_125m_training_state_is_2_to_3_gb_under_mixed_precision():
    plan = plan_for("125m", *M125)
    mem = plan["memory"]
    assert mem["precision"] == "bf16"
    assert 120e6 <= plan["model"]["parameters"] <= 130e6
    state = sum(mem["state"].values())
    assert 2 * GB <= state <= 3 * GB
    assert mem["state"]["fp32_master"] == 4 * plan["model"]["parameters"]
    assert mem["state"]["adamw_states"] == 8 * plan["model"]["parameters"]
    text = render_text(plan)
    assert "fp32 master copy" in text and "AdamW m + v" in text and "optimizer state proper" in text


def test_24gb_gpu_fits_350m_with_small_batch_and_checkpointing():
    plan = plan_for("350m", "train.micro_batch_size=2", "train.gradient_checkpointing=true", hardware="rtx4090")
    assert 300e6 <= plan["model"]["parameters"] <= 400e6
    assert plan["memory"]["verdict"] == "fits"


def test_1b_on_rtx4090_without_memory_savings_is_oom_with_advice():
    plan = plan_for("1b", "train.gradient_checkpointing=false", hardware="rtx4090")
    mem = plan["memory"]
    assert mem["verdict"] == "OOM"
    assert mem["total"] > 24 * GIB
    assert any("gradient_checkpointing=true" in a and "micro_batch_size" in a for a in mem["advice"])
    assert "OOM" in render_text(plan)
    assert plan_for("1b", hardware="a100-80gb")["memory"]["verdict"] == "fits"


def test_a_model_too_large_for_any_batch_is_told_to_shrink():
    plan = plan_for("1b", "model.num_layers=60", hardware="rtx4090")
    assert plan["memory"]["verdict"] == "OOM"
    assert any("smaller model" in a for a in plan["memory"]["advice"])


def test_125m_wants_2_5_to_10b_tokens():
    tokens = plan_for("125m", *M125)["tokens"]
    assert 2.4e9 <= tokens["recommended_min"] <= 2.6e9
    assert tokens["recommended_max"] >= 10e9
    assert tokens["corpus_train"] is None and "unknown" in tokens["corpus_source"]


def test_the_tokenized_train_split_is_judged_in_tokens_per_parameter_of_the_model_trained():
    cfg = load_config(CONFIGS / "125m.yaml", M125)
    params = training_budget(cfg, 32_000, 1)["parameters"]
    assert 120e6 < params < 130e6
    short = training_budget(cfg, 32_000, 10 * params)
    assert short["tokens_per_parameter"] == 10 and short["warning"].startswith("the train split has 10.00 tokens")
    assert set(training_budget(cfg, 32_000, 50 * params)) == {"parameters", "tokens_train", "tokens_per_parameter"}
    assert "a bigger model could use" in training_budget(cfg, 32_000, 200 * params)["note"]
    continued = load_config(CONFIGS / "125m.yaml", [*M125, "model.init_from=/models/base"])
    missing_base = training_budget(continued, 32_000, 10 * params)  # no base at that path: no shape to count
    assert (
        missing_base["warning"].startswith("parameter count unavailable") and "/models/base" in missing_base["warning"]
    )


def test_10b_tokens_of_text_take_about_40_gb():
    disk = plan_for("125m", "plan.target_tokens=10000000000")["disk"]
    assert disk["corpus_text_bytes"] == pytest.approx(40e9)
    assert disk["token_shard_bytes"] == pytest.approx(20e9)


def test_time_uses_the_mfu_the_pretrain_stage_measured():
    cfg = load_config(CONFIGS / "125m.yaml")
    assumed = estimate(cfg)["time"]
    assert assumed["mfu_source"].startswith("assumed")
    atomic_write_json(run_dir(cfg) / "pretrain" / "manifest.json", {"status": "complete", "metrics": {"mfu": 0.2}})
    measured = estimate(cfg)["time"]
    assert measured["mfu"] == 0.2 and measured["mfu_source"].startswith("measured")
    assert measured["seconds"] == pytest.approx(assumed["seconds"] * cfg.plan.mfu / 0.2)


def test_time_scales_with_tokens_mfu_and_gpus():
    one = plan_for("125m", hardware="h100-80gb")["time"]
    two = plan_for("125m", "plan.num_gpus=2", "plan.mfu=0.2", hardware="h100-80gb")["time"]
    assert one["flops_per_token"] > 6 * 85e6
    assert two["seconds"] / one["seconds"] == pytest.approx(2 * 2 * 0.5)  # 2x tokens (global batch), half MFU, 2 GPUs


def test_fsdp_shards_the_training_state_across_gpus_and_rescues_an_oom():
    ddp = plan_for("1b", "plan.num_gpus=8", hardware="rtx4090")
    fsdp = plan_for("1b", "plan.num_gpus=8", "train.sharding=fsdp", hardware="rtx4090")
    n = ddp["model"]["parameters"]
    d, f = ddp["memory"], fsdp["memory"]
    assert d["state"]["adamw_states"] == 8 * n and f["state"]["adamw_states"] == 8 * n / 8
    assert f["state"]["fp32_master"] == 4 * n / 8 and f["state"]["gradients"] == 4 * n / 8
    assert f["state"]["weights"] == 0, "bf16 copies exist only in the gathered unit"
    assert 0 < f["fsdp_gathered"] < sum(d["state"].values()) / 8  # one layer (or the embeddings) at a time
    assert f["activations"] == d["activations"], "activations are not sharded"
    assert f["total"] == pytest.approx(
        d["total"] - sum(d["state"].values()) + sum(f["state"].values()) + f["fsdp_gathered"]
    )
    assert d["total_by_sharding"] == f["total_by_sharding"] and d["total_by_sharding"]["fsdp"] == f["total"]
    assert d["verdict"] == "OOM" and f["verdict"] == "fits"
    assert d["advice"][0].startswith("train.sharding=fsdp (FSDP over the 8 GPUs)"), d["advice"]
    assert "FSDP state sharded 8 ways" in render_text(fsdp) and "FSDP gathered unit" in render_text(fsdp)
    assert time_of(ddp) == time_of(fsdp), "compute per token is the same; communication is not modelled"


def test_fsdp_on_one_gpu_is_planned_as_what_pretrain_runs_there_unsharded():
    one, one_ddp = (plan_for("1b", *s, hardware="a100-80gb") for s in (["train.sharding=fsdp"], []))
    assert one["memory"] == one_ddp["memory"] and one["memory"]["sharding"] == "ddp"
    assert any("train.sharding=fsdp on plan.num_gpus=1: nothing to shard" in w for w in one["warnings"])


def test_the_old_plan_sharding_key_names_its_replacement():
    with pytest.raises(ForgeError, match=r"plan.sharding='fsdp': the setting moved to train.sharding"):
        load_config(None, ["plan.sharding=fsdp"])


def time_of(plan: dict) -> float:
    return plan["time"]["seconds"]


# ----------------------------------------------------------------------------------------------------------------
# hardware profiles


def test_known_profiles_and_custom():
    assert {"rtx4090", "a100-40gb", "a100-80gb", "h100-80gb", "h200"} <= set(PROFILES)
    cfg = load_config(None, ["plan.hardware=custom", "plan.memory_gb=48", "plan.peak_tflops=180"])
    hw = hardware_profile(cfg.plan)
    assert (hw.memory_gib, hw.peak_tflops) == (48, 180)
    assert hardware_profile(load_config(None).plan, "cpu").kind == "cpu"
    with pytest.raises(ForgeError, match="needs plan.memory_gb"):
        hardware_profile(load_config(None, ["plan.hardware=custom"]).plan)
    with pytest.raises(ForgeError, match="not a known profile; use one of rtx4090"):
        hardware_profile(load_config(None).plan, "tpu-v9")


def test_a_gpu_is_matched_to_its_profile_by_its_most_specific_device_name():
    assert gpu_profile("NVIDIA H100 PCIe").name == "h100-pcie"
    assert gpu_profile("NVIDIA H100 80GB HBM3").name == "h100-80gb"
    assert gpu_profile("NVIDIA A10G").name == "a10g" and gpu_profile("NVIDIA A10").name == "a10"
    assert gpu_profile("NVIDIA L40S").name == "l40s" and gpu_profile("NVIDIA L4").name == "l4"
    assert gpu_profile("NVIDIA H200").peak_tflops == 989
    assert gpu_profile("Some Future Accelerator") is None


def test_the_cpu_peak_counts_the_vector_width_the_cpu_reports(tmp_path):
    from pretrain.hardware import cpu_fp32_lanes

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx fma avx2 avx512f avx512bw\n")
    assert cpu_fp32_lanes(cpuinfo) == 16
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx fma avx2 avx512_vnni_like\n")
    assert cpu_fp32_lanes(cpuinfo) == 8  # a flag that only starts with "avx512" is not AVX-512F
    assert cpu_fp32_lanes(tmp_path / "missing") == 8


# ----------------------------------------------------------------------------------------------------------------
# the stage and the CLI


def test_stage_writes_plan_without_prior_stages_and_skips_when_unchanged():
    cfg = load_config(CONFIGS / "tiny-cpu.yaml")
    manifest = run(cfg)
    out = run_dir(cfg) / "plan"
    assert manifest["status"] == "complete"
    assert (out / "plan.txt").read_text().startswith("plan for run tiny-cpu")
    plan = json.loads((out / "plan.json").read_text())
    assert plan["model"]["vocab_size"] == 4096 and manifest["metrics"]["parameters"] == plan["model"]["parameters"]
    again = run(cfg)
    assert again["started_at"] == manifest["started_at"]  # skipped

    # a tokenizer stage that has run: its token count and vocabulary are used, and the plan re-runs
    atomic_write_json(
        run_dir(cfg) / "tokenizer" / "manifest.json",
        {"status": "complete", "metrics": {"tokens_train": 3_000_000, "vocab_size": 4096, "bytes_per_token": 3.5}},
    )
    third = run(cfg)
    assert "tokenizer_manifest" in third["inputs"] and third["status"] == "complete"
    assert third["plan"]["tokens"]["corpus_train"] == 3_000_000
    assert third["plan"]["disk"]["corpus_text_bytes"] == pytest.approx(3.5 * 3_000_000)

    # the trained vocabulary disagrees with model.vocab_size: one line, before the stage starts
    with pytest.raises(ForgeError, match="model.vocab_size=8192 does not match the tokenizer's vocabulary of 4096"):
        run(load_config(CONFIGS / "tiny-cpu.yaml", ["model.vocab_size=8192"]))


def test_cli_plan_text_and_json():
    from forge.cli import app

    runner = CliRunner()
    args = ["plan", "--config", str(CONFIGS / "1b.yaml"), "--set", "train.gradient_checkpointing=false"]
    result = runner.invoke(app, [*args, "--hardware", "rtx4090", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout[result.stdout.index("{") :])
    assert plan["memory"]["verdict"] == "OOM" and plan["hardware"]["name"] == "rtx4090"
    result = runner.invoke(app, [*args, "--hardware", "a100-80gb"])
    assert result.exit_code == 0, result.output
    assert "verdict     fits" in result.stdout and "NVIDIA A100 80 GB" in result.stdout
    bad = runner.invoke(app, [*args, "--hardware", "abacus"])
    assert bad.exit_code == 2 and "not a known profile" in bad.output


# ----------------------------------------------------------------------------------------------------------------
# the activation formula against what autograd actually keeps


def _saved_bytes(model_cfg: ModelConfig, vocab: int, b: int, s: int, mixed: bool) -> int:
    """Bytes of the tensors autograd saves for the backward in one forward (parameters excluded)."""
    import torch

    from pretrain.model import build_model

    torch.manual_seed(0)
    model = build_model(model_cfg, vocab)
    model.train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    ids = torch.randint(0, vocab, (b, s))
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if mixed else contextlib.nullcontext()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
        model(input_ids=ids, labels=ids)
    return sum(v for k, v in seen.items() if k not in params)


@pytest.mark.parametrize(
    "architecture, kv, dropout, mixed",
    [("llama", None, 0.0, False), ("llama", 2, 0.0, True), ("gpt2", None, 0.0, True), ("gpt2", None, 0.1, False)],
)
def test_layer_activation_formula_matches_saved_tensors(architecture, kv, dropout, mixed):
    """One layer's term of the plan == the bytes autograd keeps for it (difference between 2 and 1 layers)."""
    ff = 512 if architecture == "gpt2" else 384
    shape = dict(architecture=architecture, hidden_size=128, num_attention_heads=4, num_key_value_heads=kv,
                 intermediate_size=ff, context_length=128, dropout=dropout)  # fmt: skip
    b, s, vocab = 2, 64, 512
    one, two = (ModelConfig(num_layers=n, **shape) for n in (1, 2))
    measured = _saved_bytes(two, vocab, b, s, mixed) - _saved_bytes(one, vocab, b, s, mixed)
    if mixed:  # autocast's bf16 weight copies are saved too; the plan books them under "weights"
        from pretrain.model import parameter_breakdown

        measured -= 2 * parameter_breakdown(one, vocab)["layers"]
    planned = layer_activation_bytes(one, b, s, mixed, device="cpu")
    assert planned == pytest.approx(measured, rel=0.05)


# ----------------------------------------------------------------------------------------------------------------
# the whole estimate against measured peak memory

PROBE = r"""
import gc, json, os, sys
import torch
from transformers.utils import logging
from forge.config import ModelConfig
from pretrain.model import build_model

logging.set_verbosity_error()
spec = json.loads(sys.argv[1])
device = spec["device"]


def train(model_cfg, vocab, b, s, steps, accum, ckpt):
    torch.manual_seed(0)
    model = build_model(model_cfg, vocab, device=device)
    model.train()
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(steps):
        for _ in range(accum):
            ids = torch.randint(0, vocab, (b, s), device=device)
            with torch.autocast(device, dtype=torch.bfloat16, enabled=spec["bf16"]):
                out = model(input_ids=ids, labels=ids)
            (out.loss / accum).backward()
            del out
        opt.step()
        opt.zero_grad(set_to_none=accum > 1)  # kept gradients stand in for accumulation's
    return model, opt


def rss():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def hwm():
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmHWM"))


torch.set_num_threads(2)
# warm up: load the kernels' code pages and thread pools, so the measured deltas are tensors only
first = spec["runs"][0]
warm = ModelConfig(**{**first["model"], "hidden_size": 64, "num_attention_heads": 1, "num_key_value_heads": None,
                      "intermediate_size": 128, "num_layers": 1})
for ckpt in {run["ckpt"] for run in spec["runs"]}:
    train(warm, 300, 2, 32, 1, 1, ckpt)
for run in spec["runs"]:
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize(); torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = rss()
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # reset the peak-RSS counter (VmHWM) to the current RSS
    kept = train(ModelConfig(**run["model"]), run["vocab"], run["b"], run["s"], 2, run["accum"], run["ckpt"])
    peak = torch.cuda.max_memory_allocated() - base if device == "cuda" else hwm() - base
    del kept
    print("PEAK", json.dumps({"name": run["name"], "peak": peak}), flush=True)
"""

SMALL_RUNS = {
    "llama": dict(model=dict(architecture="llama", hidden_size=256, num_layers=4, num_attention_heads=4,
                             intermediate_size=768, context_length=256), vocab=4096, b=4, s=256, ckpt=False),
    "gpt2-dropout": dict(model=dict(architecture="gpt2", hidden_size=256, num_layers=4, num_attention_heads=4,
                                    intermediate_size=1024, context_length=256, dropout=0.1),
                         vocab=4096, b=4, s=256, ckpt=False),
    "llama-gqa-checkpointing": dict(model=dict(architecture="llama", hidden_size=256, num_layers=6,
                                               num_attention_heads=4, num_key_value_heads=2, intermediate_size=768,
                                               context_length=256), vocab=4096, b=4, s=256, ckpt=True),
}  # fmt: skip


def _measure(runs: dict[str, dict], device: str, bf16: bool) -> dict[str, int]:
    """Peak memory of each run, measured one after the other in one fresh process."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    # A fixed mmap threshold returns every freed large tensor to the OS at once, so RSS follows live tensors
    # instead of glibc's cached heap (its dynamic threshold otherwise keeps freed activations resident).
    env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    spec = {"device": device, "bf16": bf16, "runs": [{**run, "name": name} for name, run in runs.items()]}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(spec)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=900
    )
    assert out.returncode == 0, out.stderr[-3000:]
    found = [json.loads(line[5:]) for line in out.stdout.splitlines() if line.startswith("PEAK ")]
    return {row["name"]: row["peak"] for row in found}


def _planned(spec: dict, hardware: str, precision: str) -> float:
    hw = hardware_profile(load_config(None).plan, hardware)
    model_cfg = ModelConfig(**spec["model"])
    est = memory_estimate(model_cfg, spec["vocab"], hw, precision, spec["b"], spec["s"], spec["ckpt"])
    return est["total"] - est["overhead"]  # the probe measures tensors, not the CUDA context


@pytest.fixture(scope="module")
def cpu_peaks() -> dict[str, int]:
    """Each small run: 2 optimizer steps in fp32 on the CPU, peak RSS above the pre-model baseline.

    Gradients are kept between steps (zero_grad(set_to_none=False)) so they coexist with the next micro-batch's
    activations, as they do under gradient accumulation: the case the plan sizes.
    """
    return _measure({name: {**run, "accum": 1} for name, run in SMALL_RUNS.items()}, "cpu", bf16=False)


@pytest.mark.slow
@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="needs Linux /proc/self/clear_refs")
@pytest.mark.parametrize("name", list(SMALL_RUNS))
def test_cpu_peak_memory_matches_the_plan(name, cpu_peaks):
    measured = cpu_peaks[name]
    planned = _planned(SMALL_RUNS[name], "cpu", "fp32")
    print(f"{name}: measured {measured / 2**20:.1f} MiB, planned {planned / 2**20:.1f} MiB")
    assert measured == pytest.approx(planned, rel=0.25), (
        f"measured {measured / 2**20:.0f} MiB, planned {planned / 2**20:.0f}"
    )


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        return False


GPU_RUNS = {name: {**run, "b": 16, "accum": 2} for name, run in SMALL_RUNS.items()}


@pytest.fixture(scope="module")
def gpu_peaks() -> dict[str, int]:
    """The same runs in bf16 autocast on a GPU, micro-batch 16, 2 micro-batches per step: max_memory_allocated."""
    return _measure(GPU_RUNS, "cuda", bf16=True)


@pytest.mark.slow
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", list(SMALL_RUNS))
def test_gpu_peak_memory_matches_the_plan(name, gpu_peaks):
    measured = gpu_peaks[name]
    planned = _planned(GPU_RUNS[name], "h100-80gb", "bf16")  # the CUDA context is not in max_memory_allocated
    print(f"{name}: measured {measured / 2**20:.1f} MiB, planned {planned / 2**20:.1f} MiB")
    assert measured == pytest.approx(planned, rel=0.25), (
        f"measured {measured / 2**20:.0f} MiB, planned {planned / 2**20:.0f}"
    )
