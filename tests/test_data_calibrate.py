"""Each calibration decision of the default cleaning (the docs profile) pinned on small synthetic documents, the
calibration report of pretrain/data/calibrate.py, and the token-sized splits of pretrain/data/splits.py."""

from __future__ import annotations

import numpy as np
import pytest

from forge.config import DataConfig
from pretrain.data import calibrate, filters, passes, splits

# A C API reference entry as HTML extraction renders it: a synopsis and an example in code fences, a flag list, a
# table of options, a few paragraphs of prose. Web-crawl rules misfire on it; it is what a manual is made of.
REFERENCE = "\n".join(
    [
        "sqlite3_open",
        "Opening A New Database Connection",
        "```",
        "int sqlite3_open(",
        "  const char *filename,   /* Database filename (UTF-8) */",
        "  sqlite3 **ppDb          /* OUT: SQLite db handle */",
        ");",
        "int sqlite3_open_v2(",
        "  const char *filename,   /* Database filename (UTF-8) */",
        "  sqlite3 **ppDb,         /* OUT: SQLite db handle */",
        "  int flags,              /* Flags */",
        "  const char *zVfs        /* Name of VFS module to use */",
        ");",
        "```",
        (
            "These routines open an SQLite database file as specified by the filename argument. The filename "
            "argument is interpreted as UTF-8 for sqlite3_open() and sqlite3_open_v2()."
        ),
        (
            "A database connection handle is usually returned in *ppDb, even if an error occurs. The only "
            "exception is that if SQLite is unable to allocate memory to hold the sqlite3 object, a NULL "
            "will be written into *ppDb instead of a pointer to the sqlite3 object."
        ),
        (
            "The flags parameter to sqlite3_open_v2() must include, at a minimum, one of the following three "
            "flag combinations:"
        ),
        "- SQLITE_OPEN_READONLY",
        "- SQLITE_OPEN_READWRITE",
        "- SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE",
        "flag | meaning",
        "SQLITE_OPEN_URI | The filename can be interpreted as a URI if this flag is set.",
        "SQLITE_OPEN_MEMORY | The database will be opened as an in-memory database.",
        "SQLITE_OPEN_NOMUTEX | The new database connection will use the multi-thread threading mode.",
        "```",
        "sqlite3 *db;",
        'int rc = sqlite3_open("test.db", &db);',
        "if( rc ){",
        '  fprintf(stderr, "Can\'t open database: %s\\n", sqlite3_errmsg(db));',
        "  sqlite3_close(db);",
        "  return(1);",
        "}",
        'rc = sqlite3_exec(db, "CREATE TABLE t(x)", 0, 0, 0);',
        'rc = sqlite3_exec(db, "INSERT INTO t VALUES(1)", 0, 0, 0);',
        'rc = sqlite3_exec(db, "INSERT INTO t VALUES(2)", 0, 0, 0);',
        "sqlite3_close(db);",
        "```",
        "See also: sqlite3_close(), sqlite3_errmsg()",
    ]
)
NAVIGATION = "\n".join(
    ["Home", "Download", "License", "Documentation", "- About", "- News", "- Support", "- Forum", "Search", "Site map",
     "Contact us", "Privacy | Terms", "Copyright 2024 Example Project"]
)  # fmt: skip
SPAM = "\n".join(
    ["Buy cheap replica watches online, best price and free shipping, click here now!"] * 8
    + ["Best replica watches online, order today and save big with our amazing deals!"] * 6
)
STUFFED = "cheap watches online " * 30 + "best cheap watches online for you and the family with free shipping today."
FRENCH = (
    "La directive Listen indique au serveur les adresses IP et les ports sur lesquels il doit se mettre à "
    "l'écoute. Par défaut, le serveur répond aux requêtes sur toutes les interfaces réseau.\n"
    "```\nListen 192.0.2.1:80\nListen [2001:db8::a00:20ff:fea7:ccea]:80\n```\n"
    "Si vous indiquez seulement un numéro de port, le serveur se met à l'écoute sur ce port pour toutes les "
    "interfaces. Il est possible de spécifier plusieurs directives Listen pour écouter sur plusieurs ports."
)


