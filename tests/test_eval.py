"""`forge eval`: scoring functions, red flags on models made degenerate on purpose, HF vs GGUF perplexity, the
lm-eval domain task offline, and one-line errors on bad input.

Every model here is tiny (hidden 64, 2 layers, a 384-token BPE trained in a second on a synthetic "domain"
corpus of facts about made-up functions); the module fixture trains them once:
  trained     100 steps (about one epoch) on the corpus: must pass every red flag
  repeater    trained on one phrase repeated: must trip `repetition`
  memoriser   trained to memorise 3 documents (the train split of its own run): must trip `memorisation`
  random      random init: must trip `untrained` and, against the trained model, `ppl_drift`
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from evaluation import red_flags, tasks
from evaluation.text import text_items
from forge.config import EvalConfig, ForgeConfig, ModelConfig, TokenizerConfig
from forge.hashing import sha256_file
from pretrain.qa import stage as qa_stage

REPO = Path(__file__).resolve().parent.parent
FORGE = str(Path(sys.executable).with_name("forge"))

OBJECTS = [f"{a}_{b}" for a in ("load", "dump", "parse", "split", "join", "sort") for b in ("path", "list", "text")]
ADJS = ("sorted", "first", "last", "encoded", "decoded", "quoted", "empty", "largest")
NOUNS = ("value", "string", "number", "file", "record", "line", "key", "item")
FILLER = [
    "This is useful when you work with data.",
    "It raises an error when the input is wrong.",
    "The result is a new object.",
    "You can call it many times.",
]
REPEAT = "the cat sat on the mat. "


def fact(obj: str) -> str:
    h = sum(map(ord, obj))
    return f"It returns the {ADJS[h % len(ADJS)]} {NOUNS[h // 3 % len(NOUNS)]} of a {NOUNS[h // 7 % len(NOUNS)]}."


def documents(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(5, 8)):
            obj = rng.choice(OBJECTS)
            if rng.random() < 0.5:  # the domain's own FAQ format, which the Q&A tasks ask in
                parts.append(f"Question: What does `{obj}` do?\nAnswer: {fact(obj)}\n\n")
            else:
                parts.append(f"The function `{obj}` is documented here. {fact(obj)}")
            if rng.random() < 0.5:
                parts.append(rng.choice(FILLER))
        docs.append(" ".join(parts))
    return docs


def qa_pairs() -> list[dict[str, str]]:
    return [{"question": f"What does `{obj}` do?", "answer": fact(obj)} for obj in OBJECTS]


# ----------------------------------------------------------------------------------------------------------------
# building tiny models


def train_tokenizer(texts: list[str], dest: Path, vocab_size: int = 384):
    from pretrain.tokenizer import save_tokenizer, train_bpe

    tcfg = TokenizerConfig(vocab_size=vocab_size, min_frequency=2)
    tok = train_bpe(texts, tcfg)
    dest.mkdir(parents=True, exist_ok=True)
    save_tokenizer(tok, tcfg, dest)
    return tok


def write_data_stage(root: Path, run: str, splits: dict[str, list[str]]) -> dict[str, list[Path]]:
    """runs/<run>/data/<split>-00000.parquet and a complete manifest with their sha256, as forge data writes them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = root / run / "data"
    out.mkdir(parents=True, exist_ok=True)
    parquet = {}
    for split, docs in splits.items():
        parquet[split] = [out / f"{split}-00000.parquet"]
        pq.write_table(pa.table({"id": [f"{split}-{i}" for i in range(len(docs))], "text": docs}), parquet[split][0])
    outputs = {files[0].name: sha256_file(files[0]) for files in parquet.values()}
    (out / "manifest.json").write_text(json.dumps({"stage": "data", "status": "complete", "outputs": outputs}))
    return parquet


def write_run(root: Path, run: str, tok, tok_dir: Path, splits: dict[str, list[str]]) -> Path:
    """runs/<run>/data/ (the text eval reads) and runs/<run>/tokenizer/{tokenizer files, shards/} (the ids the
    models are trained on here) as the data and tokenizer stages write them, manifests included."""
    from pretrain.token_shards import write_shards

    parquet = write_data_stage(root, run, splits)
    out = root / run / "tokenizer"
    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tok_dir / name, out / name)
    write_shards(tok, parquet, out / "shards", {"pad": 0, "unk": 1, "bos": 2, "eos": 3})
    (out / "manifest.json").write_text(json.dumps({"stage": "tokenizer", "status": "complete"}))
    return out / "shards"


def model_config() -> ModelConfig:
    return ModelConfig(
        architecture="llama", hidden_size=64, num_layers=2, num_attention_heads=2, intermediate_size=128,
        context_length=64, initializer_range=0.05,
    )  # fmt: skip


