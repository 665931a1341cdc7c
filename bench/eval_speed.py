"""Multiple-choice scoring speed: the per-choice path (one forward pass per (prompt, choice), each from scratch)
against the batched one `forge eval` uses (each prompt run once for all its choices: padded batches over a copy of
the prompt's KV cache on HF, the prompt's KV cache reused on llama.cpp), on the same items in one run; prints both
times, the ratio and the agreement of the scores.

    .venv/bin/python bench/eval_speed.py --config configs/tiny-cpu.yaml --target pretrain
    .venv/bin/python bench/eval_speed.py --config configs/tiny-cpu.yaml --target sft --items 200
    .venv/bin/python bench/eval_speed.py --config configs/tiny-cpu.yaml --target /path/to/model.gguf

The items are the eval stage's own: the run's held-out Q&A (evaluation.stage.load_qa), multiple-choice items built
from it (eval.mc_choices, the run's seed) and their prompts with and without the question (PMI), exactly the pairs
`forge eval` scores. Agreement: the same best choice on every item and the largest absolute difference of a
log-likelihood (both paths run fp32 on HF; llama.cpp's batched and single evaluations may round differently).

`--build` times the item building alone (no model) on synthetic held-out pairs of four question types: today's
`tasks.held_out_items` (the records chosen first, shots and distractors drawn by index) at 10k, 50k and 200k pairs
against the old algorithm kept here as the baseline (every record's same-type list shuffled before the cap:
quadratic, so timed only up to --old-max pairs and extrapolated by its fitted n^2 above that).

    .venv/bin/python bench/eval_speed.py --build --no-record
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the held-out pairs tests check

from test_eval import held_out_pairs  # noqa: E402 - the same pairs tests/test_eval.py checks the items of

from evaluation import tasks  # noqa: E402
from evaluation.stage import load_qa, qa_input, resolve_target  # noqa: E402
from forge.config import load_config  # noqa: E402
from models.access import Backend, is_chat_model, open_model  # noqa: E402


def per_choice(backend: Backend, pairs: list[tuple[list[int], list[int]]]) -> list[float]:
    """The old path: every pair in its own forward pass, nothing kept from the previous one."""
    out = []
    for context, continuation in pairs:
        ids, n = backend._fit(context, continuation)
        if backend.kind == "gguf":
            backend.llm.reset()  # no prompt cache: what scoring did before
        out.append(Backend.score_tails(backend, [(ids, n)])[0] if n else 0.0)
    return out


# ----------------------------------------------------------------------------------------------------------------
# item building: the old quadratic algorithm (the baseline) against tasks.held_out_items


def old_with_fewshot(records: list[dict[str, Any]], shots: int, seed: int) -> list[dict[str, Any]]:
    """evaluation/tasks.py before issue 41: every record's same-type pool listed, then sampled."""
    rng, same_qtype, out = random.Random(seed), tasks.indices_by_qtype(records), []
    for record in records:
        pool = [j for j in same_qtype[record.get("qtype")] if records[j]["answer"] != record["answer"]]
        demos = [records[j] for j in rng.sample(pool, min(shots, len(pool)))]
        out.append({**record, "fewshot": [{"question": d["question"], "answer": d["answer"]} for d in demos]})
    return out


def old_mc_items(records: list[dict[str, Any]], choices: int, seed: int) -> list[dict[str, Any]]:
    """evaluation/tasks.py before issue 41: every record's same-type list (then every record) shuffled."""
    rng, same_qtype, items = random.Random(seed), tasks.indices_by_qtype(records), []
    for i, record in enumerate(records):
        picked: list[str] = []
        same = [j for j in same_qtype[record.get("qtype")] if j != i]
        for pool in (same, range(len(records))):
            order = list(pool)
            rng.shuffle(order)
            for j in order:
                if len(picked) == choices - 1:
                    break
                answer = records[j]["answer"]
                if j != i and answer != record["answer"] and answer not in picked:
                    picked.append(answer)
        if len(picked) == choices - 1:
            options = [record["answer"], *picked]
            rng.shuffle(options)
            items.append({"question": record["question"], "choices": options, "fewshot": record["fewshot"]})
    return items


