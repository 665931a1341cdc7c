"""CPU serving speed: HF transformers fp32 against llama.cpp f16, Q8_0 and Q4_K_M on the same model and prompts.

    .venv/bin/python bench/serve_cpu.py                                   # random-init configs/125m.yaml model
    .venv/bin/python bench/serve_cpu.py --model-dir runs/tiny-cpu/pretrain/model --threads 2
    .venv/bin/python bench/serve_cpu.py --config configs/tiny-cpu.yaml --new-tokens 64 --json out.json

Every backend greedily decodes `--new-tokens` tokens after each of the same `--prompts` prompts (token ids, so
tokenization is out of the measurement), with the KV cache, on `--threads` threads: HF through a plain
forward loop with past_key_values (no generate() overhead), llama.cpp through llama_cpp.Llama.generate
(top_k=1, temp=0). Decode tokens/s counts the tokens after the first one (the first one pays for the prompt);
prompt tokens/s is one forward over `--prompt-speed-tokens` tokens, best of two. The backends alternate
`--repeats` times and the median is reported, because the machine may be shared. Goal: Q4_K_M >= 5x HF fp32.

Without --model-dir the model is built at random from --config (pretrain.model.build_model) with a small BPE
trained here on generated text and padded to the config's vocabulary: speed does not depend on the weights.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from forge.config import TokenizerConfig, load_config  # noqa: E402
from forge.machine import usable_cores  # noqa: E402
from models.access import GGUFBackend, HFBackend  # noqa: E402
from serve.gguf_export import export_gguf  # noqa: E402
from serve.quantize import quantize_gguf  # noqa: E402

TYPES = ("f16", "q8_0", "q4_k_m")
WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "it",
    "for",
    "was",
    "on",
    "are",
    "as",
    "with",
    "def",
    "return",
    "class",
    "import",
    "self",
    "value",
    "index",
    "list",
]


def random_model_dir(config: str, dest: Path) -> Path:
    """A random-init model of `config` with a small tokenizer padded to its vocabulary (see the module doc)."""
    import torch

    from pretrain.model import build_model
    from pretrain.tokenizer import save_tokenizer, train_bpe

    cfg = load_config(config)
    rng = random.Random(0)
    docs = [" ".join(rng.choices(WORDS, k=200)) for _ in range(200)]
    tcfg = TokenizerConfig(vocab_size=320, min_frequency=2)  # what 30 random words support (~335 tokens)
    tok = train_bpe(docs, tcfg)
    dest.mkdir(parents=True, exist_ok=True)
    save_tokenizer(tok, tcfg, dest)
    torch.manual_seed(0)
    model = build_model(cfg.model, cfg.model.vocab_size or cfg.tokenizer.vocab_size)
    model.save_pretrained(dest)
    return dest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, help="a saved HF model directory with its tokenizer files")
    parser.add_argument("--config", default="configs/125m.yaml", help="random-init model shape without --model-dir")
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-speed-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=None, help="default: every core")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    import torch
    from transformers import AutoConfig

    threads = args.threads or usable_cores()  # what `forge serve` gives llama-server (serving_threads)
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory(prefix="forge-bench-serve-") as tmp:
        work = Path(tmp)
        model_dir = args.model_dir or random_model_dir(args.config, work / "model")
        hf_cfg = AutoConfig.from_pretrained(model_dir)
        context = int(getattr(hf_cfg, "max_position_embeddings", None) or hf_cfg.n_positions)
        vocab = hf_cfg.vocab_size

        start = time.time()
        paths = {"f16": work / "model-f16.gguf"}
        export_gguf(model_dir, paths["f16"])
        for name in TYPES[1:]:
            paths[name] = work / f"model-{name}.gguf"
            quantize_gguf(paths["f16"], paths[name], name, threads=threads)
        sizes = {name: p.stat().st_size / 1e6 for name, p in paths.items()}
        print(
            f"exported and quantized in {time.time() - start:.1f}s: "
            + ", ".join(f"{k} {v:.1f} MB" for k, v in sizes.items())
        )

        rng = np.random.default_rng(0)
        low = min(7, vocab - 1)  # past the special and chat-role tokens
        prompts = [rng.integers(low, vocab, args.prompt_tokens).tolist() for _ in range(args.prompts)]
        speed_ids = rng.integers(low, vocab, min(args.prompt_speed_tokens, context)).tolist()
        new_tokens = min(args.new_tokens, context - args.prompt_tokens)
        n_ctx = max(args.prompt_tokens + new_tokens, len(speed_ids))

        hf = HFBackend(model_dir)
        backends = {"hf-fp32": hf}
        backends |= {name: GGUFBackend(path, n_threads=threads, logits_all=False, n_ctx=n_ctx)
                     for name, path in paths.items()}  # fmt: skip
        decode: dict[str, list[float]] = {name: [] for name in backends}
        prompt: dict[str, list[float]] = {name: [] for name in backends}
        outputs: dict[str, list[list[int]]] = {}
        for repeat in range(args.repeats):
            for name, backend in backends.items():
                runs = [backend.timed_greedy(p, new_tokens) for p in prompts]
                decode[name].append(sum(len(r.ids) - 1 for r in runs) / sum(r.decode_s for r in runs))
                outputs[name] = [r.ids for r in runs]
                prompt[name].append(backend.prompt_speed(speed_ids))
            print(
                f"repeat {repeat + 1}/{args.repeats}: " + ", ".join(f"{k} {v[-1]:.0f} tok/s" for k, v in decode.items())
            )
        for backend in backends.values():
            backend.close()

    base = statistics.median(decode["hf-fp32"])
    results = {
        "model": str(args.model_dir or f"random-init {args.config}"),
        "architecture": hf_cfg.model_type,
        "parameters": int(sum(p.numel() for p in hf.model.parameters())),
        "threads": threads,
        "prompts": args.prompts,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": new_tokens,
        "repeats": args.repeats,
        "backends": {
            name: {
                "decode_tokens_per_s": round(statistics.median(decode[name]), 2),
                "prompt_tokens_per_s": round(statistics.median(prompt[name]), 2),
                "decode_vs_hf_fp32": round(statistics.median(decode[name]) / base, 2),
                "size_mb": round(sizes[name], 2) if name in sizes else None,
                "greedy_agreement_with_hf": round(
                    float(np.mean([a == b for x, y in zip(outputs["hf-fp32"], outputs[name], strict=True)
                                   for a, b in zip(x, y, strict=True)])), 3),
            }
            for name in backends
        },
    }  # fmt: skip
    q4 = results["backends"]["q4_k_m"]["decode_vs_hf_fp32"]
    results["goal"] = {"q4_k_m_decode_vs_hf_fp32": q4, "target": 5.0, "met": q4 >= 5.0}

    print(
        f"\n{results['model']} ({results['architecture']}, {results['parameters']:,} parameters), {threads} thread(s)"
    )
    print(f"{'backend':<9} {'size MB':>8} {'decode tok/s':>13} {'x HF fp32':>10} {'prompt tok/s':>13} {'agree':>6}")
    for name, r in results["backends"].items():
        size = f"{r['size_mb']:.1f}" if r["size_mb"] else "-"
        print(
            f"{name:<9} {size:>8} {r['decode_tokens_per_s']:>13,.1f} {r['decode_vs_hf_fp32']:>10.2f} "
            f"{r['prompt_tokens_per_s']:>13,.0f} {r['greedy_agreement_with_hf']:>6.0%}"
        )
    print(f"goal Q4_K_M >= 5x HF fp32 decode: {q4:.2f}x, {'met' if q4 >= 5 else 'NOT met'}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    from results import recorded  # bench/results.py: the output goes to RESULTS.md too

    with recorded(__file__):
        main()
