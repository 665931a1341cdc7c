"""The one typed config of a Forge run: the YAML schema, the `--set` override target and what is saved beside
every stage's output.

A run is described by one YAML file with a section per stage. Every section is a pydantic model that forbids
unknown keys, so a typo is an error that names the field instead of a silently ignored setting. Cross-field rules
(heads divide the hidden size, split ratios sum to one...) raise errors that name the field, the bad value and
what is allowed.

    cfg = load_config("configs/tiny-cpu.yaml", overrides=["train.lr=1e-3"])

Here: the training path's sections (tokenizer, model, train, qa, sft, plan), the whole run and its loading. The
data stage's sections live in forge/data_config.py (its quality rules in forge/quality_rules.py), those of what
happens to a trained model (eval, quantize, registry, serve) in forge/release_config.py; every name is imported
from here.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator

from forge import ForgeError
from forge.config_section import Section, refuse_gone
from forge.data_config import (  # noqa: F401 - re-exported: `from forge.config import DataConfig` is the way in
    BUILTIN_CORPUS,
    DATA_PROFILES,
    DataConfig,
    DedupConfig,
    QualityConfig,
)
from forge.release_config import EvalConfig, QuantizeConfig, RegistryConfig, ServeConfig

# ----------------------------------------------------------------------------------------------------------------
# tokenizer


class TokenizerConfig(Section):
    vocab_size: int = Field(8192, ge=300)  # above 256 byte tokens + specials
    min_frequency: int = Field(2, ge=1)
    # In this order (ids 0-3): pad, unk, bos, eos; extra tokens may follow. The EOS token also ends every
    # assistant turn of the chat template, because llama.cpp stops generating only on EOS.
    special_tokens: list[str] = ["[PAD]", "[UNK]", "[BOS]", "[EOS]"]
    # The system, user and assistant role tokens, in this order (the ids after special_tokens).
    chat_roles: list[str] = ["<|system|>", "<|user|>", "<|assistant|>"]
    max_tokens_per_word: float = 1.4  # above this the compression report warns
    # The BPE trainer sees a sample of train of about this many bytes of text: each document is in it or not by a
    # hash of its text, so the sample does not depend on the order or sharding of the files. Its memory grows with
    # the distinct words it sees (the tokenizers trainer runs out of memory on tens of GB); a vocabulary of 8-64k
    # tokens is settled by a few GB. None: all of train.
    train_sample_bytes: int | None = Field(2_000_000_000, ge=1_000_000)

    @model_validator(mode="before")
    @classmethod
    def _cap_replaced(cls, data: Any) -> Any:
        why = "replaced by tokenizer.train_sample_bytes (a hash-stable sample of train, not its first documents)"
        return refuse_gone(data, "tokenizer", {"max_train_docs": why})


# ----------------------------------------------------------------------------------------------------------------
# model


# What the config itself must know of each model family; models/families.py holds the rest of each family's spec.
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "llama": {"activation": "silu", "grouped_query_attention": True},
    "gpt2": {"activation": "gelu_new", "grouped_query_attention": False},
}


class ModelConfig(Section):
    init_from: str | None = Field(
        None,
        description="Continue training an existing model instead of a random one: a local Hugging Face model "
        "directory (config.json, model.safetensors, tokenizer files) or a .gguf file (dequantized on load). "
        "Nothing is downloaded. The model's shape, vocabulary and tokenizer are then the base's: the other model.* "
        "shape fields are ignored, except context_length, the training window (at most the base's own). "
        "Continued pretraining gets its own train.lr and train.warmup_steps defaults (see ForgeConfig).",
    )
    architecture: Literal["llama", "gpt2"] = "llama"
    vocab_size: int | None = Field(None, ge=1)  # None: the trained tokenizer's size
    hidden_size: int = Field(768, ge=1)
    num_layers: int = Field(12, ge=1)
    num_attention_heads: int = Field(12, ge=1)
    num_key_value_heads: int | None = Field(None, ge=1)  # llama only; None: same as attention heads (no GQA)
    intermediate_size: int = Field(3072, ge=1)
    context_length: int = Field(1024, ge=8)
    activation: Literal["silu", "gelu", "gelu_new", "relu"] = "silu"  # unset: gelu_new for gpt2, silu for llama
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    tie_word_embeddings: bool = True
    rope_theta: float = Field(10_000.0, gt=0)
    initializer_range: float = Field(0.02, gt=0)

    @model_validator(mode="after")
    def _shapes_fit(self) -> ModelConfig:
        if "activation" not in self.model_fields_set:  # unset: the architecture's own (gpt2 GELU, llama SwiGLU)
            self.__dict__["activation"] = ARCHITECTURES[self.architecture]["activation"]
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"model.num_attention_heads={self.num_attention_heads} does not divide "
                f"model.hidden_size={self.hidden_size}; pick one of {_divisors(self.hidden_size)}"
            )
        kv = self.num_key_value_heads
        if kv is not None:
            if not ARCHITECTURES[self.architecture]["grouped_query_attention"] and kv != self.num_attention_heads:
                raise ValueError(
                    f"model.num_key_value_heads={kv}: {self.architecture} has no grouped-query attention; remove "
                    "the key or use architecture: llama"
                )
            if self.num_attention_heads % kv:
                raise ValueError(
                    f"model.num_key_value_heads={kv} does not divide "
                    f"model.num_attention_heads={self.num_attention_heads}; "
                    f"pick one of {_divisors(self.num_attention_heads)}"
                )
        return self

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# ----------------------------------------------------------------------------------------------------------------
# training


class TrainConfig(Section):
    # How the process group shares the training state. Either way every process computes on its slice of the same
    # global batch, and either sharding reads the other's checkpoints, so a run may switch between them and resume:
    # the same run, not a new one (left out of the skip key, like the number of processes).
    EXECUTION_ONLY = frozenset({"sharding"})

    micro_batch_size: int = Field(8, ge=1)
    grad_accum_steps: int = Field(4, ge=1)
    max_steps: int = Field(10_000, ge=1)
    lr: float = Field(3e-4, gt=0)
    min_lr_ratio: float = Field(0.1, ge=0.0, le=1.0)  # cosine decays to lr * min_lr_ratio
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    warmup_steps: int = Field(2000, ge=0)
    weight_decay: float = Field(0.1, ge=0.0)
    beta1: float = Field(0.9, ge=0.0, lt=1.0)
    beta2: float = Field(0.95, ge=0.0, lt=1.0)
    grad_clip: float | None = Field(1.0, gt=0)
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"  # auto: bf16 on GPUs with it, fp16 on older, CPU fp32
    gradient_checkpointing: bool = False
    compile: bool = False
    checkpoint_every: int = Field(500, ge=1)
    keep_checkpoints: int = Field(3, ge=1)
    eval_every: int = Field(250, ge=1)
    eval_batches: int = Field(20, ge=1)  # val windows per evaluation: this many global batches (fixed windows)
    val_rise_patience: int = Field(3, ge=1)  # consecutive evals above the minimum that raise the red flag
    stop_on_val_rise: bool = False
    spike_zscore: float = Field(6.0, gt=0)
    spike_window: int = Field(100, ge=10)
    log_every: int = Field(10, ge=1)
    sharding: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description="ddp: every process holds the whole model, gradients and AdamW states (DDP through Accelerate). "
        "fsdp: each of N processes holds 1/N of them and gathers one decoder layer at a time (PyTorch FSDP2): "
        "the model that fits N GPUs, not one. `forge plan` estimates the memory per GPU of either.",
    )


# ----------------------------------------------------------------------------------------------------------------
# the domain Q&A set


class TeacherConfig(Section):
    """A model that writes Q&A pairs from the corpus's chunks (pretrain/qa/teacher.py); each pair is kept only when
    the chunk supports it."""

    EXECUTION_ONLY = frozenset({"api_key_env", "timeout_s", "parallel"})  # how it is reached, not what it writes

    model: str = Field(description="A local .gguf file (served by Forge's llama-server while the qa stage runs), or "
                       "the model's name at `url`.")  # fmt: skip
    url: str | None = Field(None, description="An OpenAI-compatible endpoint (http://host:8000/v1: vLLM, a server "
                            "you run); None: serve `model`, a local GGUF.")  # fmt: skip
    api_key_env: str = "FORGE_TEACHER_API_KEY"  # the environment variable holding the endpoint's key, if it needs one
    chunk_tokens: int = Field(512, ge=64)  # estimated tokens of text per request
    pairs_per_chunk: int = Field(3, ge=1, le=20)
    max_chunks: int = Field(200, ge=1)  # a stable sample of the corpus's chunks: what the teacher's time is spent on
    min_support: float = Field(0.8, gt=0.0, le=1.0)  # share of an answer's content words the chunk must hold
    temperature: float = Field(0.2, ge=0.0)
    max_tokens: int = Field(768, ge=16)
    context: int = Field(4096, ge=512)  # per slot, for a local GGUF
    parallel: int = Field(2, ge=1)  # requests in flight (llama-server slots for a local GGUF)
    timeout_s: float = Field(600.0, gt=0)


class QAConfig(Section):
    """`forge qa`: the Q&A pairs SFT trains on and evaluation scores (see pretrain/qa/)."""

    source: str = Field(
        "auto",
        description="Where the pairs come from. corpus: extracted from the structure of the data stage's documents "
        "(headings, definition lists, option tables, synopses), held-out pairs from val/test documents only. "
        f"builtin: the embedded corpus's own set (only with data.inputs=[{BUILTIN_CORPUS}]). A PATH: your JSONL of "
        "{question, answer} or {messages} lines, which always wins. auto: builtin for the embedded corpus, else "
        "corpus.",
    )
    # With qa.source=corpus, also mine pairs from the documents' running text (definitions, purposes, procedures,
    # conditions; pretrain/qa/prose.py), so plain prose without headings gives a Q&A set too.
    prose: bool = True
    # A teacher model that also writes pairs from chunks of the corpus, each kept only where its chunk supports it.
    teacher: TeacherConfig | None = None
    # Objects (builtin) or questions (a JSONL file) held out for `forge eval`, by a stable hash; the builtin set also
    # holds out every object whose docstring the data stage put in val or test. Corpus pairs are held out exactly
    # when their document is in val or test, whatever this is.
    eval_fraction: float = Field(0.05, ge=0.0, lt=1.0)
    # With qa.source=corpus: the train pairs kept at most, from a sample of the train documents chosen by a hash of
    # their ids (the documents of lowest hash whose pairs fit), so a corpus of millions of documents is read in
    # bounded memory and the rest are not parsed. SFT trains on 10^4-10^5 pairs; held-out documents are all used.
    max_train_pairs: int | None = Field(200_000, ge=1)

    @model_validator(mode="after")
    def _known_source(self) -> QAConfig:
        if not self.source.strip():
            raise ValueError("qa.source is empty: use auto, corpus, builtin or the path of a JSONL file")
        return self


# ----------------------------------------------------------------------------------------------------------------
# supervised fine-tuning


class SFTConfig(Section):
    base_model: str | None = None  # an HF model directory; None: this run's runs/<run>/pretrain/model
    max_examples: int | None = Field(None, ge=1)  # cap the training examples (a seeded sample); None: all
    mode: Literal["full", "lora", "qlora"] = "lora"  # qlora: 4-bit NF4 base (bitsandbytes) + LoRA, the memory saver
    lora_r: int = Field(16, ge=1)
    lora_alpha: int = Field(32, ge=1)
    lora_dropout: float = Field(0.05, ge=0.0, lt=1.0)
    lora_target_modules: list[str] | Literal["all-linear"] = "all-linear"
    lr: float = Field(2e-4, gt=0)
    epochs: float = Field(3.0, gt=0)
    max_steps: int = -1  # > 0 overrides epochs
    micro_batch_size: int = Field(8, ge=1)
    grad_accum_steps: int = Field(1, ge=1)
    max_seq_length: int = Field(512, ge=16)
    warmup_ratio: float = Field(0.03, ge=0.0, lt=1.0)
    system_prompt: str | None = None
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"  # auto: bf16 on GPUs with it, fp16 on older, CPU fp32
    gradient_checkpointing: bool = False  # saves activation memory on big models at ~30% more compute
    log_every: int = Field(10, ge=1)  # steps between loss logs (MLflow)

    @model_validator(mode="before")
    @classmethod
    def _data_moved(cls, data: Any) -> Any:
        # The Q&A set became a stage of its own (`forge qa`), which SFT and eval both read.
        why = "the setting moved to {} (forge qa builds the Q&A set that sft and eval read); use --set {}=... instead"
        return refuse_gone(data, "sft", {old: why.format(new, new) for old, new in
                                         (("data", "qa.source"), ("eval_fraction", "qa.eval_fraction"))})  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------
# planning


class PlanConfig(Section):
    hardware: str = "cpu"  # a known profile (see `forge plan --help`) or "custom"
    num_gpus: int = Field(1, ge=1)  # the GPUs the plan spreads train.sharding over (ddp or fsdp)
    memory_gb: float | None = Field(None, gt=0)  # custom profile
    peak_tflops: float | None = Field(None, gt=0)  # custom profile
    mfu: float = Field(0.4, gt=0, le=1)
    target_tokens: int | None = None  # None: max_steps x global batch x context

    @model_validator(mode="before")
    @classmethod
    def _sharding_moved(cls, data: Any) -> Any:
        # plan.sharding was the plan's own what-if; the plan now estimates what `forge pretrain` runs
        why = "the setting moved to train.sharding (what forge pretrain runs and forge plan estimates); use --set " \
              "train.sharding=... instead"  # fmt: skip
        return refuse_gone(data, "plan", {"sharding": why})


# ----------------------------------------------------------------------------------------------------------------
# the whole run


class ForgeConfig(Section):
    run_name: str = Field("default", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    seed: int = 1337
    plan: PlanConfig = PlanConfig()
    data: DataConfig = DataConfig()
    qa: QAConfig = QAConfig()
    tokenizer: TokenizerConfig = TokenizerConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    sft: SFTConfig = SFTConfig()
    eval: EvalConfig = EvalConfig()
    quantize: QuantizeConfig = QuantizeConfig()
    registry: RegistryConfig = RegistryConfig()
    serve: ServeConfig = ServeConfig()

    # Continued pretraining of an existing model (model.init_from), unless train.lr / train.warmup_steps are set:
    # a learning rate a third of the from-scratch default, near where a pretrained model's own schedule ended,
    # which adapts it to the domain with less forgetting than re-warming to a from-scratch peak (Ibrahim et al.
    # 2024, "Simple and scalable strategies to continually pre-train LLMs"); and a short warmup, 1% of the steps,
    # since AdamW's moments start empty but the weights are already trained (no long warmup from random init).
    CONTINUED_LR: ClassVar[float] = 1e-4
    CONTINUED_WARMUP_FRACTION: ClassVar[float] = 0.01

    @model_validator(mode="after")
    def _continued_pretraining_defaults(self) -> ForgeConfig:
        if self.model.init_from is not None:
            if "lr" not in self.train.model_fields_set:
                self.train.__dict__["lr"] = self.CONTINUED_LR
            if "warmup_steps" not in self.train.model_fields_set:
                self.train.__dict__["warmup_steps"] = max(1, int(self.train.max_steps * self.CONTINUED_WARMUP_FRACTION))
        return self

    def settings(self, *names: str) -> dict[str, Any]:
        """The named sections ("sft", less their execution-only fields) or single fields ("sft.system_prompt")."""
        out: dict[str, Any] = {}
        for name in names:
            section_name, _, field_name = name.partition(".")
            section = getattr(self, section_name)
            if field_name:
                out[name] = section.model_dump(mode="json", include={field_name})[field_name]
            else:
                out[name] = section.model_dump(mode="json", exclude=set(section.EXECUTION_ONLY))
        return out

    def section_hash(self, *sections: str) -> str:
        """sha256 of the named settings (plus the seed), the config part of a stage's skip key."""
        payload = {**self.settings(*sections), "seed": self.seed}
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


