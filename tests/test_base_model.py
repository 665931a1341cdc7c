"""Starting from an existing model (model.init_from): a tiny Hugging Face llama directory with a tokenizer unlike
Forge's (digits split one by one, ChatML turns, other special tokens) built here, and the published SmolLM2-135M-
Instruct GGUF from the package registry (tests/conftest.py: smollm2_gguf)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from forge import ForgeError
from forge.config import load_config
from models.base import open_base
from models.pretokenize import TRICKY_TEXT, check_llama_cpp_tokens, llama_cpp_pre_type
from tests.test_gguf_export import generated_docs
from tests.test_tokenizer import write_data_stage

pytestmark = pytest.mark.integration  # starts servers, processes or trains (tests/conftest.py)

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>'"
    " + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def make_foreign_base(dest: Path, seed: int = 0) -> Path:
    """A random tiny LlamaForCausalLM saved with safetensors and a ChatML byte-level BPE whose pre-tokenizer splits
    digits one by one (SmolLM's), ids 0-2 <|endoftext|> <|im_start|> <|im_end|>."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )  # fmt: skip
    tok.train_from_iterator(generated_docs(300, seed=seed), trainer=trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|endoftext|>",
        unk_token=None, clean_up_tokenization_spaces=False,
    )  # fmt: skip
    hf.chat_template = CHATML
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=640, hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, rope_parameters={"rope_type": "default",
        "rope_theta": 50_000.0}, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        initializer_range=0.05,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(dest)
    hf.save_pretrained(dest)
    return dest


@pytest.fixture(scope="module")
def foreign_base(tmp_path_factory) -> Path:
    return make_foreign_base(tmp_path_factory.mktemp("base") / "tiny-chatml-llama")


# ----------------------------------------------------------------------------------------------------------------
# what is supported, and the errors for what is not


def test_missing_or_unsupported_bases_are_clear_errors(tmp_path, foreign_base):
    with pytest.raises(ForgeError, match=r"model.init_from=.*nowhere: no such file.*supported: a local Hugging Face"):
        open_base(tmp_path / "nowhere")
    (tmp_path / "model.bin").write_bytes(b"\0")
    with pytest.raises(ForgeError, match="a file that is not a .gguf"):
        open_base(tmp_path / "model.bin")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ForgeError, match="has no config.json"):
        open_base(tmp_path / "empty")
    pickled = tmp_path / "pickled"
    shutil.copytree(foreign_base, pickled)
    (pickled / "model.safetensors").rename(pickled / "pytorch_model.bin")
    with pytest.raises(ForgeError, match="no model.safetensors .pickled .bin checkpoints are never loaded"):
        open_base(pickled)
    bert = tmp_path / "bert"
    shutil.copytree(foreign_base, bert)
    config = json.loads((bert / "config.json").read_text())
    (bert / "config.json").write_text(json.dumps({**config, "model_type": "bert", "architectures": ["BertModel"]}))
    with pytest.raises(ForgeError, match=r"bert: model_type 'bert' is not a decoder-only causal LM; supported: every"):
        open_base(bert).config()


def test_the_shape_comes_from_the_base_and_continued_pretraining_defaults(foreign_base):
    from pretrain.model import build_model, count_parameters, model_config
    from pretrain.plan import estimate

    cfg = load_config(None, [f"model.init_from={foreign_base}", "model.context_length=128", "train.max_steps=500"])
    m = model_config(cfg)
    assert (m.architecture, m.hidden_size, m.num_layers, m.num_attention_heads, m.num_key_value_heads) == (
        "llama", 64, 2, 4, 2,
    )  # fmt: skip
    assert (m.intermediate_size, m.vocab_size, m.context_length, m.model_class) == (192, 640, 128, "LlamaForCausalLM")
    assert count_parameters(m) == build_model(m).num_parameters() == open_base(foreign_base).load_model(
    ).num_parameters()  # fmt: skip
    assert estimate(cfg)["model"]["parameters"] == count_parameters(m)  # forge plan reads the base's shape
    # a window longer than the base's context is the base's context
    assert model_config(load_config(None, [f"model.init_from={foreign_base}", "model.context_length=4096"])
                        ).context_length == 512  # fmt: skip
    assert (cfg.train.lr, cfg.train.warmup_steps) == (1e-4, 5)
    explicit = load_config(None, [f"model.init_from={foreign_base}", "train.lr=3e-5", "train.warmup_steps=0"])
    assert (explicit.train.lr, explicit.train.warmup_steps) == (3e-5, 0)
    assert load_config(None, []).train.lr == 3e-4  # from scratch: unchanged


