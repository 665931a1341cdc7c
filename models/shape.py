"""What Forge reads off an existing model of any family: whether transformers can run it without its own code, its
parameters by part, its sizes and its repeated blocks.

    check_causal_lm(config_dict, where)   refuse what transformers cannot run as a causal LM without remote code
    shape = read_shape(hf_config)         a ModelShape: the plan's and pretrain's view of a base model
    shape.parts                           parameters by part, counted on a meta-device instance (nothing allocated)
    decoder_layers(model)                 the blocks named by the model's `_no_split_modules` (FSDP units)

A base (`model.init_from`) of any family is read this way, llama and gpt2 bases included; the hand-written specs of
models/families.py serve only the models Forge builds from scratch, where there is no model yet to read. What a
ModelShape cannot give is the activation memory of a layer: the plan applies the measured per-layer formula of
llama or gpt2 (pretrain/memory.py), and says so.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from forge import ForgeError
from forge.config import ModelConfig

COUNTED = "counted on the model (meta device)"
FORMULA = "formula (models/families.py)"
# Families people fine-tune, named first in the one line that says what is supported.
WELL_KNOWN = ("llama", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3", "mistral", "olmo2", "gpt2")


def causal_lm_types() -> dict[str, str]:
    """model_type -> the class AutoModelForCausalLM builds, for every decoder-only family this transformers ships.
    Encoders with an LM head (bert...) and the decoder halves of encoder-decoders (bart...) are in transformers'
    causal-LM table too, but are no base to continue: they are left out."""
    from transformers.models.auto import modeling_auto as auto

    not_decoders = {*auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES, *auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
                    *auto.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES}  # fmt: skip
    return {k: v for k, v in auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items() if k not in not_decoders}


def supported() -> str:
    """What model.init_from accepts, in one line."""
    import transformers

    types = causal_lm_types()
    others = len(types) - len(WELL_KNOWN)
    return (f"every decoder-only causal LM transformers {transformers.__version__} ships ({', '.join(WELL_KNOWN)} "
            f"and {others} more: transformers' MODEL_FOR_CAUSAL_LM_MAPPING_NAMES), except those that need "
            "trust_remote_code")  # fmt: skip


def check_causal_lm(config: dict[str, Any], where: str) -> None:
    """Refuse, in one line naming the family and what is supported, a config.json that transformers cannot run as
    a causal LM with its own code. A config with `auto_map` whose model_type transformers ships runs transformers'
    class (trust_remote_code stays off), as the published Phi-3 configs do."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    model_type = config.get("model_type")
    if model_type not in CONFIG_MAPPING_NAMES:
        why = "its code comes with the model (auto_map: trust_remote_code, never run here)" if config.get(
            "auto_map") else "transformers does not know it"  # fmt: skip
        raise ForgeError(f"{where}: model_type {model_type!r}: {why}; supported: {supported()}")
    if model_type not in causal_lm_types():
        raise ForgeError(
            f"{where}: model_type {model_type!r} is not a decoder-only causal LM; supported: {supported()}"
        )


@dataclass(frozen=True, eq=False)
class ModelShape:
    """A base model's shape, read off the model: the fields of forge.config.ModelConfig the plan and pretrain read,
    and its parameters by part."""

    architecture: str  # the transformers model_type (qwen3, gemma3_text...)
    model_class: str  # what AutoModelForCausalLM builds (Qwen3ForCausalLM)
    config: Any  # the transformers config
    vocab_size: int  # embedding rows (a base may have more than its tokenizer has tokens)
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    context_length: int  # the training window: at most the base's own
    dropout: float
    tie_word_embeddings: bool
    parts: dict[str, int]  # embeddings, layers, final_norm (every other weight), output_head
    blocks: tuple[str, ...]  # the classes of `_no_split_modules`: FSDP units, checkpointed layers
    parameters_source: str = COUNTED

    def model_copy(self, update: dict[str, Any]) -> ModelShape:
        """A copy with `update` (ModelConfig's spelling, so either shape reads alike)."""
        return replace(self, **update)


Shape = ModelConfig | ModelShape  # what a run trains: a config from scratch, or a base read off its model


def read_shape(config: Any) -> ModelShape:
    """The shape of a transformers config's model, its parameters counted on a meta-device instance (kept: the plan
    asks several times, and a 7B model takes a second or two to build even on the meta device)."""
    key = config.to_json_string(use_diff=False)
    if key not in _SHAPES:
        _SHAPES[key] = _count_on_meta(config)
    return _SHAPES[key]


_SHAPES: dict[str, ModelShape] = {}


def _count_on_meta(config: Any) -> ModelShape:
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    embed = model.get_input_embeddings()
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is embed.weight
    text = config.get_text_config()
    hidden, heads = embed.embedding_dim, getattr(text, "num_attention_heads", None) or 1
    return ModelShape(
        architecture=config.model_type, model_class=type(model).__name__, config=config,
        vocab_size=embed.num_embeddings, hidden_size=hidden, num_layers=len(decoder_layers(model)),
        num_attention_heads=heads, num_key_value_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=getattr(text, "head_dim", None) or hidden // heads,
        intermediate_size=getattr(text, "intermediate_size", None) or getattr(text, "n_inner", None) or 4 * hidden,
        context_length=context_length(config), dropout=float(getattr(text, "attention_dropout", 0.0) or 0.0),
        tie_word_embeddings=tied, parts=parameters_by_part(model), blocks=tuple(model._no_split_modules or ()),
    )  # fmt: skip


def context_length(config: Any) -> int:
    """The longest sequence the model was built for (max_position_embeddings; gpt2's n_positions maps onto it)."""
    length = getattr(config.get_text_config(), "max_position_embeddings", None)
    if not length:
        raise ForgeError(f"{config.model_type}: the config names no max_position_embeddings (no context length)")
    return int(length)


def parameters_by_part(model: Any) -> dict[str, int]:
    """Unique parameters (a tied head once) by part: the input embeddings and any other embedding table outside
    the blocks (learned positions), the blocks, an untied output head, and every other weight (the final norm)."""
    import torch

    seen: set[int] = set()

    def count(params: Any) -> int:
        new = [p for p in params if id(p) not in seen]
        seen.update(id(p) for p in new)
        return sum(p.numel() for p in new)

    layers = sum(count(block.parameters()) for block in decoder_layers(model))
    tables = [m for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    embeddings = sum(count(m.parameters()) for m in [model.get_input_embeddings(), *tables])
    head = model.get_output_embeddings()
    output_head = count(head.parameters()) if head is not None else 0
    return {"embeddings": embeddings, "layers": layers, "final_norm": count(model.parameters()),
            "output_head": output_head}  # fmt: skip


def decoder_layers(model: Any) -> list[Any]:
    """The repeated blocks of a transformers model (a peft wrapper is looked through): the outermost modules whose
    class the model names in `_no_split_modules`, in order. Each is one FSDP unit, as Accelerate's FSDP wraps them."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(inner, "_no_split_modules", None) or ())
    blocks: dict[str, Any] = {}  # by module path: a block's own submodules are not blocks
    for path, module in inner.named_modules():
        if type(module).__name__ in names and not any(path.startswith(f"{outer}.") for outer in blocks):
            blocks[path] = module
    if not blocks:
        raise ForgeError(
            f"{type(inner).__name__}: no module of the classes its _no_split_modules names ({sorted(names) or 'none'})"
            ": Forge takes a model's layers there (the plan's layer count, FSDP's units), so it cannot plan or train it"
        )
    return list(blocks.values())
