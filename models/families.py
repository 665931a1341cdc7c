"""One spec per family Forge trains from scratch (model.architecture): what cannot be read off a model that does
not exist yet.

    fam = family(cfg.model.architecture)          # or family_of(hf_config) for Forge's own GGUF writer
    fam.hf_config(cfg.model, vocab, ids)          # the transformers config to build
    fam.parameter_breakdown(cfg.model, vocab)     # exact parameter counts by part, without importing torch
    fam.layer_activation_per_token(cfg.model, mixed)   # the plan's activation bytes per token and layer (measured)
    fam.gguf_hparams(writer, hf_config); fam.gguf_tensor(name, array, hf_config)   # Forge's own GGUF writer

    llama  LlamaForCausalLM: RMSNorm, SwiGLU feed-forward, rotary positions, no biases (Forge's default; also
           SmolLM, TinyLlama, Llama 2/3 shapes with grouped-query attention)
    gpt2   GPT2LMHeadModel: LayerNorm, GELU feed-forward, learned positions, biases, dropout

An existing model (model.init_from) of any family, these two included, is read off the model instead
(models/shape.py): its parameters counted on a meta-device instance, its blocks from its `_no_split_modules`. The
parameter formulas here equal those counts (tests/test_base_families.py); they stay because `forge plan` on a
config from scratch then needs no torch. The few facts the config itself needs (each family's default activation,
whether it has grouped-query attention) live in forge.config.ARCHITECTURES, which this table extends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from forge import ForgeError
from forge.config import ARCHITECTURES, ModelConfig
from models.shape import Shape

QUANT_BLOCK = 256  # llama.cpp K-quants (Q4_K_M...) need rows divisible by 256, else tensors fall back


@dataclass(frozen=True)
class Family:
    name: str  # ModelConfig.architecture, the transformers model_type and the GGUF general.architecture
    # Feed-forward width / hidden size of the design, and the band outside which `pretrain.model.validate` warns.
    ffn_rule: tuple[float, float, float]
    # Bytes per token and hidden unit the plan counts for the embedding output and the final norm.
    embed_norm_bytes: int

    # the subclasses fill these in
    def warnings(self, m: ModelConfig) -> list[str]:
        raise NotImplementedError

    def hf_config(self, m: ModelConfig, vocab: int, common: dict[str, Any]) -> Any:
        raise NotImplementedError

    def parameter_breakdown(self, m: ModelConfig, vocab: int) -> dict[str, int]:
        raise NotImplementedError

    def layer_activation_per_token(self, m: Shape, mixed: bool, math_path: bool) -> float:
        raise NotImplementedError

    def shape(self, config: Any) -> tuple[int, int, int]:
        """(layers, attention heads, key/value heads) of a transformers config of this family."""
        raise NotImplementedError

    def gguf_hparams(self, writer: Any, config: Any) -> None:
        raise NotImplementedError

    def gguf_tensor(self, hf_name: str, data: np.ndarray, config: Any) -> np.ndarray:
        return data


class Llama(Family):
    def warnings(self, m: ModelConfig) -> list[str]:
        out = []
        if m.activation != "silu":
            out.append(f"model.activation={m.activation}: llama's gated feed-forward is SwiGLU (silu)")
        if m.dropout > 0:
            out.append(
                f"model.dropout={m.dropout}: llama applies dropout to attention probabilities only (no residual "
                "dropout)"
            )
        return out

    def hf_config(self, m: ModelConfig, vocab: int, common: dict[str, Any]) -> Any:
        from transformers import LlamaConfig

        return LlamaConfig(
            hidden_size=m.hidden_size, num_hidden_layers=m.num_layers, num_attention_heads=m.num_attention_heads,
            num_key_value_heads=m.num_key_value_heads or m.num_attention_heads,
            intermediate_size=m.intermediate_size, max_position_embeddings=m.context_length, hidden_act=m.activation,
            attention_dropout=m.dropout, rope_parameters={"rope_type": "default", "rope_theta": m.rope_theta},
            vocab_size=vocab, **common,
        )  # fmt: skip

    def parameter_breakdown(self, m: ModelConfig, vocab: int) -> dict[str, int]:
        h, ff = m.hidden_size, m.intermediate_size
        kv_dim = (m.num_key_value_heads or m.num_attention_heads) * m.head_dim
        # two RMSNorm weights; q, o: h x h; k, v: h x kv_dim; gate, up: h x ff; down: ff x h (no biases)
        per_layer = 2 * h + 2 * h * h + 2 * h * kv_dim + 3 * h * ff
        head = 0 if m.tie_word_embeddings else vocab * h
        return {"embeddings": vocab * h, "layers": m.num_layers * per_layer, "final_norm": h, "output_head": head}

    def layer_activation_per_token(self, m: Shape, mixed: bool, math_path: bool) -> float:
        h, ff = m.hidden_size, m.intermediate_size
        per_token = (34 * h + 8 * ff) if mixed else (40 * h + 16 * ff)
        if mixed and m.dropout > 0 and math_path:
            per_token += 6 * h  # dropout masks and the un-fused attention's extra copies
        return per_token

    def shape(self, config: Any) -> tuple[int, int, int]:
        heads = config.num_attention_heads
        return config.num_hidden_layers, heads, getattr(config, "num_key_value_heads", None) or heads

    def gguf_hparams(self, writer: Any, config: Any) -> None:
        if config.hidden_act != "silu":
            raise ForgeError(f"llama with hidden_act={config.hidden_act!r}: llama.cpp's llama graph is SwiGLU (silu)")
        if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
            raise ForgeError("llama with biases (attention_bias / mlp_bias) is not exported")
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        writer.add_context_length(config.max_position_embeddings)
        writer.add_embedding_length(config.hidden_size)
        writer.add_block_count(config.num_hidden_layers)
        writer.add_feed_forward_length(config.intermediate_size)
        writer.add_head_count(config.num_attention_heads)
        writer.add_head_count_kv(config.num_key_value_heads or config.num_attention_heads)
        writer.add_rope_dimension_count(head_dim)
        writer.add_rope_freq_base(rope_theta(config))
        writer.add_layer_norm_rms_eps(config.rms_norm_eps)

    def gguf_tensor(self, hf_name: str, data: np.ndarray, config: Any) -> np.ndarray:
        # HF keeps each head's rotary dimensions as first half / second half; llama.cpp as interleaved pairs
        _, heads, kv_heads = self.shape(config)
        if hf_name.endswith("self_attn.q_proj.weight"):
            return _permute_rotary(data, heads)
        if hf_name.endswith("self_attn.k_proj.weight"):
            return _permute_rotary(data, kv_heads)
        return data


GPT2_ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh", "gelu", "gelu_fast")  # llama.cpp's gpt2 graph: tanh GELU
GPT2_CONV1D = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")


class GPT2(Family):
    def warnings(self, m: ModelConfig) -> list[str]:
        if m.activation in ("silu", "relu"):
            return [f"model.activation={m.activation}: the gpt2 design uses gelu_new (GELU)"]
        return []

    def hf_config(self, m: ModelConfig, vocab: int, common: dict[str, Any]) -> Any:
        from transformers import GPT2Config

        return GPT2Config(
            n_embd=m.hidden_size, n_layer=m.num_layers, n_head=m.num_attention_heads, n_inner=m.intermediate_size,
            n_positions=m.context_length, activation_function=m.activation,
            resid_pdrop=m.dropout, embd_pdrop=m.dropout, attn_pdrop=m.dropout, vocab_size=vocab, **common,
        )  # fmt: skip

    def parameter_breakdown(self, m: ModelConfig, vocab: int) -> dict[str, int]:
        h, ff = m.hidden_size, m.intermediate_size
        # ln_1, ln_2 (weight + bias); c_attn h->3h and c_proj h->h with biases; c_fc h->ff, c_proj ff->h with biases
        per_layer = 4 * h + (h * 3 * h + 3 * h) + (h * h + h) + (h * ff + ff) + (ff * h + h)
        return {
            "embeddings": vocab * h + m.context_length * h,
            "layers": m.num_layers * per_layer,
            "final_norm": 2 * h,
            "output_head": 0 if m.tie_word_embeddings else vocab * h,
        }

    def layer_activation_per_token(self, m: Shape, mixed: bool, math_path: bool) -> float:
        h, ff = m.hidden_size, m.intermediate_size
        per_token = (24 * h + 10 * ff) if mixed else (40 * h + 20 * ff)
        if mixed and m.dropout > 0:
            per_token += 6 * h  # dropout masks (residual and attention)
        return per_token

    def shape(self, config: Any) -> tuple[int, int, int]:
        return config.n_layer, config.n_head, config.n_head

    def gguf_hparams(self, writer: Any, config: Any) -> None:
        if config.activation_function not in GPT2_ACTIVATIONS:
            raise ForgeError(
                f"gpt2 with activation {config.activation_function!r} (model.activation): llama.cpp's gpt2 graph "
                "uses GELU; build the model with model.activation: gelu_new"
            )
        writer.add_context_length(config.n_positions)
        writer.add_embedding_length(config.n_embd)
        writer.add_block_count(config.n_layer)
        writer.add_feed_forward_length(config.n_inner or 4 * config.n_embd)
        writer.add_head_count(config.n_head)
        writer.add_layer_norm_eps(config.layer_norm_epsilon)

    def gguf_tensor(self, hf_name: str, data: np.ndarray, config: Any) -> np.ndarray:
        # GPT-2's Conv1D weights are stored input x output; llama.cpp (like nn.Linear) wants output x input
        return data.T if hf_name.endswith(GPT2_CONV1D) else data


# gpt2: 4x. llama: 8/3x rounded up to a multiple of 256 (Llama 1/2 land at 2.69-2.75x, Llama 3 uses 3.5x).
FAMILIES: dict[str, Family] = {
    "llama": Llama("llama", (8 / 3, 2.5, 3.5), 12),
    "gpt2": GPT2("gpt2", (4.0, 3.5, 4.5), 8),
}
assert set(FAMILIES) == set(ARCHITECTURES), "forge.config.ARCHITECTURES and FAMILIES must name the same families"


def family(name: str) -> Family:
    if name not in FAMILIES:
        raise ForgeError(f"architecture {name!r} is not supported; supported: {', '.join(FAMILIES)}")
    return FAMILIES[name]


def family_of(config: Any, where: str = "the model") -> Family:
    """The spec of a transformers config's family (its model_type), for Forge's own GGUF writer; a ForgeError naming
    `where` and the families that have a spec otherwise."""
    model_type = getattr(config, "model_type", None)
    if model_type not in FAMILIES:
        raise ForgeError(
            f"{where}: model_type {model_type!r} has no spec in models/families.py; those with one: "
            f"{', '.join(FAMILIES)} (LlamaForCausalLM-style models such as SmolLM, TinyLlama, Llama 2/3; GPT-2-style "
            "GPT2LMHeadModel)"
        )
    return FAMILIES[model_type]


def rope_theta(config: Any) -> float:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", None):
        raise ForgeError(f"rope_type={rope_type!r} is not supported (only plain rotary positions)")
    theta = params.get("rope_theta", getattr(config, "rope_theta", None))
    return float(theta if theta is not None else 10_000.0)


def _permute_rotary(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF rotary layout (first half / second half of each head) -> llama.cpp's (interleaved pairs)."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