# ----------------------------------------------------------------------------------------------------------------
# tokenizer and pretrain stages on the base


def test_tokenizer_stage_records_the_base_tokenizer_and_pretrain_continues_the_base(
    foreign_base, isolated_runs, monkeypatch
):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from pretrain import tokenizer as tok_stage
    from pretrain import train as train_stage
    from pretrain.token_shards import load_split, read_meta

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    docs = generated_docs(160, seed=3)
    write_data_stage(isolated_runs, "cont", {"train": docs[:120], "val": docs[120:145], "test": docs[145:]})
    sets = [
        f"model.init_from={foreign_base}",
        "model.context_length=64",
        "run_name=cont",
        "train.max_steps=3",
        "train.micro_batch_size=2",
        "train.grad_accum_steps=1",
        "train.eval_every=3",
        "train.eval_batches=1",
        "train.checkpoint_every=3",
        "train.precision=fp32",
        "tokenizer.max_tokens_per_word=0.5",
    ]  # fmt: skip  (every text needs more: the warning fires)
    manifest = tok_stage.run(load_config(None, sets))
    out = isolated_runs / "cont" / "tokenizer"
    base_tok = AutoTokenizer.from_pretrained(foreign_base)
    ours = AutoTokenizer.from_pretrained(out)
    assert ours.get_vocab() == base_tok.get_vocab()  # no new vocabulary
    assert ours.chat_template == CHATML
    report = json.loads((out / "report.json").read_text())
    assert report["base"]["sha256"] == manifest["inputs"]["base"]  # the base's identity, hashed by content
    assert report["base"]["architecture"] == "llama" and set(report["tokenizer_files"]) >= {"tokenizer.json"}
    assert report["tokens_per_word"] > 0 and report["roundtrip_checked_documents"] == 25
    [warning] = report["warnings"]  # advice for a vocabulary that cannot be retrained here, not tokenizer.vocab_size
    assert "the base model's tokenizer was trained on other text" in warning and "vocab_size" not in warning
    meta = read_meta(out / "shards")
    assert meta["eos_id"] == 2 and meta["bos_id"] == 1 and "user_id" not in meta
    tokens, offsets = load_split(out / "shards", "val")
    first = tokens[offsets[0] : offsets[1] - 1].tolist()
    assert first == base_tok(docs[120], add_special_tokens=False)["input_ids"]  # the shards use the base's ids

    # a learning rate of ~0 keeps the weights: the exported model IS the base, so it was loaded, not built
    train_stage.run(load_config(None, [*sets, "train.lr=1e-12"]))
    exported = isolated_runs / "cont" / "pretrain" / "model"
    got, want = load_file(exported / "model.safetensors"), load_file(foreign_base / "model.safetensors")
    assert set(got) == set(want)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=1e-6)
    assert json.loads((exported / "config.json").read_text())["max_position_embeddings"] == 512
    assert (
        json.loads((isolated_runs / "cont" / "pretrain" / "manifest.json").read_text())["inputs"]["base"]
        == (report["base"]["sha256"])
    )


# ----------------------------------------------------------------------------------------------------------------
# the GGUF export of a foreign tokenizer


