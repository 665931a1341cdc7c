"""A Hugging Face model directory (a family of models/families.py, a byte-level BPE tokenizer) -> one f16 GGUF
file for llama.cpp. (models.gguf.check_gguf is the guard that refuses a corrupted or truncated GGUF before
llama.cpp reads it.)

    info = export_gguf("runs/tiny-cpu/pretrain/model", "model-f16.gguf")     # from a saved directory
    write_gguf(model.state_dict(), model.config, tokenizer_dir, out_path)    # from a model in memory

Written with the PyPI `gguf` library alone (GGUFWriter + TensorNameMap): no llama.cpp source checkout, no network,
no sentencepiece. llama.cpp's own converter recognises a pre-tokenizer by hashing the tokenization of a fixed
string, which a tokenizer trained by us never matches, so the vocabulary is written here directly:
  tokenizer.ggml.model = "gpt2"  byte-level BPE
  tokenizer.ggml.pre             the llama.cpp pre-tokenizer type that splits text like the tokenizer does
                                 (models/pretokenize.py: "gpt-2" for Forge's tokenizers, "smollm" for SmolLM's...);
                                 after writing, llama.cpp itself tokenizes a fixed text of digits, contractions,
                                 Unicode, whitespace runs and code, and the file is refused (never renamed into
                                 place) unless its token ids equal the HF tokenizer's
  tokens, merges, token types   special tokens are CONTROL, other added tokens USER_DEFINED, ids the model has but
                                the tokenizer lacks (a padded vocabulary) UNUSED
  bos/eos/unk/pad ids, add_bos_token / add_eos_token   as in tokenizer_config.json (ours: false, so llama.cpp adds
                                no BOS the model never saw in training)
  tokenizer.chat_template       the tokenizer's chat template: llama-cpp-python otherwise silently falls back to
                                the llama-2 prompt format

Tensors: 2-D weights in f16 (or f32), 1-D norms and biases in f32, as llama.cpp's converter writes them, each
through its family's transform (llama's rotary permutation of q/k, GPT-2's Conv1D transpose).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from forge import ForgeError
from forge.io import atomic_path
from models.families import Family, family_of
from models.pretokenize import check_llama_cpp_tokens, llama_cpp_pre_type

SKIPPED_SUFFIXES = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")  # buffers, not weights


# ----------------------------------------------------------------------------------------------------------------
# reading a model directory


def load_state_dict(model_dir: Path) -> dict[str, Any]:
    """Every tensor of a saved model directory (model.safetensors or its shards) as torch tensors."""
    from safetensors.torch import load_file

    model_dir = Path(model_dir)
    single = model_dir / "model.safetensors"
    index = model_dir / "model.safetensors.index.json"
    if single.is_file():
        return load_file(single)
    if index.is_file():
        files = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        tensors: dict[str, Any] = {}
        for name in files:
            tensors.update(load_file(model_dir / name))
        return tensors
    raise ForgeError(
        f"{model_dir} has no model.safetensors (or model.safetensors.index.json): not a saved model directory; "
        "export one with forge pretrain or forge sft"
    )


def read_tokenizer(tokenizer_dir: Path) -> dict[str, Any]:
    """tokenizer.json, tokenizer_config.json and the chat template of a transformers tokenizer directory."""
    tokenizer_dir = Path(tokenizer_dir)
    path = tokenizer_dir / "tokenizer.json"
    if not path.is_file():
        raise ForgeError(f"{path} not found: the model directory must hold the tokenizer files (forge tokenizer)")
    tok = json.loads(path.read_text(encoding="utf-8"))
    model = tok.get("model", {})
    if model.get("type") != "BPE":
        raise ForgeError(f"{path}: tokenizer model {model.get('type')!r} is not BPE; only byte-level BPE is exported")
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_file=str(path))
    pre = llama_cpp_pre_type(hf, str(path))  # ForgeError when llama.cpp has no type that splits like it
    config_path = tokenizer_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    template_path = tokenizer_dir / "chat_template.jinja"
    template = template_path.read_text(encoding="utf-8") if template_path.is_file() else config.get("chat_template")
    return {"json": tok, "config": config, "chat_template": template, "pre": pre, "hf": hf}


class Vocabulary(NamedTuple):
    tokens: list[str]  # one per embedding row, by id
    types: list[int]  # gguf.TokenType of each
    merges: list[str]
    ids: dict[str, int]  # the tokenizer's own token -> id


def vocabulary(tok: dict[str, Any], n_vocab: int) -> Vocabulary:
    """The tokens, token types, merges and token -> id for a model with `n_vocab` embedding rows."""
    import gguf

    vocab: dict[str, int] = dict(tok["model"]["vocab"])
    added = {t["content"]: t for t in tok.get("added_tokens", [])}
    for content, t in added.items():
        vocab[content] = t["id"]
    if max(vocab.values()) >= n_vocab:
        raise ForgeError(
            f"the tokenizer has ids up to {max(vocab.values())} but the model only {n_vocab} embedding rows: the "
            "model was built for another tokenizer"
        )
    tokens = [f"[UNUSED_{i}]" for i in range(n_vocab)]
    types = [int(gguf.TokenType.UNUSED)] * n_vocab
    for content, i in vocab.items():
        tokens[i] = content
        if content in added:
            special = added[content].get("special", False)
            types[i] = int(gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED)
        else:
            types[i] = int(gguf.TokenType.NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"].get("merges", [])]
    return Vocabulary(tokens, types, merges, vocab)


# ----------------------------------------------------------------------------------------------------------------
# writing


def write_gguf(
    state_dict: Mapping[str, Any],
    config: Any,
    tokenizer_dir: Path,
    out_path: Path,
    outtype: str = "f16",
    name: str | None = None,
) -> dict[str, Any]:
    """Write a GGUF of a llama or gpt2 model (`state_dict` of torch tensors, its transformers `config`).

    The file appears atomically under `out_path`. Returns a summary (architecture, tensors, parameters, bytes).
    """
    import gguf

    if outtype not in ("f16", "f32"):
        raise ForgeError(f"outtype={outtype!r}: the export writes f16 or f32; quantize from the f16 file")
    fam = family_of(config, "GGUF export")
    tok = read_tokenizer(tokenizer_dir)
    vocab = vocabulary(tok["json"], config.vocab_size)  # refuses a tokenizer with more ids than the model has rows
    gguf_arch = {name: key for key, name in gguf.MODEL_ARCH_NAMES.items()}[fam.name]
    names = gguf.get_tensor_name_map(gguf_arch, fam.shape(config)[0])

    out_path = Path(out_path)
    with atomic_path(out_path) as tmp:
        writer = gguf.GGUFWriter(tmp, gguf.MODEL_ARCH_NAMES[gguf_arch])
        writer.add_name(name or out_path.stem)
        writer.add_vocab_size(config.vocab_size)
        fam.gguf_hparams(writer, config)
        writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if outtype == "f16" else gguf.LlamaFileType.ALL_F32)
        _add_tokenizer(writer, tok, vocab, config)
        n_tensors, params = _add_tensors(writer, state_dict, fam, names, config, outtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        checked = check_llama_cpp_tokens(tmp, tok["hf"])  # raises before the rename: no GGUF that tokenizes apart
    return {
        "path": str(out_path),
        "architecture": fam.name,
        "outtype": outtype,
        "tensors": n_tensors,
        "parameters": params,
        "vocab_size": config.vocab_size,
        "tokenizer_tokens": len(vocab.ids),
        "pre_tokenizer": tok["pre"],
        "tokenization_checked_tokens": checked,
        "size_bytes": out_path.stat().st_size,
    }


def _add_tokenizer(writer: Any, tok: dict[str, Any], vocab: Vocabulary, config: Any) -> None:
    """The tokenizer's metadata (the module docstring lists it); a special token tokenizer_config.json does not
    name falls back to the model config's id."""
    tok_config = tok["config"]

    def special_id(key: str, fallback: int | None) -> int | None:
        value = tok_config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        return vocab.ids.get(value, fallback) if isinstance(value, str) else fallback

    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(tok["pre"])
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    writer.add_token_merges(vocab.merges)
    for key, add, fallback in (
        ("bos_token", writer.add_bos_token_id, getattr(config, "bos_token_id", None)),
        ("eos_token", writer.add_eos_token_id, getattr(config, "eos_token_id", None)),
        ("unk_token", writer.add_unk_token_id, None),
        ("pad_token", writer.add_pad_token_id, getattr(config, "pad_token_id", None)),
    ):
        token_id = special_id(key, fallback)
        if token_id is not None:
            add(int(token_id))
    writer.add_add_bos_token(bool(tok_config.get("add_bos_token", False)))
    writer.add_add_eos_token(bool(tok_config.get("add_eos_token", False)))
    if tok["chat_template"]:
        writer.add_chat_template(tok["chat_template"])


