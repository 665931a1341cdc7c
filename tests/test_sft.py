"""`forge sft` on a tiny model: the exact loss mask, each mode's parameter updates, the LoRA export and the stage.

The base is built here in seconds: a byte-level BPE trained on a slice of the stdlib corpus with pretrain.tokenizer's
own pre-tokenizer, special tokens and chat template (`save_tokenizer`), and a 2-layer, 64-wide llama.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch

from finetune import sft
from finetune.sft_data import Example
from forge import ForgeError
from forge.config import ForgeConfig, ModelConfig, TokenizerConfig, load_config
from pretrain.qa import stage as qa_stage

pytestmark = pytest.mark.integration  # starts servers, processes or trains (tests/conftest.py)

CONVERSATION = [
    {"role": "system", "content": "You answer questions about Python."},
    {"role": "user", "content": "What does `json.dumps` do?"},
    {"role": "assistant", "content": "Serialize obj to a JSON formatted str."},
    {"role": "user", "content": "And `json.loads`?"},
    {"role": "assistant", "content": "Deserialize s to a Python object."},
]


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory) -> Path:
    """An HF model directory like the pretrain stage exports: tiny llama + Forge tokenizer + chat template."""
    from pretrain.data.stdlib_corpus import iter_stdlib_records
    from pretrain.model import build_model
    from pretrain.tokenizer import save_tokenizer, train_bpe

    out = tmp_path_factory.mktemp("base") / "model"
    out.mkdir()
    tcfg = TokenizerConfig(vocab_size=512)
    tok = train_bpe([r["text"] for r in itertools.islice(iter_stdlib_records(), 400)], tcfg)
    save_tokenizer(tok, tcfg, out)
    mcfg = ModelConfig(hidden_size=64, num_layers=2, num_attention_heads=2, intermediate_size=128, context_length=256)
    torch.manual_seed(0)
    build_model(mcfg, tok.get_vocab_size()).save_pretrained(out)
    return out


def _cfg(base: Path, qa: dict | None = None, **sft_fields) -> ForgeConfig:
    fields = {"base_model": str(base), "micro_batch_size": 4, "max_seq_length": 128, "lr": 1e-2, "max_steps": 3,
              "warmup_ratio": 0.0, "log_every": 1, **sft_fields}  # fmt: skip
    return ForgeConfig(run_name="t", sft=fields, qa=qa or {})


def _examples(n: int = 8) -> list[Example]:
    return [
        Example([{"role": "user", "content": f"What is item {i}?"}, {"role": "assistant", "content": f"It is {i}."}])
        for i in range(n)
    ] + [Example(CONVERSATION)]


# ----------------------------------------------------------------------------------------------------------------
# the loss mask


def expected_labels(tokenizer, messages) -> tuple[list[int], list[bool]]:
    """Token ids and supervised flags built turn by turn, independently of the template and of TRL:
    role token (never supervised), content (supervised in assistant turns), EOS after assistant turns (supervised)."""
    roles = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
    role_ids = {role: tokenizer.convert_tokens_to_ids(token) for role, token in roles.items()}
    ids: list[int] = []
    supervised: list[bool] = []
    for m in messages:
        content = tokenizer(m["content"], add_special_tokens=False)["input_ids"]
        is_reply = m["role"] == "assistant"
        ids += [role_ids[m["role"]], *content]
        supervised += [False] + [is_reply] * len(content)
        if is_reply:
            ids.append(tokenizer.eos_token_id)
            supervised.append(True)
    return ids, supervised


def test_loss_mask_is_exactly_the_assistant_replies_and_their_eos(tiny_base, tmp_path):
    cfg = _cfg(tiny_base, mode="full")
    tokenizer = sft.load_tokenizer(tiny_base)
    model, _ = sft.load_model(tiny_base, cfg.sft)
    trainer = sft.build_trainer(model, tokenizer, [Example(CONVERSATION), *_examples(2)], cfg, tmp_path)
    batch = trainer.data_collator([trainer.train_dataset[0], trainer.train_dataset[1]])  # padded with a short one

    ids, supervised = expected_labels(tokenizer, CONVERSATION)
    # the template renders exactly the turn-by-turn sequence, so the positions below are the conversation's own
    assert batch["input_ids"][0, : len(ids)].tolist() == ids
    labels = batch["labels"][0]
    assert (labels[: len(ids)] != -100).tolist() == supervised
    assert (labels[len(ids) :] == -100).all()  # padding never supervised
    assert labels[labels != -100].tolist() == [i for i, s in zip(ids, supervised, strict=True) if s]
    # what is supervised decodes to the two replies, each closed by EOS, and nothing else
    text = tokenizer.decode(labels[labels != -100].tolist(), skip_special_tokens=False)
    assert text == "Serialize obj to a JSON formatted str.[EOS]Deserialize s to a Python object.[EOS]"
    assert sum(supervised) < len(ids) / 2  # the system and user turns are a real share of the sequence


def test_training_template_renders_like_the_shipped_one(tiny_base):
    tokenizer = sft.load_tokenizer(tiny_base)
    patched = sft.training_chat_template(tokenizer)
    assert "{% generation %}" in patched and "{% generation %}" not in tokenizer.chat_template
    for prompt in (False, True):
        assert tokenizer.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=prompt) == (
            tokenizer.apply_chat_template(
                CONVERSATION, tokenize=False, add_generation_prompt=prompt, chat_template=patched
            )  # fmt: skip
        )
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"  # no EOS after replies
    assert sft.training_chat_template(tokenizer) is None  # not Forge's: the mask comes from renderings
    with pytest.raises(ForgeError, match="does not end an assistant turn with the EOS token.*generation"):
        sft.assistant_mask(tokenizer, CONVERSATION)


# ----------------------------------------------------------------------------------------------------------------
# parameters: trainable ones change, frozen ones do not (TRL's own test, per mode)


def _train_and_compare(base: Path, mode: str, tmp_path: Path):
    cfg = _cfg(base, mode=mode, max_steps=4)
    tokenizer = sft.load_tokenizer(base)
    model, lora = sft.load_model(base, cfg.sft)
    trainer = sft.build_trainer(model, tokenizer, _examples(), cfg, tmp_path, lora)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    changed, unchanged = set(), set()
    for name, param in trainer.model.named_parameters():
        (unchanged if torch.equal(before[name], param.detach()) else changed).add(name)
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    return trainer, trainable, changed, unchanged


def test_full_mode_updates_every_parameter(tiny_base, tmp_path):
    _, trainable, changed, unchanged = _train_and_compare(tiny_base, "full", tmp_path)
    assert trainable and changed == trainable and not unchanged


def test_lora_mode_updates_only_the_adapter(tiny_base, tmp_path):
    _, trainable, changed, unchanged = _train_and_compare(tiny_base, "lora", tmp_path)
    assert trainable and all("lora_" in n for n in trainable)
    assert changed == trainable  # lora_A and lora_B of every adapted layer moved
    assert unchanged.isdisjoint(trainable)  # and every frozen parameter stayed exactly as it was
    assert any("q_proj.base_layer" in n for n in unchanged) and any("embed_tokens" in n for n in unchanged)


@pytest.mark.slow
def test_qlora_mode_trains_on_cpu_with_a_4bit_base(tiny_base, tmp_path):
    trainer, trainable, changed, unchanged = _train_and_compare(tiny_base, "qlora", tmp_path)
    import bitsandbytes as bnb

    four_bit = [m for m in trainer.model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert four_bit and all(m.weight.quant_type == "nf4" for m in four_bit)
    assert trainable and all("lora_" in n for n in trainable) and changed == trainable
    assert any("base_layer" in n for n in unchanged)  # the 4-bit weights did not move
    assert trainer.state.global_step == 4 and all(
        torch.isfinite(torch.tensor(h["loss"])) for h in trainer.state.log_history if "loss" in h
    )

    # export: the adapter merged into the unquantized base equals base + adapter unmerged; the trained
    # NF4 base + adapter differs from it only by the base's 4-bit rounding
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    sft.export(trainer, tiny_base, tmp_path, "qlora")
    ids = torch.tensor([[5, 40, 41, 42, 6, 43, 44, 3]])
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "model", dtype=torch.float32).eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_base, dtype=torch.float32)
    unmerged = PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    trainer.model.eval()
    with torch.no_grad():
        a, b, q = merged(ids).logits, unmerged(ids).logits, trainer.model(input_ids=ids).logits.float()
    assert torch.allclose(a, b, atol=1e-3, rtol=1e-3), (a - b).abs().max()
    print(f"qlora: |merged - NF4 base + adapter| max {(a - q).abs().max():.4f}, logit scale {a.abs().max():.3f}")


# ----------------------------------------------------------------------------------------------------------------
# the stage end to end: outputs, export equivalence, skipping


def _write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.mark.slow
def test_stage_lora_exports_a_merged_model_equal_to_base_plus_adapter(tiny_base, tmp_path, isolated_runs):
    rows = [{"question": f"What does function number {i} of module {i % 7} do?", "answer": f"It returns {i * 3}."}
            for i in range(60)]  # fmt: skip
    rows[5] = "{not json"
    rows[9] = {"question": "Q?", "answer": "  "}
    data = _write(tmp_path / "qa.jsonl", rows)
    cfg = _cfg(tiny_base, {"source": str(data), "eval_fraction": 0.1}, mode="lora", max_steps=4)
    qa_stage.run(cfg)
    manifest = sft.run(cfg)
    out = isolated_runs / "t" / "sft"
    assert manifest["status"] == "complete" and manifest["metrics"]["steps"] == 4
    qa_report = json.loads((isolated_runs / "t" / "qa" / "report.json").read_text())
    assert [s["line"] for s in qa_report["details"]["skipped_lines"]] == [6, 10]  # the user's file, line by line
    assert manifest["metrics"]["skipped"] == 0  # every line the qa stage wrote is valid and fits max_seq_length
    held = [json.loads(line) for line in (isolated_runs / "t" / "qa" / "qa_eval.jsonl").read_text().splitlines()]
    trained = [json.loads(line) for line in (out / "sft_train.jsonl").read_text().splitlines()]
    assert held and {h["question"] for h in held}.isdisjoint(m["messages"][0]["content"] for m in trained)
    assert len(held) + len(trained) + qa_report["details"]["near_duplicates_removed"] == 58
    assert {t["source"]["line"] for t in trained} <= set(range(1, 61)) - {6, 10}  # provenance: the file's line

    # the exported model carries the base's tokenizer and chat template byte for byte
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (out / "model" / name).read_bytes() == (tiny_base / name).read_bytes()

    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out / "model")
    text = tokenizer.apply_chat_template(CONVERSATION, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    merged = AutoModelForCausalLM.from_pretrained(out / "model", dtype=torch.float32).eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_base, dtype=torch.float32)
    unmerged = PeftModel.from_pretrained(base, out / "adapter").eval()
    plain = AutoModelForCausalLM.from_pretrained(tiny_base, dtype=torch.float32).eval()
    with torch.no_grad():
        a, b, c = merged(ids).logits, unmerged(ids).logits, plain(ids).logits
    assert torch.allclose(a, b, atol=1e-4, rtol=1e-4), (a - b).abs().max()
    assert (a - c).abs().max() > 1e-2  # and the adapter did change the model

    # MLflow got the per-step losses; a second run is skipped
    from forge.tracking import client_for

    history = client_for(cfg).get_metric_history(manifest["mlflow_run_id"], "loss")
    assert len(history) >= 4
    assert sft.run(cfg)["finished_at"] == manifest["finished_at"]


def test_cli_without_a_base_model_is_one_line(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "FORGE_RUNS_DIR": str(tmp_path / "runs")}
    forge = [sys.executable, "-c", "from forge.cli import main; main()"]
    out = subprocess.run([*forge, "sft", "--config", "configs/tiny-cpu.yaml"], capture_output=True, text=True, env=env)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    run = tmp_path / "runs" / "tiny-cpu"
    assert out.stderr.strip().splitlines() == [
        f"error: forge sft reads what earlier stages of run 'tiny-cpu' write: qa has not run ({run / 'qa'}); pretrain "
        f"has not run ({run / 'pretrain'}); run `forge qa`, then `forge pretrain` with the same --config first"
    ]


def test_stage_errors_are_one_line(tiny_base, tmp_path):
    with pytest.raises(ForgeError, match="pretrain has not run"):
        sft.run(ForgeConfig(run_name="t"))
    with pytest.raises(ForgeError, match=r"qa has not run .*; run `forge qa`"):
        sft.run(_cfg(tiny_base))
    bad = _write(tmp_path / "bad.jsonl", ["[1, 2]", '{"question": "x"}'])
    with pytest.raises(ForgeError, match=r"bad\.jsonl: no valid example in 2 line\(s\) \(line 1: .*; line 2: "):
        qa_stage.run(_cfg(tiny_base, {"source": str(bad)}))
    good = _write(tmp_path / "good.jsonl", [{"question": f"What is {i}?", "answer": f"It is {i}."} for i in range(9)])
    qa_stage.run(_cfg(tiny_base, {"source": str(good)}))
    with pytest.raises(ForgeError, match=r"built with other qa or data settings .*run `forge qa`"):
        sft.run(_cfg(tiny_base, {"source": str(bad)}))  # the config asks for another set than the one on disk
    with pytest.raises(ForgeError, match="sft.data=.*the setting moved to qa.source"):
        load_config(None, [f"sft.data={good}"])


@pytest.mark.slow
def test_stage_on_the_builtin_qa_holds_out_objects_for_eval(tiny_base, isolated_runs):
    cfg = _cfg(tiny_base, mode="full", max_examples=32, max_steps=2, system_prompt="Answer about Python.")
    from pretrain.data import stage as data_stage

    data_stage.run(cfg)
    qa_stage.run(cfg)
    manifest = sft.run(cfg)
    out = isolated_runs / "t" / "sft"
    report = json.loads((out / "data_report.json").read_text())
    qa_report = json.loads((isolated_runs / "t" / "qa" / "report.json").read_text())
    held = [json.loads(line) for line in (isolated_runs / "t" / "qa" / "qa_eval.jsonl").read_text().splitlines()]
    trained = [json.loads(line) for line in (out / "sft_train.jsonl").read_text().splitlines()]
    assert len(trained) == 32 == manifest["metrics"]["train_examples"] and report["capped_to"] == 32
    assert qa_report["train_pairs"] > 3000 and "below the usual 10,000-100,000 guidance" in report["guidance"]
    assert len(held) == qa_report["eval_pairs"] >= 200 and report["qa_set"] == "builtin"
    assert {h["object"] for h in held}.isdisjoint(t["object"] for t in trained)
    first = sft.load_data(cfg, sft.load_tokenizer(tiny_base), qa_stage.qa_set(cfg))[1][0]
    assert first["messages"] == [
        {"role": "system", "content": "Answer about Python."},
        {"role": "user", "content": first["question"]},
    ]  # the prompt as trained: forge eval renders it with add_generation_prompt
    assert trained[0]["messages"][0]["role"] == "system" and trained[0]["messages"][-1]["role"] == "assistant"
    samples = json.loads((out / "samples.json").read_text())
    assert len(samples) == 3 and all(isinstance(s["answer"], str) for s in samples)