def test_gguf_export_of_a_foreign_tokenizer_tokenizes_and_scores_like_hf(foreign_base, tmp_path):
    import torch
    from llama_cpp import Llama
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from models.gguf import gguf_metadata
    from serve.gguf_export import export_gguf

    info = export_gguf(foreign_base, tmp_path / "m.gguf")
    assert info["pre_tokenizer"] == "smollm" and info["tokenization_checked_tokens"] > 100
    meta = gguf_metadata(tmp_path / "m.gguf", "tokenizer.ggml.pre", "tokenizer.ggml.eos_token_id")
    assert meta == {"tokenizer.ggml.pre": "smollm", "tokenizer.ggml.eos_token_id": 2}
    tok = AutoTokenizer.from_pretrained(foreign_base)
    ids = tok(TRICKY_TEXT, add_special_tokens=False)["input_ids"]
    assert check_llama_cpp_tokens(tmp_path / "m.gguf", tok) == len(ids)
    model = AutoModelForCausalLM.from_pretrained(foreign_base, dtype=torch.float32).eval()
    with torch.inference_mode():
        expected = model(torch.tensor([ids[:100]])).logits[0].numpy()
    llm = Llama(model_path=str(tmp_path / "m.gguf"), n_ctx=128, n_batch=128, logits_all=True, verbose=False)
    try:
        llm.eval(ids[:100])
        got = np.array(llm.scores[:100])
    finally:
        llm.close()
    assert expected.std() > 0.3 and np.abs(got - expected).max() < 0.01


def test_a_pre_tokenizer_llama_cpp_does_not_have_is_refused_and_nothing_is_written(foreign_base, tmp_path):
    from tokenizers import pre_tokenizers
    from transformers import AutoTokenizer

    from serve.gguf_export import export_gguf

    odd = tmp_path / "odd"
    shutil.copytree(foreign_base, odd)
    tok = AutoTokenizer.from_pretrained(odd)
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)  # " " before each text
    tok.save_pretrained(odd)
    with pytest.raises(ForgeError, match="matches none of llama.cpp's known types .* not exported"):
        export_gguf(odd, tmp_path / "odd.gguf")
    assert not list(tmp_path.glob("*.gguf")) and not list(tmp_path.glob(".odd.gguf*"))


# ----------------------------------------------------------------------------------------------------------------
# the published base: SmolLM2-135M-Instruct, Q4_1 GGUF


def test_smollm2_gguf_base_shape_and_tokenizer_match_llama_cpp(smollm2_gguf):
    from transformers import AutoTokenizer

    base = open_base(smollm2_gguf)
    m = base.model_shape(256)
    assert (m.hidden_size, m.num_layers, m.num_attention_heads, m.num_key_value_heads, m.vocab_size) == (
        576, 30, 9, 3, 49152,
    )  # fmt: skip
    tok = base.tokenizer()
    assert llama_cpp_pre_type(tok, "smollm2") == "smollm"
    assert check_llama_cpp_tokens(smollm2_gguf, tok) > 100
    assert tok("2024", add_special_tokens=False)["input_ids"] == [tok.convert_tokens_to_ids(c) for c in "2024"]
    assert "<|im_start|>" in tok.chat_template and tok.eos_token == "<|im_end|>"
    # transformers' own GGUF tokenizer forgets the GGUF's pre-tokenizer (plain GPT-2 split): what open_base corrects
    raw = AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name, local_files_only=True)
    assert llama_cpp_pre_type(raw, "raw") == "gpt-2"


# ----------------------------------------------------------------------------------------------------------------
# SFT with the base's own chat template (ChatML): the loss mask is still exactly the replies and their EOS

CONVERSATION = [
    {"role": "system", "content": "You answer questions about Python."},
    {"role": "user", "content": "What does `json.dumps` do in 2024?"},
    {"role": "assistant", "content": "Serialize obj to a JSON formatted str."},
    {"role": "user", "content": "And `json.loads`?"},
    {"role": "assistant", "content": "Deserialize s to a Python object."},
]


