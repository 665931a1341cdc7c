"""`forge tokenizer`: a byte-level BPE trained on the train split, a compression report, a chat template and token
shards for pretraining.

    forge tokenizer --config configs/tiny-cpu.yaml
    AutoTokenizer.from_pretrained("runs/tiny-cpu/tokenizer")

Reads the data stage's `runs/<run>/data/<split>-NNNNN.parquet`; writes into `runs/<run>/tokenizer/`:
  tokenizer.json, tokenizer_config.json, chat_template.jinja   a transformers tokenizer directory
  shards/                                                     token shards, one per data shard, encoded by a
                                                              process pool (data.workers: 0 is one per core) or,
                                                              with data.executor=ray, by Ray tasks (see
                                                              pretrain/token_shards.py)
  report.json, report.md                                      the compression report (val split)

Ids are fixed: the config's special tokens in order ([PAD]=0, [UNK]=1, [BOS]=2, [EOS]=3), then its chat role
tokens (system, user, assistant), then the 256 byte symbols, then the merges. The pre-tokenizer is
`ByteLevel(add_prefix_space=False, use_regex=True)`: the GPT-2 regex, which llama.cpp reproduces as pre-tokenizer
type "gpt-2". There is no normalizer and no post-processor: encoding adds no BOS/EOS and `decode(encode(text))`
gives back the exact text (tabs, runs of spaces, any Unicode). Whoever wants a BOS adds it; the GGUF export must
set add_bos_token=false like tokenizer_config.json does, or llama.cpp prepends a BOS the model never saw.

The chat template (with the default tokens) renders each turn as its role token followed by the content, and ends
every assistant turn with the EOS token, the only token llama.cpp stops on; `add_generation_prompt` appends the
assistant role token. No newlines or spaces are added:

    <|system|>Be brief.<|user|>Hi<|assistant|>Hello![EOS]<|user|>Bye<|assistant|>
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from tokenizers import Tokenizer, decoders, pre_tokenizers, trainers
from tokenizers import models as bpe_models  # not the project's models/ package, which run_base imports

from forge import ForgeError
from forge.config import ForgeConfig, TokenizerConfig
from forge.hashing import hash_share, sha256_file
from forge.io import atomic_write_bytes, atomic_write_json, atomic_write_text
from forge.lineage import Stage, require_reads, run_stage
from forge.paths import run_dir
from forge.progress import progress
from pretrain.data.splits import SPLITS
from pretrain.token_shards import iter_text_batches, load_split, write_shards
from pretrain.tokenizer_report import compression_report, report_markdown

log = logging.getLogger("forge.tokenizer")

SPECIAL_NAMES = ("pad", "unk", "bos", "eos")  # what the first four `tokenizer.special_tokens` are, in order
CHAT_ROLES = ("system", "user", "assistant")  # what the three `tokenizer.chat_roles` are, in order
N_BYTES = 256  # the byte-level alphabet: every byte has a token, so no text is ever unknown
FORBIDDEN_CHARS = "'\"\\"  # would break the Jinja string literals the chat template quotes tokens in


# ----------------------------------------------------------------------------------------------------------------
# config checks: everything that can be wrong before a single document is read


def all_special_tokens(tcfg: TokenizerConfig) -> list[str]:
    """Every special token in id order: special_tokens (pad, unk, bos, eos, extras...), then the chat roles."""
    return [*tcfg.special_tokens, *tcfg.chat_roles]


def check_config(tcfg: TokenizerConfig) -> None:
    """Raise one ForgeError listing every problem with the tokenizer section (no data needed)."""
    problems = []
    if len(tcfg.special_tokens) < len(SPECIAL_NAMES):
        problems.append(
            f"tokenizer.special_tokens={tcfg.special_tokens}: needs at least {len(SPECIAL_NAMES)} tokens, in this "
            "order: pad, unk, bos, eos (e.g. [PAD] [UNK] [BOS] [EOS])"
        )
    if len(tcfg.chat_roles) != len(CHAT_ROLES):
        problems.append(
            f"tokenizer.chat_roles={tcfg.chat_roles}: needs exactly {len(CHAT_ROLES)} tokens, in this order: "
            "system, user, assistant (e.g. <|system|> <|user|> <|assistant|>)"
        )
    tokens = all_special_tokens(tcfg)
    seen: dict[str, str] = {}
    names = [*(f"special_tokens[{i}]" for i in range(len(tcfg.special_tokens)))]
    names += [f"chat_roles[{i}]" for i in range(len(tcfg.chat_roles))]
    for name, token in zip(names, tokens, strict=True):
        if not token or token != token.strip() or any(c.isspace() for c in token):
            problems.append(f"tokenizer.{name}={token!r}: a special token must be non-empty and contain no whitespace")
        elif any(c in token for c in FORBIDDEN_CHARS):
            problems.append(f"tokenizer.{name}={token!r}: a special token must not contain quotes or backslashes")
        elif len(token) == 1:
            problems.append(f"tokenizer.{name}={token!r}: a one-character special token would capture that character")
        if token in seen:
            problems.append(
                f"tokenizer.{name}={token!r} collides with tokenizer.{seen[token]}: every special and chat role "
                "token must be distinct (the end of an assistant turn is always the EOS token, not a role)"
            )
        seen.setdefault(token, name)
    floor = N_BYTES + len(tokens) + 1
    if tcfg.vocab_size < floor:
        problems.append(
            f"tokenizer.vocab_size={tcfg.vocab_size} leaves no room for merges: {N_BYTES} byte tokens + "
            f"{len(tokens)} special tokens need vocab_size >= {floor} (domain tokenizers usually have 32k-50k)"
        )
    if problems:
        raise ForgeError("; ".join(problems))


# ----------------------------------------------------------------------------------------------------------------
# the data stage's shards


def data_shards(cfg: ForgeConfig) -> dict[str, list[Path]]:
    """The data stage's parquet shards per split (the reading stage checked that it completed: require_reads)."""
    data_dir = run_dir(cfg) / "data"
    shards = {split: sorted(data_dir.glob(f"{split}-*.parquet")) for split in SPLITS}
    missing = [split for split, files in shards.items() if not files]
    if missing:
        raise ForgeError(
            f"{data_dir} has no {'/'.join(missing)} shards ({missing[0]}-00000.parquet...); re-run forge data"
        )
    return shards


