"""Tiny random models of the families people fine-tune, saved the way their published bases are, for tests.

    from families import FAMILIES, tiny_model   # tests/ is on sys.path under pytest
    path = tiny_model("qwen3", tmp_path / "qwen3")   # -> the directory, ready for from_pretrained / init_from

Each is built from its own transformers config class (2 layers, hidden 64, head_dim 16, feed-forward 128: every row
a multiple of 32, so Q8_0 quantizes every matrix), random weights from a fixed seed, saved with
`save_pretrained(safe_serialization=True)` beside a tokenizer of the family's kind and its real chat template style:

    llama, qwen2, qwen3, olmo2    byte-level BPE (tokenizer.json; Llama 3, Qwen and OLMo 2 ship that kind), split
                                  by Llama 3's regex, Qwen's (with its NFC normalizer) and GPT-2's
    gemma2, gemma3, phi3, mistral SentencePiece (tokenizer.model + the tokenizer.json transformers makes of it;
                                  Gemma, Phi-3-mini and Mistral 7B ship that kind)

The tokenizers are trained here on CORPUS in well under a second, so nothing is downloaded. Their vocabularies are
ones no published model has, the case of a fine-tune's extended tokenizer, which llama.cpp's converter cannot
recognise by hash. The chat turn markers are special tokens, and the end-of-turn token is the EOS
token (llama.cpp stops on EOS only). The weights are drawn with a larger spread than the configs' default
(`initializer_range` 0.2 against 0.02) so that next-token logits spread over several units: comparing two runtimes on
nearly uniform logits would prove nothing. A model directory is deterministic: the same family gives the same files.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FAMILIES = ("llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "mistral", "olmo2")
SEED = 1234
VOCAB_SIZE = 512  # the trained part of each vocabulary; special tokens come on top
# The split regexes of the published BPE families, as their tokenizer.json files write them.
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
    r"\s+(?!\S)|\s+"
)
QWEN2_SPLIT = LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 512,
    "initializer_range": 0.2,
    "tie_word_embeddings": True,  # as the small bases do; not OLMo 2, whose llama.cpp graph needs output.weight
}

# What the tokenizers learn from: prose, numbers, punctuation and code, the kinds of text a domain corpus holds.
CORPUS = [
    "The quick brown fox jumps over the lazy dog. A model reads text as tokens, one piece at a time.",
    "Training a language model on a small domain corpus takes hours on a CPU and minutes on a GPU.",
    "It's 2024-12-04; we'll have done 1234567 things by then, and 3.14159 is close to pi.",
    "Hello world! How are you today? I'm fine, thank you. Don't worry: they're here and we've seen it.",
    "def add(a, b):\n    return a + b\n\nclass Point:\n    x: int = 0\n    y: int = 0\n",
    "for i in range(10):\n    print(f'{i} squared is {i ** 2}')  # a comment\n",
    "import json\nwith open('data.json') as f:\n    data = json.load(f)\n",
    "Quantization stores each weight in fewer bits: eight, four or even two, with a scale per block.",
    "The server answers chat requests with the model's own template, then stops at the end-of-turn token.",
    "User: What is the capital of France?\nAssistant: The capital of France is Paris.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 100 1000 65536, and symbols: + - * / = < > ( ) [ ] { } # @ % & ! ?",
    "Café, naïve, résumé: accents appear in English too. Ελληνικά, русский and 日本語 are other scripts.",
] * 4


# ----------------------------------------------------------------------------------------------------------------
# chat templates, in each family's published style


CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3 = (
    "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
GEMMA = (
    "{{ bos_token }}{% for message in messages %}{% set role = 'model' if message['role'] == 'assistant' "
    "else message['role'] %}{{ '<start_of_turn>' + role + '\\n' + message['content'] + '<end_of_turn>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)
PHI3 = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
MISTRAL = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% else %}{{ message['content'] + eos_token }}{% endif %}"
    "{% endfor %}"
)
OLMO2 = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'assistant' %}"
    "{{ '<|assistant|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{% else %}{{ '<|' + message['role'] + '|>\\n' + message['content'] + '\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class Family:
    config: Callable[..., Any]  # vocab_size and the special token ids -> the transformers config
    model: str  # the transformers class that saves it
    tokenizer: str  # "bpe-gpt2", "bpe-llama3", "bpe-qwen2", "spm-gemma" (no dummy prefix), "spm-llama" (Mistral)
    template: str
    specials: dict[str, str]  # bos/eos/pad/unk -> token (None: the family has none)
    extra: list[str] = field(default_factory=list)  # other special tokens (turn markers)


def _config(name: str, **overrides: Any) -> Callable[..., Any]:
    def build(**tokens: Any) -> Any:
        import transformers

        return getattr(transformers, name)(**{**SHAPE, **overrides, **tokens})

    return build


SPM_SPECIALS = {"unk": "<unk>", "bos": "<s>", "eos": "</s>"}
GEMMA_SPECIALS = {"pad": "<pad>", "eos": "<end_of_turn>", "bos": "<bos>", "unk": "<unk>"}
CHATML_SPECIALS = {"eos": "<|im_end|>", "pad": "<|endoftext|>"}
GEMMA_SOFTCAPS = {"final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0, "query_pre_attn_scalar": 16}

SPECS = {
    "llama": Family(
        _config("LlamaConfig"), "LlamaForCausalLM", "bpe-llama3", LLAMA3,
        {"bos": "<|begin_of_text|>", "eos": "<|eot_id|>"}, ["<|start_header_id|>", "<|end_header_id|>"],
    ),
    "qwen2": Family(_config("Qwen2Config"), "Qwen2ForCausalLM", "bpe-qwen2", CHATML, CHATML_SPECIALS, ["<|im_start|>"]),
    "qwen3": Family(_config("Qwen3Config"), "Qwen3ForCausalLM", "bpe-qwen2", CHATML, CHATML_SPECIALS, ["<|im_start|>"]),
    "olmo2": Family(
        _config("Olmo2Config", tie_word_embeddings=False), "Olmo2ForCausalLM", "bpe-gpt2", OLMO2,
        {"bos": "<|endoftext|>", "eos": "<|endoftext|>", "pad": "<|pad|>"},
        ["<|system|>", "<|user|>", "<|assistant|>"],
    ),
    "gemma2": Family(
        _config("Gemma2Config", sliding_window=4096, **GEMMA_SOFTCAPS), "Gemma2ForCausalLM", "spm-gemma", GEMMA,
        GEMMA_SPECIALS, ["<start_of_turn>"],
    ),
    "gemma3": Family(
        _config("Gemma3TextConfig", sliding_window=4096, query_pre_attn_scalar=16), "Gemma3ForCausalLM", "spm-gemma",
        GEMMA, GEMMA_SPECIALS, ["<start_of_turn>"],
    ),
    "phi3": Family(
        _config("Phi3Config", sliding_window=None), "Phi3ForCausalLM",
        "spm-llama", PHI3, {**SPM_SPECIALS, "eos": "<|end|>", "pad": "<|endoftext|>"},
        ["<|system|>", "<|user|>", "<|assistant|>"],
    ),
    "mistral": Family(
        _config("MistralConfig", sliding_window=None), "MistralForCausalLM", "spm-llama", MISTRAL, SPM_SPECIALS,
        ["[INST]", "[/INST]"],
    ),
}  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------
# tokenizers


def bpe_tokenizer(spec: Family) -> Any:
    """A byte-level BPE trained on CORPUS with the family's split, its special tokens added as special."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    split = {"bpe-llama3": LLAMA3_SPLIT, "bpe-qwen2": QWEN2_SPLIT}.get(spec.tokenizer)
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if split:
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), "isolated"), byte_level])
    if spec.tokenizer == "bpe-qwen2":
        backend.normalizer = normalizers.NFC()
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    backend.train_from_iterator(CORPUS, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend)
    return _add_specials(tokenizer, spec)


