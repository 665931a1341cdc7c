"""The one typed config of a Forge run: the YAML schema, the `--set` override target and what is saved beside
every stage's output.

A run is described by one YAML file with a section per stage. Every section is a pydantic model that forbids
unknown keys, so a typo is an error that names the field instead of a silently ignored setting. Cross-field rules
(heads divide the hidden size, split ratios sum to one...) raise errors that name the field, the bad value and
what is allowed.

    cfg = load_config("configs/tiny-cpu.yaml", overrides=["train.lr=1e-3"])
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from forge import ForgeError

BUILTIN_CORPUS = "builtin:python-stdlib"


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    # Fields that change how a stage runs but not what it produces (worker counts, executors): left out of the skip
    # key, so moving a run to more cores or to a cluster does not redo finished work.
    EXECUTION_ONLY: ClassVar[frozenset[str]] = frozenset()


def refuse_gone(data: Any, section: str, gone: dict[str, str]) -> Any:
    """A setting a config may still carry that no longer exists: an error naming it, its value and where it went."""
    for old, why in gone.items():
        if isinstance(data, dict) and old in data:
            raise ValueError(f"{section}.{old}={data[old]!r}: {why}")
    return data


# ----------------------------------------------------------------------------------------------------------------
# data


# The cleaning profiles: named sets of thresholds, one table. `data.profile` picks one; any setting given explicitly
# (data.quality.min_words: 10, --set data.min_language_score=0.5) overrides its profile's value.
#   web:  crawled web pages, the rules as published (datatrove's Gopher, C4 and FineWeb defaults, fastText's 0.65
#         language score as in FineWeb/RefinedWeb) measured on the whole document; HTML extraction favours
#         precision (drops more chrome).
#   docs: curated domain text (manuals, reference pages, legal or medical text, books, any language): the same
#         rules measured on the prose only (code, listings, option lists and tables set aside), so they mean what
#         they were fit for; HTML extraction favours recall (keeps definition lists and option tables).
DATA_PROFILES: dict[str, dict[str, Any]] = {
    "web": {
        "html_extraction_favor": "precision",
        "boilerplate_min_line_words": 3,  # C4: lines of fewer than 3 words are menus and buttons
        "min_language_score": 0.65,
        "quality.measure_on": "text",
        "quality.min_words": 50,
        "quality.max_words": 100_000,
        "quality.min_mean_word_length": 3.0,
        "quality.max_mean_word_length": 10.0,
        "quality.max_symbol_word_ratio": 0.1,
        "quality.max_bullet_lines_ratio": 0.9,
        "quality.max_ellipsis_lines_ratio": 0.3,
        "quality.min_alpha_words_ratio": 0.8,
        "quality.min_stop_words": 2,
        "quality.max_duplicate_lines_ratio": 0.3,
        "quality.max_duplicate_paragraphs_ratio": 0.3,
        "quality.max_duplicate_line_chars_ratio": 0.2,
        "quality.max_duplicate_paragraph_chars_ratio": 0.2,
        "quality.max_top_ngram_chars_ratio": {2: 0.20, 3: 0.18, 4: 0.16},
        "quality.max_dup_ngram_chars_ratio": {5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12, 9: 0.11, 10: 0.10},
        "quality.c4_min_sentences": 5,
        "quality.fineweb_min_punct_lines_ratio": 0.12,
        "quality.fineweb_max_short_lines_ratio": 0.67,
        "quality.fineweb_max_dup_line_chars_ratio": 0.01,
        "quality.fineweb_max_newlines_per_word": 0.3,
    },
}
DATA_PROFILES["docs"] = {
    **DATA_PROFILES["web"],
    "html_extraction_favor": "recall",
    # Headings, list items and option names are short lines of real content; recurring chrome is still caught by
    # the recurring-line rule.
    "boilerplate_min_line_words": 0,
    "quality.measure_on": "prose",
    # Curated reference entries (a constant, a glossary term) are short by design; a page with less prose than
    # this is a stub, a redirect or navigation.
    "quality.min_words": 20,
    "quality.max_words": 1_000_000,  # a book, or a whole manual in one file
    # List items are how reference pages give options and constants (navigation link lists have no prose at all).
    "quality.max_bullet_lines_ratio": 1.0,
    # Reference text is templated (every directive or function described in the same frame): twice Gopher's
    # shares of repeated n-grams; generated spam repeats far more.
    "quality.max_dup_ngram_chars_ratio": {5: 0.30, 6: 0.28, 7: 0.26, 8: 0.24, 9: 0.22, 10: 0.20},
    "quality.c4_min_sentences": 1,  # C4's 5 is a web-page length rule; a short entry states what it needs in one
    # FineWeb's 1% targets crawl chrome repeated within a page (removed here before, by the recurring-line rule);
    # a note repeated under each entry of a manual is content.
    "quality.fineweb_max_dup_line_chars_ratio": 0.1,
}


class QualityConfig(Section):
    """Document quality heuristics (Gopher quality + repetition, C4, FineWeb), see pretrain/data/filters.py.

    Unset values come from `data.profile` (DATA_PROFILES); read the data report's calibration section to see
    what each rule removed from your corpus and which setting to change.
    """

    enabled: bool = True
    # What the rules measure: "prose" (lines of running text; code blocks, listings, option lists and table
    # scaffolding set aside) or "text" (the whole document, as the rules were published).
    measure_on: Literal["prose", "text"] | None = None
    min_words: int | None = Field(None, ge=0)
    max_words: int | None = Field(None, ge=1)
    min_mean_word_length: float | None = None
    max_mean_word_length: float | None = None
    max_symbol_word_ratio: float | None = None
    max_bullet_lines_ratio: float | None = None
    max_ellipsis_lines_ratio: float | None = None
    min_alpha_words_ratio: float | None = None
    min_stop_words: int | None = None
    max_duplicate_lines_ratio: float | None = None
    max_duplicate_paragraphs_ratio: float | None = None
    max_duplicate_line_chars_ratio: float | None = None
    max_duplicate_paragraph_chars_ratio: float | None = None
    max_top_ngram_chars_ratio: dict[int, float] | None = None
    max_dup_ngram_chars_ratio: dict[int, float] | None = None
    c4_drop_lorem_ipsum: bool = True
    c4_drop_curly_brace: bool = False  # C4 drops docs with "{": wrong for code and technical domains
    c4_min_sentences: int | None = None
    fineweb_min_punct_lines_ratio: float | None = None
    fineweb_max_short_lines_ratio: float | None = None
    fineweb_max_dup_line_chars_ratio: float | None = None
    fineweb_max_newlines_per_word: float | None = None


class DedupConfig(Section):
    """Exact + MinHash near-duplicate removal at document level, then paragraph dedup.

    LSH uses explicit bands x rows: datasketch's threshold-derived default (9x13 at t=0.8) catches only ~40% of
    pairs at J=0.8. Candidates are verified against `jaccard_threshold` before they are merged.
    """

    exact: bool = True
    near: bool = True
    ngram: int = Field(5, ge=1)
    bands: int = Field(14, ge=1)
    rows: int = Field(8, ge=1)
    jaccard_threshold: float = Field(0.8, ge=0.0, le=1.0)
    paragraph: bool = True
    min_paragraph_chars: int = Field(50, ge=1)
    decontaminate: bool = True  # drop train documents that near-duplicate a val/test document


class DataConfig(Section):
    EXECUTION_ONLY = frozenset({"workers", "executor", "ray_address"})  # the same documents come out either way

    inputs: list[str] = [BUILTIN_CORPUS]
    text_field: str = "text"  # the text column of .jsonl / .parquet inputs
    # The cleaning thresholds' defaults (DATA_PROFILES): docs for curated domain text, web for crawled pages.
    profile: Literal["docs", "web"] = "docs"
    # Split ratios by a stable hash of the document id. val and test each also get at least min_eval_tokens
    # (estimated as words x 1.3 on the text as read, before any cleaning) if the ratio gives fewer, up to
    # max_eval_fraction of the corpus each: see pretrain/data/splits.py.
    split: dict[Literal["train", "val", "test"], float] = {"train": 0.98, "val": 0.01, "test": 0.01}
    # What the gate's evidence needs with room: its 30 items (registry min_items) of bits per byte at up to
    # eval.text_item_tokens (512) each are ~15k tokens of test text; val's loss curve needs no more.
    min_eval_tokens: int = Field(20_000, ge=0)
    # A document of more estimated tokens than this is cut into sections (by its headings, else at paragraphs)
    # before the split is assigned, so one long PDF or a manual of a few chapters still gives val and test their
    # share; each section is a document from then on (pretrain/data/sections.py). 0: never cut.
    max_section_tokens: int = Field(2048, ge=0)
    # The evaluation's minimum is absolute (an interval over 30 items needs the text whatever the corpus), so a
    # small corpus gives it a larger share: one 250-page manual (~150k estimated tokens as read) needs a fifth to
    # a quarter of itself for val and test each once cleaning has taken its contents pages and untranslated parts.
    max_eval_fraction: float = Field(0.25, gt=0.0, lt=0.5)
    html_extraction: bool = True
    html_extraction_favor: Literal["precision", "recall"] | None = None  # trafilatura's trade-off; None: profile
    boilerplate: bool = True
    boilerplate_min_doc_fraction: float = Field(0.05, gt=0.0, le=1.0)  # a line in >= this share of docs is boilerplate
    boilerplate_min_docs: int = Field(5, ge=2)
    # Lines of fewer words than this are dropped (C4: menus, buttons, stray labels); 0 keeps short lines, which
    # headings, list items and code-like lines of curated text need. None: the profile's.
    boilerplate_min_line_words: int | None = Field(None, ge=0)
    language: bool = True
    languages: list[str] = ["en"]  # ISO 639-1 codes as fastText's lid.176 names them (en, de, fr, pt, zh...)
    min_language_score: float | None = Field(None, ge=0.0, le=1.0)
    # A document with fewer prose words than this is not judged by the language rule (too little to tell).
    language_min_words: int = Field(20, ge=1)
    quality: QualityConfig = Field(default_factory=QualityConfig)
    # The calibration (pretrain/data/calibrate.py) flags any rule that alone would drop more than this share of
    # the train split's documents, with examples and the setting to change.
    calibration_max_drop_share: float = Field(0.1, gt=0.0, le=1.0)
    dedup: DedupConfig = Field(default_factory=DedupConfig)
    date_field: str = "date"
    date_before: str | None = None  # ISO date: keep only documents dated before it
    max_doc_bytes: int = Field(10_000_000, ge=1)
    shard_docs: int = Field(50_000, ge=1)
    workers: int = Field(0, ge=0)  # 0: one per core
    executor: Literal["local", "ray"] = Field(
        "local",
        description="Where the per-record passes and LSH banding run: this machine's process pool (local) or Ray "
        "Data (ray: a cluster at data.ray_address, or a local Ray instance of data.workers CPUs). Same output.",
    )
    ray_address: str | None = Field(
        None,
        description="The Ray cluster to connect to (ray://host:10001 or host:6379, as ray.init takes it); None: "
        "start a local Ray instance for this run. Only read with data.executor=ray.",
    )

    @model_validator(mode="after")
    def _split_sums_to_one(self) -> DataConfig:
        total = sum(self.split.values())
        if abs(total - 1.0) > 1e-6 or set(self.split) != {"train", "val", "test"}:
            raise ValueError(
                f"data.split={self.split} must give train, val and test ratios summing to 1 (they sum to {total:g})"
            )
        if min(self.split.values()) <= 0:
            raise ValueError(f"data.split={self.split}: every ratio must be > 0 (val and test must not be empty)")
        return self

    @model_validator(mode="after")
    def _profile_fills_unset(self) -> DataConfig:
        # Written into __dict__ (not assigned) so they stay "unset": changing data.profile later refills them.
        for dotted, value in DATA_PROFILES[self.profile].items():
            section, _, name = dotted.rpartition(".")
            target = self.quality if section == "quality" else self
            if name not in target.model_fields_set:
                target.__dict__[name] = copy.deepcopy(value)
        return self


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
    max_train_docs: int | None = None  # cap the docs the BPE trainer sees (None: all of train)


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
    # global batch, and checkpoints and the export hold whole tensors, so a run may switch between them and resume:
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
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"  # auto: bf16 on GPUs that have it, else fp32
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
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"  # auto: bf16 on GPUs that have it, else fp32
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
# evaluation


class EvalConfig(Section):
    """`forge eval`: bits per byte, domain tasks, generations and the red flags' thresholds (see evaluation/)."""

    ppl_window: int | None = None  # tokens; None: each model's own context length
    ppl_stride: int | None = None  # None: half the window
    # Bits per byte is scored on items of test text: every test document cut into pieces of at most text_item_bytes
    # (at a paragraph, line or word), text_items of them drawn by a stable hash of their text. Every model reads the
    # same pieces through its own tokenizer, so two evaluations pair up item by item; the gate's bits-per-byte rules
    # need registry min_items (30) of them, and a few long documents give as many as many short ones.
    text_items: int = Field(200, ge=1)
    text_item_bytes: int = Field(1024, ge=64)
    qa_max_examples: int = Field(200, ge=1)  # held-out Q&A pairs answered by generation (the slow part)
    mc_max_examples: int = Field(1000, ge=1)  # multiple-choice items: cheap to score, and 200 leave +-0.03 of noise
    mc_choices: int = Field(4, ge=2)
    chat: bool | None = None  # prompt through the chat template; None: when the model has one and is not pretrain's
    # Solved examples of the same question type before each question to a base model (lm-eval's num_fewshot), as
    # many as fit in half its context: pretraining never showed it the Question/Answer format. Chat models get none.
    base_fewshot: int = Field(3, ge=0)
    prompts: list[str] = []  # generation prompts; empty: the first prompt_tokens of generation_prompts test documents
    generation_prompts: int = Field(8, ge=1)
    prompt_tokens: int = Field(32, ge=1)
    max_new_tokens: int = Field(64, ge=1)
    temperature: float = Field(0.8, ge=0.0)  # sampled generations (0: greedy), seeded with the run's seed
    top_k: int = Field(50, ge=0)
    random_baseline: bool = True  # also score a random-init model of the same shape (HF targets): the floor
    reference: str | None = None  # model dir or .gguf for ppl_drift; None: sft -> pretrain model, gguf -> original
    benchmarks: list[str] = []  # lm-eval tasks (forge_qa_mc is the shipped domain task); --benchmarks overrides
    benchmark_limit: int | None = Field(None, ge=1)  # lm-eval examples per task (None: all)
    min_benchmark: dict[str, float] = {}  # task -> lowest acceptable score (a red flag each)
    repetition_ngram: int = Field(4, ge=1)
    max_repeated_ngram_rate: float = 0.5
    min_distinct_2: float = 0.2
    max_ppl_drift: float = 0.10  # relative bits-per-byte increase against the reference model
    # ... against the base model of a fine-tune (SFT's default reference): SFT on Q&A trades some raw-text
    # prediction for instruction following; more than this on the test split is forgetting the domain's text.
    max_finetune_ppl_drift: float = 0.25
    max_val_ppl_rise: float = 0.05  # last val perplexity of the training history over its minimum
    memorisation_docs: int = Field(20, ge=1)  # training and test documents continued greedily
    memorisation_prefix: int = Field(32, ge=1)
    memorisation_suffix: int = Field(32, ge=1)
    max_memorisation_gap: float = 0.2  # verbatim continuation rate, train minus test
    min_generation_tokens: int = Field(4, ge=0)  # shorter generations count as degenerate
    max_degenerate_rate: float = 0.5  # incoherence: share of degenerate generations allowed at low perplexity
    incoherence_ppl_ratio: float = Field(1.0, gt=0)  # "low perplexity": bits per byte below this x the unigram's
    max_uniform_ppl_ratio: float = Field(0.5, gt=0)  # untrained: test perplexity / vocabulary size at or above it

    @model_validator(mode="before")
    @classmethod
    def _bytes_became_items(cls, data: Any) -> Any:
        why = ("the test text is now scored as items (the gate judges each rule on at least registry min_items of "
               "them); use eval.text_items (how many) and eval.text_item_bytes (the largest item), e.g. --set "
               "eval.text_items=100")  # fmt: skip
        return refuse_gone(data, "eval", {"max_test_bytes": why})