def shard_listing(files: list[Path]) -> str:
    """A content id for a split's shards: their names and sha256, the stage's skip key for that input."""
    return "\n".join(f"{f.name} {sha256_file(f)}" for f in files)


def train_texts(shards: list[Path], sample_bytes: int | None, desc: str = "tokenizer: read train"
                ) -> Iterator[list[str]]:  # fmt: skip
    """The train split in batches, sampled to about `sample_bytes` of text (tokenizer.train_sample_bytes);
    forge.progress counts the documents read as `desc` (a bar on a terminal, else a log line every 30 seconds)."""
    total = text_bytes(shards)
    share = 1.0 if sample_bytes is None else min(1.0, sample_bytes / max(1, total))
    if share < 1.0:
        log.info("%s: a %.1f%% sample of train (tokenizer.train_sample_bytes=%d of its %d bytes)", desc,
                 100 * share, sample_bytes, total)  # fmt: skip
    with progress(total=doc_count(shards), desc=desc, unit="doc", logger=log) as bar:
        for batch in iter_text_batches(shards):
            bar.update(len(batch))
            kept = batch if share >= 1.0 else [text for text in batch if hash_share(text) < share]
            if kept:
                yield kept


def doc_count(shards: list[Path]) -> int:
    """The documents in parquet shards, from their footers (no text read)."""
    return sum(pq.ParquetFile(f).metadata.num_rows for f in shards)


def text_bytes(shards: list[Path]) -> int:
    """The UTF-8 bytes of the documents in parquet shards, counted in Arrow (no Python strings). Exact, not the
    footers' sizes: those depend on the order of the documents, and the sample must not."""
    import pyarrow.compute as pc

    return sum(pc.sum(pc.binary_length(pq.read_table(f, columns=["text"])["text"])).as_py() or 0 for f in shards)


# ----------------------------------------------------------------------------------------------------------------
# training


def pre_tokenizer() -> pre_tokenizers.ByteLevel:
    # use_regex=True is the GPT-2 split regex (llama.cpp pre-tokenizer "gpt-2"); no prefix space, so the first
    # word of a text is encoded as it is and decode(encode(text)) == text.
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def check_corpus_capacity(shards: list[Path], tcfg: TokenizerConfig) -> None:
    """Fail before training when the train split cannot produce `vocab_size` tokens.

    Every BPE merge joins two adjacent symbols inside one distinct pre-tokenized word, so a corpus whose distinct
    words have B bytes in all (n words) allows at most B - n merges. We stop reading as soon as the bound covers
    the merges needed, so on a real corpus this reads a few documents. The bound ignores min_frequency: a corpus
    that passes here can still fall short, which `train_tokenizer` reports with the exact size reached.
    """
    needed = tcfg.vocab_size - len(all_special_tokens(tcfg)) - N_BYTES
    splitter = pre_tokenizer()
    words: set[str] = set()
    bound = docs = 0
    for batch in train_texts(shards, tcfg.train_sample_bytes, "tokenizer: vocabulary bound"):
        for text in batch:
            docs += 1
            for word, _ in splitter.pre_tokenize_str(text):
                if word not in words:
                    words.add(word)
                    bound += len(word) - 1  # byte-level symbols: one per byte
            if bound >= needed:
                return
    most = N_BYTES + len(all_special_tokens(tcfg)) + bound
    raise ForgeError(
        f"tokenizer.vocab_size={tcfg.vocab_size} is larger than the train split can support: its {docs} documents "
        f"({len(words)} distinct words) allow at most {most} tokens ({N_BYTES} bytes + "
        f"{len(all_special_tokens(tcfg))} special tokens + {bound} merges); lower tokenizer.vocab_size or add data"
    )