def build_and_train(
    ids: np.ndarray, steps: int, seed: int = 0, lr: float = 3e-3, starts: np.ndarray | None = None, vocab: int = 384
):
    """A tiny llama trained on random windows of `ids` (or windows beginning at `starts`, e.g. document starts)."""
    import torch

    from pretrain.model import build_model

    torch.manual_seed(seed)
    model = build_model(model_config(), vocab)
    if steps:
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        rng = np.random.default_rng(seed)
        T = model_config().context_length
        model.train()
        for _ in range(steps):
            begin = rng.integers(0, len(ids) - T, size=8) if starts is None else rng.choice(starts, size=8)
            x = torch.as_tensor(np.stack([ids[s : s + T] for s in begin]).astype(np.int64))
            loss = model(input_ids=x, labels=x).loss  # the model shifts the labels: next-token prediction
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model.eval()


def save_model(model, dest: Path, tok_dir: Path, history: list[dict] | None = None) -> Path:
    """An exported model like forge pretrain writes: model/, its tokenizer files, forge_pretrain.json."""
    model.save_pretrained(dest)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tok_dir / name, dest / name)
    (dest / "forge_pretrain.json").write_text("{}")
    if history is not None:
        (dest.parent / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in history))
        (dest.parent / "manifest.json").write_text(json.dumps({"stage": "pretrain", "status": "complete"}))
    return dest


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread: on a shared, loaded machine two threads make these tiny models slower, not faster."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def world(tmp_path_factory, one_thread):
    """Shards for two runs (main: the corpus; mem: 3 documents to memorise) and the four models."""
    from pretrain.token_shards import load_split

    root = tmp_path_factory.mktemp("eval-world")
    train_docs, val_docs, test_docs = documents(400, 1), documents(20, 2), documents(30, 3)
    tok_dir = root / "tok"
    tok = train_tokenizer(train_docs + [REPEAT * 20], tok_dir)
    runs = root / "runs"
    main = write_run(runs, "main", tok, tok_dir, {"train": train_docs, "val": val_docs, "test": test_docs})
    mem_docs = documents(3, 9)
    mem = write_run(runs, "mem", tok, tok_dir, {"train": mem_docs, "val": val_docs, "test": test_docs})
    train_ids = np.asarray(load_split(main, "train")[0], dtype=np.int64)
    mem_ids, mem_offsets = (np.asarray(a, dtype=np.int64) for a in load_split(mem, "train"))
    repeat_ids = np.asarray(tok.encode(REPEAT * 40).ids, dtype=np.int64)

    falling = [{"step": s, "val_loss": v} for s, v in [(0, 6.0), (50, 4.0), (100, 3.5), (150, 3.4)]]
    # a second tokenizer (a smaller vocabulary) and a model trained on the same text through it
    tok_dir_2 = root / "tok-320"
    tok_2 = train_tokenizer(train_docs + [REPEAT * 20], tok_dir_2, vocab_size=320)
    train_ids_2 = np.asarray([t for d in train_docs for t in [*tok_2.encode(d).ids, 3]], dtype=np.int64)
    models = {
        "trained": save_model(build_and_train(train_ids, 100), runs / "main" / "pretrain" / "model", tok_dir, falling),
        "trained_320": save_model(build_and_train(train_ids_2, 100, vocab=320), root / "trained-320", tok_dir_2),
        "repeater": save_model(build_and_train(repeat_ids, 100), root / "repeater", tok_dir),
        "memoriser": save_model(build_and_train(mem_ids, 100, starts=mem_offsets[:-1]), root / "memoriser", tok_dir),
        "random": save_model(build_and_train(train_ids, 0), root / "random", tok_dir),
    }
    return {"root": root, "runs": runs, "tok_dir": tok_dir, "models": models, "shards": main, "test_docs": test_docs}


def small_cfg(run: str, tmp_path: Path, **eval_overrides) -> ForgeConfig:
    qa = tmp_path / "qa.jsonl"
    qa.write_text("".join(json.dumps(p) + "\n" for p in qa_pairs()))
    fields = dict(
        qa_max_examples=8, mc_max_examples=10, generation_prompts=6, prompt_tokens=12, max_new_tokens=24,
        memorisation_docs=5, memorisation_prefix=16, memorisation_suffix=16, random_baseline=False,
    )  # fmt: skip
    fields.update(eval_overrides)
    cfg = ForgeConfig(run_name=run, qa={"source": str(qa), "eval_fraction": 0.6}, eval=EvalConfig(**fields))
    qa_stage.run(cfg)  # the held-out Q&A eval reads: a user's file, split by the qa stage
    return cfg


def use_runs(world, isolated_runs: Path) -> None:
    """Copy the fixture's runs into this test's runs directory (FORGE_RUNS_DIR)."""
    shutil.copytree(world["runs"], isolated_runs, dirs_exist_ok=True)


# ----------------------------------------------------------------------------------------------------------------
# scoring functions


def test_f1_and_exact_match_follow_squad_normalisation():
    assert tasks.exact_match("The Sorted list.", "sorted list") == 1.0
    f1 = tasks.token_f1("returns the sorted list", "It returns the sorted list.")  # precision 1, recall 3/4
    assert f1 == pytest.approx(2 * 0.75 / 1.75)
    assert tasks.token_f1("", "x") == 0.0 and tasks.token_f1("a b", "c d") == 0.0


