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
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/tiny-cpu.yaml")
    parser.add_argument("--target", default="pretrain", help="pretrain, sft, a model directory or a .gguf file")
    parser.add_argument("--items", type=int, default=None, help="multiple-choice items (default: eval.mc_max_examples)")
    parser.add_argument("--set", action="append", default=[], help="config override a.b=value")
    args = parser.parse_args()

    cfg = load_config(args.config, args.set)
    model_path, _, _ = resolve_target(cfg, args.target)
    records = load_qa(cfg, qa_input(cfg))
    backend = open_model(model_path)
    chat = is_chat_model(backend) if cfg.eval.chat is None else cfg.eval.chat
    if not chat and cfg.eval.base_fewshot:
        records = tasks.with_fewshot(records, cfg.eval.base_fewshot, cfg.seed)
    items = tasks.build_mc_items(records, cfg.eval.mc_choices, cfg.seed)
    items = tasks.select_qa(items, args.items or cfg.eval.mc_max_examples)
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
