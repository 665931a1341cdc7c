"""A Hugging Face model directory of any family llama.cpp knows -> an f16 GGUF, through llama.cpp's own converter.

    info = convert_to_gguf("runs/x/sft/model", "model-f16.gguf")   # qwen2, qwen3, gemma2/3, phi3, mistral, olmo2...

The converter is `convert_hf_to_gguf.py`'s Python package (`conversion/`, one module per family, and its `gguf-py`)
from the llama.cpp that the pinned llama-cpp-python sdist vendors: the same source as the bindings that quantize and
evaluate and as llama-server. docker/llama-server.sh extracts it into ~/.cache/forge/llama-convert-VERSION/ (`make
install`); FORGE_LLAMA_CONVERT names another place (an image). Its gguf-py is newer than PyPI's `gguf` of the same
version number and the converter needs it (LazyChunkedTensor...), so the converter runs in a child process
(`python -m serve.gguf_convert`) with its own gguf-py first on sys.path, never beside the `gguf` Forge imports.

What it writes: the family's tensors and hyperparameters, the vocabulary (BPE or SentencePiece, with token types and
special token ids) and `tokenizer.chat_template` from the tokenizer files (tokenizer_config.json or
chat_template.jinja), so llama-server and other GGUF runtimes render chats as SFT trained them.

The one change to the converter's path: it recognises a BPE pre-tokenizer only by hashing the tokenization of a
fixed text, so a vocabulary it never saw (a fine-tune's extended one, a test tokenizer) makes it raise. Then, and
only then, Forge names the llama.cpp type that splits text like the tokenizer (models/pretokenize.py); published
bases keep the converter's own choice. Either way, before the file is renamed into place, llama.cpp itself tokenizes
a fixed text of digits, contractions, Unicode, whitespace runs and code, and the file is refused unless its ids
equal the Hugging Face tokenizer's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from forge import ForgeError
from forge.io import atomic_path

OUTTYPES = ("f32", "f16", "bf16")  # the converter's float outputs; quantized types come from llama.cpp's quantizer
UNSUPPORTED = 3  # the child's exit status for a family the converter has no class for
# The split regexes of published BPE families as their tokenizer.json writes them -> llama.cpp's type with that
# regex (llama-vocab.cpp): a fine-tune that extends Qwen's or Llama 3's vocabulary keeps its base's split, which
# models/pretokenize.py (gpt-2, smollm) does not list. Qwen's NFC normalizer is accepted as llama.cpp's own Qwen
# GGUFs accept it (NFC text, such as the check text, tokenizes the same).
_SPLIT_TAIL = r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}%s| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
PUBLISHED_SPLITS = {
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|" + _SPLIT_TAIL % "": "qwen2",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|" + _SPLIT_TAIL % "{1,3}": "llama-bpe",
}


def converter_dir() -> Path:
    """Where llama.cpp's converter of the installed llama-cpp-python lives; ForgeError with the fix if absent."""
    version = metadata.version("llama-cpp-python")
    cache = Path(os.environ.get("FORGE_LLAMA_SERVER_CACHE") or Path.home() / ".cache" / "forge")
    where = Path(os.environ.get("FORGE_LLAMA_CONVERT") or cache / f"llama-convert-{version}")
    if not (where / "convert_hf_to_gguf.py").is_file() or not (where / "gguf-py" / "gguf").is_dir():
        raise ForgeError(
            f"llama.cpp's converter not found in {where} (convert_hf_to_gguf.py, conversion/, gguf-py/ of "
            f"llama-cpp-python {version}): run `make install` (docker/llama-server.sh extracts it from the sdist), "
            "or set FORGE_LLAMA_CONVERT to a directory holding them"
        )
    return where


def convert_to_gguf(model_dir: Path, out_path: Path, outtype: str = "f16", name: str | None = None) -> dict[str, Any]:
    """Convert a saved HF model directory (config.json, safetensors, tokenizer files) to a GGUF at `out_path`.

    The file appears atomically, only after llama.cpp's tokenization of a check text equals the HF tokenizer's.
    Returns a summary: architectures, outtype, pre-tokenizer and who chose it, chat template, tensors, size.
    """
    from transformers import AutoTokenizer

    from models.gguf import check_gguf, gguf_metadata
    from models.pretokenize import check_llama_cpp_tokens

    model_dir, out_path = Path(model_dir), Path(out_path)
    if outtype not in OUTTYPES:
        raise ForgeError(f"outtype={outtype!r}: the converter writes {', '.join(OUTTYPES)}; quantize from that file")
    hf_config = _hf_config(model_dir)
    converter = converter_dir()
    with atomic_path(out_path) as tmp:
        child = _run_child(converter, model_dir, tmp, outtype, name or out_path.stem, hf_config)
        summary = check_gguf(tmp)
        checked = check_llama_cpp_tokens(tmp, AutoTokenizer.from_pretrained(model_dir))
        meta = gguf_metadata(tmp, "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.chat_template")
    return {
        **summary,
        "path": str(out_path),
        "hf_architecture": child["architecture"],
        "model_type": hf_config.get("model_type"),
        "outtype": outtype,
        "tokenizer_model": meta["tokenizer.ggml.model"],
        "pre_tokenizer": meta["tokenizer.ggml.pre"],
        "pre_tokenizer_from": child["pre_tokenizer_from"],
        "chat_template": meta["tokenizer.chat_template"] is not None,
        "tokenization_checked_tokens": checked,
        "converter": str(converter),
        "size_bytes": out_path.stat().st_size,
    }


