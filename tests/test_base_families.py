"""Bases of the families people fine-tune (model.init_from): llama, qwen2, qwen3, gemma2, gemma3, phi3, mistral and
olmo2, as tiny random models built from their transformers config classes (tests/families.py).

Quick: each is accepted, its parameters are counted on the model (meta device) and equal the real model's; the
blocks come from `_no_split_modules`; what transformers cannot run without the model's own code is refused in one
line. Integration: 2 steps of continued pretraining through the real stages, and 2 steps of LoRA SFT with the base's
own chat template, whose assistant-only mask is checked character by character against the rendered conversation.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from families import FAMILIES, tiny_model

from forge import ForgeError
from forge.config import ModelConfig, load_config
from models.base import open_base
from models.shape import COUNTED, FORMULA, decoder_layers, read_shape

CONVERSATION = [
    {"role": "system", "content": "You answer questions about Python."},
    {"role": "user", "content": "What does `json.dumps` do in 2024?"},
    {"role": "assistant", "content": "Serialize obj to a JSON formatted str."},
    {"role": "user", "content": "And `json.loads`?"},
    {"role": "assistant", "content": "Deserialize s to a Python object."},
]
MODEL_TYPE = {"gemma3": "gemma3_text"}  # tests/families.py's gemma3 is the text-only Gemma 3 (270M, 1B)


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bases")
    return {family: tiny_model(family, root / family) for family in FAMILIES}


# ----------------------------------------------------------------------------------------------------------------
# accepted, and read off the model


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_is_accepted_and_the_plan_counts_the_real_model(bases, family):
    import torch
    from transformers import AutoModelForCausalLM

    from forge.report_card import model_facts, model_rows
    from pretrain.plan import estimate, render_text

    model = AutoModelForCausalLM.from_pretrained(bases[family], dtype=torch.float32)
    real = sum(p.numel() for p in model.parameters())
    in_layers = sum(p.numel() for name, p in model.named_parameters() if name.startswith("model.layers."))
    plan = estimate(load_config(None, [f"model.init_from={bases[family]}", "model.context_length=64"]), "cpu")
    summary = plan["model"]
    assert summary["parameters"] == real and summary["parameter_breakdown"]["layers"] == in_layers
    assert summary["architecture"] == MODEL_TYPE.get(family, family) and summary["num_layers"] == 2
    assert summary["context_length"] == 64 and summary["vocab_size"] == model.config.vocab_size
    text = render_text(plan)
    assert f"family      {summary['architecture']} ({type(model).__name__}, a base: model.init_from)" in text
    assert f"{real:,} " in text and COUNTED in text
    assert "estimated: llama's per-layer formula" in text or family == "llama"
    rows = dict(model_rows({}, {"parameters": real}, model_facts(plan)))  # the report card, before pretraining
    assert rows["family"] == summary["family"] and rows["parameters"] == f"{real} ({COUNTED})"


def test_blocks_are_the_classes_named_in_no_split_modules():
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    class Block(torch.nn.Module):
        def __init__(self, inner: bool) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(2, 2)
            self.inner = Block(False) if inner else None  # a block inside a block is part of it, not another

    class Model(torch.nn.Module):
        _no_split_modules = ["Block"]

        def __init__(self) -> None:
            super().__init__()
            self.stack = torch.nn.ModuleList([Block(True), Block(True)])
            self.norm = torch.nn.LayerNorm(2)

    model = Model()
    assert decoder_layers(model) == list(model.stack)
    model._no_split_modules = []
    with pytest.raises(ForgeError, match=r"Model: no module of the classes its _no_split_modules names \(none\)"):
        decoder_layers(model)
    config = Qwen3Config(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=16, vocab_size=100)  # fmt: skip
    with torch.device("meta"):
        qwen = AutoModelForCausalLM.from_config(config)
    assert decoder_layers(qwen) == list(qwen.model.layers)
    assert read_shape(config).blocks == ("Qwen3DecoderLayer",) and read_shape(config).num_layers == 3


@pytest.mark.parametrize("architecture", ["llama", "gpt2"])
def test_the_from_scratch_formula_equals_the_count_on_the_model(architecture):
    from pretrain.model import count_parameters, hf_config, parameter_breakdown, parameters_source

    m = ModelConfig(architecture=architecture, hidden_size=64, num_layers=3, num_attention_heads=4,
                    intermediate_size=160, context_length=128, tie_word_embeddings=architecture == "gpt2")  # fmt: skip
    counted = read_shape(hf_config(m, 300))
    assert parameter_breakdown(m, 300) == counted.parts and count_parameters(m, 300) == sum(counted.parts.values())
    assert parameters_source(m) == FORMULA and counted.parameters_source == COUNTED


def _base_dir(path: Path, config: dict) -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    (path / "model.safetensors").write_bytes(b"")  # never read: the config is refused first
    return path


def test_a_family_needing_remote_code_or_unknown_or_not_a_decoder_is_refused_in_one_line(tmp_path):
    remote = _base_dir(
        tmp_path / "remote",
        {
            "model_type": "acme_lm",
            "auto_map": {
                "AutoConfig": "configuration_acme.AcmeConfig",
                "AutoModelForCausalLM": "modeling_acme.AcmeForCausalLM",
            },
        },
    )
    unknown = _base_dir(tmp_path / "unknown", {"model_type": "acme_lm"})
    bert = _base_dir(tmp_path / "bert", {"model_type": "bert", "architectures": ["BertModel"]})
    cases = [
        (remote, "model_type 'acme_lm': its code comes with the model .auto_map: trust_remote_code, never run here."),
        (unknown, "model_type 'acme_lm': transformers does not know it"),
        (bert, "model_type 'bert' is not a decoder-only causal LM"),
    ]  # fmt: skip
    for path, reason in cases:
        with pytest.raises(ForgeError, match=reason) as refused:
            open_base(path).config()
        line = str(refused.value)
        assert "\n" not in line and line.startswith(f"model.init_from={path}: ")
        assert "supported: every decoder-only causal LM transformers " in line
        assert "llama, qwen2, qwen3, gemma2, gemma3_text, phi3, mistral, olmo2, gpt2 and " in line
        assert line.endswith("except those that need trust_remote_code")


def test_an_auto_map_beside_a_family_transformers_ships_runs_transformers_own_class(bases, tmp_path):
    import shutil

    phi3 = tmp_path / "phi3"
    shutil.copytree(bases["phi3"], phi3)  # as microsoft/Phi-3-mini ships: auto_map to its old remote code
    config = json.loads((phi3 / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_phi3.Phi3ForCausalLM"}
    (phi3 / "config.json").write_text(json.dumps(config))
    assert open_base(phi3).model_shape().model_class == "Phi3ForCausalLM"


# ----------------------------------------------------------------------------------------------------------------
# continued pretraining through the real stages


@pytest.mark.integration
@pytest.mark.parametrize("family", FAMILIES)
def test_two_steps_of_continued_pretraining(bases, family, isolated_runs):
    from safetensors.torch import load_file
    from test_gguf_export import generated_docs
    from test_tokenizer import write_data_stage

    from pretrain import tokenizer as tok_stage
    from pretrain import train as train_stage

    docs = generated_docs(40, seed=3)
    write_data_stage(isolated_runs, "cpt", {"train": docs[:30], "val": docs[30:36], "test": docs[36:]})
    sets = [
        f"model.init_from={bases[family]}",
        "model.context_length=32",
        "run_name=cpt",
        "train.max_steps=2",
        "train.micro_batch_size=2",
        "train.grad_accum_steps=1",
        "train.eval_every=2",
        "train.eval_batches=1",
        "train.checkpoint_every=2",
        "train.precision=fp32",
        "train.lr=1e-2",
        "train.warmup_steps=0",
        "train.gradient_checkpointing=true",
    ]  # fmt: skip  (the family's own checkpointed layers)
    tok_stage.run(load_config(None, sets))
    manifest = train_stage.run(load_config(None, sets))
    metrics = manifest["metrics"]
    assert manifest["status"] == "complete" and metrics["steps"] == 2
    exported = isolated_runs / "cpt" / "pretrain" / "model"
    config = json.loads((exported / "config.json").read_text())
    assert config["model_type"] == MODEL_TYPE.get(family, family) and config["max_position_embeddings"] == 512
    got, base = load_file(exported / "model.safetensors"), load_file(bases[family] / "model.safetensors")
    assert set(got) == set(base)  # the base's weights, continued: same tensors
    assert metrics["parameters"] == sum(t.numel() for t in base.values())
    assert any(not got[name].equal(base[name]) for name in base)  # and trained
    gguf_matches_hf(exported, isolated_runs / "cpt")


def gguf_matches_hf(model_dir: Path, out: Path) -> None:
    """The continued model through llama.cpp's converter (f16) and quantizer (Q8_0): next-token logits as the HF
    model's, within tests/test_gguf_convert.py's tolerances."""
    from test_gguf_convert import TEXT, TOLERANCE, hf_logits, llama_cpp_logits
    from transformers import AutoTokenizer

    from serve.gguf_convert import convert_to_gguf
    from serve.quantize import quantize_gguf

    convert_to_gguf(model_dir, out / "model-f16.gguf")
    quantize_gguf(out / "model-f16.gguf", out / "model-q8_0.gguf", "q8_0", threads=2)
    ids = AutoTokenizer.from_pretrained(model_dir)(TEXT)["input_ids"]
    reference = hf_logits(model_dir, ids)
    for outtype, tolerance in TOLERANCE.items():
        assert np.abs(llama_cpp_logits(out / f"model-{outtype}.gguf", ids) - reference).max() < tolerance, outtype


# ----------------------------------------------------------------------------------------------------------------
# LoRA SFT with the base's own chat template


def reply_spans(rendered: str, messages: list[dict[str, str]], eos: str) -> list[tuple[int, int]]:
    """Where each assistant reply and the EOS that closes it sit in the rendered conversation, found by searching
    the text in order (independently of how finetune/sft.py derives the mask)."""
    spans, cursor = [], 0
    for message in messages:
        if message["role"] == "assistant":
            start = rendered.index(message["content"] + eos, cursor)
            cursor = start + len(message["content"] + eos)
            spans.append((start, cursor))
    return spans


@pytest.mark.integration
@pytest.mark.parametrize("family", FAMILIES)
def test_two_steps_of_lora_sft_supervise_exactly_the_replies_and_their_eos(bases, family, tmp_path):
    from finetune import sft
    from finetune.sft_data import Example
    from forge.config import ForgeConfig

    base = bases[family]
    cfg = ForgeConfig(run_name="t", sft={"base_model": str(base), "mode": "lora", "micro_batch_size": 2,
                                         "max_seq_length": 256, "lr": 1e-2, "max_steps": 2, "warmup_ratio": 0.0,
                                         "log_every": 1})  # fmt: skip
    tokenizer = sft.load_tokenizer(base)
    model, lora = sft.load_model(base, cfg.sft)
    short = Example([{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}])
    trainer = sft.build_trainer(model, tokenizer, [Example(CONVERSATION), short], cfg, tmp_path, lora)
    batch = trainer.data_collator([trainer.train_dataset[0], trainer.train_dataset[1]])

    rendered = tokenizer.apply_chat_template(CONVERSATION, tokenize=False)
    encoded = tokenizer(rendered, add_special_tokens=False, return_offsets_mapping=True)
    ids, n = encoded["input_ids"], len(encoded["input_ids"])
    assert batch["input_ids"][0, :n].tolist() == ids  # the conversation as the base's own template renders it
    labels = batch["labels"][0]
    supervised = (labels[:n] != -100).tolist()
    spans = reply_spans(rendered, CONVERSATION, tokenizer.eos_token)
    inside = [any(a <= start and stop <= b for a, b in spans) for start, stop in encoded["offset_mapping"]]
    assert supervised == inside and (labels[n:] == -100).all()
    covered = "".join(rendered[a:b] for (a, b), flag in zip(encoded["offset_mapping"], supervised, strict=True) if flag)
    eos = tokenizer.eos_token
    assert covered == f"Serialize obj to a JSON formatted str.{eos}Deserialize s to a Python object.{eos}"
    assert labels[labels != -100].tolist() == [i for i, flag in zip(ids, supervised, strict=True) if flag]

    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters() if p.requires_grad}
    result = trainer.train()
    assert result.global_step == 2 and before and all("lora_" in name for name in before)
    after = dict(trainer.model.named_parameters())
    assert any(not before[name].equal(after[name].detach()) for name in before)  # the adapter trained


def test_a_turn_that_ends_with_its_own_token_not_eos_is_refused_with_the_fix(bases):
    from finetune import sft

    tokenizer = sft.load_tokenizer(bases["gemma2"])
    tokenizer.eos_token = "</s>"  # the published Gemma: EOS <eos>, turns closed by <end_of_turn>
    with pytest.raises(ForgeError, match=r"followed by '<end_of_turn>\\n'.*Gemma's <end_of_turn>.* eos_token"):
        sft.assistant_mask(tokenizer, CONVERSATION)
