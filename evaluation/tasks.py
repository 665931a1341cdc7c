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


def with_fewshot(records: list[dict[str, Any]], shots: int, seed: int) -> list[dict[str, Any]]:
    """Each record with `fewshot`: `shots` other records of its question type, solved (a seeded draw). For a base
    model, which never saw the Question/Answer format in pretraining: lm-eval's num_fewshot, drawn from the same
    held-out set as lm-eval does for a task with no train split. The random-init twin gets the same examples."""
    rng = random.Random(seed)
    same_qtype = indices_by_qtype(records)
    out = []
    for record in records:
        # never one with the same answer ("json" for another `json` function): it would hand the answer over
        pool = [j for j in same_qtype[record.get("qtype")] if records[j]["answer"] != record["answer"]]
        demos = [records[j] for j in rng.sample(pool, min(shots, len(pool)))]
        out.append({**record, "fewshot": [{"question": d["question"], "answer": d["answer"]} for d in demos]})
    return out


def indices_by_qtype(records: list[dict[str, Any]]) -> dict[Any, list[int]]:
    """Question type -> the indices of its records (a user's file without types: one group, None)."""
    groups: dict[Any, list[int]] = {}
    for i, record in enumerate(records):
        groups.setdefault(record.get("qtype"), []).append(i)
    return groups


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


def select_qa(records: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """At most `limit` records, a stable choice (by a hash of the question), in file order."""
    if len(records) <= limit:
        return list(records)
    ranked = sorted(range(len(records)), key=lambda i: hashlib.sha256(records[i]["question"].encode()).hexdigest())
    keep = set(ranked[:limit])
    return [r for i, r in enumerate(records) if i in keep]


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


def build_mc_items(records: list[dict[str, Any]], choices: int, seed: int) -> list[dict[str, Any]]:
    """For each record: its answer among `choices - 1` distinct answers of other records (same qtype first)."""
    rng = random.Random(seed)
    same_qtype = indices_by_qtype(records)
    items = []
    for i, record in enumerate(records):
        picked: list[str] = []
        same = [j for j in same_qtype[record.get("qtype")] if j != i]
        for pool in (same, range(len(records))):  # other question types only when the same type runs short
            order = list(pool)
            rng.shuffle(order)
            for j in order:
                if len(picked) == choices - 1:
                    break
                answer = records[j]["answer"]
                if j != i and answer != record["answer"] and answer not in picked:
                    picked.append(answer)
        if len(picked) < choices - 1:
            continue  # too few distinct answers to build this item
        options = [record["answer"], *picked]
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
