"""GGUF export of foreign families through llama.cpp's own converter (serve/gguf_convert.py).

For each family of tests/families.py: a tiny random model saved as safetensors -> f16 GGUF (the converter) -> Q8_0
(llama.cpp's quantizer, serve.quantize.quantize_gguf); llama.cpp's next-token logits on a fixed text agree with the
Hugging Face model's, the chat template is in the GGUF, and llama.cpp tokenizes like the HF tokenizer (checked
inside convert_to_gguf before the file is renamed into place).

Tolerances, max |logit difference| over every position and vocabulary entry (the logits spread with a std of ~1.6;
a conversion error such as a missing rotary permutation or norm shift moves them by units):
    f16   0.1   (f16 weights and activations against fp32; measured worst 0.038, llama; best 0.008, gemma3)
    q8_0  0.6   (8-bit weights and activations; measured worst 0.43, phi3; best 0.19, gemma3)
and the argmax agrees at every position where the HF model's top two logits are further apart than the tolerance
(random weights make near ties, which may flip within it).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from families import FAMILIES, tiny_model

from forge import ForgeError

TEXT = "The quick brown fox jumps over the lazy dog. It's 2024: we'll convert 1234567 models, café and all."
TOLERANCE = {"f16": 0.1, "q8_0": 0.6}


def hf_logits(model_dir: Path, ids: list[int]) -> np.ndarray:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def llama_cpp_logits(gguf_path: Path, ids: list[int]) -> np.ndarray:
    from models.gguf import load_llama

    llm = load_llama(gguf_path, n_ctx=128, n_threads=2, logits_all=True)
    try:
        llm.eval(ids)
        return np.array(llm.scores[: len(ids)], dtype=np.float32)
    finally:
        llm.close()


@pytest.mark.integration
@pytest.mark.parametrize("family", FAMILIES)
def test_family_converts_quantizes_and_matches_hf_logits(family, tmp_path):
    from transformers import AutoTokenizer

    from models.gguf import gguf_metadata
    from serve.gguf_convert import convert_to_gguf
    from serve.quantize import quantize_gguf

    model_dir = tiny_model(family, tmp_path / family)
    info = convert_to_gguf(model_dir, tmp_path / "model-f16.gguf")
    assert info["tokenization_checked_tokens"] > 100 and info["chat_template"]
    quantize_gguf(tmp_path / "model-f16.gguf", tmp_path / "model-q8_0.gguf", "q8_0", threads=2)

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    template = gguf_metadata(tmp_path / "model-f16.gguf", "tokenizer.chat_template")["tokenizer.chat_template"]
    assert template == tokenizer.chat_template  # llama-server renders chats with the model's own template
    ids = tokenizer(TEXT)["input_ids"]
    reference = hf_logits(model_dir, ids)
    report = {"family": family, "architecture": info["architecture"], "pre": info["pre_tokenizer"]}
    for outtype in ("f16", "q8_0"):
        ours = llama_cpp_logits(tmp_path / f"model-{outtype}.gguf", ids)
        diff = float(np.abs(ours - reference).max())
        top2 = np.sort(reference, axis=-1)[:, -2:]
        decisive = top2[:, 1] - top2[:, 0] > TOLERANCE[outtype]  # a near tie may flip within the tolerance
        agree = ours.argmax(-1) == reference.argmax(-1)
        report[outtype] = {"max_abs_diff": round(diff, 4), "argmax_agreement": round(float(agree.mean()), 3)}
        print(json.dumps(report))  # the figures the module docstring quotes: pytest -s shows them
        assert diff < TOLERANCE[outtype], report
        assert agree[decisive].all(), report
    expected = tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    served = served_prompt(tmp_path / "model-q8_0.gguf", tmp_path)
    # llama-server drops a leading BOS from the text when it adds one itself as it tokenizes: compared without it
    bos = tokenizer.bos_token or ""
    assert served.removeprefix(bos) == expected.removeprefix(bos), "llama-server renders the model's own template"
    from serve.modelfile import modelfile

    lines = modelfile(tmp_path / "model-q8_0.gguf").splitlines()  # Ollama's, measured from the same template
    assert "FROM ./model-q8_0.gguf" in lines and f"PARAMETER stop {json.dumps(tokenizer.eos_token)}" in lines


CHAT = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And 3+3?"}]  # fmt: skip


def served_prompt(gguf_path: Path, tmp_path: Path) -> str:
    """The prompt llama-server renders for CHAT (its /apply-template), after a real chat completion succeeded."""
    import httpx
    from conftest import free_port

    from models.llama_server import ServerProcess, llama_server_binary, llama_server_command

    command = llama_server_command(gguf_path, "tiny", n_ctx=256, parallel=1, threads=2)
    port = free_port()
    command += ["--host", "127.0.0.1", "--port", str(port)]
    with ServerProcess(command, port, "tiny", log_path=tmp_path / "server.log",
                       cwd=Path(llama_server_binary()).resolve().parent) as server:  # fmt: skip
        reply = httpx.post(f"{server.base_url}/chat/completions", timeout=60,
                           json={"model": "tiny", "messages": CHAT, "max_tokens": 4})  # fmt: skip
        assert reply.status_code == 200, reply.text
        rendered = httpx.post(f"http://127.0.0.1:{port}/apply-template", json={"messages": CHAT}, timeout=30)
        return rendered.json()["prompt"]


@pytest.mark.integration
def test_unrecognised_family_is_refused_naming_it(tmp_path):
    """A family llama.cpp's converter has no class for is one ForgeError naming the family, and no file."""
    from serve.gguf_convert import convert_to_gguf

    model_dir = tiny_model("qwen3", tmp_path / "m")
    config = json.loads((model_dir / "config.json").read_text())
    config.update(architectures=["NoSuchFamilyForCausalLM"], model_type="nosuch")
    (model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ForgeError, match=r"family nosuch \(NoSuchFamilyForCausalLM\) is not supported"):
        convert_to_gguf(model_dir, tmp_path / "out.gguf")
    assert not list(tmp_path.glob("*out.gguf*"))


def test_published_split_names_the_llama_cpp_type():
    """A tokenizer with Qwen's or Llama 3's split regex gets llama.cpp's qwen2 / llama-bpe; GPT-2's gets None (then
    models/pretokenize.py decides)."""
    from families import SPECS, bpe_tokenizer

    from serve.gguf_convert import published_split

    assert published_split(bpe_tokenizer(SPECS["qwen2"])) == "qwen2"
    assert published_split(bpe_tokenizer(SPECS["llama"])) == "llama-bpe"
    assert published_split(bpe_tokenizer(SPECS["olmo2"])) is None


def test_missing_converter_names_the_fix(tmp_path, monkeypatch):
    from serve.gguf_convert import converter_dir

    monkeypatch.setenv("FORGE_LLAMA_CONVERT", str(tmp_path / "nowhere"))
    with pytest.raises(ForgeError, match="make install"):
        converter_dir()


def test_outtype_and_model_dir_are_checked(tmp_path):
    from serve.gguf_convert import convert_to_gguf

    with pytest.raises(ForgeError, match="outtype='q4_k_m'"):
        convert_to_gguf(tmp_path, tmp_path / "x.gguf", outtype="q4_k_m")
    with pytest.raises(ForgeError, match="config.json not found"):
        convert_to_gguf(tmp_path, tmp_path / "x.gguf")