def _spm_tokenizer(spec: Family, work: Path) -> Any:
    """A SentencePiece BPE (byte fallback) trained on CORPUS, written as `work`/tokenizer.model, and the fast
    tokenizer transformers converts from it (GemmaTokenizer or LlamaTokenizer, as the published bases name)."""
    import sentencepiece as spm
    from transformers import AutoTokenizer

    gemma = spec.tokenizer == "spm-gemma"
    ids = {"pad_id": 0, "eos_id": 1, "bos_id": 2, "unk_id": 3} if gemma else {"unk_id": 0, "bos_id": 1, "eos_id": 2}
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS), model_writer=model, model_type="bpe", vocab_size=VOCAB_SIZE,
        byte_fallback=True, split_digits=True, add_dummy_prefix=not gemma, remove_extra_whitespaces=False,
        normalization_rule_name="identity", allow_whitespace_only_pieces=True, pad_id=ids.pop("pad_id", -1),
        **ids, num_threads=1, minloglevel=2, hard_vocab_limit=False,
    )  # fmt: skip
    work.mkdir(parents=True, exist_ok=True)
    (work / "tokenizer.model").write_bytes(model.getvalue())
    (work / "tokenizer_config.json").write_text(
        '{"tokenizer_class": "%s"}' % ("GemmaTokenizer" if gemma else "LlamaTokenizer"), encoding="utf-8"
    )
    tokenizer = AutoTokenizer.from_pretrained(work)
    return _add_specials(tokenizer, spec)


def _add_specials(tokenizer: Any, spec: Family) -> Any:
    roles = {f"{role}_token": token for role, token in spec.specials.items()}
    tokenizer.add_special_tokens({**roles, "additional_special_tokens": spec.extra})
    tokenizer.chat_template = spec.template
    return tokenizer


# ----------------------------------------------------------------------------------------------------------------
# the model


def tiny_model(family: str, directory: Path) -> Path:
    """Build the tiny random model of `family` (one of FAMILIES) into `directory` and return it.

    The directory holds config.json, model.safetensors, generation_config.json and the tokenizer files
    (tokenizer.json, tokenizer_config.json with the chat template, and tokenizer.model for SentencePiece families).
    """
    import torch
    import transformers

    if family not in SPECS:
        raise ValueError(f"family {family!r}: not one of {', '.join(FAMILIES)}")
    spec = SPECS[family]
    directory = Path(directory)
    tokenizer = bpe_tokenizer(spec) if spec.tokenizer.startswith("bpe") else _spm_tokenizer(spec, directory)
    ids = {f"{role}_token_id": tokenizer.convert_tokens_to_ids(spec.specials[role]) if role in spec.specials else None
           for role in ("bos", "eos", "pad")}  # fmt: skip
    config = spec.config(vocab_size=len(tokenizer), **ids)
    torch.manual_seed(SEED)
    model = getattr(transformers, spec.model)(config).eval()
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    return directory