# ----------------------------------------------------------------------------------------------------------------
# loading, overrides and error messages


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> ForgeConfig:
    """Read a YAML run config, apply `a.b.c=value` overrides, validate. Raises ForgeError with every problem."""
    raw: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        path = Path(path)
        source = str(path)
        if not path.is_file():
            raise ForgeError(f"config file {path} not found; pass --config with one of: {_shipped_configs()}")
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f":{mark.line + 1}" if mark else ""
            raise ForgeError(f"config file {path}{where} is not valid YAML: {getattr(exc, 'problem', exc)}") from None
        if not isinstance(raw, dict):
            raise ForgeError(f"config file {path} must be a mapping of sections (data:, model:, ...)")
    for item in overrides or []:
        _apply_override(raw, item)
    try:
        return ForgeConfig.model_validate(raw)
    except ValidationError as exc:
        raise ForgeError(f"invalid config ({source}): " + "; ".join(format_validation_errors(exc))) from None


def _apply_override(raw: dict[str, Any], item: str) -> None:
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise ForgeError(f"--set {item!r}: expected KEY=VALUE, e.g. --set train.lr=1e-3")
    node = raw
    parts = key.strip().split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ForgeError(f"--set {item!r}: {part} is a value, not a section")
        node = child
    node[parts[-1]] = yaml.safe_load(value) if value.strip() else None


def format_validation_errors(exc: ValidationError) -> list[str]:
    """One readable line per problem: the dotted field, the bad value and what is allowed."""
    lines = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            parent = err["loc"][:-1]
            lines.append(f"unknown key {field} (allowed: {', '.join(_allowed_keys(parent))})")
            continue
        message = err["msg"].removeprefix("Value error, ")
        if field and field.split(".")[-1] not in message:
            message = f"{field}={err.get('input')!r}: {message}"
        lines.append(message)
    return lines


def _allowed_keys(loc: tuple[Any, ...]) -> list[str]:
    model: type[BaseModel] = ForgeConfig
    for part in loc:
        annotation = model.model_fields[str(part)].annotation
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return list(model.model_fields)


def _shipped_configs() -> str:
    root = Path(__file__).resolve().parent.parent / "configs"
    return ", ".join(sorted(str(p.relative_to(root.parent)) for p in root.glob("*.yaml"))) or "(none found)"