def train_tokenizer(shards: list[Path], tcfg: TokenizerConfig) -> Tokenizer:
    """Train the byte-level BPE on the train shards, streaming, and check it reached the requested size."""
    return train_bpe(train_texts(shards, tcfg.train_sample_bytes), tcfg)


def train_bpe(texts: Iterable[str] | Iterable[list[str]], tcfg: TokenizerConfig) -> Tokenizer:
    """Train Forge's byte-level BPE on texts (or batches of texts); the checks below hold for every caller."""
    specials = all_special_tokens(tcfg)
    tokenizer = Tokenizer(bpe_models.BPE(unk_token=tcfg.special_tokens[1]))
    tokenizer.pre_tokenizer = pre_tokenizer()
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=tcfg.vocab_size,
        min_frequency=tcfg.min_frequency,
        special_tokens=specials,  # ids 0.. in this order
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes, seen in train or not
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    got = tokenizer.get_vocab_size()
    if got < tcfg.vocab_size:
        raise ForgeError(
            f"tokenizer.vocab_size={tcfg.vocab_size} is larger than the train split supports: BPE with "
            f"min_frequency={tcfg.min_frequency} stopped at {got} tokens (no pair left occurring "
            f"{tcfg.min_frequency}+ times); set tokenizer.vocab_size <= {got}, lower tokenizer.min_frequency or add "
            "data"
        )
    # A special token whose text BPE can also build from bytes (e.g. "EOS", all letters) would turn ordinary text
    # into a control token; "[EOS]" and "<|user|>" mix letters and punctuation, which the GPT-2 regex splits.
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    merged = {"".join(pair) for pair in merges}
    as_bytes = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    built = [t for t in specials if as_bytes.pre_tokenize_str(t)[0][0] in merged]
    if built:
        raise ForgeError(
            f"special token(s) {built} are also frequent text of the train split (BPE merged them from bytes), so "
            "ordinary text would encode as a control token; use tokens that mix letters and punctuation, like "
            "[EOS] or <|user|>"
        )
    for i, token in enumerate(specials):
        if tokenizer.token_to_id(token) != i:
            raise ForgeError(f"special token {token!r} got id {tokenizer.token_to_id(token)}, expected {i}")
    return tokenizer


# ----------------------------------------------------------------------------------------------------------------
# the transformers tokenizer directory


def chat_template(tcfg: TokenizerConfig) -> str:
    """The Jinja chat template: role token + content per turn, EOS after each assistant turn (see module doc)."""
    system, user, assistant = (f"'{t}'" for t in tcfg.chat_roles)
    eos = f"'{tcfg.special_tokens[3]}'"
    return (
        "{%- for message in messages -%}\n"
        "{%- if message['role'] == 'system' -%}\n"
        f"{{{{ {system} + message['content'] }}}}\n"
        "{%- elif message['role'] == 'user' -%}\n"
        f"{{{{ {user} + message['content'] }}}}\n"
        "{%- elif message['role'] == 'assistant' -%}\n"
        f"{{{{ {assistant} + message['content'] + {eos} }}}}\n"
        "{%- else -%}\n"
        "{{ raise_exception('unknown chat role ' + message['role'] + ': use system, user or assistant') }}\n"
        "{%- endif -%}\n"
        "{%- endfor -%}\n"
        "{%- if add_generation_prompt -%}\n"
        f"{{{{ {assistant} }}}}\n"
        "{%- endif -%}\n"
    )


