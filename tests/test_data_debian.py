"""`forge data` with its defaults on real manuals that Debian ships: sqlite3-doc, git-doc, apache2-doc (English and
French), and the Debian Reference as HTML (15 long chapters) and as one PDF each in English, Spanish and Chinese.
Only data.inputs (and data.languages) differ from the defaults.

The packages come from the `debian_docs` fixture (tests/conftest.py: `apt-get download` + `dpkg -x` into a cache).
A set is the package's regular HTML pages: git-doc's AsciiDoc sources of the same pages and apache's symbolic links
to pages of other languages are left out. Debian's apache2-doc ships a few en/ pages in Portuguese (bind.html,
install.html, ...: the pt-br translation installed over the English one); the language rule drops them, and they
count here as dropped content pages.

Long documents are cut into sections before the split (pretrain/data/sections.py), so the unit is a section: each
input document read and cut exactly as the data stage does (pretrain/data/documents.py). A content section is one
whose text (of a page, its trafilatura extraction, favour recall: the most inclusive, the same for every set) has at
least 150 words (Chinese: segmented words). Acceptance: >= 90% of the content sections kept, not counting those
removed as a (near-)copy of one that is kept (sqlite's point-release notes repeat the release before them); val and
test each hold at least data.min_eval_tokens estimated tokens after cleaning.

    FORGE_DEBIAN_DEBS=/tmp/debdocs python -m pytest -q tests/test_data_debian.py -s   # -s prints the figures
"""

from __future__ import annotations

import io
import json
import shutil
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import zstandard

from forge.config import DataConfig, ForgeConfig
from forge.lineage import Stage
from pretrain.data import documents, filters, ingest, stage, words

pytestmark = pytest.mark.slow

CONTENT_WORDS = 150
REFERENCE = "usr/share/debian-reference"
# set name -> (package, directory of its documents inside the package, their file pattern, data.languages)
SETS = {
    "sqlite": ("sqlite3-doc", "usr/share/doc/sqlite3", "*.html", ["en"]),
    "git": ("git-doc", "usr/share/doc/git-doc", "*.html", ["en"]),
    "apache-en": ("apache2-doc", "usr/share/doc/apache2-doc/manual/en", "*.html", ["en"]),
    "apache-fr": ("apache2-doc", "usr/share/doc/apache2-doc/manual/fr", "*.html", ["fr"]),
    "reference-en-html": ("debian-reference-en", REFERENCE, "*.en.html", ["en"]),
    "reference-es-html": ("debian-reference-es", REFERENCE, "*.es.html", ["es"]),
    "reference-zh-html": ("debian-reference-zh-cn", REFERENCE, "*.zh-cn.html", ["zh"]),
    "reference-en-pdf": ("debian-reference-en", REFERENCE, "*.en.pdf", ["en"]),
    "reference-es-pdf": ("debian-reference-es", REFERENCE, "*.es.pdf", ["es"]),
    "reference-zh-pdf": ("debian-reference-zh-cn", REFERENCE, "*.zh-cn.pdf", ["zh"]),
}


@pytest.fixture(scope="session")
def debian_sets(debian_docs, tmp_path_factory) -> dict[str, Path]:
    """Each set's documents copied into one directory per set (symbolic links left out)."""
    out = {}
    for name, (package, sub, pattern, _) in SETS.items():
        source = debian_docs(package) / sub
        target = tmp_path_factory.mktemp("debian-sets") / name
        for path in sorted(source.rglob(pattern)):
            if path.is_symlink() or not path.is_file():
                continue
            dest = target / path.relative_to(source)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest)
        out[name] = target
    return out


def sections_of(root: Path, cfg: DataConfig) -> dict[str, int]:
    """Every section id the data stage makes of the set -> words of its text (a page's: extracted, favour recall)."""
    out = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        for record in ingest.iter_file(path, f"{root.name}/{path.relative_to(root).as_posix()}", cfg):
            for doc in documents.as_read(record, cfg):
                text = filters.extract_html(doc["text"], "recall") if doc["format"] == "html" else doc["text"]
                out[doc["id"]] = len(words.segment(text)) if isinstance(text, str) else 0
    return out


def run_set(root: Path, languages: list[str]) -> dict:
    data = DataConfig(inputs=[str(root)], languages=languages)
    assert data == DataConfig(inputs=[str(root)], languages=languages, profile="docs")  # the defaults, nothing else
    s = Stage(name="data", cfg=ForgeConfig(run_name=root.name, data=data))
    start = time.time()
    stage.build(s)
    wall = time.time() - start
    kept, rows = {}, {}
    for shard in sorted(s.dir.glob("*-*.parquet")):
        for row in pq.read_table(shard, columns=["id", "meta"]).to_pylist():
            kept[row["id"]] = shard.name.split("-")[0]
            rows[row["id"]] = {"meta": json.loads(row["meta"])}
    with open(s.dir / "removed.jsonl.zst", "rb") as fh:
        lines = io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(fh), encoding="utf-8").read().splitlines()
    removed = {r["id"]: r for r in map(json.loads, lines)}
    report = json.loads((s.dir / "report.json").read_text())
    return {"kept": kept, "removed": removed, "report": report, "wall_s": wall, "dir": s.dir, "rows": rows,
            "min": data.min_eval_tokens}  # fmt: skip