def chatml_labels(tok, messages) -> tuple[list[int], list[bool]]:
    """Ids and supervised flags built turn by turn, independently of the template and of TRL."""
    ids: list[int] = []
    supervised: list[bool] = []

    def add(text: str, flag: bool) -> None:
        piece = tok(text, add_special_tokens=False)["input_ids"]
        ids.extend(piece)
        supervised.extend([flag] * len(piece))

    for m in messages:
        reply = m["role"] == "assistant"
        add(f"<|im_start|>{m['role']}\n", False)
        add(m["content"] + "<|im_end|>", reply)
        add("\n", False)
    return ids, supervised


@pytest.mark.parametrize("mode", ["full", "lora", "qlora"])
def test_sft_on_a_base_with_its_own_chat_template_masks_exactly(foreign_base, tmp_path, mode):
    from finetune import sft
    from finetune.sft_data import Example
    from forge.config import ForgeConfig

    cfg = ForgeConfig(run_name="t", sft={"base_model": str(foreign_base), "mode": mode, "micro_batch_size": 2,
                                         "max_seq_length": 256, "lr": 1e-2, "max_steps": 2, "warmup_ratio": 0.0,
                                         "log_every": 1})  # fmt: skip
    tokenizer = sft.load_tokenizer(foreign_base)
    assert sft.training_chat_template(tokenizer) is None  # ChatML: not Forge's, no generation markers
    model, lora = sft.load_model(foreign_base, cfg.sft)
    short = Example([{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}])
    trainer = sft.build_trainer(model, tokenizer, [Example(CONVERSATION), short], cfg, tmp_path, lora)
    batch = trainer.data_collator([trainer.train_dataset[0], trainer.train_dataset[1]])
    ids, supervised = chatml_labels(tokenizer, CONVERSATION)
    assert batch["input_ids"][0, : len(ids)].tolist() == ids
    labels = batch["labels"][0]
    assert (labels[: len(ids)] != -100).tolist() == supervised
    assert (labels[len(ids) :] == -100).all()
    text = tokenizer.decode(labels[labels != -100].tolist(), skip_special_tokens=False)
    assert text == "Serialize obj to a JSON formatted str.<|im_end|>Deserialize s to a Python object.<|im_end|>"
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    after = dict(trainer.model.named_parameters())
    assert any(not torch_equal(before[n], after[n]) for n in before)  # it trained


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b.detach()))


def test_a_template_that_rewrites_earlier_turns_is_refused(foreign_base):
    from finetune import sft

    tokenizer = sft.load_tokenizer(foreign_base)
    # marks the last message specially: earlier turns render differently once later turns follow
    tokenizer.chat_template = CHATML.replace(
        "'<|im_start|>' + message['role']", "('<|last|>' if loop.last else '<|im_start|>') + message['role']"
    )
    with pytest.raises(ForgeError, match="renders earlier turns differently"):
        sft.assistant_mask(tokenizer, CONVERSATION)


# ----------------------------------------------------------------------------------------------------------------
# the whole path from the published base, through the real CLI: continued pretraining, LoRA SFT, eval, quantize,
# register, the gate, then `forge serve` on llama.cpp answering the openai client


