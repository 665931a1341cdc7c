"""`forge quantize`: llama.cpp types by name with real K-quants, sliding-window perplexity, the stage's inputs and
errors, the whole stage on a briefly trained model (drift bars of the issue) and the 125M model under 100 MB."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from test_gguf_export import generated_docs, hf_ids, make_model_dir, make_tokenizer_dir

from forge import ForgeError
from forge.config import ForgeConfig, QuantizeConfig, load_config

pytestmark = pytest.mark.integration  # starts servers, processes or trains (tests/conftest.py)


@pytest.fixture(scope="module")
def llama_f16(tmp_path_factory):
    from serve.gguf_export import export_gguf

    root = tmp_path_factory.mktemp("quant")
    tok_dir = make_tokenizer_dir(root / "tokenizer")
    model_dir = make_model_dir(root / "llama", "llama", tok_dir)
    export_gguf(model_dir, root / "f16.gguf")
    return model_dir, root / "f16.gguf"


# ----------------------------------------------------------------------------------------------------------------
# types by name


def test_gguf_types_by_name():
    from serve.quantize import check_types, gguf_types

    known = gguf_types()
    assert {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_k_m", "q5_k_m", "q6_k", "iq4_xs"} <= set(known)
    assert check_types(["Q4_K_M", "q8_0"]) == ["f16", "q4_k_m", "q8_0"]  # f16 first: the quantizer's input
    with pytest.raises(ForgeError, match=r"unknown llama.cpp type\(s\) q4_k_x; known: .*q4_k_m"):
        check_types(["q4_k_x"])


def test_quantize_q8_and_real_k_quants(llama_f16, tmp_path):
    from llama_cpp import Llama

    from serve.quantize import k_quant_fallback, quantize_gguf

    model_dir, f16 = llama_f16
    q8 = quantize_gguf(f16, tmp_path / "q8_0.gguf", "q8_0", threads=2)
    q4 = quantize_gguf(f16, tmp_path / "q4_k_m.gguf", "q4_k_m", threads=2)
    assert q8["tensor_types"]["Q8_0"] == 15  # every 2-D weight (7 per layer + embeddings)
    assert "Q4_K" in q4["tensor_types"] and "Q6_K" in q4["tensor_types"]  # real K-quants: hidden 256
    assert k_quant_fallback("q4_k_m", q4["tensor_types"]) is None
    assert "fell back" in k_quant_fallback("q4_k_m", {"Q5_0": 3, "F32": 2})
    assert f16.stat().st_size > q8["size_bytes"] > q4["size_bytes"]

    ids = hf_ids(model_dir, generated_docs(1, seed=3)[0])[:64]
    logits = {}
    for name, path in (("f16", f16), ("q4", tmp_path / "q4_k_m.gguf")):
        llm = Llama(model_path=str(path), n_ctx=128, logits_all=True, verbose=False)
        llm.eval(ids)
        logits[name] = np.array(llm.scores[: len(ids)])
        llm.close()
    diff = np.abs(logits["f16"] - logits["q4"])
    assert 0 < diff.max() < 1.0  # quantized: different, but close


# ----------------------------------------------------------------------------------------------------------------
# perplexity


def test_windows_score_every_token_once():
    from models.perplexity import windows

    for n, window, stride in [(10, 4, 2), (100, 16, 5), (17, 8, 8), (3, 8, 4), (50, 50, 25)]:
        targets = [t for _, end, first in windows(n, window, stride) for t in range(first, end)]
        assert targets == list(range(1, n)), (n, window, stride)
        assert all(end - begin <= window for begin, end, _ in windows(n, window, stride))
    with pytest.raises(ForgeError, match="stride"):
        windows(10, 4, 5)


def test_perplexity_hf_and_gguf_agree(llama_f16):
    import torch
    from transformers import AutoModelForCausalLM

    from models.access import GGUFBackend
    from models.perplexity import perplexity_hf

    model_dir, f16 = llama_f16
    ids = hf_ids(model_dir, " ".join(generated_docs(6, seed=5)))[:300]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    # one window holding everything == the plain full-context perplexity
    with torch.inference_mode():
        logits = model(torch.tensor([ids[:100]])).logits[0, :-1]
        full = math.exp(torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:100])).item())
    assert perplexity_hf(model, ids[:100], 100, 50).ppl == pytest.approx(full, rel=1e-5)

    hf = perplexity_hf(model, ids, 128, 64)
    scorer = GGUFBackend(f16, n_threads=2, n_ctx=128)  # how forge quantize measures a GGUF
    try:
        gg = scorer.perplexity(ids, 128, 64)
    finally:
        scorer.close()
    assert hf.tokens == gg.tokens == len(ids) - 1 and hf.windows == gg.windows
    assert gg.ppl == pytest.approx(hf.ppl, rel=2e-3)
    with pytest.raises(ForgeError, match="longer than the model's context"):
        perplexity_hf(model, ids, 256, 128)


# ----------------------------------------------------------------------------------------------------------------
# the stage


def test_missing_model_is_a_clear_error(isolated_runs):
    from serve.quantize import run

    cfg = ForgeConfig(run_name="nomodel")
    with pytest.raises(ForgeError) as err:
        run(cfg)
    message = str(err.value)
    assert "runs/nomodel/sft/model" in message.replace(str(isolated_runs), "runs")
    assert "pretrain/model" in message and "forge pretrain" in message
    with pytest.raises(ForgeError, match="unknown llama.cpp type"):
        run(ForgeConfig(run_name="nomodel", quantize=QuantizeConfig(gguf_types=["q9_k"])))
    with pytest.raises(ForgeError, match="target"):
        run(cfg, target="best")


def _write_shards(tokenizer_dir, shards_dir, docs):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer

    from pretrain.token_shards import write_shards

    parquet = {}
    for split, part in (("train", docs[:-40]), ("val", docs[-40:-20]), ("test", docs[-20:])):
        path = shards_dir.parent / f"{split}-00000.parquet"
        pq.write_table(pa.table({"text": part}), path)
        parquet[split] = [path]
    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    write_shards(tokenizer, parquet, shards_dir, {"pad": 0, "unk": 1, "bos": 2, "eos": 3})


def _train_briefly(model_dir, shards_dir, steps):
    """A few hundred AdamW steps on the train shard, so the model has learned something quantization can hurt."""
    import torch
    from transformers import AutoModelForCausalLM

    from pretrain.token_shards import load_split

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two threads on this shared 2-core machine are 10-20x slower, not faster
    torch.manual_seed(0)
    tokens = torch.from_numpy(np.asarray(load_split(shards_dir, "train")[0], dtype=np.int64))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    for _ in range(steps):
        starts = torch.randint(0, len(tokens) - 65, (8,))
        batch = torch.stack([tokens[s : s + 64] for s in starts])
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.save_pretrained(model_dir)
    torch.set_num_threads(threads)
    return loss.item()


@pytest.mark.slow
def test_stage_reports_fidelity_and_cost(isolated_runs, tmp_path):
    from serve.quantize import run

    run_path = isolated_runs / "qt"
    tok_dir = make_tokenizer_dir(tmp_path / "tokenizer")
    shards = run_path / "tokenizer" / "shards"
    shards.parent.mkdir(parents=True)
    _write_shards(tok_dir, shards, generated_docs(300, seed=11))
    model_dir = make_model_dir(run_path / "pretrain" / "model", "llama", tok_dir, initializer_range=0.02)
    loss = _train_briefly(model_dir, shards, steps=80)
    assert loss < 4.5  # it learned something (uniform over ~640 tokens: 6.5)
    for stage in ("pretrain", "tokenizer"):
        (run_path / stage / "manifest.json").write_text(json.dumps({"status": "complete"}))

    cfg = ForgeConfig(
        run_name="qt",
        quantize=QuantizeConfig(max_eval_tokens=2500, generation_prompts=2, max_new_tokens=16, threads=1),
    )
    manifest = run(cfg)
    assert manifest["status"] == "complete"
    out = run_path / "quantize"
    report = json.loads((out / "quantize.json").read_text())
    arts = report["artifacts"]
    assert list(arts) == ["hf-fp32", "f16", "q8_0", "q4_k_m", "bnb-int8", "bnb-nf4"]
    for name in ("f16", "q8_0", "q4_k_m"):
        assert (out / f"model-{name}.gguf").stat().st_size == arts[name]["size_bytes"]
        assert arts[name]["decode_tokens_per_s"] > 0 and arts[name]["prompt_tokens_per_s"] > 0
    assert arts["f16"]["size_bytes"] > arts["q8_0"]["size_bytes"] > arts["q4_k_m"]["size_bytes"]
    assert abs(arts["f16"]["ppl_drift"]) < 0.002  # f16 GGUF == the HF model
    assert abs(arts["q8_0"]["ppl_drift_vs_f16"]) < 0.01  # the bars
    assert abs(arts["q4_k_m"]["ppl_drift_vs_f16"]) < 0.05
    assert arts["q8_0"]["drift_ok"] and arts["q4_k_m"]["drift_ok"]
    assert arts["f16"]["greedy_prefix_agreement"] >= 0.9
    for name in ("bnb-int8", "bnb-nf4"):
        assert "error" not in arts[name], arts[name]
        assert arts[name]["size_bytes"] < arts["hf-fp32"]["size_bytes"]
        assert abs(arts[name]["ppl_drift"]) < 0.1
    assert "--quantization fp8" in report["gpu_serving"]
    assert "| q4_k_m |" in (out / "report.md").read_text()
    metrics = manifest["metrics"]
    assert metrics["q4_k_m_ppl_drift_vs_f16"] == arts["q4_k_m"]["ppl_drift_vs_f16"]
    print(json.dumps({k: {f: v.get(f) for f in ("size_mb", "ppl", "ppl_drift", "ppl_drift_vs_f16",
                                                "greedy_prefix_agreement", "decode_tokens_per_s")}
                      for k, v in arts.items()}, indent=1))  # fmt: skip

    again = run(cfg)  # unchanged model and config: skipped
    assert again["finished_at"] == manifest["finished_at"]


@pytest.mark.slow
def test_125m_q4_k_m_is_under_100_mb(tmp_path):
    """A 125M model in Q4_K_M fits in 100 MB: a random-init model built from configs/125m.yaml (any architecture)."""
    import torch

    from pretrain.model import build_model
    from serve.gguf_export import write_gguf
    from serve.quantize import quantize_gguf

    cfg = load_config("configs/125m.yaml")
    vocab = cfg.model.vocab_size or cfg.tokenizer.vocab_size
    tok_dir = make_tokenizer_dir(tmp_path / "tok", vocab_size=400)  # padded to the model's vocabulary
    torch.manual_seed(0)
    model = build_model(cfg.model, vocab)
    params = sum(p.numel() for p in model.parameters())
    write_gguf(model.state_dict(), model.config, tok_dir, tmp_path / "f16.gguf")
    del model
    info = quantize_gguf(tmp_path / "f16.gguf", tmp_path / "q4_k_m.gguf", "q4_k_m")
    (tmp_path / "f16.gguf").unlink()
    print(f"125m ({cfg.model.architecture}, {params:,} parameters): Q4_K_M {info['size_bytes'] / 1e6:.1f} MB")
    assert "Q4_K" in info["tensor_types"]
    assert info["size_bytes"] < 100e6


def test_greedy_agreement_and_prompts():
    from serve.quantize import generation_prompts, greedy_agreement

    got = greedy_agreement([[1, 2, 3, 4], [5, 6]], [[1, 2, 9, 4], [5, 6]])
    assert got == {"greedy_prefix_agreement": 0.75, "greedy_token_agreement": 0.875, "greedy_exact_match": 0.5}
    ids = np.arange(1000)
    prompts = generation_prompts(ids, np.array([0, 10, 300, 1000]), 3, 32)
    assert [p[0] for p in prompts] == [10, 300, 0]  # documents longer than the prompt first, then other spans
    assert all(len(p) == 32 for p in prompts)
