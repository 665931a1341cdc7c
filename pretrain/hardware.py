"""Training FLOPs per token and a device's peak FLOP/s, for the MFU estimate the training loop logs.

    flops_per_token(cfg.model, vocab)   6 N (forward + backward of every matmul weight, the output head included)
                                        + 12 L H T (attention scores and values, PaLM appendix B)
    peak_flops(device, precision)       dense tensor-core peak of a known GPU; for a CPU, `forge plan`'s CPU profile

The numbers are estimates: MFU tells whether a run is in the right range (30-50% on a GPU is good), not more.
`plan.peak_tflops` in the config overrides the table; the CPU figure is `forge plan`'s.
"""

from __future__ import annotations

from forge.config import ForgeConfig, ModelConfig
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


def flops_per_token(model_cfg: ModelConfig, vocab_size: int) -> float:
    """Training FLOPs per token (forward + backward): 6 x matmul parameters + attention."""
    parts = parameter_breakdown(model_cfg, vocab_size)
    matmul_params = parts["layers"] + vocab_size * model_cfg.hidden_size  # the output head, tied or not
    attention = 12 * model_cfg.num_layers * model_cfg.hidden_size * model_cfg.context_length
    return 6.0 * matmul_params + attention


def peak_flops(device_type: str, precision: str, cfg: ForgeConfig | None = None) -> float:
    """Peak FLOP/s of one device of this kind (a whole CPU counts as one device); `plan.peak_tflops` overrides.

    The CPU figure is `forge plan`'s CPU profile, so the plan's time estimate and the measured MFU agree.
    """
    if cfg is not None and cfg.plan.peak_tflops:
        return cfg.plan.peak_tflops * 1e12
    if device_type == "cuda":
        import torch

        name = torch.cuda.get_device_name()
        tflops = next((v for k, v in GPU_PEAK_TFLOPS.items() if k in name), 100.0)
        return tflops * 1e12 * (FP32_FRACTION if precision == "fp32" else 1.0)
    from pretrain.plan import hardware_profile  # deferred: plan imports this module

    return hardware_profile(cfg or ForgeConfig(), "cpu").peak_tflops * 1e12