def _hf_config(model_dir: Path) -> dict[str, Any]:
    path = model_dir / "config.json"
    if not path.is_file():
        raise ForgeError(f"{path} not found: not a saved Hugging Face model directory")
    config: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    if not config.get("architectures"):
        raise ForgeError(f"{path} has no 'architectures': the converter picks the family by it; save the model with "
                         "save_pretrained, which writes it")  # fmt: skip
    return config


def _run_child(
    converter: Path, model_dir: Path, out: Path, outtype: str, name: str, hf_config: dict[str, Any]
) -> dict[str, Any]:
    """Run the converter in a child process; its last stdout line is a JSON summary. ForgeError on failure."""
    root = Path(__file__).resolve().parent.parent  # Forge's own packages, for models.pretokenize in the child
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "serve.gguf_convert", str(converter), str(model_dir), str(out), outtype, name]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    family = f"{hf_config.get('model_type')} ({', '.join(hf_config['architectures'])})"
    if proc.returncode == UNSUPPORTED:
        raise ForgeError(
            f"{model_dir}: family {family} is not supported by llama.cpp's converter (llama-cpp-python "
            f"{metadata.version('llama-cpp-python')}), so it has no GGUF; serve the Hugging Face directory with vLLM "
            "instead, or pick a base of a family the converter lists (`python convert_hf_to_gguf.py "
            "--print-supported-models` in the converter's directory)"
        )
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-12:])
        raise ForgeError(
            f"{model_dir}: llama.cpp's converter failed on family {family} (exit {proc.returncode}):\n{tail}"
        )
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


# ----------------------------------------------------------------------------------------------------------------
# the child: llama.cpp's converter with its own gguf-py


def _child(converter: str, model_dir: str, out: str, outtype: str, name: str) -> int:
    """Convert in this process: the converter's gguf-py must be the `gguf` imported, so nothing imported it yet."""
    import logging

    if "gguf" in sys.modules:
        raise RuntimeError("the PyPI gguf is already imported: the converter needs its own gguf-py")
    sys.path[:0] = [converter, str(Path(converter) / "gguf-py")]
    logging.basicConfig(level=logging.WARNING)
    import gguf
    import torch
    from conversion import ModelBase, ModelType, get_model_architecture, get_model_class

    hparams = ModelBase.load_hparams(Path(model_dir), False)
    architecture = get_model_architecture(hparams, ModelType.TEXT)
    try:
        model_class = get_model_class(architecture, mmproj=False)
    except NotImplementedError:
        print(f"llama.cpp's converter has no class for {architecture}", file=sys.stderr)
        return UNSUPPORTED
    chosen = _pre_tokenizer_fallback(model_dir)
    ftype = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
             "bf16": gguf.LlamaFileType.MOSTLY_BF16}[outtype]  # fmt: skip
    with torch.inference_mode():
        model = model_class(Path(model_dir), ftype, Path(out), model_name=name)
        model.write()
    print(json.dumps({"architecture": architecture, "pre_tokenizer_from": chosen.get("from")}))
    return 0


def _pre_tokenizer_fallback(model_dir: str) -> dict[str, str]:
    """Wrap the converter's hash lookup of the BPE pre-tokenizer: a hash it knows keeps its answer ("converter");
    an unknown one gets the llama.cpp type that splits like the tokenizer ("forge"), or a ForgeError naming why none
    does. Returns the dict the choice is recorded in (empty when the vocabulary is not BPE)."""
    from conversion.base import TextModel

    from models.pretokenize import llama_cpp_pre_type

    by_hash = TextModel.get_vocab_base_pre
    chosen: dict[str, str] = {}

    def choose(self: Any, tokenizer: Any) -> str:
        try:
            pre: str = by_hash(self, tokenizer)
            chosen["from"] = "converter"
        except NotImplementedError:  # the converter's "BPE pre-tokenizer was not recognized"
            pre = published_split(tokenizer) or llama_cpp_pre_type(tokenizer, f"{model_dir}: tokenizer")
            chosen["from"] = "forge"
        return pre

    TextModel.get_vocab_base_pre = choose  # type: ignore[method-assign]
    return chosen


def published_split(tokenizer: Any) -> str | None:
    """The llama.cpp type of a fast tokenizer whose one Split regex is a published family's (PUBLISHED_SPLITS)."""
    state = json.loads(tokenizer.backend_tokenizer.to_str())
    if (state.get("normalizer") or {}).get("type", "NFC") != "NFC":
        return None
    pre = state.get("pre_tokenizer") or {}
    splits = [p["pattern"].get("Regex") for p in pre.get("pretokenizers", [pre]) if p.get("type") == "Split"]
    return PUBLISHED_SPLITS.get(splits[0]) if len(splits) == 1 else None


if __name__ == "__main__":
    try:
        sys.exit(_child(*sys.argv[1:6]))
    except ForgeError as exc:
        print(f"ForgeError: {exc}", file=sys.stderr)
        sys.exit(2)
