"""The tokenizer stage's compression report: how well the vocabulary fits the corpus, measured on a split while its
token shards are written (pretrain/tokenizer.py), as report.json and report.md.

    report = compression_report(tokenizer, stats, cfg.tokenizer)     # stats: token_shards.write_shards's
    markdown = report_markdown(report, splits)
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tokenizers import Tokenizer

from forge.config import TokenizerConfig
from pretrain.token_shards import SplitStats

TOP_TOKENS = 20  # how many of the most frequent val tokens the report lists


def compression_report(
    tokenizer: Tokenizer, stats: dict[str, SplitStats], tcfg: TokenizerConfig, split: str = "val",
    unk_token: str | None = "", from_base: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """Compression of `split` (tokens per word, chars per token, vocabulary use, top tokens, unknown bytes).
    `unk_token`: the unknown token ("": the config's, None: the tokenizer has none); `from_base`: the tokenizer is
    model.init_from's, which cannot be retrained here (the warning's advice differs)."""
    s, train = stats[split], stats["train"]
    vocab = tokenizer.get_vocab_size()
    unk_id = (
        tokenizer.token_to_id(tcfg.special_tokens[1] if unk_token == "" else unk_token)
        if unk_token is not None
        else None
    )
    tokens = max(s.doc_tokens, 1)
    top = np.argsort(-s.token_counts, kind="stable")[:TOP_TOKENS]
    report: dict[str, Any] = {
        "split": split,
        "documents": s.documents,
        "words": s.words,
        "chars": s.chars,
        "bytes": s.bytes,
        "doc_tokens": s.doc_tokens,
        "tokens_per_word": round(s.doc_tokens / max(s.words, 1), 4),
        "chars_per_token": round(s.chars / tokens, 4),
        "bytes_per_token": round(s.bytes / tokens, 4),
        "vocab_size": vocab,
        "vocab_used_fraction": round(float((s.token_counts > 0).sum()) / vocab, 4),
        "vocab_used_fraction_train": round(float((train.token_counts > 0).sum()) / vocab, 4),
        "unk_token_rate": float(s.token_counts[unk_id]) / tokens if unk_id is not None else 0.0,
        # bytes of this split whose value never occurs in train: their byte tokens were never trained
        "unknown_byte_rate": float(s.byte_counts[train.byte_counts == 0].sum()) / max(s.bytes, 1),
        "top_tokens": [
            {
                "id": int(i),
                "token": tokenizer.id_to_token(int(i)),
                "text": tokenizer.decode([int(i)], skip_special_tokens=False),
                "count": int(s.token_counts[i]),
                "share": round(float(s.token_counts[i]) / tokens, 4),
            }
            for i in top
            if s.token_counts[i] > 0
        ],
        "max_tokens_per_word": tcfg.max_tokens_per_word,
        "warnings": [],
    }
    if s.words == 0:
        report["warnings"].append(f"the {split} split has no words: compression was not measured; check forge data")
    elif report["tokens_per_word"] > tcfg.max_tokens_per_word:
        fix = ("the base model's tokenizer was trained on other text: each window holds fewer words and training "
               "sees fewer per step; a base whose vocabulary fits this domain (model.init_from) splits it better"
               if from_base else "use a larger vocabulary (tokenizer.vocab_size, usually 32k-50k, 48k for "
               "acronym-heavy technical text) or a training corpus more representative of the text the model will "
               "see")  # fmt: skip
        report["warnings"].append(
            f"{split}: {report['tokens_per_word']:.3f} tokens per word > tokenizer.max_tokens_per_word="
            f"{tcfg.max_tokens_per_word}: the tokenizer splits this domain's words poorly; {fix}"
        )
    return report


def report_markdown(report: dict[str, Any], splits: dict[str, dict[str, int]]) -> str:
    r = report
    lines = [
        f"# Tokenizer report: compression on {r['split']}",
        "",
        f"- vocabulary: {r['vocab_size']:,} tokens; used on {r['split']}: {r['vocab_used_fraction']:.1%}, "
        f"on train: {r['vocab_used_fraction_train']:.1%}",
        f"- tokens per word: {r['tokens_per_word']:.3f} (warning above {r['max_tokens_per_word']})",
        f"- characters per token: {r['chars_per_token']:.3f}; bytes per token: {r['bytes_per_token']:.3f}",
        f"- unknown-byte rate (bytes never seen in train): {r['unknown_byte_rate']:.2e}; "
        f"[UNK] token rate: {r['unk_token_rate']:.2e}",
        f"- {r['split']}: {r['documents']:,} documents, {r['words']:,} words, {r['chars']:,} characters, "
        f"{r['doc_tokens']:,} tokens",
        "",
        "| split | documents | tokens (with one EOS per document) |",
        "|---|---:|---:|",
        *(f"| {name} | {s['documents']:,} | {s['tokens']:,} |" for name, s in splits.items()),
        "",
    ]
    lines += [f"Most frequent {r['split']} tokens:", "", "| id | text | count | share |", "|---:|---|---:|---:|"]
    for t in r["top_tokens"]:
        text = repr(t["text"]).replace("|", "\\|")  # a pipe would end the table cell
        lines.append(f"| {t['id']} | `{text}` | {t['count']:,} | {t['share']:.2%} |")
    lines += ["", *(f"WARNING: {w}" for w in r["warnings"])]
    return "\n".join(lines).rstrip() + "\n"