# ----------------------------------------------------------------------------------------------------------------
# quantization, registry, serving


class QuantizeConfig(Section):
    """`forge quantize`: GGUF types by llama.cpp name (f16 is always written: it is the quantizer's input),
    bitsandbytes loading checks, and how each artifact is measured (see serve/quantize.py)."""

    gguf_types: list[str] = ["f16", "q8_0", "q4_k_m"]
    bitsandbytes: list[Literal["int8", "nf4"]] = ["int8", "nf4"]
    max_eval_tokens: int = Field(50_000, ge=2)  # test-split tokens for perplexity
    ppl_window: int | None = Field(None, ge=2)  # None: the model's context length
    ppl_stride: int | None = Field(None, ge=1)  # None: half the window
    generation_prompts: int = Field(4, ge=1)  # test documents whose first tokens prompt the greedy generations
    max_new_tokens: int = Field(32, ge=1)  # greedy tokens per prompt (agreement and decode tokens/s)
    threads: int | None = Field(None, ge=1)  # CPU threads for llama.cpp and torch; None: every core
    # Relative perplexity increase over the f16 GGUF above which the report warns (the acceptance bars).
    max_ppl_drift: dict[str, float] = {"q8_0": 0.01, "q4_k_m": 0.05}


class RegistryConfig(Section):
    model_name: str = "forge-model"
    tracking_uri: str | None = None  # None: MLFLOW_TRACKING_URI, else sqlite under the runs directory
    experiment: str = "forge"
    gate_policy: str = "configs/policies/gate.yaml"


