"""`forge data` end to end on a dirty corpus built on the fly (no fixtures on disk), and through the CLI.

English prose comes from the running Python's `pydoc_data.topics` (real sentences, different in every document);
everything else (foreign languages, boilerplate HTML, gibberish, bad files) is written here.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import zstandard

from forge.config import DataConfig, ForgeConfig
from forge.lineage import Stage
from pretrain.data import ingest, stage
from pretrain.data.dedup import jaccard, shingles
from pretrain.data.splits import split_of

# ----------------------------------------------------------------------------------------------------------------
# the dirty corpus

SPLIT = {"train": 0.98, "val": 0.01, "test": 0.01}
# The hash split alone (no token minimum for val and test, which would grow them on a corpus this small), so a test
# can name a file whose id lands in the split it wants.
HASH_SPLIT = {"split": SPLIT, "min_eval_tokens": 0}


def english_sentences() -> list[str]:
    from pydoc_data.topics import topics

    out, seen = [], set()
    for key in sorted(topics):
        for sentence in re.split(r"(?<=\.)\s+", " ".join(topics[key].split())):
            if 8 <= len(sentence.split()) <= 30 and re.fullmatch(r"[A-Za-z ,]+\.", sentence) and sentence not in seen:
                seen.add(sentence)
                out.append(sentence)
    return out


def english_docs(n: int, per_doc: int = 8) -> list[str]:
    """n documents of `per_doc` distinct sentences, two sentences per line."""
    sentences = english_sentences()
    assert len(sentences) >= n * per_doc, "pydoc topics too small for this many documents"
    docs = []
    for i in range(n):
        chunk = sentences[i * per_doc : (i + 1) * per_doc]
        docs.append("\n".join(" ".join(chunk[j : j + 2]) for j in range(0, per_doc, 2)))
    return docs


def name_in(split: str, stem: str, suffix: str, root_name: str) -> str:
    """A file name whose document id lands in `split` (ids are '<root dir>/<file>')."""
    for i in range(100_000):
        name = f"{stem}{i}{suffix}"
        if split_of(f"{root_name}/{name}", SPLIT) == split:
            return name
    raise AssertionError("no name found")


def edit_words(text: str, edits: int) -> str:
    """Replace `edits` evenly spaced words with a fixed other word (a controlled near-duplicate)."""
    words = text.split(" ")
    step = len(words) // (edits + 1)
    for k in range(1, edits + 1):
        words[k * step] = "zebra"
    return " ".join(words)


DUTCH = (
    "Het weer in Nederland is vaak wisselvallig, met veel regen en wind. In de zomer kan het warm zijn, maar de "
    "winters zijn meestal zacht en nat. Veel mensen fietsen elke dag naar hun werk, ook als het regent. De "
    "steden zijn oud en hebben smalle straten met grachten. Op zaterdag gaan families vaak naar de markt om "
    "verse groenten, kaas en brood te kopen. Kinderen spelen buiten in het park totdat het donker wordt."
)
POLISH = (
    "Polska jest krajem w Europie Środkowej, który ma bogatą historię i kulturę. Stolicą kraju jest Warszawa, "
    "duże miasto nad Wisłą. Wiele osób spędza wakacje nad morzem albo w górach, gdzie można chodzić po szlakach. "
    "Tradycyjne jedzenie to pierogi, bigos i żurek, które są popularne w całym kraju. Zimą często pada śnieg, a "
    "dzieci lubią jeździć na sankach. W niedzielę rodziny spotykają się na wspólnym obiedzie."
)
SPANISH = (
    "España es un país con una historia larga y una cultura muy variada. En verano muchas personas viajan a la "
    "costa para disfrutar del sol y del mar. La comida española es famosa en todo el mundo, sobre todo la "
    "paella y las tapas. Las ciudades tienen plazas grandes donde la gente se reúne por la tarde. Los niños "
    "juegan en la calle hasta muy tarde durante las vacaciones. Los domingos las familias comen juntas."
)
GIBBERISH = "asdf jkl; qwer asdf zxcv qwerty uiop hjkl asdfgh jkl; zxcvbn qwer asdf asdf " * 6
KEYBOARD_MASH = "xkqz vbnm plok wert yuio zzxq jjkl pqow ieur tyal skdj fhgz mnbv lkjh gfds poiu " * 5
TOO_SHORT = "The cat sat on the mat today."
FOOTER = "Copyright Example Corp, subscribe to our newsletter for weekly updates on everything"


def html_page(body_text: str) -> str:
    paragraphs = "".join(f"<p>{line}</p>" for line in body_text.split("\n"))
    nav = "".join(f"<li><a href='/{w}'>{w.title()} section link</a></li>" for w in ("home", "news", "sports", "about"))
    return f"""<!DOCTYPE html><html><head><title>Assignment statements explained</title></head><body>