def test_metrics_by_question_type_are_reported_beside_the_headline():
    from evaluation.report import build_eval, to_markdown

    rows = [{"qtype": "members", "f1": 1.0, "exact_match": 1.0}, {"qtype": "members", "f1": 0.0, "exact_match": 0.0},
            {"qtype": "describe", "f1": 0.3, "exact_match": 0.0}]  # fmt: skip
    fields = {"qa_f1": "f1", "qa_exact_match": "exact_match"}
    assert tasks.by_qtype(rows, fields, "qa_examples") == {
        "qa_f1.describe": 0.3, "qa_exact_match.describe": 0.0, "qa_examples.describe": 1.0,
        "qa_f1.members": 0.5, "qa_exact_match.members": 0.5, "qa_examples.members": 2.0,
    }  # fmt: skip
    assert tasks.by_qtype([*rows, {"f1": 1.0, "exact_match": 1.0}], fields, "qa_examples") == {}  # a user's file
    # the floor of a label question: always answering the commonest label ("a method")
    assert tasks.best_constant_exact_match(["a method", "A method.", "a class", "a module"]) == 0.5

    tokenizer = {"name": "t", "vocab_size": 384, "sha256": "1" * 64}

    def result(f1_members: float) -> dict:
        return {"text": {"bits_per_byte": 1.5, "ppl": 10.0, "tokens": 100, "tokenizer": tokenizer}, "chat": True,
                "samples": [], "unigram": {"bits_per_byte": 4.0, "ppl": 50.0, "tokenizer": tokenizer,
                                           "document_bits": [1200.0]},
                "documents": {"index": [0], "bytes": [300], "bits": [450.0]}, "qa_predictions": [],
                "mc_predictions": [{"id": "m1", "correct": True, "correct_norm": False, "correct_pmi": True}],
                "qa": {"qa_f1": 0.4, "qa_exact_match": 0.2, "qa_examples": 3.0, "qa_empty_rate": 0.0,
                       "qa_f1.members": f1_members, "qa_exact_match.members": f1_members, "qa_examples.members": 2.0,
                       "qa_constant_exact_match.members": 0.5},
                "mc": {"mc_acc": 0.5, "mc_acc_norm": 0.5, "mc_acc_pmi": 0.5, "mc_chance": 0.25, "mc_examples": 4.0,
                       "mc_acc.members": 0.75, "mc_examples.members": 4.0}}  # fmt: skip

    data = {"test_text_sha256": "2" * 64, "test_shards": {}, "test_items": 3, "test_item_bytes": 1024,
            "test_bytes": 300, "qa_sha256": "3" * 64, "qa_source": "qa.jsonl"}  # fmt: skip
    report = build_eval(target="m", artifact_kind="hf", sha256="0" * 64, result=result(0.5), baseline=result(0.0),
                        flags=[], benchmarks=None, memorisation={"train": {"exact": 0.0}, "test": {"exact": 0.0}},
                        reference=None, data=data, document_ids=["d0"])  # fmt: skip
    assert report["items"]["text"] == {"ids": ["d0"], "bytes": [300], "bits": [450.0], "bits_unigram": [1200.0],
                                       "bits_random_init": [450.0]}  # fmt: skip
    assert report["items"]["mc"] == {"ids": ["m1"], "chance": 0.25, "correct": [1], "correct_norm": [0],
                                     "correct_pmi": [1]}  # fmt: skip
    by_type = {m["name"]: m for m in report["metrics"] if m["group"] == "domain_by_type"}
    assert by_type["qa_f1.members"]["random_init"] == 0.0 and by_type["qa_f1.members"]["higher_is_better"] is True
    assert by_type["mc_acc.members"]["chance"] == 0.25 and by_type["mc_examples.members"]["higher_is_better"] is None
    assert {m["name"] for m in report["metrics"] if m["group"] == "domain"} >= {"qa_f1", "mc_acc"}
    table = to_markdown(report, []).split("Domain metrics by question type")[1]
    assert "| members | qa_f1 | 2 | 0.5 | 0 | - | yes |" in table  # examples, model, random init, (no floor), beats
    assert "| members | qa_exact_match | 2 | 0.5 | 0 | 0.5 | yes |" in table  # floor: the best constant answer
    assert "| members | mc_acc | 4 | 0.75 | 0.75 | 0.25 | no |" in table