def clean(text: str, doc_id: str = "doc", **settings) -> dict:
    """clean_record of one train document under the defaults (plus `settings`): what the stage decides."""
    record = {"id": doc_id, "text": text, "split": "train", "meta": {}, "removed": {}}
    return passes.clean_record(record, DataConfig(**settings), None, 5)


def test_a_code_heavy_reference_page_is_kept():
    kept = clean(REFERENCE)
    assert "drop" not in kept, kept.get("reason")
    # the language is judged on the prose lines only: the whole text (code and flags included) scores below the
    # 0.65 that FineWeb keeps, the prose well above it
    lang, whole = filters.ranked_languages(REFERENCE)[0]
    assert lang == "en" and whole < 0.65
    assert kept["meta"]["lang"] == "en" and kept["meta"]["lang_score"] > 0.85 and kept["meta"]["prose_words"] == 84
    # the same page under the web profile (the rules as published, on the whole text): the repeated code lines fail
    web = clean(REFERENCE, profile="web")
    assert (web["drop"], web["rule"]) == ("fineweb", "fineweb_max_dup_line_chars_ratio")


def test_a_navigation_page_is_dropped():
    dropped = clean(NAVIGATION)
    assert (dropped["drop"], dropped["rule"], dropped["value"]) == ("gopher_quality", "min_words", 0.0)
    assert dropped["reason"] == "min_words: 0 < 20"
    assert dropped["meta"]["lang"] == "und"  # too little prose to judge: the language rule does not decide


@pytest.mark.parametrize(("text", "rule"), [(SPAM, "max_duplicate_lines_ratio"),
                                            (STUFFED, "max_top_ngram_chars_ratio[2]")])  # fmt: skip
def test_a_spam_page_is_dropped(text, rule):
    dropped = clean(text)
    assert (dropped["drop"], dropped["rule"]) == ("gopher_repetition", rule)


def test_a_page_in_another_language_follows_data_languages():
    dropped = clean(FRENCH)
    assert (dropped["drop"], dropped["rule"]) == ("language", "fr")
    assert "drop" not in clean(FRENCH, languages=["fr"])
    assert "drop" not in clean(FRENCH, languages=["en", "fr"])


# ----------------------------------------------------------------------------------------------------------------
# the calibration report


def calibration_of(texts: dict[str, str], **settings) -> dict:
    cfg = DataConfig(**settings)
    cal = calibrate.Calibration(cfg, expected_train_docs=len(texts))
    for doc_id, text in texts.items():
        cal.add(passes.clean_record({"id": doc_id, "text": text, "split": "train", "meta": {}, "removed": {}},
                                      cfg, None, 5))  # fmt: skip
    cal.add({"id": "v", "text": NAVIGATION, "split": "val", "metrics": {}})  # only train documents are measured
    return cal.summary()


def rule(summary: dict, name: str) -> dict:
    return next(r for r in summary["rules"] if r["rule"] == name)


def prose(i: int) -> str:
    return REFERENCE.replace("sqlite3_open", f"sqlite3_open{i}").replace("SQLite", f"SQLite {i}")


def test_a_rule_that_drops_more_than_a_tenth_is_flagged_with_examples_and_the_setting():
    texts = {f"ref{i}": prose(i) for i in range(16)}
    texts |= {"nav-short": NAVIGATION, "nav-long": NAVIGATION + "\nMore links\nEven more links", "nav3": "Home\nUp",
              "nav4": "Index"}  # fmt: skip
    summary = calibration_of(texts)
    assert summary["train_docs"] == summary["train_docs_measured"] == 20
    words = rule(summary, "min_words")
    assert (words["failing"], words["failing_pct"], words["dropped"], words["flagged"]) == (4, 20.0, 4, True)
    assert [e["id"] for e in words["examples"]] == ["nav-long", "nav-short", "nav3", "nav4"]  # largest first
    assert words["examples"][0] == {"id": "nav-long", "chars": len(texts["nav-long"]), "value": 0.0,
                                    "dropped_by": "min_words"}  # fmt: skip
    assert words["setting"] == "data.quality.min_words" and words["threshold"] == 20
    assert words["suggestion"] == 0 and words["set"] == "--set data.quality.min_words=0"
    assert summary["flagged"] == [r["rule"] for r in summary["rules"] if r["failing"] > 2]
    # one page in twenty (5%) fails: reported, not flagged
    one = calibration_of({**{f"ref{i}": prose(i) for i in range(19)}, "nav": NAVIGATION})
    assert rule(one, "min_words")["failing"] == 1 and not rule(one, "min_words")["flagged"]
    assert "min_words" not in one["flagged"]