class ServeConfig(Section):
    # llamacpp: llama.cpp's own llama-server; llama-cpp-python: its Python server, one request at a time (kept as a
    # fallback); vllm: the HF directory on a GPU. auto: vllm where CUDA and vLLM are there, else llamacpp.
    backend: Literal["auto", "llamacpp", "llama-cpp-python", "vllm"] = "auto"
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=1, le=65535)
    ui_port: int = Field(7860, ge=1, le=65535)
    gguf_type: str = "q4_k_m"
    n_ctx: int | None = None  # per request slot; None: the model's context length
    # Requests llama-server decodes together (continuous batching); more wait in its queue. On CPU one decode step
    # reads all the weights once for the whole batch, so throughput grows with the batch until the cores are busy
    # computing, while each slot costs n_ctx tokens of KV cache and each request's latency grows with the batch
    # (bench/serve_load.py --side-by-side --parallel N measures both on a host).
    parallel: int = Field(4, ge=1, le=256)
    threads: int | None = Field(None, ge=1)  # None: the cores this process may run on
    api_key_env: str = "FORGE_API_KEY"  # the server requires this key when the variable is set
    max_message_chars: int = Field(8000, ge=1)
    max_history_chars: int = Field(32_000, ge=1)
    max_new_tokens: int = Field(512, ge=1, le=4096)
    temperature: float = Field(0.7, ge=0.0, le=2.0)


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
        return data


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
