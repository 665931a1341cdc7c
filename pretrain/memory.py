"""The peak memory of one training step on one GPU, part by part: training state, activations, FSDP's buffers.

pretrain/plan.py's docstring derives each term; tests/test_plan.py checks them against what PyTorch allocates.
`forge plan` builds its memory verdict and advice on memory_estimate.

The parameters (and so the training state and FSDP's units) are exact for any model: the family's formula from
scratch, counted on the model for a base. A layer's activations are the one term measured per family, for llama
and gpt2 (tests/test_plan.py); a base of another family gets llama's formula on its own sizes (`activation_source`
says which), an estimate: its norms, attention and feed-forward may keep more or fewer tensors.
"""

from __future__ import annotations

from typing import Any

from models.families import FAMILIES, Family
from models.shape import Shape
from pretrain.hardware import GIB, Hardware
from pretrain.model import count_parameters, parameter_breakdown


def state_bytes_per_param(precision: str) -> dict[str, float]:
    """Training-state bytes per parameter by part (see pretrain/plan.py's docstring)."""
    if precision == "fp32":
        return {"weights": 4, "gradients": 4, "adamw_states": 8, "fp32_master": 0}
    return {"weights": 2, "gradients": 4, "adamw_states": 8, "fp32_master": 4}


def activation_family(m: Shape) -> Family:
    """The family whose measured per-layer activation formula the plan applies: the model's own, else llama's."""
    return FAMILIES.get(m.architecture, FAMILIES["llama"])


def activation_source(m: Shape) -> str:
    if m.architecture in FAMILIES:
        return f"{m.architecture}'s per-layer formula, measured (pretrain/plan.py)"
    return f"estimated: llama's per-layer formula on {m.architecture}'s sizes (measured for llama and gpt2 only)"


def layer_activation_bytes(m: Shape, b: int, s: int, mixed: bool, attention: str = "sdpa",
                           device: str = "gpu") -> float:  # fmt: skip
    """Bytes one transformer layer keeps for the backward, for a micro-batch of b sequences of s tokens."""
    h, a = m.hidden_size, m.num_attention_heads
    kv_dim = (m.num_key_value_heads or a) * m.head_dim
    math_path = attention == "eager" or (m.dropout > 0 and device == "cpu")
    per_token = activation_family(m).layer_activation_per_token(m, mixed, math_path)
    if attention == "sdpa":
        per_token -= (4 if mixed else 8) * (h - kv_dim)  # K and V stay at kv-head size
    total = b * s * per_token
    if math_path:
        total += a * s * s * b * (12 if m.dropout > 0 else (6 if mixed else 4))
    return float(total)


def activation_breakdown(m: Shape, vocab: int, b: int, s: int, precision: str, checkpointing: bool,
                         attention: str = "sdpa", device: str = "gpu") -> dict[str, float]:  # fmt: skip
    """Activation bytes of one micro-batch: the layers, the logits/loss, and the backward's transient peak."""
    mixed = precision != "fp32"
    layer = layer_activation_bytes(m, b, s, mixed, attention, device)
    h = m.hidden_size
    embed_norm = b * s * h * activation_family(m).embed_norm_bytes  # embeddings output, final norm
    logits = b * s * vocab * ((2 if mixed else 4) + 4)  # the logits + the loss's fp32 log-softmax
    transient = b * s * vocab * 8  # backward of the loss: fp32 gradients of log-probs and logits
    if checkpointing:
        # every layer's fp32 input; a layer is recomputed only after the loss's tensors are freed, so it adds
        # to the peak only where it is larger than them
        layers = m.num_layers * 4 * b * s * h + max(0.0, layer - logits - transient)
    else:
        layers = m.num_layers * layer
    return {"layers": float(layers), "embeddings_and_norm": float(embed_norm), "logits_and_loss": float(logits),
            "loss_backward_transient": float(transient)}  # fmt: skip


def fsdp_unit_bytes(m: Shape, vocab: int, precision: str) -> float:
    """FSDP's gathered buffers: the largest wrap unit's compute copy twice (current + prefetch), its fp32 grads."""
    parts = parameter_breakdown(m, vocab)
    unit = max(parts["layers"] / m.num_layers, parts["embeddings"] + parts["output_head"] + parts["final_norm"])
    return float(unit * (2 * (4 if precision == "fp32" else 2) + 4))


def memory_estimate(m: Shape, vocab: int, hw: Hardware, precision: str, micro_batch: int, seq: int,
                    checkpointing: bool, attention: str = "sdpa",
                    shards: int | None = None) -> dict[str, Any]:  # fmt: skip
    """Peak memory per device, in bytes, split by part; `shards`: FSDP over that many GPUs (None: DDP)."""
    n = count_parameters(m, vocab)
    per_param = state_bytes_per_param(precision)
    state = {k: float(v * n) for k, v in per_param.items()}
    if precision != "fp32" and checkpointing:
        # autocast's bf16 weight copies live one layer at a time when the layers are recomputed
        layers_params = parameter_breakdown(m, vocab)["layers"]
        state["weights"] = 2.0 * (n - layers_params + layers_params / m.num_layers)
    gathered = 0.0
    if shards is not None:
        # the fp32 state is split; 16-bit copies exist only in the gathered unit (counted below)
        state = {k: (0.0 if k == "weights" and precision != "fp32" else v / shards) for k, v in state.items()}
        gathered = fsdp_unit_bytes(m, vocab, precision)
    acts = activation_breakdown(m, vocab, micro_batch, seq, precision, checkpointing, attention, hw.kind)
    overhead = hw.overhead_gib * GIB
    total = sum(state.values()) + sum(acts.values()) + overhead + gathered
    return {"parameters": n, "state": state, "activations": acts, "overhead": overhead, "fsdp_gathered": gathered,
            "total": total}  # fmt: skip