def save_tokenizer(tokenizer: Tokenizer, tcfg: TokenizerConfig, out_dir: Path) -> None:
    """Write tokenizer.json, tokenizer_config.json and chat_template.jinja into `out_dir`, each atomically."""
    from transformers import PreTrainedTokenizerFast  # deferred: transformers is slow to import

    pad, unk, bos, eos, *extra = tcfg.special_tokens
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=pad,
        unk_token=unk,
        bos_token=bos,
        eos_token=eos,
        additional_special_tokens=[*extra, *tcfg.chat_roles],
        clean_up_tokenization_spaces=False,  # it would delete spaces before punctuation on decode
        add_bos_token=False,
        add_eos_token=False,
    )
    hf.chat_template = chat_template(tcfg)
    with tempfile.TemporaryDirectory(dir=out_dir.parent, prefix=".tokenizer-save-") as tmp:
        hf.save_pretrained(tmp)
        config_path = Path(tmp) / "tokenizer_config.json"
        config = json.loads(config_path.read_text(encoding="utf-8"))
        config.update(
            tokenizer_class="PreTrainedTokenizerFast",  # the class name transformers 4.x and 5.x both load
            add_bos_token=False,  # read by the GGUF export (tokenizer.ggml.add_bos_token)
            add_eos_token=False,
            clean_up_tokenization_spaces=False,
        )
        config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            atomic_write_bytes(out_dir / name, (Path(tmp) / name).read_bytes())


# ----------------------------------------------------------------------------------------------------------------
# the round trip check (the compression report: tokenizer_report.py)


def check_roundtrip(tokenizer: Tokenizer, shards: list[Path], shards_dir: Path, split: str) -> int:
    """Decode every document of a split back from its token shard; raise on the first that differs from its text."""
    tokens, offsets = load_split(shards_dir, split)
    doc = 0
    with progress(total=len(offsets) - 1, desc=f"tokenizer: round trip on {split}", unit="doc", logger=log) as bar:
        for texts in iter_text_batches(shards):
            ids = [tokens[offsets[doc + i] : offsets[doc + i + 1] - 1].tolist() for i in range(len(texts))]
            decoded = tokenizer.decode_batch(ids, skip_special_tokens=False)
            for i, (text, back) in enumerate(zip(texts, decoded, strict=True)):
                if text != back:
                    differ = (j for j, (a, b) in enumerate(zip(text, back, strict=False)) if a != b)
                    at = next(differ, min(len(text), len(back)))
                    raise ForgeError(
                        f"tokenizer round trip failed on {split} document {doc + i} at character {at}: "
                        f"{text[max(0, at - 20) : at + 20]!r} came back as {back[max(0, at - 20) : at + 20]!r}"
                    )
            doc += len(texts)
            bar.update(len(texts))
    return doc


# ----------------------------------------------------------------------------------------------------------------
# the stage


def run(cfg: ForgeConfig, force: bool = False) -> dict[str, Any]:
    """Train the tokenizer on train, save it with its chat template, report compression, write token shards.
    With model.init_from, the base model's own tokenizer instead (see `run_base`)."""
    if cfg.model.init_from is not None:
        return run_base(cfg, force)
    check_config(cfg.tokenizer)  # first: a config error is reported before missing inputs
    require_reads(cfg, "tokenizer", ["data"])
    shards = data_shards(cfg)
    check_corpus_capacity(shards["train"], cfg.tokenizer)  # cheap: stops once the bound covers the vocabulary
    stage = Stage(
        name="tokenizer",
        cfg=cfg,
        inputs={split: shard_listing(files) for split, files in shards.items()},
        artifact_exclude=("shards/*",),
    )
    return run_stage(stage, lambda s: _build(s, shards), force=force)


def run_base(cfg: ForgeConfig, force: bool = False) -> dict[str, Any]:
    """The base model's tokenizer (model.init_from): no new vocabulary. Its files are copied here with their
    sha256, its compression on val is reported as for a trained one, and the token shards are written with it."""
    from models.base import open_base

    base = open_base(cfg.model.init_from)
    require_reads(cfg, "tokenizer", ["data"])
    shards = data_shards(cfg)
    stage = Stage(
        name="tokenizer",
        cfg=cfg,  # the base's tokenizer is an input, by content
        inputs={**{split: shard_listing(files) for split, files in shards.items()}, "base": base.path},
        artifact_exclude=("shards/*",),
    )
    return run_stage(stage, lambda s: _build_base(s, shards, base), force=force)


