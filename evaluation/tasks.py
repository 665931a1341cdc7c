"""Domain tasks built from held-out data, scored on any `Backend` (HF directory or GGUF).

  qa            held-out question -> generated answer (greedy), scored by token F1 and exact match against the
                reference answer (SQuAD normalisation: lower case, no punctuation, no articles)
  mc            the right answer among `mc_choices - 1` distractors taken from other held-out pairs (same question
                type first), picked by log-likelihood of the answer given the question; `acc` sums the answer's
                log-probability, `acc_norm` divides it by the answer's length in characters (lm-eval's acc_norm),
                `acc_pmi` subtracts the answer's log-probability after the same prompt with the question left out
                (pointwise mutual information, lm-eval's acc_mutual_info); each with the chance baseline 1 / choices.
                Why PMI: the distractors are other answers, 20 to 480 characters long, so a summed log-likelihood
                mostly measures how probable an answer is on its own (a random-init model, which knows nothing,
                picks the shortest and lands off chance); PMI scores only what the question adds
  generations   configured prompts (else the first tokens of test documents) continued by sampling with a fixed
                seed per prompt, saved for the report and measured by the repetition and incoherence flags
  memorisation  greedy continuation of training documents versus test documents: the share reproduced verbatim
  unigram       the floor bits per byte are compared with: the train text's token frequencies, per tokenizer

Every task tokenizes text with the backend's own tokenizer (prompts, answers, documents): no model is ever given
another model's ids.

Records with a question type (the embedded set: describe, details, members, module) are also scored per type
("qa_f1.describe", "mc_acc.members"), with the exact match of the best constant answer as each type's floor: a
headline mean can hide a type at chance, and a model that learnt only the commonest answer scores that floor.

Prompts: a chat model (it has a chat template and is not a raw pretraining export) gets the question through its
chat template and answers until its end-of-turn (EOS); a base model gets "Question: ...\\nAnswer:" after a few
solved examples of the same question type (`eval.base_fewshot`, see `with_fewshot`) and its answer ends at EOS or
the first blank line.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import math
import random
import re
import string
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from models.access import Backend

BASE_PROMPT = "Question: {question}\nAnswer:"
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)
DRAWS_PER_CHOICE = 8  # record draws per distractor before the distinct answers are drawn from instead


# ----------------------------------------------------------------------------------------------------------------
# scoring


def normalize_answer(text: str) -> str:
    text = text.lower().translate(_PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def token_f1(prediction: str, reference: str) -> float:
    pred, ref = normalize_answer(prediction).split(), normalize_answer(reference).split()
    if not pred or not ref:
        return float(pred == ref)
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, reference: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(reference))


def ngrams(ids: Sequence[int], n: int) -> list[tuple[int, ...]]:
    return [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]


def repeated_ngram_rate(sequences: Sequence[Sequence[int]], n: int) -> float:
    """Share of n-grams that already occurred earlier in the same sequence, over all sequences."""
    repeated = total = 0
    for seq in sequences:
        grams = ngrams(list(seq), n)
        total += len(grams)
        repeated += len(grams) - len(set(grams))
    return repeated / total if total else 0.0


def distinct_n(sequences: Sequence[Sequence[int]], n: int) -> float:
    """Distinct n-grams / all n-grams, pooled over the sequences (Li et al. 2016)."""
    grams = [g for seq in sequences for g in ngrams(list(seq), n)]
    return len(set(grams)) / len(grams) if grams else 0.0


# ----------------------------------------------------------------------------------------------------------------
# prompts


def stop_ids_for(backend: Backend) -> set[int]:
    return {backend.eos_id} if backend.eos_id is not None else set()


def cut_answer(text: str, chat: bool) -> str:
    """A chat model's answer is its whole turn; a base model's ends at the first blank line."""
    text = text.strip()
    return text if chat else text.split("\n\n")[0].strip()


def question_prompt(backend: Backend, record: dict[str, Any], chat: bool) -> list[int]:
    """A chat model's prompt is its chat template; a base model's is "Question: ...\nAnswer:" after the record's
    solved examples (`fewshot`), as many of them as fit in half the model's context (the rest is the answer's)."""
    if chat:
        messages = record.get("messages") or [{"role": "user", "content": record["question"]}]
        return backend.encode(backend.render_chat(messages), special=True)
    question = BASE_PROMPT.format(question=record["question"])
    solved = [f"{BASE_PROMPT.format(question=d['question'])} {d['answer']}\n\n" for d in record.get("fewshot", ())]
    for shots in range(len(solved), 0, -1):
        with_shots = backend.encode("".join(solved[:shots]) + question)
        if len(with_shots) <= backend.context // 2:
            return with_shots
    return backend.encode(question)


def question_free_prompt(backend: Backend, record: dict[str, Any], chat: bool) -> list[int]:
    """The record's prompt with its question left out (user turns emptied; a system prompt and solved examples
    kept): what PMI compares against."""
    messages = record.get("messages")
    if chat and messages:
        messages = [{**m, "content": ""} if m["role"] == "user" else m for m in messages]
    return question_prompt(backend, {"question": "", "messages": messages, "fewshot": record.get("fewshot", [])}, chat)


def with_fewshot(
    records: list[dict[str, Any]], shots: int, seed: int, indices: Sequence[int] | None = None
) -> list[dict[str, Any]]:
    """The records at `indices` (default: all) each with `fewshot`: `shots` other records of its question type,
    solved, never one with the record's answer ("json" for another `json` function would hand the answer over). For
    a base model, which never saw the Question/Answer format in pretraining: lm-eval's num_fewshot, drawn from the
    same held-out set as lm-eval does for a task with no train split. The random-init twin gets the same examples.
    A seeded draw by index per record (`record_rng`): O(shots) each, whatever the size of its type."""
    pools = {qtype: AnswerPool(records, group) for qtype, group in indices_by_qtype(records).items()}
    out = []
    for i in range(len(records)) if indices is None else indices:
        record = records[i]
        pool, answer = pools[record.get("qtype")], record["answer"]
        eligible = pool.others(answer)
        drawn = record_rng(seed, "fewshot", i).sample(range(eligible), min(shots, eligible))
        demos = [records[pool.other(answer, position)] for position in drawn]
        out.append({**record, "fewshot": [{"question": d["question"], "answer": d["answer"]} for d in demos]})
    return out


def indices_by_qtype(records: list[dict[str, Any]]) -> dict[Any, list[int]]:
    """Question type -> the indices of its records (a user's file without types: one group, None)."""
    groups: dict[Any, list[int]] = {}
    for i, record in enumerate(records):
        groups.setdefault(record.get("qtype"), []).append(i)
    return groups


def record_rng(seed: int, purpose: str, index: int) -> random.Random:
    """A record's own generator: its draws do not depend on which other records are chosen, so the Q&A record and
    the multiple-choice item of one held-out pair get the same solved examples."""
    return random.Random(f"{seed}:{purpose}:{index}")  # a str seed is hashed with SHA-512: stable across runs


class AnswerPool:
    """Records (by index) with their equal answers next to each other, so that the records whose answer is not a
    given one are one range of positions: drawing k of them is k positions, O(k) however large the pool."""

    def __init__(self, records: list[dict[str, Any]], indices: Sequence[int]) -> None:
        runs: dict[str, list[int]] = {}
        for i in indices:
            runs.setdefault(records[i]["answer"], []).append(i)
        self.records = records
        self.answers = list(runs)  # distinct, in file order
        self.order = [i for run in runs.values() for i in run]
        ends = list(itertools.accumulate(len(run) for run in runs.values()))
        self.spans = {a: (end - len(run), end) for (a, run), end in zip(runs.items(), ends, strict=True)}

    def others(self, answer: str) -> int:
        """How many records of the pool have another answer."""
        start, end = self.spans.get(answer, (0, 0))
        return len(self.order) - (end - start)

    def other(self, answer: str, position: int) -> int:
        """The index of the record at `position` among those whose answer is not `answer`."""
        start, end = self.spans.get(answer, (0, 0))
        return self.order[position if position < start else position + end - start]

    def distinct(self, rng: random.Random, answer: str, k: int, picked: list[str]) -> list[str]:
        """`picked` grown to `k` distinct answers, none `answer`, drawn record by record (a common answer more
        often, as a shuffle of the records would give them); where a few answers crowd the pool out and
        DRAWS_PER_CHOICE draws per choice did not find them, from the pool's distinct answers."""
        picked, eligible = list(picked), self.others(answer)
        for _ in range(DRAWS_PER_CHOICE * k if eligible else 0):
            if len(picked) == k:
                return picked
            candidate = self.records[self.other(answer, rng.randrange(eligible))]["answer"]
            if candidate not in picked:
                picked.append(candidate)
        rest = rng.sample(self.answers, min(len(self.answers), k + 1))  # k + 1: `answer` and `picked` left out
        return [*picked, *(a for a in rest if a != answer and a not in picked)][:k]


def answer_ids(backend: Backend, answer: str, chat: bool) -> list[int]:
    ids = backend.encode(answer if chat else " " + answer)
    if chat and backend.eos_id is not None:
        ids = [*ids, backend.eos_id]
    return ids


def text_id(text: str) -> str:
    """An item's identity across evaluations (of another model, or of @production by the gate): its text hashed."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def item_id(question: str, answer: str) -> str:
    """A held-out Q&A item's identity: its question and reference answer."""
    return text_id(f"{question}\0{answer}")


def mc_item_id(item: dict[str, Any]) -> str:
    """A multiple-choice item's identity: its question, its answer and its choices (another draw of distractors, or
    another number of them, is another item)."""
    return text_id("\0".join([item["question"], item["choices"][item["gold"]], *sorted(item["choices"])]))


def select_indices(records: list[dict[str, Any]], limit: int) -> list[int]:
    """The indices of at most `limit` records, a stable choice (the smallest hashes of the question), ascending."""
    if len(records) <= limit:
        return list(range(len(records)))
    digest = [hashlib.sha256(r["question"].encode()).hexdigest() for r in records]
    return sorted(heapq.nsmallest(limit, range(len(records)), key=digest.__getitem__))


def select_qa(records: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """At most `limit` records, a stable choice (by a hash of the question), in file order."""
    return [records[i] for i in select_indices(records, limit)]


def held_out_items(
    records: list[dict[str, Any]], shots: int, choices: int, qa_limit: int, mc_limit: int, seed: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(Q&A records, multiple-choice items) of one evaluation. The records are chosen first (each cap by question
    hash), and only those get solved examples (`shots`, 0 for a chat model) and distractors, drawn by index: linear
    in the held-out pairs, not quadratic. Every record gives an item when the pairs hold `choices` distinct answers,
    so the items are min(mc_limit, pairs), what evaluation/evidence.py predicts for the gate's min_items."""
    qa, mc = select_indices(records, qa_limit), select_indices(records, mc_limit)
    if shots:
        chosen = sorted(set(qa) | set(mc))
        records = list(records)
        for i, solved in zip(chosen, with_fewshot(records, shots, seed, chosen), strict=True):
            records[i] = solved
    return [records[i] for i in qa], build_mc_items(records, choices, seed, mc)


# ----------------------------------------------------------------------------------------------------------------
# question answering


def run_qa(
    backend: Backend, records: list[dict[str, Any]], chat: bool, max_new_tokens: int
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Greedy answers scored by token F1 and exact match; returns (metrics, one prediction per record)."""
    stops = stop_ids_for(backend)
    prompts = [question_prompt(backend, record, chat) for record in records]
    answers = backend.greedy_many(prompts, max_new_tokens, stops, None if chat else "\n\n", "eval: questions")
    predictions = []
    for record, new in zip(records, answers, strict=True):
        text = cut_answer(backend.decode([t for t in new if t not in stops]), chat)
        predictions.append({
            "id": item_id(record["question"], record["answer"]), "question": record["question"],
            "qtype": record.get("qtype"), "reference": record["answer"],
            "prediction": text, "f1": token_f1(text, record["answer"]),
            "exact_match": exact_match(text, record["answer"]),
        })  # fmt: skip
    n = max(len(predictions), 1)
    metrics = {
        "qa_f1": sum(p["f1"] for p in predictions) / n,
        "qa_exact_match": sum(p["exact_match"] for p in predictions) / n,
        "qa_examples": float(len(predictions)),
        "qa_empty_rate": sum(not p["prediction"] for p in predictions) / n,  # e.g. greedy decoding only newlines
    }
    typed = by_qtype(predictions, {"qa_f1": "f1", "qa_exact_match": "exact_match"}, "qa_examples")
    for qtype in {p["qtype"] for p in predictions} if typed else ():
        references = [p["reference"] for p in predictions if p["qtype"] == qtype]
        typed[f"qa_constant_exact_match.{qtype}"] = best_constant_exact_match(references)
    return metrics | typed, predictions


def best_constant_exact_match(references: Sequence[str]) -> float:
    """Exact match of the best constant answer (the commonest reference): the floor a short-answer question type
    must beat, since a model that learnt only the commonest answer scores this much."""
    counts = Counter(normalize_answer(r) for r in references)
    return max(counts.values()) / len(references) if references else 0.0


def by_qtype(rows: list[dict[str, Any]], fields: dict[str, str], count: str) -> dict[str, float]:
    """`metric.qtype`: the mean of each row field per question type, and `count.qtype`, when the rows carry
    question types (the embedded Q&A set does; a user's file does not): a headline mean can hide a type at chance."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row.get("qtype") is None:
            return {}
        groups.setdefault(row["qtype"], []).append(row)
    out = {}
    for qtype, group in sorted(groups.items()):
        out |= {
            f"{metric}.{qtype}": sum(float(r[field]) for r in group) / len(group) for metric, field in fields.items()
        }
        out[f"{count}.{qtype}"] = float(len(group))
    return out


# ----------------------------------------------------------------------------------------------------------------
# multiple choice


def build_mc_items(
    records: list[dict[str, Any]], choices: int, seed: int, indices: Sequence[int] | None = None
) -> list[dict[str, Any]]:
    """For each record at `indices` (default: all): its answer among `choices - 1` distinct answers of other records
    (same question type first, any type for the rest), option order shuffled; a seeded draw by index per record
    (`record_rng`), O(choices) each. None when the records hold fewer than `choices` distinct answers."""
    same = {qtype: AnswerPool(records, group) for qtype, group in indices_by_qtype(records).items()}
    anywhere = AnswerPool(records, range(len(records)))
    if len(anywhere.answers) < choices:
        return []  # too few distinct answers to build any item (each record's own is one of them)
    items = []
    for i in range(len(records)) if indices is None else indices:
        record, rng = records[i], record_rng(seed, "mc", i)
        picked = same[record.get("qtype")].distinct(rng, record["answer"], choices - 1, [])
        options = [record["answer"], *anywhere.distinct(rng, record["answer"], choices - 1, picked)]
        rng.shuffle(options)
        items.append({
            "question": record["question"], "qtype": record.get("qtype"), "choices": options,
            "gold": options.index(record["answer"]),
            **({"messages": record["messages"]} if record.get("messages") else {}),
            **({"fewshot": record["fewshot"]} if record.get("fewshot") else {}),
        })  # fmt: skip
    return items


MCPairs = tuple[list[tuple[list[int], list[int]]], list[list[list[int]]]]


def mc_pairs(backend: Backend, items: list[dict[str, Any]], chat: bool) -> MCPairs:
    """Every distinct (prompt, answer) pair the items need, in item order, and per item the index of each
    choice's pair after its prompt and after its question-free prompt."""
    pairs: list[tuple[list[int], list[int]]] = []
    where: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}  # one score per distinct (prompt, answer)
    keys = []  # per item: ([index of each choice's score], [index of each choice's question-free score])
    for item in items:
        context, question_free = question_prompt(backend, item, chat), question_free_prompt(backend, item, chat)
        answers = [answer_ids(backend, c, chat) for c in item["choices"]]
        indices = []
        for prompt in (context, question_free):  # answers recur as distractors: their question-free score once
            for answer in answers:
                key = (tuple(prompt), tuple(answer))
                if key not in where:
                    where[key] = len(pairs)
                    pairs.append((prompt, answer))
            indices.append([where[(tuple(prompt), tuple(a))] for a in answers])
        keys.append(indices)
    return pairs, keys


def run_mc(backend: Backend, items: list[dict[str, Any]], chat: bool) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Accuracy by summed, length-normalised and question-conditional (PMI) log-likelihood; returns (metrics, one
    row per item). Every (prompt, choice) of every item is scored in one `continuation_logprobs` call: each
    item's prompt is evaluated once for all its choices (batched on the HF path)."""
    pairs, keys = mc_pairs(backend, items, chat)
    logprobs = backend.continuation_logprobs(pairs, desc="eval: multiple choice")
    rows = []
    for item, (scored, free) in zip(items, keys, strict=True):
        scores, priors = [logprobs[i] for i in scored], [logprobs[i] for i in free]
        norm = [s / max(len(c), 1) for s, c in zip(scores, item["choices"], strict=True)]
        pmi = [s - p for s, p in zip(scores, priors, strict=True)]
        pred, pred_norm, pred_pmi = int(np.argmax(scores)), int(np.argmax(norm)), int(np.argmax(pmi))
        rows.append({
            "id": mc_item_id(item), "question": item["question"],
            "qtype": item.get("qtype"), "gold": item["gold"], "pred": pred,
            "pred_norm": pred_norm, "pred_pmi": pred_pmi, "correct": pred == item["gold"],
            "correct_norm": pred_norm == item["gold"], "correct_pmi": pred_pmi == item["gold"],
            "logprobs": [round(s, 4) for s in scores], "question_free_logprobs": [round(p, 4) for p in priors],
        })  # fmt: skip
    n = max(len(rows), 1)
    k = len(items[0]["choices"]) if items else 0
    metrics = {
        "mc_acc": sum(r["correct"] for r in rows) / n,
        "mc_acc_norm": sum(r["correct_norm"] for r in rows) / n,
        "mc_acc_pmi": sum(r["correct_pmi"] for r in rows) / n,
        "mc_chance": 1 / k if k else 0.0,
        "mc_examples": float(len(rows)),
    }
    fields = {"mc_acc": "correct", "mc_acc_norm": "correct_norm", "mc_acc_pmi": "correct_pmi"}
    return metrics | by_qtype(rows, fields, "mc_examples"), rows


# ----------------------------------------------------------------------------------------------------------------
# generations


def document_prompts(backend: Backend, texts: Sequence[str], n: int, length: int) -> list[list[int]]:
    """The first `length` ids (the backend's own) of the first `n` documents longer than 2 x length ids."""
    out = []
    for text in texts:
        ids = backend.encode(text)
        if len(ids) > 2 * length:
            out.append(ids[:length])
        if len(out) == n:
            break
    return out


def run_generations(
    backend: Backend,
    prompts: list[tuple[str, list[int]]],
    max_new_tokens: int,
    temperature: float,
    top_k: int,
    seed: int,
) -> list[dict[str, Any]]:
    """One sample per prompt, seeded by `seed + index`; returns the prompt, the new ids and their text."""
    stops = stop_ids_for(backend)
    samples = []
    for i, (text, ids) in enumerate(prompts):
        new = backend.generate(ids, max_new_tokens, temperature, top_k, seed + i, stops)
        content = [t for t in new if t not in stops]
        samples.append({"prompt": text, "seed": seed + i, "ids": content, "text": backend.decode(content)})
    return samples


# ----------------------------------------------------------------------------------------------------------------
# memorisation


def pick_documents(backend: Backend, texts: Sequence[str], n: int, min_len: int, seed: int) -> list[np.ndarray]:
    """`n` documents of at least `min_len` ids of the backend's tokenizer: the first that long in a seeded order."""
    out = []
    for i in np.random.default_rng(seed).permutation(len(texts)):
        ids = backend.encode(texts[i])
        if len(ids) >= min_len:
            out.append(np.asarray(ids, dtype=np.int64))
        if len(out) == n:
            break
    return out


def verbatim_rate(backend: Backend, documents: list[np.ndarray], prefix: int, suffix: int) -> dict[str, float]:
    """Greedy continuation of each document's first `prefix` ids: the share reproducing the next `suffix` ids
    exactly, and the mean share of those ids matched before the first difference."""
    exact = matched = 0.0
    continuations = backend.greedy_many([doc[:prefix].tolist() for doc in documents], suffix, desc="eval: memorisation")
    for doc, new in zip(documents, continuations, strict=True):
        truth = doc[prefix : prefix + suffix].tolist()
        run = next((i for i, (a, b) in enumerate(zip(new, truth, strict=False)) if a != b), min(len(new), len(truth)))
        exact += float(new[: len(truth)] == truth)
        matched += run / len(truth)
    n = max(len(documents), 1)
    return {"exact": exact / n, "prefix_match": matched / n, "documents": float(len(documents))}


# ----------------------------------------------------------------------------------------------------------------
# a unigram floor: what "low bits per byte" is measured against


def unigram_floor(backend: Backend, train_texts: Sequence[str], test_texts: Sequence[str]) -> dict[str, Any]:
    """Bits per byte (and per-token perplexity) of the add-one-smoothed unigram distribution of the backend's
    tokenizer, fitted on the train text, on every id of the test documents (over the same bytes as score_text);
    `document_bits`: each test document's bits (0.0 for one that tokenizes to nothing)."""
    counts = np.ones(backend.vocab_size, dtype=np.float64)
    for text in train_texts:
        ids = np.asarray(backend.encode(text), dtype=np.int64)
        counts += np.bincount(ids[ids < backend.vocab_size], minlength=backend.vocab_size)
    logp = np.log(counts / counts.sum())
    nll = tokens = n_bytes = 0.0
    document_bits = []
    for text in test_texts:
        ids = np.asarray(backend.encode(text), dtype=np.int64)
        doc_nll = -float(logp[np.minimum(ids, backend.vocab_size - 1)].sum()) if len(ids) else 0.0
        document_bits.append(doc_nll / math.log(2))
        if len(ids):
            nll += doc_nll
            tokens += len(ids)
            n_bytes += len(text.encode("utf-8"))
    if not tokens:
        return {"bits_per_byte": float("nan"), "ppl": float("nan"), "tokenizer": backend.tokenizer_info()}
    return {"bits_per_byte": nll / math.log(2) / n_bytes, "ppl": math.exp(nll / tokens),
            "tokenizer": backend.tokenizer_info(), "document_bits": document_bits}  # fmt: skip