def old_items(records: list[dict[str, Any]], limits: tuple[int, int]) -> tuple[list[Any], list[Any]]:
    records = old_with_fewshot(records, 3, 0)
    return tasks.select_qa(records, limits[0]), tasks.select_qa(old_mc_items(records, 4, 0), limits[1])


def build_bench(old_max: int) -> None:
    """Seconds to build the default caps' items (qa 200, mc 1000, 3 shots, 4 choices), old and new."""
    limits, old_fit = (200, 1000), None
    print(f"{'pairs':>8} {'old s':>10} {'new s':>8}   (qa_max_examples={limits[0]}, mc_max_examples={limits[1]})")
    for n in sorted({2_000, 5_000, old_max, 10_000, 50_000, 200_000}):
        records = held_out_pairs(n)
        start = time.perf_counter()
        qa, items = tasks.held_out_items(records, 3, 4, *limits, seed=0)
        new_s = time.perf_counter() - start
        old = "-"
        if n <= old_max:
            start = time.perf_counter()
            old_qa, old_mc = old_items(records, limits)
            old_s = time.perf_counter() - start
            old, old_fit = f"{old_s:10.2f}", old_s / n**2
            same = [r["question"] for r in qa] == [r["question"] for r in old_qa] and \
                [r["question"] for r in items] == [r["question"] for r in old_mc]  # fmt: skip
            assert same, f"{n} pairs: the old and new algorithms chose different records"
        elif old_fit is not None:
            old = f"~{old_fit * n**2:9.0f}"  # the quadratic fitted at the largest size timed
        print(f"{n:>8,} {old:>10} {new_s:8.2f}   {len(qa)} qa records, {len(items)} items")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/tiny-cpu.yaml")
    parser.add_argument("--target", default="pretrain", help="pretrain, sft, a model directory or a .gguf file")
    parser.add_argument("--items", type=int, default=None, help="multiple-choice items (default: eval.mc_max_examples)")
    parser.add_argument("--set", action="append", default=[], help="config override a.b=value")
    parser.add_argument("--build", action="store_true", help="time the item building alone (no model)")
    parser.add_argument("--old-max", type=int, default=10_000, help="largest size the old algorithm is timed at")
    args = parser.parse_args()
    if args.build:
        build_bench(args.old_max)
        return

    cfg = load_config(args.config, args.set)
    model_path, _, _ = resolve_target(cfg, args.target)
    records = load_qa(cfg, qa_input(cfg))
    backend = open_model(model_path)
    chat = is_chat_model(backend) if cfg.eval.chat is None else cfg.eval.chat
    e, shots = cfg.eval, 0 if chat else cfg.eval.base_fewshot
    _, items = tasks.held_out_items(records, shots, e.mc_choices, 1, args.items or e.mc_max_examples, cfg.seed)
    pairs, keys = tasks.mc_pairs(backend, items, chat)
    print(f"{model_path} ({backend.kind}, {'chat' if chat else 'base'}): {len(items)} items, {len(pairs)} scored pairs")

    start = time.perf_counter()
    old = np.array(per_choice(backend, pairs))
    old_s = time.perf_counter() - start
    start = time.perf_counter()
    new = np.array(backend.continuation_logprobs(pairs, desc="batched"))
    new_s = time.perf_counter() - start
    backend.close()

    def best(scores: np.ndarray) -> list[int]:
        return [int(np.argmax(scores[k[0]])) for k in keys]

    same = sum(a == b for a, b in zip(best(old), best(new), strict=True))
    print(f"per-choice: {old_s:8.2f} s")
    print(f"batched:    {new_s:8.2f} s")
    print(f"speed-up:   {old_s / new_s:8.2f} x")
    print(f"agreement:  same best choice on {same}/{len(items)} items; max |log-likelihood difference| "
          f"{np.abs(old - new).max():.2e}")  # fmt: skip


if __name__ == "__main__":
    from results import recorded  # bench/results.py: the output goes to RESULTS.md too

    with recorded(__file__):
        main()