@pytest.mark.parametrize("name", list(SETS))
def test_defaults_keep_the_content_sections_and_size_val_and_test(name, debian_sets):
    root = debian_sets[name]
    languages = SETS[name][3]
    every = sections_of(root, DataConfig(inputs=[str(root)], languages=languages))
    content = {i: n for i, n in every.items() if n >= CONTENT_WORDS}
    result = run_set(root, languages)
    kept, removed, report = result["kept"], result["removed"], result["report"]
    assert set(kept) | set(removed) == set(every)

    # A content page removed as a copy of another still has its content in the corpus: the copy it names is kept.
    copies = {i: r for i, r in removed.items() if i in content and r.get("duplicate_of")}
    for doc_id in copies:
        copy = doc_id
        while copy in removed:  # a chain (an exact copy of a page that is itself a near copy) ends at a kept page
            copy = removed[copy].get("duplicate_of")
        assert copy in kept, (doc_id, removed[doc_id])
    unique = [i for i in content if i not in copies]
    dropped = {i: removed[i] for i in unique if i not in kept}
    share = 1 - len(dropped) / len(unique)
    splits = report["splits"]
    by_rule: dict[str, int] = {}
    for r in removed.values():
        key = f"{r['filter']}: {r['rule']}"
        by_rule[key] = by_rule.get(key, 0) + 1
    documents_in = len({i.split("#")[0] for i in every})
    share_all = 100 * sum(i in kept for i in content) / len(content)
    print(
        f"\n{name}: {documents_in} documents in, {len(every)} sections, {len(content)} content sections "
        f"({len(copies)} removed as copies of a kept one), kept {len(kept)} sections: {len(unique) - len(dropped)} of "
        f"the {len(unique)} other content sections = {100 * share:.1f}% ({share_all:.1f}% of all content sections), "
        f"wall {result['wall_s']:.1f}s\n"
        f"  dropped by rule: {by_rule}\n"
        f"  val {splits['val']['docs']} docs ~{splits['val']['est_tokens']:,} tokens "
        f"(~{report['split_plan']['assigned_tokens']['val']:,} as read), "
        f"test {splits['test']['docs']} docs ~{splits['test']['est_tokens']:,} tokens "
        f"(~{report['split_plan']['assigned_tokens']['test']:,} as read) "
        f"(ratios {', '.join(f'{k} {v:.3f}' for k, v in report['split_plan']['ratios'].items())}); "
        f"markup {report['markup']['pct_raw_chars']:.0f}% of raw, {report['removed_pct_chars']:.1f}% of text removed; "
        f"flagged rules: {report['calibration']['flagged']}\n"
        + "".join(f"  dropped content section {i} ({content[i]} words): {r['filter']}: {r['reason']}\n"
                  for i, r in sorted(dropped.items()))
    )  # fmt: skip
    assert share >= 0.90, dropped
    for split in ("val", "test"):
        assert splits[split]["est_tokens"] >= result["min"], (split, splits[split], report["split_plan"])
    assert not report["split_plan"]["notes"]
    # markup is counted apart, and the characters still add up
    filters_chars = sum(f["chars"] for f in report["filters"].values())
    assert report["markup"]["chars"] + filters_chars + report["kept"]["chars"] == report["raw"]["chars"]
    if name.endswith("-pdf"):
        assert list(report["by_format"]) == ["pdf"] and report["by_format"]["pdf"]["documents"] == 1
        assert all(r["meta"]["pages"] for r in result["rows"].values())  # every section names its source pages
    else:
        assert report["markup"]["pct_raw_chars"] > 30  # HTML: most raw characters are tags, scripts and styles
    assert (result["dir"] / "removed_by_filter.png").exists() and (result["dir"] / "calibration.png").exists()


@pytest.mark.parametrize("name", ["reference-zh-html", "reference-zh-pdf"])
def test_every_chinese_chapter_is_kept_as_chinese(name, debian_sets):
    """The language judge reads the Chinese prose, not the English package names and commands among it."""
    result = run_set(debian_sets[name], ["zh"])
    langs = {i: r["meta"].get("lang") for i, r in result["rows"].items()}
    assert set(langs.values()) == {"zh"}, {i: v for i, v in langs.items() if v != "zh"}
    # the preface, the 12 chapters and the appendix (DocBook's pr01, ch01-ch12, apa); index.zh-cn.html is the table
    # of contents, links only, or the whole book as one PDF
    chapters = {p.name for p in debian_sets[name].iterdir() if not p.name.startswith("index.")}
    kept_chapters = {i.split("#")[0].split("/", 1)[1] for i in langs}
    print(
        f"\n{name}: {len(kept_chapters)} of {len(chapters)} chapters kept, {len(langs)} sections, all zh; words by "
        f"{result['report']['by_language']['zh']['words']}"
    )
    assert kept_chapters == chapters