class PriorHeavyBackend:
    """A stand-in scorer: log p(answer | prompt) = -(answer length in characters), + 3 when the prompt names the
    answer's first word. Its length prior outweighs what the question adds, as a small model's does."""

    eos_id = None
    chat_template = "stand-in"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def encode(self, text: str, special: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def render_chat(self, messages: list[dict]) -> str:
        return "".join(f"<{m['role']}>{m['content']}" for m in messages)

    def continuation_logprobs(self, pairs: list[tuple[list[int], list[int]]], desc: str = "") -> list[float]:
        out = []
        for context, continuation in pairs:
            prompt, answer = "".join(map(chr, context)), "".join(map(chr, continuation))
            self.calls.append(prompt)
            out.append(-len(answer) + (3.0 if answer.split()[0] in prompt else 0.0))
        return out


def test_pmi_scores_what_the_question_adds_not_the_answers_own_probability():
    answers = {"alpha": "alpha rises slowly and then it settles", "beta": "beta is flat and stays flat",
               "gamma": "gamma jumps"}  # fmt: skip
    records = [{"question": f"What does `{k}` do?", "answer": v, "qtype": "describe"} for k, v in answers.items()]
    items = tasks.build_mc_items(records, choices=3, seed=0)
    backend = PriorHeavyBackend()
    metrics, rows = tasks.run_mc(backend, items, chat=False)
    # summed log-likelihood picks the shortest answer whatever was asked; PMI picks the answer the question names
    assert [item["choices"][row["pred"]] for row, item in zip(rows, items, strict=True)] == [answers["gamma"]] * 3
    assert metrics["mc_acc"] == pytest.approx(1 / 3) and metrics["mc_acc_pmi"] == 1.0
    assert metrics["mc_acc_pmi.describe"] == 1.0 and metrics["mc_examples.describe"] == 3.0
    assert rows[0]["logprobs"][rows[0]["gold"]] - rows[0]["question_free_logprobs"][rows[0]["gold"]] == 3.0
    # each answer's question-free score is computed once, though it is a choice in every item
    assert sum(p == "Question: \nAnswer:" for p in backend.calls) == len(answers)
    # a chat record keeps its system prompt and loses only the question
    chat_record = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why?"}]}
    assert "".join(map(chr, tasks.question_free_prompt(backend, chat_record, chat=True))) == "<system>Be brief.<user>"


def test_a_base_model_gets_solved_examples_of_the_same_type_that_fit_half_its_context():
    records = [{"question": f"Which module defines `m{i}.f`?", "answer": f"m{i % 3}", "qtype": "module"}
               for i in range(6)]  # fmt: skip
    records += [{"question": f"What does `{n}` do?", "answer": f"It does {n}.", "qtype": "describe"} for n in "gh"]
    shot = tasks.with_fewshot(records, shots=3, seed=0)
    assert shot == tasks.with_fewshot(records, shots=3, seed=0)  # seeded
    for record, solved in zip(records, shot, strict=True):
        assert {k: solved[k] for k in record} == record
        assert all(d["answer"] != record["answer"] for d in solved["fewshot"])  # never hands the answer over
        same_type = [r for r in records if r["qtype"] == record["qtype"]]
        assert all({**d, "qtype": record["qtype"]} in same_type for d in solved["fewshot"])
    assert [len(s["fewshot"]) for s in shot] == [3] * 6 + [1, 1]  # a type with one other record gives one

    backend = PriorHeavyBackend()
    backend.context = 1000
    prompt = "".join(map(chr, tasks.question_prompt(backend, shot[0], chat=False)))
    demos = shot[0]["fewshot"]
    assert prompt == "".join(f"Question: {d['question']}\nAnswer: {d['answer']}\n\n" for d in demos) + \
        f"Question: {records[0]['question']}\nAnswer:"  # fmt: skip
    backend.context = 2 * (len(prompt) - 1)  # one character short of three shots: two are kept
    assert "".join(map(chr, tasks.question_prompt(backend, shot[0], chat=False))).count("Question:") == 3
    backend.context = 20  # no room for any: the bare question
    assert "".join(map(chr, tasks.question_prompt(backend, shot[0], chat=False))) == \
        f"Question: {records[0]['question']}\nAnswer:"  # fmt: skip
    backend.context = 1000  # PMI's question-free prompt keeps the examples; a chat model never gets them
    free = "".join(map(chr, tasks.question_free_prompt(backend, shot[0], chat=False)))
    assert free == prompt.removesuffix(f"{records[0]['question']}\nAnswer:") + "\nAnswer:"
    assert "".join(map(chr, tasks.question_prompt(backend, shot[0], chat=True))) == f"<user>{records[0]['question']}"


def held_out_pairs(n: int) -> list[dict[str, str]]:
    """n synthetic held-out pairs of four question types, each type's answers its own: `describe` all distinct,
    `details` 50 answers, `module` 3 (fewer than a 4-choice item needs besides its own), `members` one answer on 49
    records of 50 (a crowded pool)."""
    pairs = []
    for i in range(n):
        qtype, j = ("describe", "describe", "details", "module", "members")[i % 5], i // 5
        answer = {"describe": f"It does thing {i}.", "details": f"It takes {j % 50} arguments.",
                  "module": f"mod{j % 3}", "members": "no members" if j % 50 else f"members {j}"}[qtype]  # fmt: skip
        pairs.append({"question": f"Q{i}: about `f{i}` ({qtype})?", "answer": answer, "qtype": qtype})
    return pairs


def test_items_of_200k_held_out_pairs_are_drawn_by_index_with_every_invariant():
    records = held_out_pairs(200_000)
    qa, items = tasks.held_out_items(records, shots=3, choices=4, qa_limit=500, mc_limit=1000, seed=7)
    assert len(qa) == 500 and len(items) == 1000  # the caps: what evaluation/evidence.py predicts
    assert [r["question"] for r in qa] == [r["question"] for r in tasks.select_qa(records, 500)]
    assert [i["question"] for i in items] == [r["question"] for r in tasks.select_qa(records, 1000)]
    by_question = {r["question"]: r for r in records}
    type_answers: dict[str, set[str]] = {}
    for r in records:
        type_answers.setdefault(r["qtype"], set()).add(r["answer"])
    for item in items:
        own = by_question[item["question"]]
        assert item["choices"][item["gold"]] == own["answer"] and len(set(item["choices"])) == 4
        same = sum(c in type_answers[own["qtype"]] for c in item["choices"]) - 1
        assert same == min(3, len(type_answers[own["qtype"]]) - 1)  # same type first, other types only for the rest
    for solved in [*qa, *items]:
        own = by_question[solved["question"]]
        shots = solved["fewshot"]
        assert len(shots) == 3 and len({s["question"] for s in shots}) == 3
        for shot in shots:  # never the item itself, never its answer, always its type
            assert shot["question"] != own["question"] and shot["answer"] != own["answer"]
            assert by_question[shot["question"]]["qtype"] == own["qtype"]
    again = tasks.held_out_items(records[:20_000], 3, 4, 500, 1000, seed=7)
    assert again == tasks.held_out_items(records[:20_000], 3, 4, 500, 1000, seed=7)  # seeded
    assert again != tasks.held_out_items(records[:20_000], 3, 4, 500, 1000, seed=8)


def test_too_few_distinct_answers_give_no_item_and_a_chat_model_no_examples():
    records = [{"question": f"Q{i}?", "answer": f"a{i % 3}"} for i in range(30)]
    qa, items = tasks.held_out_items(records, shots=0, choices=4, qa_limit=10, mc_limit=10, seed=0)
    assert items == [] and len(qa) == 10 and not any("fewshot" in r for r in qa)
    assert len(tasks.build_mc_items(records, choices=3, seed=0)) == 30


def test_repetition_metrics():
    loop = [1, 2, 3] * 10
    assert tasks.repeated_ngram_rate([loop], 4) > 0.8
    assert tasks.repeated_ngram_rate([list(range(30))], 4) == 0.0
    assert tasks.distinct_n([list(range(30))], 2) == 1.0
    assert tasks.distinct_n([loop], 2) == pytest.approx(3 / 29)


def test_val_rise_flag_reads_the_history():
    cfg = EvalConfig(max_val_ppl_rise=0.05)
    rising = [{"step": s, "val_loss": v} for s, v in [(0, 5.0), (10, 3.0), (20, 3.2), (30, 3.4)]]
    flag = red_flags.val_rise([{"step": 5, "loss": 4.0}, *rising], "h.jsonl", cfg)  # train-loss lines ignored
    assert flag["passed"] is False and flag["best_step"] == 10
    assert flag["value"] == pytest.approx(np.exp(0.4) - 1)
    assert red_flags.val_rise(rising[:2], "h.jsonl", cfg)["passed"] is True
    assert red_flags.val_rise(None, None, cfg)["passed"] is None


def test_incoherence_needs_low_perplexity_and_degenerate_generations():
    cfg = EvalConfig()
    loops, varied = [[5, 6, 7, 8] * 8] * 4, [list(range(i, i + 32)) for i in range(4)]
    assert red_flags.incoherence(10.0, 50.0, loops, cfg)["passed"] is False  # low ppl, degenerate text
    assert red_flags.incoherence(80.0, 50.0, loops, cfg)["passed"] is True  # degenerate but not "low" ppl
    assert red_flags.incoherence(10.0, 50.0, varied, cfg)["passed"] is True
    assert red_flags.incoherence(10.0, 50.0, [[1], [2], [3]], cfg)["passed"] is False  # empty-ish answers


def test_sampling_is_seeded():
    from models.access import sample_token

    logits = np.linspace(0, 3, 50)
    draw = [sample_token(logits, 0.9, 10, np.random.default_rng(7)) for _ in range(3)]
    assert len(set(draw)) == 1 and draw[0] >= 40  # same seed, same token; top-k keeps the 10 largest
    assert sample_token(logits, 0.0, 0, np.random.default_rng(0)) == 49


# ----------------------------------------------------------------------------------------------------------------
# the red flags on degenerate models, through the stage


def _flags(manifest_dir: Path) -> tuple[dict[str, bool | None], dict]:
    report = json.loads((manifest_dir / "eval.json").read_text())
    return {f["name"]: f["passed"] for f in report["flags"]}, report


@pytest.mark.slow
def test_each_degenerate_model_trips_its_flag_and_the_trained_model_passes(world, isolated_runs, tmp_path):
    from evaluation.stage import run

    use_runs(world, isolated_runs)
    models = world["models"]

    # the trained model, as the pretrain stage's export: history read, report against a random-init twin
    manifest = run(small_cfg("main", tmp_path, random_baseline=True), target="pretrain")
    assert manifest["stage"] == "eval-pretrain" and manifest["status"] == "complete"
    stage_dir = isolated_runs / "main" / "eval-pretrain"
    flags, report = _flags(stage_dir)
    assert flags == {"repetition": True, "ppl_drift": None, "val_rise": True, "memorisation": True,
                     "incoherence": True, "untrained": True}, report["flags"]  # fmt: skip
    assert report["passed"] is True and manifest["metrics"]["flags_failed"] == 0
    metrics = {m["name"]: m for m in report["metrics"]}
    assert metrics["bits_per_byte"]["value"] < 0.5 * metrics["bits_per_byte"]["random_init"]
    assert metrics["bits_per_byte_random_init"]["value"] == metrics["bits_per_byte"]["random_init"]
    assert metrics["bits_per_byte"]["value"] < metrics["bits_per_byte_unigram"]["value"]
    assert metrics["perplexity"]["tokenizer"] == report["tokenizer"] and report["tokenizer"]["vocab_size"] == 384
    assert report["data"]["qa_sha256"] == sha256_file(isolated_runs / "main" / "qa" / "qa_eval.jsonl")
    data_manifest = json.loads((isolated_runs / "main" / "data" / "manifest.json").read_text())
    assert report["data"]["test_shards"] == {"test-00000.parquet": data_manifest["outputs"]["test-00000.parquet"]}
    for name in ("qa_f1", "qa_exact_match"):  # each beats random init
        assert metrics[name]["value"] > metrics[name]["random_init"], (name, metrics[name])
    assert metrics["mc_chance"]["value"] == 0.25
    # the twin scores only a quarter of the 10 items (3): its accuracy is 0 to 1 by luck, so chance is the floor here
    for name in ("mc_acc", "mc_acc_norm", "mc_acc_pmi"):
        assert metrics[name]["value"] > 0.25 and "random_init" in metrics[name], (name, metrics[name])
    assert metrics["qa_examples"]["value"] == 8 and metrics["mc_examples"]["value"] == 10  # capped apart
    assert all(m["artifact_sha256"] == report["artifact"]["sha256"] for m in report["metrics"] + report["flags"])
    md = (stage_dir / "report.md").read_text()
    assert "random init" in md and "plots/domain.png" in md and (stage_dir / "plots" / "domain.png").is_file()
    assert (stage_dir / "plots" / "val_ppl.png").is_file() and (stage_dir / "report.html").is_file()
    samples = json.loads((stage_dir / "samples.json").read_text())
    assert len(samples) == 6 and all(s["text"] for s in samples)
    # unchanged inputs and config: skipped; the same seeds give the same samples
    again = run(small_cfg("main", tmp_path, random_baseline=True), target="pretrain")
    assert again["started_at"] == manifest["started_at"]

    # always repeats a phrase
    run(small_cfg("main", tmp_path), target=str(models["repeater"]))
    flags, report = _flags(next(isolated_runs.glob("main/eval-*repeater*")))
    assert flags["repetition"] is False, report["flags"]
    assert flags["memorisation"] is True

    # memorised its (3-document) train split
    run(small_cfg("mem", tmp_path), target=str(models["memoriser"]))
    flags, report = _flags(next(isolated_runs.glob("mem/eval-*memoriser*")))
    assert flags["memorisation"] is False, report["flags"]
    mem = next(f for f in report["flags"] if f["name"] == "memorisation")
    assert mem["train"]["exact"] >= 0.6 and mem["test"]["exact"] <= 0.2

    # random init, against the trained model as reference
    trained = str(models["trained"])
    run(small_cfg("main", tmp_path, reference=trained), target=str(models["random"]))
    flags, report = _flags(next(isolated_runs.glob("main/eval-*random*")))
    assert flags["untrained"] is False and flags["ppl_drift"] is False, report["flags"]
    assert flags["memorisation"] is True and flags["repetition"] is True


# ----------------------------------------------------------------------------------------------------------------
# bits per byte: two tokenizers, one text


def reference_bits_per_byte(model_dir: Path, texts: list[str], window: int, stride: int) -> float:
    """Plain torch, target by target: each document's ids after its EOS (the tokenizer adds no BOS), and every id t
    predicted by the first window, of `window` ids moving by `stride`, that reaches it (begin = k * stride)."""
    import math

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    nats, n_bytes = 0.0, 0
    for text in texts:
        ids = [tokenizer.eos_token_id, *tokenizer(text, add_special_tokens=False)["input_ids"]]
        n_bytes += len(text.encode("utf-8"))
        logp: dict[int, torch.Tensor] = {}  # window k -> its log-softmax rows
        for t in range(1, len(ids)):
            k = 0 if t < window else (t - window) // stride + 1
            if k not in logp:
                chunk = torch.tensor([ids[k * stride : k * stride + window]])
                with torch.no_grad():
                    logp[k] = torch.log_softmax(model(chunk).logits[0].double(), dim=-1)
            nats -= float(logp[k][t - k * stride - 1, ids[t]])
    return nats / math.log(2) / n_bytes


@pytest.mark.slow
def test_two_models_with_different_tokenizers_are_scored_in_bits_per_byte_of_the_same_text(
    world, isolated_runs, tmp_path
):
    from evaluation.stage import run

    use_runs(world, isolated_runs)
    reports = {}
    for name in ("trained", "trained_320"):
        target = world["models"][name]
        run(small_cfg("main", tmp_path, ppl_window=48, ppl_stride=16), target=str(target))
        stage_dir = next(isolated_runs.glob(f"main/eval-*{target.name}-*"))
        reports[name] = json.loads((stage_dir / "eval.json").read_text())
        metrics = {m["name"]: m for m in reports[name]["metrics"]}
        pieces = text_items(world["test_docs"], EvalConfig().text_item_bytes, EvalConfig().text_items)
        expected = reference_bits_per_byte(target, pieces, 48, 16)
        assert abs(metrics["bits_per_byte"]["value"] - expected) < 1e-4, (name, metrics["bits_per_byte"], expected)
        details = metrics["bits_per_byte"]["details"]
        assert details["bytes"] == sum(len(d.encode()) for d in pieces) and details["window"] == 48
        assert metrics["perplexity"]["value"] == pytest.approx(np.exp(details["nll_nats"] / details["tokens"]))
        tok = reports[name]["tokenizer"]
        assert metrics["perplexity"]["tokenizer"] == metrics["perplexity_unigram"]["tokenizer"] == tok
        assert f"{tok['name']} ({tok['vocab_size']} tokens" in (stage_dir / "report.md").read_text()
    first, second = reports["trained"]["tokenizer"], reports["trained_320"]["tokenizer"]
    assert (first["vocab_size"], second["vocab_size"]) == (384, 320) and first["sha256"] != second["sha256"]
    # the same text was measured: one identity, whatever the tokenizer
    assert reports["trained"]["data"] == reports["trained_320"]["data"]
    ids = [{m["name"]: m for m in r["metrics"]}["bits_per_byte"]["details"]["tokens"] for r in reports.values()]
    assert ids[0] < ids[1]  # more ids for the smaller vocabulary, over the same bytes


def test_a_few_long_documents_give_the_gate_enough_items_paired_across_tokenizers(world, isolated_runs, tmp_path):
    """Three long test documents are scored as pieces of at most eval.text_item_bytes: every rule gets min_items
    (30) items, and two models with different tokenizers read the same byte ranges, so the gate pairs them."""
    from evaluation.stage import run
    from forge.policy import load_policy
    from registry import gate

    use_runs(world, isolated_runs)
    long_docs = ["\n\n".join(documents(12, seed)) for seed in (21, 22, 23)]  # ~3 x 4 kB
    write_data_stage(isolated_runs, "long", {"train": documents(40, 1), "val": documents(5, 2), "test": long_docs})
    shutil.copytree(isolated_runs / "main" / "tokenizer", isolated_runs / "long" / "tokenizer")
    cfg = small_cfg("long", tmp_path, ppl_window=48, ppl_stride=16, text_item_bytes=256)
    items = {}
    for name in ("trained", "trained_320"):
        run(cfg, target=str(world["models"][name]))
        stage_dir = next(isolated_runs.glob(f"long/eval-*{world['models'][name].name}-*"))
        items[name] = json.loads((stage_dir / "eval.json").read_text())["items"]["text"]
    a, b = items["trained"], items["trained_320"]
    assert len(a["ids"]) >= 30 and a["ids"] == b["ids"] and a["bytes"] == b["bytes"]  # one item, one byte range
    assert max(a["bytes"]) <= 256 and sum(a["bytes"]) >= 0.9 * sum(len(d.encode()) for d in long_docs)
    policy = load_policy(REPO / "configs" / "policies" / "gate.yaml")
    diff = gate._better_by(
        gate._scores({"items": {"text": a}}, "bits_per_byte"),
        gate._scores({"items": {"text": b}}, "bits_per_byte"),
        "bits_per_byte",
        policy,
    )
    assert diff is not None and diff.n == len(a["ids"]) >= policy.min_items


@pytest.mark.slow
def test_an_external_gguf_is_scored_through_its_own_vocabulary(smollm2_gguf, isolated_runs, tmp_path):
    """SmolLM2-135M-Instruct (49k tokens) on English technical text (stdlib docstrings, as the demo's corpus):
    what a 135M model scores there, not the thousands of perplexity another tokenizer's ids would give."""
    import itertools

    from evaluation.stage import run
    from pretrain.data.stdlib_corpus import iter_stdlib_records

    texts = [r["text"] for r in itertools.islice(iter_stdlib_records(), 3000) if len(r["text"]) > 300]
    write_data_stage(isolated_runs, "stdlib", {"train": texts[40:400], "val": texts[400:410], "test": texts[:40]})
    cfg = small_cfg("stdlib", tmp_path, qa_max_examples=4, mc_max_examples=8, generation_prompts=2, max_new_tokens=16,
                    memorisation_docs=2)  # fmt: skip
    run(cfg, target=str(smollm2_gguf))
    report = json.loads(next(isolated_runs.glob("stdlib/eval-*/eval.json")).read_text())
    metrics = {m["name"]: m for m in report["metrics"]}
    assert report["tokenizer"]["vocab_size"] == 49152 and report["tokenizer"]["name"].startswith("gguf:gpt2")
    bpb, unigram = metrics["bits_per_byte"]["value"], metrics["bits_per_byte_unigram"]["value"]
    assert 0.3 < bpb < 1.5 and bpb < 0.5 * unigram, (bpb, unigram)
    assert metrics["perplexity"]["value"] < 100 and metrics["perplexity"]["tokenizer"] == report["tokenizer"]
    pieces = text_items(texts[:40], cfg.eval.text_item_bytes, cfg.eval.text_items)
    assert metrics["bits_per_byte"]["details"]["bytes"] == sum(len(t.encode()) for t in pieces)
    assert {f["name"]: f["passed"] for f in report["flags"]}["untrained"] is True


# ----------------------------------------------------------------------------------------------------------------
# HF vs GGUF


@pytest.mark.slow
def test_hf_and_f16_gguf_perplexity_agree_within_one_percent(world, tmp_path):
    from models.access import GGUFBackend, HFBackend
    from pretrain.token_shards import load_split
    from serve.gguf_export import export_gguf

    model_dir = world["models"]["trained"]
    gguf = tmp_path / "model-f16.gguf"
    export_gguf(model_dir, gguf)
    ids = np.asarray(load_split(world["shards"], "test")[0][:3000], dtype=np.int64)
    hf, ll = HFBackend(model_dir), GGUFBackend(gguf, n_threads=1)
    try:
        p_hf, p_ll = hf.perplexity(ids, 64, 32), ll.perplexity(ids, 64, 32)
        assert p_hf.tokens == p_ll.tokens == len(ids) - 1
        assert abs(p_ll.ppl / p_hf.ppl - 1) < 0.01, (p_hf.ppl, p_ll.ppl)
        assert p_hf.ppl < 100  # a trained model: the agreement is not between two uniform guesses
        # the task primitives agree too: tokenization, greedy generation, answer log-likelihood
        prompt = hf.encode("The function `load_path` is documented here.")
        assert ll.encode("The function `load_path` is documented here.") == prompt
        assert hf.generate(prompt, 8) == ll.generate(prompt, 8)
        answer = hf.encode(" " + fact("load_path"))
        assert ll.continuation_logprob(prompt, answer) == pytest.approx(hf.continuation_logprob(prompt, answer), 0.01)
    finally:
        ll.close()


# ----------------------------------------------------------------------------------------------------------------
# lm-eval


@pytest.mark.slow
def test_lm_eval_domain_task_runs_offline(world, tmp_path, monkeypatch):
    from evaluation.benchmarks import DOMAIN_TASK, run_benchmarks

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    items = tasks.build_mc_items(qa_pairs(), 4, seed=0)[:8]
    rows = run_benchmarks(world["models"]["trained"], [DOMAIN_TASK], items, tmp_path / "lm_eval", EvalConfig(), 0)
    scores = {r["metric"]: r["value"] for r in rows if r["task"] == DOMAIN_TASK}
    assert all(0.0 <= scores[m] <= 1.0 for m in ("acc", "acc_norm", "acc_mutual_info")) and scores["sample_len"] == 8
    written = (tmp_path / "lm_eval" / f"{DOMAIN_TASK}.yaml").read_text()
    assert str((tmp_path / "lm_eval" / f"{DOMAIN_TASK}.jsonl").resolve()) in written
    assert json.loads((tmp_path / "lm_eval" / "results.json").read_text())["results"][DOMAIN_TASK]


# ----------------------------------------------------------------------------------------------------------------
# bad input: one line


def forge(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([FORGE, *args], cwd=REPO, capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.integration
def test_bad_input_is_a_one_line_error(world, isolated_runs, tmp_path):
    use_runs(world, isolated_runs)
    (tmp_path / "qa.jsonl").write_text("".join(json.dumps(p) + "\n" for p in qa_pairs()))
    not_model = tmp_path / "not-a-model"
    not_model.mkdir()
    (not_model / "notes.txt").write_text("hello")
    bad_gguf = tmp_path / "broken.gguf"
    bad_gguf.write_bytes(b"GGUF" + b"\x00" * 40)
    small_cfg("main", tmp_path)  # the qa stage of the run
    shutil.copytree(isolated_runs / "main", isolated_runs / "empty")
    write_data_stage(isolated_runs, "empty", {"train": documents(5, 1), "val": documents(2, 2), "test": []})

    env = {**os.environ, "FORGE_RUNS_DIR": str(isolated_runs)}
    common = ["--set", f"qa.source={tmp_path / 'qa.jsonl'}", "--set", "qa.eval_fraction=0.6"]
    cases = [
        (["--run", "main", "--target", str(not_model)], "not a model directory"),
        (["--run", "main", "--target", str(bad_gguf)], "broken.gguf"),
        (["--run", "empty", "--target", "pretrain"], "test split"),
        (["--run", "main", "--target", "sft"], "forge sft"),
        (["--run", "main", "--target", str(tmp_path / "missing")], "not found"),
    ]
    for args, expected in cases:
        out = forge("eval", *common, *args, env=env)
        assert out.returncode == 2, (args, out.stderr[-2000:])
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], (args, out.stderr[-2000:])
        assert "Traceback" not in out.stderr