<div id="cookie-banner" class="cookie-consent">This site uses cookies to improve your experience. Accept all cookies
or manage cookie preferences in the cookie settings.</div>
<header><nav class="menu"><ul>{nav}</ul></nav></header>
<div class="breadcrumbs"><a href="/">Home</a> &gt; <a href="/docs">Docs</a> &gt; Article</div>
<main><article><h1>Assignment statements explained</h1>{paragraphs}</article></main>
<aside class="sidebar"><h3>Popular posts</h3><ul><li><a href="/p1">Ten tricks for faster loops you never knew</a></li>
<li><a href="/p2">Why generators beat lists for huge data sets</a></li></ul></aside>
<div class="share">Share on Facebook Share on Twitter Share on LinkedIn</div>
<section class="comments"><h3>42 comments</h3><div class="comment">Great article, thanks a lot!</div></section>
<footer><p>Terms of use | Privacy policy | Contact us | All rights reserved 2024 Example Corp</p></footer>
</body></html>"""


def build_dirty_corpus(root: Path) -> dict[str, object]:
    """Write the corpus under root/ (root.name is the id prefix); return what each case should become."""
    root.mkdir(parents=True, exist_ok=True)
    rn = root.name
    docs = english_docs(30)
    expect: dict[str, object] = {"kept": [], "dropped": {}}
    kept, dropped = expect["kept"], expect["dropped"]

    def put(name: str, text: str | bytes) -> str:
        path = root / name
        path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
        return f"{rn}/{name}"

    # 0-14: clean English, kept (0-5 carry a recurring footer line that boilerplate removal must strip)
    for i in range(15):
        text = docs[i] + (f"\n{FOOTER}" if i < 6 else "")
        kept.append(put(name_in("train", f"en{i:02d}_", ".txt", rn), text))
    expect["footer_docs"] = list(kept[:6])
    # exact duplicate (case and whitespace changes) and a near duplicate (2 words replaced), both in train; they
    # sort after the originals, and the first in input order is the one kept
    dropped[put(name_in("train", "zz_dup_exact", ".txt", rn), "  " + docs[1].lower().replace(" ", "  ") + "\n")] = (
        "exact_dedup"
    )
    near = edit_words(docs[2], edits=2)
    expect["near_pair"] = (docs[2], near)
    dropped[put(name_in("train", "zz_dup_near", ".md", rn), near)] = "near_dedup"
    # a train document that repeats another's paragraph: the paragraph goes (paragraph dedup), the document stays;
    # it sorts before the duplicates above, whose removal must not depend on it
    expect["para_id"] = put(name_in("train", "para", ".txt", rn), f"{docs[3]}\n\n{docs[28]}\n\n{docs[29]}")
    kept.append(expect["para_id"])
    expect["para_cut"], expect["para_kept"] = docs[3], docs[28]
    # a val document and its near-duplicate in train: the train copy goes (decontamination)
    val_id = put(name_in("val", "heldout", ".txt", rn), docs[20])
    kept.append(val_id)
    expect["val_id"] = val_id
    dropped[put(name_in("train", "leak", ".txt", rn), edit_words(docs[20], edits=1))] = "decontamination"
    # foreign languages
    for lang, text in (("nl", DUTCH), ("pl", POLISH), ("es", SPANISH)):
        dropped[put(name_in("train", f"lang_{lang}", ".txt", rn), text)] = "language"
    # boilerplate-heavy HTML: the article is kept, the chrome is not
    expect["html_id"] = put(name_in("train", "page", ".html", rn), html_page(docs[25]))
    kept.append(expect["html_id"])
    expect["html_body"] = docs[25]
    # gibberish, keyboard mash, too short
    dropped[put(name_in("train", "gibberish", ".txt", rn), GIBBERISH)] = "language"
    dropped[put(name_in("train", "mash", ".txt", rn), KEYBOARD_MASH)] = "language"
    dropped[put(name_in("train", "short", ".txt", rn), TOO_SHORT)] = "gopher_quality"
    # unreadable inputs
    dropped[put("binary.txt", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) * 4)] = "unreadable"
    dropped[put("latin1.txt", "Caf\xe9 cr\xe8me br\xfbl\xe9e, a French dessert.".encode("latin-1"))] = "unreadable"
    dropped[put("empty.md", "  \n\n ")] = "unreadable"
    dropped[put("denied.txt", docs[26])] = "unreadable"  # the test makes reading it raise PermissionError
    # JSONL: a good record with metadata, a broken line, a record without the text field, one 50 MB line
    lines = [
        json.dumps({"text": docs[27], "date": "1925-03-01", "url": "https://example.org/a"}),
        "{not json",
        json.dumps({"body": "no text field here"}),
        json.dumps({"text": "x" * (50 << 20)}),
    ]
    jsonl = name_in("train", "records", ".jsonl", rn)
    put(jsonl, "\n".join(lines) + "\n")
    kept.append(f"{rn}/{jsonl}#1")
    for lineno in (2, 3, 4):
        dropped[f"{rn}/{jsonl}#{lineno}"] = "unreadable"
    return expect


# ----------------------------------------------------------------------------------------------------------------
# helpers to run the stage and read what it wrote


def build(data: DataConfig, run_name: str = "t") -> Path:
    """The stage body without MLflow (fast); the CLI test below goes through run_stage."""
    s = Stage(name="data", cfg=ForgeConfig(run_name=run_name, data=data))
    stage.build(s)
    return s.dir


def read_shards(out: Path) -> dict[str, dict]:
    docs = {}
    for path in sorted(out.glob("*-*.parquet")):
        split = path.name.split("-")[0]
        for row in pq.read_table(path).to_pylist():
            assert row["id"] not in docs
            docs[row["id"]] = {**row, "split": split, "meta": json.loads(row["meta"])}
    return docs


def read_removed(out: Path) -> list[dict]:
    with open(out / "removed.jsonl.zst", "rb") as fh:
        text = io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(fh), encoding="utf-8").read()
    return [json.loads(line) for line in text.splitlines()]


@pytest.fixture
def dirty(tmp_path, monkeypatch):
    root = tmp_path / "corpus"
    expect = build_dirty_corpus(root)
    real = ingest.read_bytes

    def read_bytes(path: Path) -> bytes:
        if path.name == "denied.txt":
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(ingest, "read_bytes", read_bytes)  # root ignores chmod 000
    return root, expect


# ----------------------------------------------------------------------------------------------------------------
# the dirty corpus: every case lands where it should, and the report adds up


def test_dirty_corpus_lands_where_it_should(dirty):
    root, expect = dirty
    a, b = expect["near_pair"]
    assert jaccard(shingles(a, 5), shingles(b, 5)) >= 0.8  # the controlled edit really is a near-duplicate
    out = build(DataConfig(inputs=[str(root)], **HASH_SPLIT, workers=2))  # 2 workers: the process pool path

    kept = read_shards(out)
    removed = {r["id"]: r for r in read_removed(out)}
    assert set(kept) == set(expect["kept"]), (sorted(set(kept) ^ set(expect["kept"])), removed)
    for doc_id, where in expect["dropped"].items():
        assert removed[doc_id]["filter"] == where, (doc_id, removed[doc_id])
    assert set(removed) == set(expect["dropped"])
    reasons = {k: v["reason"] for k, v in removed.items()}
    assert any(r.startswith("binary") for r in reasons.values())
    assert any(r.startswith("invalid_utf8") for r in reasons.values())
    assert any(r.startswith("empty") for r in reasons.values())
    assert any(r.startswith("permission_denied") for r in reasons.values())
    assert any(r.startswith("too_large") for r in reasons.values())
    assert any(r.startswith("bad_json") for r in reasons.values())
    assert any(r.startswith("missing_field") and "data.text_field" in r for r in reasons.values())

    # every document sits in the split its id hashes to
    for doc_id, doc in kept.items():
        assert doc["split"] == split_of(doc_id, SPLIT)
    assert kept[expect["val_id"]]["split"] == "val"
    # the HTML article survives, its chrome does not
    html = kept[expect["html_id"]]["text"]
    assert expect["html_body"].split("\n")[0][:60] in " ".join(html.split())
    for chrome in ("cookie", "Share on", "Popular posts", "comments", "Privacy policy", "section link"):
        assert chrome.lower() not in html.lower(), chrome
    para = kept[expect["para_id"]]["text"]
    assert expect["para_cut"] not in para and expect["para_kept"] in para
    # the recurring footer line is stripped, the documents kept
    for doc_id in expect["footer_docs"]:
        assert FOOTER not in kept[doc_id]["text"] and len(kept[doc_id]["text"].split()) > 50
    # JSONL metadata and language travel in meta
    jsonl_doc = next(d for i, d in kept.items() if i.endswith("#1"))
    assert jsonl_doc["meta"]["date"] == "1925-03-01" and jsonl_doc["meta"]["lang"] == "en"

    report = json.loads((out / "report.json").read_text())
    by_filter: dict[str, int] = {}
    for r in removed.values():
        by_filter[r["filter"]] = by_filter.get(r["filter"], 0) + 1
    assert {k: v["docs"] for k, v in report["filters"].items() if v["docs"]} == by_filter
    assert report["raw"]["docs"] == len(kept) + len(removed)
    assert report["kept"]["docs"] == len(kept)
    removed_chars = sum(v["chars"] for v in report["filters"].values())
    assert report["raw"]["chars"] == report["markup"]["chars"] + report["kept"]["chars"] + removed_chars
    assert report["filters"]["boilerplate"]["chars"] >= 6 * len(FOOTER)  # partial edits are counted
    # markup (tags, scripts, styles) is counted apart from the page chrome extraction removed (cookie banner, menu)
    assert report["markup"]["chars"] > 500 and report["filters"]["html_extraction"]["chars"] > 300
    assert report["split_plan"]["ratios"] == SPLIT and report["calibration"]["train_docs"] > 20
    assert report["duplicates"]["exact"]["clusters"] >= 1 and report["duplicates"]["near"]["verified_pairs"] >= 2
    assert {s: v["docs"] for s, v in report["splits"].items()} == {
        s: sum(d["split"] == s for d in kept.values()) for s in ("train", "val", "test")
    }
    assert (out / "removed_by_filter.png").read_bytes()[:4] == b"\x89PNG"
    md = (out / "report.md").read_text()
    assert "decontamination" in md and "## Duplicates" in md and "Storage estimate" in md
    # the empty test split still has a shard, with the schema
    test_shards = sorted(out.glob("test-*.parquet"))
    assert test_shards and pq.read_schema(test_shards[0]).names == ["id", "text", "source", "meta"]
    assert not (out / ".work").exists()


def test_splits_do_not_move_when_thresholds_change(dirty):
    """val and test grow to data.min_eval_tokens from the sizes of the documents as read: no cleaning setting (the
    profile, its extraction mode, a threshold) moves a document, and val and test hold their minimum."""
    root, _ = dirty
    placement = []
    for profile, min_words, score in (("docs", 20, 0.65), ("web", 100, 0.9)):
        data = DataConfig(inputs=[str(root)], profile=profile, min_eval_tokens=150, workers=1,
                          min_language_score=score, quality={"min_words": min_words})  # fmt: skip
        out = build(data, run_name=f"m{min_words}")
        report = json.loads((out / "report.json").read_text())
        plan = report["split_plan"]
        assert plan["ratios"]["val"] > SPLIT["val"] and plan["ratios"]["test"] > SPLIT["test"]  # grown
        assert min(plan["assigned_tokens"]["val"], plan["assigned_tokens"]["test"]) >= 150
        where = {i: d["split"] for i, d in read_shards(out).items()}
        where.update({r["id"]: r["split"] for r in read_removed(out) if r["filter"] != "unreadable"})
        assert all(split_of(i, plan["ratios"]) == s for i, s in where.items())  # the ratios reproduce the split
        placement.append(where)
    first, second = placement
    assert set(first) == set(second)
    assert first == second
    assert len(read_shards(out)) < len(first)  # the stricter run really removed more


def test_an_empty_result_is_a_clear_error_with_a_report(tmp_path):
    from forge import ForgeError

    root = tmp_path / "few"
    root.mkdir()
    for i, text in enumerate(english_docs(3)):
        (root / f"d{i}.txt").write_text(text)
    data = DataConfig(inputs=[str(root)], workers=1)
    data.quality.min_words = 100_000
    with pytest.raises(ForgeError, match=r"every one of the 3 input documents was removed; read .*report.md"):
        build(data)
    report = json.loads((tmp_path / "runs" / "t" / "data" / "report.json").read_text())
    assert report["filters"]["gopher_quality"]["docs"] == 3  # the report says which filter to loosen


def test_metadata_date_filter_keeps_only_older_documents(tmp_path):
    docs = english_docs(3)
    root = tmp_path / "dated"
    root.mkdir()
    rows = [{"text": docs[0], "date": "1901-05-02"}, {"text": docs[1], "date": "1950"}, {"text": docs[2]}]
    (root / "a.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = build(DataConfig(inputs=[str(root)], date_before="1930-01-01", workers=1))
    assert list(read_shards(out)) == ["dated/a.jsonl#1"]
    reasons = {r["id"]: r for r in read_removed(out)}
    assert reasons["dated/a.jsonl#2"]["filter"] == "metadata" and "not before" in reasons["dated/a.jsonl#2"]["reason"]
    assert "no 'date' field" in reasons["dated/a.jsonl#3"]["reason"]


def test_compressed_jsonl_and_parquet_inputs(tmp_path):
    import gzip

    import pyarrow as pa

    docs = english_docs(4)
    root = tmp_path / "mixed"
    root.mkdir()
    with gzip.open(root / "a.jsonl.gz", "wt") as fh:
        fh.write(json.dumps({"content": docs[0], "id": "doc-a"}) + "\n")
    (root / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(json.dumps({"content": docs[1]}).encode()))
    pq.write_table(pa.table({"content": [docs[2], docs[3]], "url": ["u1", "u2"]}), root / "c.parquet")
    out = build(DataConfig(inputs=[str(root)], text_field="content", split={"train": 0.5, "val": 0.25, "test": 0.25},
                           workers=1))  # fmt: skip
    kept = read_shards(out)
    assert set(kept) == {"doc-a", "mixed/b.jsonl.zst#1", "mixed/c.parquet#0", "mixed/c.parquet#1"}
    assert kept["mixed/c.parquet#1"]["meta"]["url"] == "u2"


# ----------------------------------------------------------------------------------------------------------------
# through the CLI, with MLflow


def test_cli_reports_a_missing_input_clearly(tmp_path):
    from typer.testing import CliRunner

    from forge.cli import app

    result = CliRunner().invoke(app, ["data", "--set", "data.inputs=[/nonexistent/corpus]"])
    assert result.exit_code == 2
    assert "data.inputs: /nonexistent/corpus does not exist; give a directory or file" in result.output


@pytest.mark.slow  # ~6 s idle, 20-30 s on the shared machine (MLflow's sqlite store is created and migrated)
def test_cli_runs_the_stage_skips_and_reruns(tmp_path, isolated_runs):
    from typer.testing import CliRunner

    from forge.cli import app

    root = tmp_path / "small"
    root.mkdir()
    for i, text in enumerate(english_docs(6)):
        (root / f"d{i}.txt").write_text(text)
    (root / "d_copy.txt").write_text(english_docs(1)[0])
    config = tmp_path / "run.yaml"
    config.write_text(f"run_name: clirun\ndata:\n  inputs: [{json.dumps(str(root))}]\n  workers: 1\n")
    runner = CliRunner()

    result = runner.invoke(app, ["data", "--config", str(config)])
    assert result.exit_code == 0, result.output
    out = isolated_runs / "clirun" / "data"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["metrics"]["kept_docs"] == 6
    assert manifest["metrics"]["removed_exact_dedup_docs"] + manifest["metrics"]["removed_decontamination_docs"] == 1
    assert "removed_by_filter.png" in manifest["outputs"] and "report.md" in manifest["outputs"]
    # unchanged inputs and config: skipped; a changed input file: re-run
    assert runner.invoke(app, ["data", "--config", str(config)]).exit_code == 0
    assert json.loads((out / "manifest.json").read_text())["started_at"] == manifest["started_at"]
    (root / "d0.txt").write_text(english_docs(8)[7])
    assert runner.invoke(app, ["data", "--config", str(config)]).exit_code == 0
    rerun = json.loads((out / "manifest.json").read_text())
    assert rerun["inputs"] != manifest["inputs"] and rerun["metrics"]["kept_docs"] == 7  # no copy any more


@pytest.mark.slow
def test_builtin_corpus_through_the_cli_finds_duplicates():
    import subprocess
    import sys
    import time

    start = time.time()
    proc = subprocess.run(
        # the demo's data settings: they keep the short docstrings, where most copies are
        [sys.executable, "-m", "forge.cli", "data", "--run", "stdlib",
         "--config", str(Path(__file__).resolve().parent.parent / "configs" / "tiny-cpu.yaml")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    print(f"forge data on the builtin corpus: {time.time() - start:.1f}s")  # acceptance: < 2 min on an idle machine
    from forge.paths import runs_root

    report = json.loads((runs_root() / "stdlib" / "data" / "report.json").read_text())
    assert report["raw"]["docs"] > 5000
    assert report["duplicates"]["exact"]["docs_removed"] >= 5 and report["duplicates"]["near"]["docs_removed"] > 20
    assert report["kept"]["docs"] > 1000
    kept = read_shards(runs_root() / "stdlib" / "data")  # asserts the ids are unique
    assert all(i.startswith("python-stdlib:") for i in kept)
    assert not any(".test." in i or "idlelib" in i or "turtledemo" in i for i in kept)


def test_a_record_that_crashes_a_filter_is_dropped_not_the_run(tmp_path, monkeypatch):
    from pretrain.data import filters

    root = tmp_path / "crash"
    root.mkdir()
    docs = english_docs(3)
    for i, text in enumerate(docs):
        (root / f"d{i}.txt").write_text(text)
    real = filters.measure

    def exploding(text, q, lang="en"):
        if text == docs[1]:
            raise RuntimeError("boom")
        return real(text, q, lang)

    monkeypatch.setattr(filters, "measure", exploding)
    out = build(DataConfig(inputs=[str(root)], workers=1, split={"train": 0.98, "val": 0.01, "test": 0.01}))
    assert set(read_shards(out)) == {"crash/d0.txt", "crash/d2.txt"}
    (failed,) = read_removed(out)
    assert failed["id"] == "crash/d1.txt" and failed["reason"] == "processing_error: RuntimeError: boom"