def test_a_flagged_language_rule_names_the_languages_it_found():
    texts = {f"ref{i}": prose(i) for i in range(8)} | {
        f"fr{i}": FRENCH.replace("Listen", f"Listen{i}") for i in range(3)
    }
    lang = rule(calibration_of(texts), "min_language_score")
    assert lang["flagged"] and lang["failing"] == 3 and lang["languages_failing"] == {"fr": 3}
    assert lang["set"].startswith("--set 'data.languages=[en, fr]'")


def test_suggestions_round_towards_keeping_and_name_the_whole_ngram_table():
    check = calibrate.Check("x", "gopher_repetition", "m", "max", "data.quality.max_dup_ngram_chars_ratio[5]", 0.3)
    values = np.linspace(0.0, 0.4567, 101)
    assert calibrate.suggestion(check, values, 0.1) == 0.42  # the 90th percentile (0.411) rounded up
    line = calibrate.setting_line(check, 0.42, DataConfig())
    assert (
        line == "--set 'data.quality.max_dup_ngram_chars_ratio={5: 0.42, 6: 0.28, 7: 0.26, 8: 0.24, 9: 0.22, 10: 0.2}'"
    )
    low = calibrate.Check("y", "fineweb", "m", "min", "data.quality.fineweb_min_punct_lines_ratio", 0.12)
    assert calibrate.suggestion(low, np.linspace(0.0567, 1.0, 101), 0.1) == 0.15  # the 10th percentile, rounded down


# ----------------------------------------------------------------------------------------------------------------
# splits sized for evaluation


def plan(n: int, tokens: int, **settings) -> tuple[np.ndarray, np.ndarray, splits.SplitPlan]:
    units = np.array([splits.hash_unit(f"doc-{i}") for i in range(n)])
    sizes = np.full(n, tokens)
    return units, sizes, splits.plan_split(units, sizes, DataConfig(**settings))


def test_val_and_test_grow_to_the_token_minimum():
    units, sizes, p = plan(1000, 500, min_eval_tokens=30_000)  # 500k tokens: 1% would be ~5k
    want = 30_000 * splits.EVAL_HEADROOM
    for split in ("val", "test"):
        assert want <= p.assigned_tokens[split] <= want + 500  # one document past the target
    assert sum(p.ratios.values()) == pytest.approx(1.0) and not p.notes
    # documents only move out of train: whatever 98:1:1 held out stays held out
    before = [splits.split_at(u, DataConfig().split) for u in units]
    after = [splits.split_at(u, p.ratios) for u in units]
    assert all(a != "train" for b, a in zip(before, after, strict=True) if b != "train")
    assert {s: sum(sizes[i] for i, a in enumerate(after) if a == s) for s in splits.SPLITS} == p.assigned_tokens
    # the plan is a function of the documents, not of their order
    order = np.random.default_rng(0).permutation(len(units))
    assert splits.plan_split(units[order], sizes[order], DataConfig(min_eval_tokens=30_000)).ratios == p.ratios


def test_a_large_corpus_keeps_its_ratios_exactly():
    _, _, p = plan(20_000, 500)  # 10M tokens: 1% is 100k, above the minimum
    assert p.ratios == DataConfig().split and not p.notes
    _, _, p = plan(1000, 500, min_eval_tokens=0)
    assert p.ratios == DataConfig().split


def test_a_corpus_too_small_for_the_minimum_says_so():
    _, _, p = plan(50, 100)  # 5,000 tokens in all
    assert p.assigned_tokens["val"] <= 1250 and p.assigned_tokens["test"] <= 1250  # max_eval_fraction=0.25 each
    assert p.assigned_tokens["val"] > 0 and p.assigned_tokens["test"] > 0
    assert len(p.notes) == 2 and "the corpus holds only ~5,000 estimated tokens" in p.notes[0]
    assert "data.min_eval_tokens=20,000" in p.notes[0] and "data.max_eval_fraction=0.25" in p.notes[0]
