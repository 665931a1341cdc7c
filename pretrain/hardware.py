"""The hardware Forge plans for and measures against: one table of device profiles, FLOPs per token, peak FLOP/s.

    hardware_profile(cfg.plan, name)    a named profile (plan.hardware, `forge plan --hardware`), "cpu" (this
                                        machine) or "custom" (plan.memory_gb and plan.peak_tflops)
    flops_per_token(cfg.model, vocab)   6 N (forward + backward of every matmul weight, the output head included)
                                        + 12 L H T (attention scores and values, PaLM appendix B)
    peak_flops(device, precision)       the peak of the GPU the training loop runs on (matched by its device name
                                        in the same table), or of this CPU: the MFU the loop logs
    local_hardware()                    the device this process runs on: its CUDA GPU, else this CPU
    resolve_precision(precision, hw)    train.precision / sft.precision for a run on `hw`, "auto" resolved: the one
                                        rule the plan (its planned hardware), pretrain and SFT (their device) share

The plan's time estimate and the measured MFU read the same peak, so they agree. The numbers are estimates: MFU
tells whether a run is in the right range (30-50% on a GPU is good), not more.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from forge import ForgeError
from forge.config import ForgeConfig, ModelConfig, PlanConfig
from forge.machine import usable_cores
from pretrain.model import parameter_breakdown

GIB = 1024**3
FP32_FRACTION = 0.5  # fp32 matmuls run as TF32 at about half the bf16 rate on Ampere and later
UNKNOWN_GPU_TFLOPS = 100.0  # a GPU not in the table: a mid-range guess; plan.peak_tflops sets the real figure


@dataclass(frozen=True)
class Hardware:
    name: str
    label: str
    memory_gib: float  # per device; a GPU's "24 GB" is 24 GiB, and plan.memory_gb is read the same way
    peak_tflops: float  # dense bf16 tensor-core peak from the vendor's datasheet, no sparsity (fp32 for the CPU)
    kind: str = "gpu"
    overhead_gib: float = 0.8  # CUDA context, cuBLAS/cuDNN workspaces: not available to tensors
    device_name: str = ""  # a substring of torch.cuda.get_device_name() that identifies the device
    bf16: bool = True  # native bf16 (compute capability 8.0 and later); older GPUs run fp16 on their tensor cores


PROFILES: dict[str, Hardware] = {
    h.name: h
    for h in [
        Hardware("rtx4090", "NVIDIA RTX 4090 24 GB", 24, 165, device_name="RTX 4090"),
        Hardware("rtx3090", "NVIDIA RTX 3090 24 GB", 24, 71, device_name="RTX 3090"),
        Hardware("t4", "NVIDIA T4 16 GB", 16, 65, device_name="T4", bf16=False),  # peak: fp16
        Hardware("v100", "NVIDIA V100 32 GB", 32, 125, device_name="V100", bf16=False),  # peak: fp16
        Hardware("a10", "NVIDIA A10 24 GB", 24, 125, device_name="A10"),
        Hardware("a10g", "NVIDIA A10G 24 GB", 24, 70, device_name="A10G"),
        Hardware("l4", "NVIDIA L4 24 GB", 24, 121, device_name="L4"),
        Hardware("l40s", "NVIDIA L40S 48 GB", 48, 362, device_name="L40S"),
        Hardware("a100-40gb", "NVIDIA A100 40 GB", 40, 312),  # by name an A100: the 80 GB profile, same peak
        Hardware("a100-80gb", "NVIDIA A100 80 GB", 80, 312, device_name="A100"),
        Hardware("h100-pcie", "NVIDIA H100 PCIe 80 GB", 80, 756, device_name="H100 PCIe"),
        Hardware("h100-80gb", "NVIDIA H100 SXM 80 GB", 80, 989, device_name="H100"),
        Hardware("h200", "NVIDIA H200 141 GB", 141, 989, device_name="H200"),
    ]
}  # fmt: skip
ALIASES = {"4090": "rtx4090", "3090": "rtx3090", "a100": "a100-80gb", "h100": "h100-80gb", "h200-141gb": "h200"}


def _cpu_profile() -> Hardware:
    try:
        import psutil

        memory = psutil.virtual_memory().total / GIB
    except ImportError:  # pragma: no cover - psutil is a dependency
        memory = 16.0
    cores = usable_cores()
    lanes = cpu_fp32_lanes()
    # 2 FMA units x fp32 lanes x 2 flops x ~3 GHz per core: 0.1 TFLOP/s with AVX2, 0.19 with AVX-512. A ceiling
    # (AVX-512 code often runs below 3 GHz): counting an AVX-512 core as AVX2 put the MFU of a 135M model at 117%.
    tflops = 2 * lanes * 2 * 3.0e9 / 1e12 * cores
    label = f"this CPU ({cores} cores, fp32, {lanes * 32}-bit FMA)"
    return Hardware("cpu", label, round(memory, 1), tflops, "cpu", 0.0)  # bf16: autocast runs it (slowly)


def cpu_fp32_lanes(cpuinfo: Path = Path("/proc/cpuinfo")) -> int:
    """fp32 lanes of the widest vector FMA the CPU reports: 16 (AVX-512), 8 (AVX2, and where it cannot be read)."""
    try:
        flags = next((line for line in cpuinfo.read_text().splitlines() if line.startswith("flags")), "").split()
    except OSError:
        return 8
    return 16 if "avx512f" in flags else 8


def hardware_profile(p: PlanConfig, name: str | None = None) -> Hardware:
    """The profile named by `name` or plan.hardware; plan.memory_gb / plan.peak_tflops override its figures."""
    key = (name or p.hardware).lower()
    key = ALIASES.get(key, key)
    if key == "custom":
        if p.memory_gb is None or p.peak_tflops is None:
            raise ForgeError(
                "plan.hardware=custom needs plan.memory_gb and plan.peak_tflops, e.g. --set plan.memory_gb=48 "
                "--set plan.peak_tflops=180"
            )
        hw = Hardware("custom", f"custom GPU {p.memory_gb:g} GB, {p.peak_tflops:g} TFLOP/s", p.memory_gb, p.peak_tflops)
    elif key == "cpu":
        hw = _cpu_profile()
    elif key in PROFILES:
        hw = PROFILES[key]
    else:
        raise ForgeError(
            f"plan.hardware={key!r} is not a known profile; use one of {', '.join(known_profiles())} "
            "(custom needs plan.memory_gb and plan.peak_tflops)"
        )
    if key != "custom" and (p.memory_gb is not None or p.peak_tflops is not None):
        hw = replace(hw, label=hw.label + " (overridden)", memory_gib=p.memory_gb or hw.memory_gib,
                     peak_tflops=p.peak_tflops or hw.peak_tflops)  # fmt: skip
    return hw


def known_profiles() -> list[str]:
    return [*PROFILES, "cpu", "custom"]


def gpu_profile(device_name: str) -> Hardware | None:
    """The profile of a CUDA device by its name; the longest matching name wins ("H100 PCIe" over "H100")."""
    matches = [h for h in PROFILES.values() if h.device_name and h.device_name in device_name]
    return max(matches, key=lambda h: len(h.device_name), default=None)


def flops_per_token(model_cfg: ModelConfig, vocab_size: int) -> float:
    """Training FLOPs per token (forward + backward): 6 x matmul parameters + attention."""
    parts = parameter_breakdown(model_cfg, vocab_size)
    matmul_params = parts["layers"] + vocab_size * model_cfg.hidden_size  # the output head, tied or not
    attention = 12 * model_cfg.num_layers * model_cfg.hidden_size * model_cfg.context_length
    return 6.0 * matmul_params + attention


def peak_flops(device_type: str, precision: str, cfg: ForgeConfig | None = None) -> float:
    """Peak FLOP/s of one device of this kind (a whole CPU counts as one device); `plan.peak_tflops` overrides."""
    if cfg is not None and cfg.plan.peak_tflops:
        return cfg.plan.peak_tflops * 1e12
    if device_type == "cuda":
        import torch

        profile = gpu_profile(torch.cuda.get_device_name())
        tflops = profile.peak_tflops if profile else UNKNOWN_GPU_TFLOPS
        return tflops * 1e12 * (FP32_FRACTION if precision == "fp32" else 1.0)
    return _cpu_profile().peak_tflops * 1e12


def local_hardware() -> Hardware:
    """The device this process runs on: its CUDA GPU (the table's profile where it has one; bf16 as the GPU runs it
    natively, not torch's emulation), else this CPU."""
    import torch

    if not torch.cuda.is_available():
        return _cpu_profile()
    name = torch.cuda.get_device_name()
    memory = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / GIB
    known = gpu_profile(name) or Hardware(name, name, memory, UNKNOWN_GPU_TFLOPS, device_name=name)
    return replace(known, label=name, bf16=torch.cuda.is_bf16_supported(including_emulation=False))


def resolve_precision(precision: str, hw: Hardware, setting: str = "train.precision") -> str:
    """`precision` (auto, bf16, fp16 or fp32) for a run on `hw`. auto: bf16 on a GPU that has it, fp16 (with loss
    scaling) on an older GPU, fp32 on the CPU (where autocast is slow). Refuses what the device cannot run."""
    if hw.kind == "cpu":
        if precision == "fp16":
            raise ForgeError(f"{setting}=fp16 needs a CUDA GPU; on CPU use bf16, fp32 or auto")
        return "fp32" if precision == "auto" else precision
    if precision == "auto":
        return "bf16" if hw.bf16 else "fp16"
    if precision == "bf16" and not hw.bf16:
        raise ForgeError(f"{setting}=bf16: {hw.label} has no bf16; use fp16 or auto")
    return precision