@pytest.mark.slow
def test_from_the_published_base_to_a_served_chat_answer(smollm2_gguf, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import threading
    import time

    import torch
    import yaml
    from conftest import free_port
    from llama_cpp import Llama
    from openai import OpenAI
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from forge.hashing import sha256_file

    repo = Path(__file__).resolve().parent.parent
    runs, port = tmp_path / "runs", free_port()
    env = {**{k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}, "FORGE_RUNS_DIR": str(runs)}
    # The path, not the model: a few LoRA steps do not make SmolLM2 answer the held-out questions better than its
    # few-shot base (measured: Q&A F1 0.079 against 0.19, interval [-0.24, -0.008] over 24 pairs), and the shipped
    # gate says so. Here the gate holds every rule but that one and takes 20 items as enough; the gate's quality
    # rules themselves are tests/test_gate_cli.py's.
    policy = yaml.safe_load((repo / "configs" / "policies" / "gate.yaml").read_text())
    # The random-init floor is left out too (one more model to score twice), and every count is the gate's 20.
    policy["quality"]["beats_base"], policy["min_items"] = [], 20
    policy["quality"]["beats_floors"] = ["unigram"]
    (tmp_path / "gate.yaml").write_text(yaml.safe_dump(policy))
    quick = {"model.init_from": smollm2_gguf, "train.max_steps": 2, "train.checkpoint_every": 2,
             "train.eval_every": 2, "train.eval_batches": 2, "sft.max_steps": 4, "quantize.max_eval_tokens": 2000,
             "eval.mc_max_examples": 20, "eval.qa_max_examples": 20, "eval.text_items": 20,
             "eval.random_baseline": False, "eval.memorisation_docs": 4, "eval.generation_prompts": 2,
             "serve.port": port, "serve.ui_port": free_port(),
             "registry.gate_policy": tmp_path / "gate.yaml"}  # fmt: skip
    sets = [arg for key, value in quick.items() for arg in ("--set", f"{key}={value}")]
    forge = str(Path(sys.executable).with_name("forge"))
    cmd = [forge, "pipeline", "--config", "configs/base-smollm2.yaml", *sets]
    proc = subprocess.Popen(cmd, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    try:
        deadline = time.time() + 1800
        while not any("serving" in line and f"127.0.0.1:{port}" in line for line in lines) and proc.poll() is None:
            assert time.time() < deadline, "".join(lines[-30:])
            time.sleep(0.5)
        assert proc.poll() is None, "".join(lines[-40:])
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=3, timeout=120)
        reply = client.chat.completions.create(
            model="forge-base-smollm2", messages=[{"role": "user", "content": "What does `json.dumps` do?"}],
            max_tokens=24, temperature=0.0,
        )  # fmt: skip
        answer = reply.choices[0].message.content or ""
        assert reply.usage.completion_tokens >= 3 and len(answer.split()) >= 3, answer  # words, not noise
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
    assert code == 0, "".join(lines[-30:])

    run = runs / "base-smollm2"
    lineage = json.loads((run / "register" / "lineage.json").read_text())
    assert lineage["base"]["sha256"] == sha256_file(smollm2_gguf)  # the base is recorded, and it is this file
    card = json.loads((run / "report.json").read_text())
    assert card["gate"]["passed"] is True and card["outcome"]["result"] == "promoted"
    served = json.loads((run / "serve" / "serving.json").read_text())
    assert served["source"]["alias"] == "production" and served["model"].endswith("model-q4_k_m.gguf")

    # the final model: HF (fp32, the SFT's merged weights) and its f16 GGUF tokenize and score alike
    model_dir = Path(json.loads((run / "quantize" / "quantize.json").read_text())["model_dir"])
    tok = AutoTokenizer.from_pretrained(model_dir)
    f16 = run / "quantize" / "model-f16.gguf"
    assert check_llama_cpp_tokens(f16, tok) > 100
    ids = tok(TRICKY_TEXT, add_special_tokens=False)["input_ids"][:64]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        expected = model(torch.tensor([ids])).logits[0].numpy()
    llm = Llama(model_path=str(f16), n_ctx=128, n_batch=128, logits_all=True, verbose=False)
    try:
        llm.eval(ids)
        got = np.array(llm.scores[: len(ids)])
    finally:
        llm.close()
    assert (got.argmax(-1) == expected.argmax(-1)).mean() > 0.95
    assert np.abs(got - expected).max() < 0.05 * np.abs(expected).max()  # f16 weights: relative to the logits' size