def _add_tensors(
    writer: Any, state_dict: Mapping[str, Any], fam: Family, names: Any, config: Any, outtype: str
) -> tuple[int, int]:
    """Every weight under its GGUF name (`names`: gguf's TensorNameMap), through its family's transform: 2-D in
    `outtype`, 1-D in f32. Buffers and a tied output head are left out. Returns (tensors, parameters) written."""
    tied = bool(getattr(config, "tie_word_embeddings", True))
    params = 0
    n_tensors = 0
    for hf_name in sorted(state_dict):
        if hf_name.endswith(SKIPPED_SUFFIXES):
            continue
        if hf_name == "lm_head.weight" and tied:
            continue  # llama.cpp reuses token_embd as the output layer when output.weight is absent
        new_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if new_name is None:
            raise ForgeError(f"tensor {hf_name!r} has no GGUF name for {fam.name}: not exported")
        data = fam.gguf_tensor(hf_name, state_dict[hf_name].detach().to("cpu").float().numpy(), config)
        data = np.ascontiguousarray(data, dtype=np.float16 if outtype == "f16" and data.ndim > 1 else np.float32)
        writer.add_tensor(new_name, data)
        params += data.size
        n_tensors += 1
    return n_tensors, params


def export_gguf(model_dir: Path, out_path: Path, outtype: str = "f16", name: str | None = None) -> dict[str, Any]:
    """A saved HF model directory (weights + config + tokenizer files) -> a GGUF file."""
    from transformers import AutoConfig

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise ForgeError(f"{model_dir}/config.json not found: not a saved model directory")
    config = AutoConfig.from_pretrained(model_dir)
    return write_gguf(load_state_dict(model_dir), config, model_dir, out_path, outtype=outtype, name=name)
