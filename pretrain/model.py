"""The model: a `ModelConfig` becomes a Hugging Face transformers model, so vLLM, llama.cpp and lm-eval load the
checkpoints with no conversion. What differs between the families (llama, gpt2) is in models/families.py.

    warnings = validate(cfg.model, vocab_size=tokenizer_size)   # errors raise ForgeError, the rest are returned
    n = count_parameters(cfg.model, vocab_size)                 # exact, without building anything
    model = build_model(cfg.model, vocab_size)                  # random init; device="meta" allocates nothing
    m = model_config(cfg)          # the shape the run trains: cfg.model, or a base's ModelShape (models/shape.py)

Special tokens follow the tokenizer stage: [PAD]=0, [UNK]=1, [BOS]=2, [EOS]=3.
"""

from __future__ import annotations

from typing import Any

from forge import ForgeError
from forge.config import ForgeConfig, ModelConfig
from models.families import QUANT_BLOCK, family
from models.shape import FORMULA, ModelShape, Shape

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3

GOOD_HEAD_DIMS = (64, 128)  # what fused attention kernels and most inference engines are tuned for


def model_config(cfg: ForgeConfig) -> Shape:
    """The shape the run trains: `cfg.model`, or with model.init_from the base's, read off the model (a meta-device
    instance of its config.json or GGUF metadata), with model.context_length as the training window when it is
    below the base's own."""
    if cfg.model.init_from is None:
        return cfg.model
    from models.base import open_base

    window = cfg.model.context_length if "context_length" in cfg.model.model_fields_set else None
    return open_base(cfg.model.init_from).model_shape(window)


def resolve_vocab(model_cfg: ModelConfig, vocab_size: int | None = None) -> int:
    """The vocabulary size to build with: the tokenizer's, checked against `model.vocab_size` when both exist."""
    if vocab_size is not None and model_cfg.vocab_size is not None and vocab_size != model_cfg.vocab_size:
        raise ForgeError(
            f"model.vocab_size={model_cfg.vocab_size} does not match the tokenizer's vocabulary of {vocab_size}; "
            f"set model.vocab_size={vocab_size} or remove it (the tokenizer's size is then used)"
        )
    size = vocab_size if vocab_size is not None else model_cfg.vocab_size
    if size is None:
        raise ForgeError(
            "model.vocab_size is not set and no tokenizer size was given; set model.vocab_size or train the "
            "tokenizer first (forge tokenizer)"
        )
    if size < 4:
        raise ForgeError(f"vocab_size={size} cannot hold the 4 special tokens [PAD] [UNK] [BOS] [EOS]; use >= 300")
    return size


def validate(model_cfg: Shape, vocab_size: int | None = None) -> list[str]:
    """Check a model config against the tokenizer and the conventions; raise ForgeError on what cannot work.

    Shape errors (heads not dividing the hidden size, negative sizes...) are already refused when the config is
    loaded; this adds the vocabulary check and returns warnings for what works but costs speed or quality. A base's
    shape is what it is: nothing to advise on.
    """
    if isinstance(model_cfg, ModelShape):
        return []
    vocab = resolve_vocab(model_cfg, vocab_size) if (vocab_size or model_cfg.vocab_size) else None
    m = model_cfg
    warnings = []
    if m.head_dim not in GOOD_HEAD_DIMS:
        good = [f"{m.hidden_size // d} ({d})" for d in GOOD_HEAD_DIMS if m.hidden_size % d == 0] or ["none fit"]
        warnings.append(
            f"model.num_attention_heads={m.num_attention_heads} gives head dim {m.head_dim}; 64 or 128 is what fused "
            f"attention kernels are tuned for: heads (head dim) {', '.join(good)}"
        )
    fam = family(m.architecture)
    rule, low, high = fam.ffn_rule
    ratio = m.intermediate_size / m.hidden_size
    if not low <= ratio <= high:
        suggested = _round_up(int(rule * m.hidden_size), QUANT_BLOCK)
        warnings.append(
            f"model.intermediate_size={m.intermediate_size} is {ratio:.2f}x the hidden size; {m.architecture} uses "
            f"about {rule:.3g}x (e.g. {suggested})"
        )
    for name in ("hidden_size", "intermediate_size"):
        value = getattr(m, name)
        if value % QUANT_BLOCK:
            warnings.append(
                f"model.{name}={value} is not a multiple of {QUANT_BLOCK}: llama.cpp K-quants (Q4_K_M) fall back to "
                f"other types for these tensors; use {_round_up(value, QUANT_BLOCK)} or "
                f"{max(QUANT_BLOCK, value // QUANT_BLOCK * QUANT_BLOCK)}"
            )
    warnings += fam.warnings(m)
    if vocab is not None and vocab % 64:
        warnings.append(f"vocabulary size {vocab} is not a multiple of 64: the output layer's matmuls run slower")
    return warnings


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def hf_config(
    model_cfg: ModelConfig,
    vocab_size: int | None = None,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
    pad_id: int = PAD_ID,
) -> Any:
    """The transformers config (LlamaConfig or GPT2Config) for a Forge model config."""
    m = model_cfg
    vocab = resolve_vocab(m, vocab_size)
    common = dict(
        bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id, tie_word_embeddings=m.tie_word_embeddings,
        initializer_range=m.initializer_range, use_cache=True,
    )  # fmt: skip
    return family(m.architecture).hf_config(m, vocab, common)


def build_model(
    model_cfg: Shape,
    vocab_size: int | None = None,
    device: Any = None,
    attn_implementation: str = "sdpa",
    **token_ids: int,
) -> Any:
    """A randomly initialised causal LM (of a base's shape: its config, random weights). `device="meta"` builds the
    structure without allocating any weights."""
    import torch
    from transformers import AutoModelForCausalLM

    config = model_cfg.config if isinstance(model_cfg, ModelShape) else hf_config(model_cfg, vocab_size, **token_ids)
    with torch.device(device or "cpu"):
        return AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)


def count_parameters(model_cfg: Shape, vocab_size: int | None = None) -> int:
    """The exact number of trainable parameters of `build_model`, from the config alone (tied weights once)."""
    return sum(parameter_breakdown(model_cfg, vocab_size).values())


def parameter_breakdown(model_cfg: Shape, vocab_size: int | None = None) -> dict[str, int]:
    """Parameters by part: embeddings (token + learned positions), transformer layers, final norm (with a base:
    every other weight), output head. A base's were counted on the model, for its own embedding rows (`vocab_size`
    is not used: the tokenizer of a base never resizes it)."""
    if isinstance(model_cfg, ModelShape):
        return dict(model_cfg.parts)
    return family(model_cfg.architecture).parameter_breakdown(model_cfg, resolve_vocab(model_cfg, vocab_size))


def parameters_source(model_cfg: Shape) -> str:
    """Where the parameter counts come from: counted on a base's model, or the family's formula."""
    return model_cfg.parameters_source if isinstance(model_cfg, ModelShape) else FORMULA
