"""`forge tokenizer` on generated corpora: config errors before training, the saved transformers directory and its
chat template, exact round trips, token shards whose counts add up, and the compression warning."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from forge import ForgeError
from forge.config import load_config
from forge.paths import run_dir
from pretrain import tokenizer as stage
from pretrain.token_shards import load_split, read_meta, token_dtype

ENGLISH_WORDS = (
    "the of and to in is that it for was on are as with his they at be this from have or by one had not but what "
    "all were when we there can an your which their said if do will each about how up out them then she many some "
    "so these would other into has more her two like him see time could no make than first been its who now people "
    "my made over did down only way find use may water long little very after words called just where most know "
    "get through back much before go good new write our used me man too any day same right look think also around "
    "another came come work three word must because does part even place well such here take why help put different "
    "away again off went old number great tell men say small every found still between name should home big give air"
)
ENGLISH = ENGLISH_WORDS.split()

# Tabs, runs of spaces, leading/trailing whitespace, accents, CJK, emoji, CRLF and literal special-token text.
TRICKY = [
    "\tindented with a tab\tand  two  spaces,   three   spaces\n\n\n    four-space indent\n",
    "  leading spaces, trailing spaces   ",
    "café naïve façade Ünïcödé — “quotes” ‘single’ … 😀🚀 中文文本 日本語 한국어 Ελληνικά русский",
    "Windows line\r\nendings\r\n and a form feed\x0c and a NUL-free zero-width\u200bjoiner",
    "literal markers [EOS] and [BOS] and <|user|> and <|assistant|> inside a document",
    "def f(x):\n\treturn {'a': [1, 2, 3]}  # comment\n",
]

TWO_TURNS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is a list?"},
    {"role": "assistant", "content": "A mutable sequence."},
    {"role": "user", "content": "And a tuple?"},
    {"role": "assistant", "content": "An immutable one."},
]
RENDERED = (
    "<|system|>Be brief.<|user|>What is a list?<|assistant|>A mutable sequence.[EOS]"
    "<|user|>And a tuple?<|assistant|>An immutable one.[EOS]"
)


def english_docs(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        sentences = []
        for _ in range(rng.randint(3, 8)):
            words = rng.choices(ENGLISH, k=rng.randint(6, 14))
            sentences.append(" ".join(words).capitalize() + rng.choice([".", ".", ".", "?", "!"]))
        docs.append(" ".join(sentences))
    return docs


def foreign_docs(n: int, seed: int) -> list[str]:
    """An agglutinative made-up language: stems + suffixes with diacritics give thousands of distinct word forms."""
    rng = random.Random(seed)
    syllables = [c + v for c in "kltvsmnrpjhdgyöçş" for v in ("a", "e", "i", "ı", "o", "ö", "u", "ü", "ä", "ea")]
    stems = ["".join(rng.choices(syllables, k=rng.randint(2, 4))) for _ in range(1500)]
    suffixes = ["lar", "ler", "ında", "inde", "dan", "ten", "ımız", "iniz", "ları", "sına", "ğü", "yı", ""]
    docs = []
    for _ in range(n):
        words = [rng.choice(stems) + rng.choice(suffixes) + rng.choice(suffixes) for _ in range(rng.randint(40, 90))]
        docs.append(" ".join(words).capitalize() + ".")
    return docs


def write_data_stage(runs, run_name: str, splits: dict[str, list[str]], shard_docs: int = 150) -> None:
    """What the data stage leaves: runs/<run>/data/<split>-NNNNN.parquet and a complete manifest."""
    data = runs / run_name / "data"
    data.mkdir(parents=True)
    for split, texts in splits.items():
        for n, start in enumerate(range(0, max(len(texts), 1), shard_docs)):
            chunk = texts[start : start + shard_docs]
            columns = {
                "id": [f"{split}-{start + i}" for i in range(len(chunk))],
                "text": chunk,
                "source": ["generated"] * len(chunk),
                "meta": ["{}"] * len(chunk),
            }
            table = pa.table(columns, schema=pa.schema([(name, pa.string()) for name in columns]))
            pq.write_table(table, data / f"{split}-{n:05d}.parquet")
    (data / "manifest.json").write_text(json.dumps({"stage": "data", "status": "complete"}))


def config(run_name: str, *overrides: str):
    return load_config(None, [f"run_name={run_name}", "tokenizer.vocab_size=700", *overrides])


@pytest.fixture(scope="module")
def english_run(tmp_path_factory):
    """An English corpus (train in 3 shards) with the tricky documents in every split; the stage run once."""
    runs = tmp_path_factory.mktemp("english") / "runs"
    splits = {
        "train": english_docs(400, seed=1) + TRICKY,
        "val": english_docs(40, seed=2) + TRICKY,
        "test": english_docs(20, seed=3) + TRICKY[:2],
    }
    # A word only the test split contains, often enough that a BPE trained on it would learn it.
    splits["test"].append(" ".join(["zyqxwvj"] * 300))
    write_data_stage(runs, "en", splits)
    cfg = config("en")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FORGE_RUNS_DIR", str(runs))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        manifest = stage.run(cfg)
    return runs, splits, manifest, runs / "en" / "tokenizer"


# ----------------------------------------------------------------------------------------------------------------
# errors before training


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("tokenizer.chat_roles=['<|system|>', '<|user|>', '[EOS]']", "chat_roles[2]='[EOS]' collides with"),
        ("tokenizer.chat_roles=['<|user|>', '<|user|>', '<|assistant|>']", "chat_roles[1]='<|user|>' collides"),
        ("tokenizer.special_tokens=['[PAD]', '[UNK]', '[PAD]', '[EOS]']", "special_tokens[2]='[PAD]' collides"),
        ("tokenizer.chat_roles=['<|user|>', '<|assistant|>']", "needs exactly 3 tokens"),
        ("tokenizer.special_tokens=['[PAD]', '[UNK]', '[EOS]']", "needs at least 4 tokens"),
        ("tokenizer.chat_roles=['<|system|>', '<| user |>', '<|assistant|>']", "contain no whitespace"),
        ("tokenizer.chat_roles=['<|system|>', \"<|user's|>\", '<|assistant|>']", "quotes or backslashes"),
    ],
)
def test_bad_special_tokens_are_clear_errors_before_any_data_is_read(override, message):
    # no data stage exists: the config error must come first
    with pytest.raises(ForgeError) as err:
        stage.run(config("bad", override))
    assert message in str(err.value)


def test_missing_data_stage_asks_for_forge_data(isolated_runs):
    with pytest.raises(ForgeError, match="run `forge data`"):
        stage.run(config("nodata"))
    (isolated_runs / "half" / "data").mkdir(parents=True)
    (isolated_runs / "half" / "data" / "manifest.json").write_text('{"status": "running"}')
    with pytest.raises(ForgeError, match="is 'running'.*run `forge data`"):
        stage.run(config("half"))


def test_vocab_larger_than_the_corpus_supports_fails_before_training(isolated_runs, monkeypatch):
    write_data_stage(isolated_runs, "small", {"train": english_docs(5, 1), "val": ["a b"], "test": ["c d"]})
    trained = []
    monkeypatch.setattr(stage, "train_tokenizer", lambda *a: trained.append(a))
    with pytest.raises(ForgeError, match=r"vocab_size=20000 is larger than the train split can support.*at most"):
        stage.run(config("small", "tokenizer.vocab_size=20000"))
    assert trained == []
    assert not (isolated_runs / "small" / "tokenizer" / "tokenizer.json").exists()


def test_vocab_the_trainer_cannot_reach_names_the_size_it_reached(isolated_runs):
    # distinct words pass the capacity bound, but min_frequency=50 leaves the trainer few pairs to merge
    write_data_stage(isolated_runs, "rare", {"train": foreign_docs(30, 1), "val": ["a b"], "test": ["c d"]})
    with pytest.raises(ForgeError, match=r"stopped at \d+ tokens.*set tokenizer.vocab_size <= \d+"):
        stage.run(config("rare", "tokenizer.min_frequency=50"))


def test_a_special_token_that_is_also_a_corpus_word_is_an_error(isolated_runs):
    docs = [d + " (EOS) (EOS)" for d in english_docs(200, 1)]
    write_data_stage(isolated_runs, "word", {"train": docs, "val": ["a b"], "test": ["c d"]})
    with pytest.raises(ForgeError, match=r"\['EOS'\] are also frequent text of the train split"):
        stage.run(config("word", "tokenizer.special_tokens=['[PAD]', '[UNK]', '[BOS]', 'EOS']"))


def test_the_trainer_sees_a_hash_stable_sample_of_about_train_sample_bytes(tmp_path):
    docs = english_docs(400, 1)
    write_data_stage(tmp_path, "in-order", {"train": docs, "val": ["a"], "test": ["b"]})
    write_data_stage(tmp_path, "reversed", {"train": docs[::-1], "val": ["a"], "test": ["b"]})
    shards = {run: sorted((tmp_path / run / "data").glob("train-*.parquet")) for run in ("in-order", "reversed")}
    assert len(shards["in-order"]) > 1  # the sample spans shards
    whole = stage.text_bytes(shards["in-order"])
    quarter = whole // 4  # below the config's floor: the function samples any share
    sampled = {run: [t for batch in stage.train_texts(files, quarter) for t in batch] for run, files in shards.items()}
    assert sorted(sampled["in-order"]) == sorted(sampled["reversed"])  # the same documents, whatever their order
    assert 60 <= len(sampled["in-order"]) <= 140  # about a quarter of the 400 documents
    every = [t for batch in stage.train_texts(shards["in-order"], None) for t in batch]
    assert every == docs


def test_the_old_document_cap_is_refused_naming_its_replacement():
    with pytest.raises(ForgeError, match="tokenizer.max_train_docs.*replaced by tokenizer.train_sample_bytes"):
        load_config(None, ["tokenizer.max_train_docs=100"])


# ----------------------------------------------------------------------------------------------------------------
# the saved tokenizer


def test_saved_directory_loads_with_autotokenizer_and_renders_the_chat_template(english_run):
    from transformers import AutoTokenizer

    _, _, _, out = english_run
    assert {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"} <= {p.name for p in out.iterdir()}
    tok = AutoTokenizer.from_pretrained(out)
    assert len(tok) == 700
    assert (tok.pad_token, tok.unk_token, tok.bos_token, tok.eos_token) == ("[PAD]", "[UNK]", "[BOS]", "[EOS]")
    assert (tok.pad_token_id, tok.unk_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2, 3)
    assert tok.convert_tokens_to_ids(["<|system|>", "<|user|>", "<|assistant|>"]) == [4, 5, 6]

    assert tok.apply_chat_template(TWO_TURNS, tokenize=False) == RENDERED
    prompt = tok.apply_chat_template(TWO_TURNS[:4], tokenize=False, add_generation_prompt=True)
    assert prompt == RENDERED.removesuffix("An immutable one.[EOS]")
    ids = tok.apply_chat_template(TWO_TURNS, tokenize=True, return_dict=False)
    if isinstance(ids, dict):  # transformers versions differ on the default return type
        ids = ids["input_ids"]
    assert ids[0] == 4 and ids[-1] == 3  # starts with <|system|>, no BOS; ends with the EOS token
    assert ids.count(3) == 2 and ids.count(6) == 2  # one EOS per assistant turn
    with pytest.raises(Exception, match="unknown chat role tool"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)
    assert (out / "chat_template.jinja").read_text() == stage.chat_template(load_config(None).tokenizer)


def test_decode_encode_is_exact_for_every_val_document(english_run):
    from transformers import AutoTokenizer

    _, splits, _, out = english_run
    tok = AutoTokenizer.from_pretrained(out)
    for doc in splits["val"]:
        ids = tok.encode(doc)  # default arguments: no BOS/EOS may be added, no spaces cleaned up
        assert tok.decode(ids) == doc
        assert tok.decode(tok(doc, split_special_tokens=True)["input_ids"]) == doc
    assert tok.encode("[EOS]") == [3]  # a special token's text maps to its id when not split...
    assert 3 not in tok.encode("[EOS]", split_special_tokens=True)  # ...and to bytes when it is


def test_trained_on_train_only(english_run):
    from transformers import AutoTokenizer

    _, _, _, out = english_run
    tok = AutoTokenizer.from_pretrained(out)
    assert len(tok.tokenize(" zyqxwvj")) >= 3  # 300 occurrences in test, none in train: never merged
    assert len(tok.tokenize(" water")) == 1  # a train word is


# ----------------------------------------------------------------------------------------------------------------
# token shards and the report


def test_token_shards_hold_every_document_then_eos_and_counts_add_up(english_run):
    from transformers import AutoTokenizer

    runs, splits, manifest, out = english_run
    tok = AutoTokenizer.from_pretrained(out)
    meta = read_meta(out / "shards")
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == 700 and meta["eos_id"] == 3
    assert (meta["pad_id"], meta["system_id"], meta["user_id"], meta["assistant_id"]) == (0, 4, 5, 6)
    for split, docs in splits.items():
        per_doc = [tok(d, add_special_tokens=False, split_special_tokens=True)["input_ids"] for d in docs]
        tokens, offsets = load_split(out / "shards", split)
        assert tokens.dtype == np.uint16
        assert len(offsets) == len(docs) + 1 and offsets[0] == 0 and offsets[-1] == len(tokens)
        assert len(tokens) == sum(len(ids) for ids in per_doc) + len(docs)
        expected = np.array([t for ids in per_doc for t in [*ids, 3]], dtype=np.uint16)
        np.testing.assert_array_equal(tokens, expected)
        info = meta["splits"][split]
        assert (info["documents"], info["doc_tokens"], info["tokens"]) == (
            len(docs), sum(map(len, per_doc)), len(tokens)
        )  # fmt: skip
        assert manifest["metrics"][f"tokens_{split}"] == len(tokens)
        data = sorted((runs / "en" / "data").glob(f"{split}-*.parquet"))  # a token shard per data shard, in order
        assert [s["file"] for s in info["shards"]] == [f.name.replace(".parquet", ".bin") for f in data]
        assert [s["documents"] for s in info["shards"]] == [pq.ParquetFile(f).metadata.num_rows for f in data]
        assert sum(s["tokens"] for s in info["shards"]) == info["tokens"]
    # literal special-token text inside a document is plain text in the shards
    tokens, offsets = load_split(out / "shards", "val")
    i = splits["val"].index(TRICKY[4])
    assert tokens[offsets[i] : offsets[i + 1] - 1].min() >= 7


def test_report_and_manifest_metrics_on_english(english_run, monkeypatch):
    runs, splits, manifest, out = english_run
    metrics = manifest["metrics"]
    report = json.loads((out / "report.json").read_text())
    assert manifest["status"] == "complete"
    assert metrics["compression_warning"] == 0 and report["warnings"] == []
    assert 1.0 <= metrics["tokens_per_word"] <= 1.4
    words = sum(len(d.split()) for d in splits["val"])
    assert metrics["tokens_per_word"] == pytest.approx(report["doc_tokens"] / words, abs=1e-4)
    assert metrics["chars_per_token"] == pytest.approx(sum(map(len, splits["val"])) / report["doc_tokens"], abs=1e-4)
    assert 0 < metrics["vocab_used_fraction"] <= metrics["vocab_used_fraction_train"] <= 1
    assert metrics["unk_token_rate"] == 0 and metrics["roundtrip_failures"] == 0
    assert report["roundtrip_checked_documents"] == len(splits["val"])
    # the tricky val docs share their bytes with the tricky train docs: nothing unknown
    assert metrics["unknown_byte_rate"] == 0
    assert report["top_tokens"][0]["count"] >= report["top_tokens"][-1]["count"] > 0
    markdown = (out / "report.md").read_text()
    print(markdown)  # shown with pytest -s
    assert "tokens per word" in markdown and "WARNING" not in markdown
    assert "training_budget" not in report, "tokens per parameter are the pretrain stage's: they depend on the model"
    monkeypatch.setenv("FORGE_RUNS_DIR", str(runs))
    from forge import tracking

    client = tracking.client_for(config("en"))
    logged = client.get_run(manifest["mlflow_run_id"])
    assert logged.data.metrics["tokens_per_word"] == pytest.approx(metrics["tokens_per_word"])
    assert {"report.md", "report.json", "chat_template.jinja"} <= {
        a.path for a in client.list_artifacts(logged.info.run_id)
    }
    # unchanged inputs and config: skipped
    again = stage.run(config("en"))
    assert again["started_at"] == manifest["started_at"]


def test_compression_warning_fires_on_a_non_english_corpus_and_unknown_bytes_are_counted(isolated_runs):
    foreign = foreign_docs(300, seed=4)
    val = foreign_docs(30, seed=5) + ["ﬁ∮ ⌘ tamam sade"]
    write_data_stage(isolated_runs, "xx", {"train": foreign, "val": val, "test": foreign_docs(10, seed=6)})
    manifest = stage.run(config("xx"))
    metrics = manifest["metrics"]
    report = json.loads((isolated_runs / "xx" / "tokenizer" / "report.json").read_text())
    assert metrics["tokens_per_word"] > 1.4 and metrics["compression_warning"] == 1
    assert "larger vocabulary" in report["warnings"][0] and "more representative" in report["warnings"][0]
    markdown = (isolated_runs / "xx" / "tokenizer" / "report.md").read_text()
    print(markdown)  # the acceptance asks for the report to be shown: pytest -s
    assert "WARNING" in markdown
    unseen = sum(len(c.encode()) for c in "ﬁ∮⌘")  # the only val bytes absent from train
    assert metrics["unknown_byte_rate"] == pytest.approx(unseen / sum(len(d.encode()) for d in val))


def test_an_empty_val_split_is_reported_not_fatal(isolated_runs):
    write_data_stage(isolated_runs, "noval", {"train": english_docs(200, 1), "val": [], "test": ["a b"]})
    manifest = stage.run(config("noval"))
    assert manifest["metrics"]["tokens_val"] == 0 and manifest["metrics"]["compression_warning"] == 1
    tokens, offsets = load_split(isolated_runs / "noval" / "tokenizer" / "shards", "val")
    assert len(tokens) == 0 and offsets.tolist() == [0]
    report = json.loads((isolated_runs / "noval" / "tokenizer" / "report.json").read_text())
    assert "no words" in report["warnings"][0]


@pytest.mark.integration
def test_cli_without_the_data_stage_is_one_line_asking_for_forge_data(isolated_runs):
    forge = Path(sys.executable).with_name("forge")
    out = subprocess.run(
        [str(forge), "tokenizer", "--set", "run_name=cli"], capture_output=True, text=True, env=os.environ, timeout=120
    )
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().startswith("error: forge tokenizer reads what earlier stages of run 'cli' write: data")
    assert "data has not run" in out.stderr
    assert "run `forge data`" in out.stderr and "Traceback" not in out.stderr


def test_token_dtype_widens_past_65536():
    assert token_dtype(65536) == np.uint16 and token_dtype(65537) == np.uint32


# ----------------------------------------------------------------------------------------------------------------
# shards encoded in parallel, read as one array


def test_a_split_in_several_shards_gives_the_windows_of_one_concatenated_array(english_run, tmp_path):
    from pretrain.loader import WindowLoader, eval_windows, iter_eval_batches

    shards = read_meta(english_run[3] / "shards")["splits"]["train"]["shards"]
    bins = [np.fromfile(english_run[3] / "shards" / s["file"], dtype="<u2") for s in shards]
    flat = np.concatenate(bins)  # the single-file layout's array
    idx = [np.load(english_run[3] / "shards" / s["index"]) for s in shards]
    starts = np.cumsum([0, *map(len, bins)])
    tokens, offsets = load_split(english_run[3] / "shards", "train")
    assert len(bins) == 3 and len(tokens) == len(flat) and all(isinstance(p, np.memmap) for p in tokens.parts)
    np.testing.assert_array_equal(
        offsets, np.concatenate([[0], *(i[1:] + s for i, s in zip(idx, starts, strict=False))])
    )

    window = 64
    loaders = WindowLoader(tokens, window - 1, seed=3), WindowLoader(flat, window - 1, seed=3)
    every = loaders[0].starts(0, 2 * loaders[0].windows_per_epoch)  # two epochs: two phases
    crossing = [s for border in starts[1:-1] for s in range(border - window + 1, border)]  # every border window
    assert any(s < b < s + window for s in every for b in starts[1:-1]), "no loader window crosses a shard border"
    for chosen in (every, np.array(crossing)):
        for i in range(0, len(chosen), 16):
            for got, want in zip(*(loader.batch(chosen[i : i + 16]) for loader in loaders), strict=True):
                assert torch_equal(got, want)
    val_starts = eval_windows(tokens, window - 1, 40)
    for got, want in zip(*(iter_eval_batches(t, val_starts, window - 1, 8) for t in (tokens, flat)), strict=True):
        assert torch_equal(got[0], want[0]) and torch_equal(got[1], want[1])
    for key in (0, -1, starts[1], starts[1] - 1, slice(None, None, 7), slice(-5, None), slice(10, 3)):
        np.testing.assert_array_equal(tokens[key], flat[key])
    np.testing.assert_array_equal(tokens[np.array([starts[2], 5, -2])], flat[np.array([starts[2], 5, -2])])
    np.testing.assert_array_equal(np.asarray(tokens, dtype=np.int64), flat.astype(np.int64))

    # the one-file layout (format 1) still reads, as one shard; an unknown format asks for a re-run
    old = tmp_path / "old"
    old.mkdir()
    flat.tofile(old / "train.bin")
    np.save(old / "train.npy", offsets)
    splits = {"train": {"file": "train.bin", "index": "train.npy", "tokens": len(flat)}}
    (old / "meta.json").write_text(json.dumps({"format": "forge-token-shards/1", "dtype": "uint16", "splits": splits}))
    single, single_offsets = load_split(old, "train")
    assert (
        len(single.parts) == 1
        and single[starts[1] - 3 : starts[1] + 3].tolist() == flat[starts[1] - 3 : starts[1] + 3].tolist()
    )
    np.testing.assert_array_equal(single_offsets, offsets)
    (old / "meta.json").write_text(json.dumps({"format": "forge-token-shards/9", "dtype": "uint16", "splits": splits}))
    with pytest.raises(ForgeError, match="re-run forge tokenizer --force"):
        load_split(old, "train")


def torch_equal(a, b) -> bool:
    return a.shape == b.shape and bool((a == b).all())


@pytest.mark.integration  # a pool of two spawned processes
def test_one_worker_and_a_pool_of_two_write_the_same_shards_byte_for_byte(english_run, tmp_path):
    from tokenizers import Tokenizer

    from pretrain.token_shards import write_shards

    runs, _, _, out = english_run
    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    shards = {split: sorted((runs / "en" / "data").glob(f"{split}-*.parquet")) for split in ("train", "val", "test")}
    ids = {"pad": 0, "unk": 1, "bos": 2, "eos": 3, "system": 4, "user": 5, "assistant": 6}
    stats = {w: write_shards(tokenizer, shards, tmp_path / f"w{w}", ids, workers=w) for w in (1, 2)}
    files = {w: {p.name: p.read_bytes() for p in (tmp_path / f"w{w}").iterdir()} for w in (1, 2)}
    assert files[1] == files[2] and len(files[1]) == 2 * 5 + 1  # 5 data shards: .bin + .idx each, and meta.json
    assert files[1] == {p.name: p.read_bytes() for p in (out / "shards").iterdir()}  # and what the stage wrote
    for split, one in stats[1].items():
        two = stats[2][split]
        assert (one.documents, one.doc_tokens, one.chars, one.bytes, one.words) == (
            two.documents, two.doc_tokens, two.chars, two.bytes, two.words)  # fmt: skip
        np.testing.assert_array_equal(one.token_counts, two.token_counts)
        np.testing.assert_array_equal(one.byte_counts, two.byte_counts)
        assert one.documents == read_meta(out / "shards")["splits"][split]["documents"] > 0


def test_the_pool_starts_only_where_it_pays_off(monkeypatch):
    from pretrain.token_shards import POOL_MIN_BYTES, ShardJob, pool_size

    monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0, 1, 2, 3}, raising=False)
    jobs = lambda *sizes: [ShardJob("train", i, Path(f"{i}.parquet"), Path("."), s) for i, s in enumerate(sizes)]  # noqa: E731
    big = POOL_MIN_BYTES
    assert pool_size(jobs(big, big, big, big, big), None) == 4  # enough balanced work: one process per core
    assert pool_size(jobs(big, big), None) == 2  # no more processes than shards
    assert pool_size(jobs(1000, 1000, 1000), None) == 1  # too little text to repay the start
    assert (
        pool_size(jobs(4 * big, big // 10, big // 10), None) == 1
    )  # one shard is the work: the thread pool spreads it
    assert pool_size(jobs(1000, 1000, 1000), 2) == 2 and pool_size(jobs(1000), 8) == 1  # data.workers, capped


# ----------------------------------------------------------------------------------------------------------------
# acceptance on the embedded default corpus


@pytest.mark.slow
def test_default_corpus_round_trips_and_shard_counts_add_up():
    from transformers import AutoTokenizer

    from pretrain.data import stage as data_stage

    cfg = load_config(Path(__file__).resolve().parent.parent / "configs" / "tiny-cpu.yaml")
    data_stage.run(cfg)
    manifest = stage.run(cfg)
    out = run_dir(cfg) / "tokenizer"
    tok = AutoTokenizer.from_pretrained(out)
    meta = read_meta(out / "shards")
    for split, files in stage.data_shards(cfg).items():
        docs = [t for f in files for t in pq.read_table(f).column("text").to_pylist()]
        assert docs, split
        ids = tok(docs, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        if split == "val":
            assert [tok.decode(tok.encode(d)) for d in docs] == docs
            assert tok.batch_decode(ids) == docs
        assert (
            meta["splits"][split]["tokens"] == sum(map(len, ids)) + len(docs) == manifest["metrics"][f"tokens_{split}"]
        )
    metrics = manifest["metrics"]
    assert metrics["encode_seconds"] < 60
    assert metrics["compression_warning"] == int(metrics["tokens_per_word"] > cfg.tokenizer.max_tokens_per_word)
    assert metrics["unk_token_rate"] == 0