def _build_base(stage: Stage, shards: dict[str, list[Path]], base: Any) -> dict[str, float]:
    tokenizer = base.tokenizer()
    with tempfile.TemporaryDirectory(dir=stage.dir.parent, prefix=".tokenizer-save-") as tmp:
        tokenizer.save_pretrained(tmp)
        spm = base.path / "tokenizer.model"
        if not base.is_gguf and spm.is_file() and not (Path(tmp) / spm.name).exists():
            # a fast tokenizer saves no SentencePiece model, and llama.cpp's converter reads a Gemma's, a Phi-3's or
            # a Mistral's vocabulary from it: the base's own file goes along
            (Path(tmp) / spm.name).write_bytes(spm.read_bytes())
        saved = sorted(p for p in Path(tmp).iterdir() if p.is_file())
        for path in saved:
            atomic_write_bytes(stage.dir / path.name, path.read_bytes())
    files = {p.name: sha256_file(stage.dir / p.name) for p in saved}
    identity = base.identity()
    log.info("tokenizer: using the base model's tokenizer (%s, %s tokens)", identity["path"], f"{len(tokenizer):,}")
    backend = tokenizer.backend_tokenizer
    ids = {name: getattr(tokenizer, f"{name}_token_id") for name in SPECIAL_NAMES}
    ids = {name: int(i) for name, i in ids.items() if i is not None}
    return _shards_and_report(stage, shards, backend, tokenizer.unk_token, 0.0,
                              {"base": identity, "tokenizer_files": files}, ids)  # fmt: skip


def _build(stage: Stage, shards: dict[str, list[Path]]) -> dict[str, float]:
    tcfg = stage.cfg.tokenizer
    log.info(
        "tokenizer: training a %d-token byte-level BPE on %d train shard(s)", tcfg.vocab_size, len(shards["train"])
    )
    start = time.time()
    tokenizer = train_tokenizer(shards["train"], tcfg)
    train_seconds = time.time() - start
    save_tokenizer(tokenizer, tcfg, stage.dir)

    ids = {name: i for i, name in enumerate(SPECIAL_NAMES)}  # ids 0-3: pad, unk, bos, eos
    ids |= {role: tokenizer.token_to_id(token) for role, token in zip(CHAT_ROLES, tcfg.chat_roles, strict=True)}
    return _shards_and_report(stage, shards, tokenizer, "", train_seconds, {}, ids)


def _shards_and_report(
    stage: Stage, shards: dict[str, list[Path]], tokenizer: Tokenizer, unk_token: str | None,
    train_seconds: float, extra: dict[str, Any], ids: dict[str, int],
) -> dict[str, float]:  # fmt: skip
    """Write the token shards with `tokenizer`, check the round trip on val, report compression."""
    tcfg, data = stage.cfg.tokenizer, stage.cfg.data
    start = time.time()  # wall time: the shards' own times add up the workers'
    stats = write_shards(tokenizer, shards, stage.dir / "shards", ids, workers=data.workers or None, data_cfg=data)
    encode_seconds = time.time() - start
    log.info("tokenizer: encoded %s in %.1fs", ", ".join(f"{k} {v.tokens:,}" for k, v in stats.items()), encode_seconds)
    checked = check_roundtrip(tokenizer, shards["val"], stage.dir / "shards", "val")

    report = compression_report(tokenizer, stats, tcfg, unk_token=unk_token, from_base="base" in extra)
    report["roundtrip_checked_documents"] = checked
    splits = {k: {"documents": v.documents, "doc_tokens": v.doc_tokens, "tokens": v.tokens} for k, v in stats.items()}
    atomic_write_json(stage.dir / "report.json", {**report, "splits": splits, **extra})
    markdown = report_markdown(report, splits)
    if "base" in extra:
        b = extra["base"]
        markdown = markdown.replace("\n\n", f"\n\nThe base model's tokenizer, not trained here: {b['path']} "
                                    f"({b['origin']}, sha256 {b['sha256'][:16]}...).\n\n", 1)  # fmt: skip
    atomic_write_text(stage.dir / "report.md", markdown)
    log.info("tokenizer report (%s):\n%s", stage.dir / "report.md", markdown)
    for warning in report["warnings"]:
        log.warning("tokenizer: %s", warning)

    metrics: dict[str, float] = {f"tokens_{k}": v.tokens for k, v in stats.items()}
    metrics |= {f"docs_{k}": v.documents for k, v in stats.items()}
    metrics |= {k: report[k] for k in ("tokens_per_word", "chars_per_token", "bytes_per_token", "vocab_used_fraction")}
    metrics |= {k: report[k] for k in ("vocab_used_fraction_train", "unknown_byte_rate", "unk_token_rate")}
    metrics |= {
        "vocab_size": tokenizer.get_vocab_size(),
        "compression_warning": int(bool(report["warnings"])),
        "train_seconds": round(train_seconds, 3),
        "encode_seconds": round(encode_seconds, 3),
        "roundtrip_failures": 0,  # check_roundtrip raises on the first failure
    }
    return metrics
