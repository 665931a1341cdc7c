"""Training FLOPs per token and a device's peak FLOP/s, for the MFU estimate the training loop logs.

    flops_per_token(cfg.model, vocab)   6 N (forward + backward of every matmul weight, the output head included)
                                        + 12 L H T (attention scores and values, PaLM appendix B)
    peak_flops(device, precision)       dense tensor-core peak of a known GPU; for a CPU, cores x clock x FMA lanes

The numbers are estimates: MFU tells whether a run is in the right range (30-50% on a GPU is good), not more.
`plan.peak_tflops` in the config overrides the table.
"""

from __future__ import annotations

import os
from pathlib import Path

from forge.config import ModelConfig
from pretrain.model import parameter_breakdown

# Dense bf16/fp16 tensor-core peak in TFLOP/s, from the vendors' datasheets (no sparsity), by device-name substring.
GPU_PEAK_TFLOPS = {
    "H200": 989.0,
    "H100 PCIe": 756.0,
    "H100": 989.0,
    "A100": 312.0,
    "L40S": 362.0,
    "L4": 121.0,
    "A10G": 70.0,
    "A10": 125.0,
    "RTX 4090": 165.0,
    "RTX 3090": 71.0,
    "V100": 125.0,
    "T4": 65.0,
}
FP32_FRACTION = 0.5  # fp32 matmuls run as TF32 at about half the bf16 rate on Ampere and later
CPU_DEFAULT_GHZ = 2.5
CPU_FLOPS_PER_CYCLE = 32  # fp32 per core: 2 FMA units x 8 AVX2 lanes x 2 (multiply + add)


def flops_per_token(model_cfg: ModelConfig, vocab_size: int) -> float:
    """Training FLOPs per token (forward + backward): 6 x matmul parameters + attention."""
    parts = parameter_breakdown(model_cfg, vocab_size)
    matmul_params = parts["layers"] + vocab_size * model_cfg.hidden_size  # the output head, tied or not
    attention = 12 * model_cfg.num_layers * model_cfg.hidden_size * model_cfg.context_length
    return 6.0 * matmul_params + attention


def peak_flops(device_type: str, precision: str, override_tflops: float | None = None) -> float:
    """Peak FLOP/s of one device of this kind (a whole CPU socket counts as one device)."""
    if override_tflops:
        return override_tflops * 1e12
    if device_type == "cuda":
        import torch

        name = torch.cuda.get_device_name()
        tflops = next((v for k, v in GPU_PEAK_TFLOPS.items() if k in name), 100.0)
        return tflops * 1e12 * (FP32_FRACTION if precision == "fp32" else 1.0)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores * _cpu_ghz() * 1e9 * CPU_FLOPS_PER_CYCLE


def _cpu_ghz() -> float:
    try:
        text = Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").read_text()
        return int(text) / 1e6
    except (OSError, ValueError):
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("cpu MHz"):
                return float(line.split(":")[1]) / 1000
    except (OSError, ValueError, IndexError):
        pass
    return CPU_DEFAULT_GHZ
