"""The model-access layer (models/): the same primitives on an HF directory and on its GGUF, exactly.

HF-vs-GGUF logits and perplexity are pinned in test_gguf_export.py and test_eval.py; here: what the KV cache,
llama.cpp's last-logits-only path and bitsandbytes loading must not change, and the errors for bad paths.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_gguf_export import generated_docs, make_model_dir, make_tokenizer_dir

from forge import ForgeError

pytestmark = pytest.mark.integration  # starts servers, processes or trains (tests/conftest.py)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """(model_dir, f16 gguf) of a random-init tiny llama, logits spread out enough for argmax to be meaningful."""
    from serve.gguf_export import export_gguf

    root = tmp_path_factory.mktemp("models")
    model_dir = make_model_dir(root / "llama", "llama", make_tokenizer_dir(root / "tokenizer"), initializer_range=0.2)
    gguf = root / "llama-f16.gguf"
    export_gguf(model_dir, gguf)
    return model_dir, gguf


def _greedy_without_cache(model, prompt: list[int], n: int) -> list[int]:
    """Greedy decoding that recomputes the whole sequence every step: what the KV cache must reproduce."""
    ids, out = list(prompt), []
    for _ in range(n):
        out.append(int(np.argmax(model.logits(ids)[-1])))
        ids.append(out[-1])
    return out


def test_hf_generation_with_the_kv_cache_equals_recomputing_every_step(llama):
    from models.access import HFBackend

    model = HFBackend(llama[0])
    prompt = model.encode(generated_docs(1, seed=3)[0])[:24]
    expected = _greedy_without_cache(model, prompt, 16)
    assert model.generate(prompt, 16) == expected
    timed = model.timed_greedy(prompt, 16)
    assert timed.ids == expected and timed.prompt_s > 0 and timed.decode_tokens_per_s > 0
    assert len(set(expected)) > 1  # not a constant output, which any bug would also produce


def test_batched_greedy_answers_equal_one_prompt_at_a_time(llama, monkeypatch):
    """Left-padded prompts of different lengths decoded together give exactly `generate`'s greedy ids, stop ids and
    stop text included, across batches (GENERATE_ROWS shrunk to split them)."""
    from models import hf_backend
    from models.access import HFBackend

    model = HFBackend(llama[0])
    docs = [model.encode(d) for d in generated_docs(10, seed=4)]
    prompts = [doc[: 3 + 5 * i] for i, doc in enumerate(docs)]
    alone = [model.generate(p, 12) for p in prompts]
    stop = {alone[3][4]}  # a stop id that ends some answers early (and is kept), others not
    stopped = [model.generate(p, 12, stop_ids=stop) for p in prompts]
    text_stop = model.decode(alone[5][2:4])
    by_text = [model.generate(p, 12, stop_text=text_stop) for p in prompts]
    monkeypatch.setattr(hf_backend, "GENERATE_ROWS", 4)
    assert model.greedy_many(prompts, 12) == alone
    assert model.greedy_many(prompts, 12, stop_ids=stop) == stopped and any(len(a) < 12 for a in stopped)
    assert model.greedy_many(prompts, 12, stop_text=text_stop) == by_text and len(by_text[5]) < 12
    assert len({tuple(a) for a in alone}) > 5  # the prompts lead to different answers


def test_llama_cpp_without_all_logits_generates_what_it_does_with_them(llama):
    from models.access import GGUFBackend

    model_dir, gguf = llama
    scorer, fast = GGUFBackend(gguf, n_threads=1), GGUFBackend(gguf, n_threads=1, logits_all=False)
    try:
        prompt = scorer.encode(generated_docs(1, seed=4)[0])[:24]
        expected = _greedy_without_cache(scorer, prompt, 12)
        assert scorer.generate(prompt, 12) == expected
        assert fast.timed_greedy(prompt, 12).ids == expected
        assert fast.prompt_speed(prompt) > 0
    finally:
        scorer.close()
        fast.close()


def test_bitsandbytes_loading_shrinks_the_model_and_keeps_its_tokenizer(llama):
    from models.access import HFBackend

    full, nf4 = HFBackend(llama[0]), HFBackend(llama[0], quantization="nf4")
    assert nf4.memory_footprint() < 0.5 * full.memory_footprint()
    text = generated_docs(1, seed=5)[0]
    assert nf4.encode(text) == full.encode(text)
    ids = full.encode(text)[:32]
    assert np.isfinite(nf4.logits(ids)).all()


def test_open_model_refuses_what_it_cannot_open(llama, tmp_path):
    from models.access import open_model

    with pytest.raises(ForgeError, match="does not exist"):
        open_model(tmp_path / "missing")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ForgeError, match="neither a model directory nor a .gguf file"):
        open_model(tmp_path / "notes.txt")
    with pytest.raises(ForgeError, match="not a model directory"):
        open_model(tmp_path)
    with pytest.raises(ForgeError, match="quantized already"):
        open_model(llama[1], quantization="int8")
    with pytest.raises(ForgeError, match="quantization='int4'"):
        open_model(llama[0], quantization="int4")


def _choice_pairs(model, items: int, choices: int) -> list[tuple[list[int], list[int]]]:
    """Prompts and continuations of different lengths across items, each prompt shared by `choices` continuations
    of one length (so that no choice wins by being shortest)."""
    docs = [model.encode(d) for d in generated_docs(items + choices, seed=6)]
    return [(docs[i][: 4 + 3 * i], docs[i + j + 1][: 2 + i % 5]) for i in range(items) for j in range(choices)]


def test_batched_scores_equal_the_per_choice_scores(llama, monkeypatch):
    """The padded, batched HF forward and llama.cpp's prompt-cache reuse score exactly what one sequence per
    forward does: same best choice on every item, log-likelihoods within 1e-4 (fp32)."""
    from models import hf_backend
    from models.access import Backend, GGUFBackend, HFBackend

    hf = HFBackend(llama[0])
    pairs = _choice_pairs(hf, items=12, choices=4)
    fitted = [hf._fit(c, a) for c, a in pairs]
    per_choice = np.array(Backend.score_tails(hf, fitted))  # one forward per sequence: the old path
    batched = np.array(hf.continuation_logprobs(pairs))
    assert np.abs(batched - per_choice).max() < 1e-4
    assert (batched.reshape(12, 4).argmax(1) == per_choice.reshape(12, 4).argmax(1)).all()
    assert len(set(per_choice.reshape(12, 4).argmax(1))) > 1  # not one answer everywhere
    monkeypatch.setattr(hf_backend, "BATCH_LOGITS", hf.vocab_size * 40)  # a few rows of logits per forward
    assert np.abs(np.array(hf.continuation_logprobs(pairs)) - per_choice).max() < 1e-4

    gguf = GGUFBackend(llama[1], n_threads=1)
    try:
        reused = np.array(gguf.continuation_logprobs(pairs))  # each item's prompt evaluated once, then reused
        fresh = []
        for request in fitted:
            gguf.llm.reset()
            fresh += gguf.score_tails([request])
        assert np.abs(reused - np.array(fresh)).max() < 1e-4
        # f16 weights against fp32: a relative error of order 1e-3 per token, summed over each continuation's tokens
        assert (np.abs(reused - per_choice) <= 0.01 * np.abs(per_choice) + 1e-3).all()
    finally:
        gguf.close()


def test_documents_are_read_after_one_separator_and_the_tokenizer_is_labelled(llama):
    """A Forge tokenizer adds no BOS: a document follows its EOS (what pretraining put between documents), on the HF
    model and on its GGUF alike, and both carry one tokenizer label."""
    from models.access import GGUFBackend, HFBackend

    hf, gguf = HFBackend(llama[0]), GGUFBackend(llama[1], n_threads=1)
    try:
        assert hf.document_separator() == gguf.document_separator() == hf.eos_id
        assert hf.tokenizer_info() == {**gguf.tokenizer_info(), "name": hf.tokenizer_info()["name"]}
        texts = generated_docs(3, seed=8)
        score = hf.score_text(texts, window=16, stride=8)
        assert score.bytes == sum(len(t.encode()) for t in texts) and score.documents == 3
        assert score.tokens == sum(len(hf.encode(t)) for t in texts)  # every id scored, the first ones included
        assert abs(gguf.score_text(texts, 16, 8).bits_per_byte / score.bits_per_byte - 1) < 0.01
    finally:
        gguf.close()
