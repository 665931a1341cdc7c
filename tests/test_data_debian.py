"""`forge data` with its defaults on real manuals that Debian ships: sqlite3-doc, git-doc, apache2-doc (English and
French). Only data.inputs (and data.languages for French) differ from the defaults.

The packages come from the `debian_docs` fixture (tests/conftest.py: `apt-get download` + `dpkg -x` into a cache).
A set is the package's regular HTML pages: git-doc's AsciiDoc sources of the same pages and apache's symbolic links
to pages of other languages are left out. Debian's apache2-doc ships a few en/ pages in Portuguese (bind.html,
install.html, ...: the pt-br translation installed over the English one); the language rule drops them, and they
count here as dropped content pages.

A content page is one whose extracted text (trafilatura, favour recall: the most inclusive extraction, the same for
every set) has at least 150 words. Acceptance: >= 90% of the content pages kept, not counting those removed as a
(near-)copy of a page that is kept (sqlite's point-release notes repeat the release before them); val and test each
hold at least data.min_eval_tokens estimated tokens after cleaning.

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
from pretrain.data import filters, stage

pytestmark = pytest.mark.slow

CONTENT_WORDS = 150
# set name -> (package, directory of its pages inside the package, data.languages)
SETS = {
    "sqlite": ("sqlite3-doc", "usr/share/doc/sqlite3", ["en"]),
    "git": ("git-doc", "usr/share/doc/git-doc", ["en"]),
    "apache-en": ("apache2-doc", "usr/share/doc/apache2-doc/manual/en", ["en"]),
    "apache-fr": ("apache2-doc", "usr/share/doc/apache2-doc/manual/fr", ["fr"]),
}


@pytest.fixture(scope="session")
def debian_sets(debian_docs, tmp_path_factory) -> dict[str, Path]:
    """Each set's regular .html pages copied into one directory per set (symbolic links left out)."""
    out = {}
    for name, (package, sub, _) in SETS.items():
        source = debian_docs(package) / sub
        target = tmp_path_factory.mktemp("debian-sets") / name
        for path in sorted(source.rglob("*.html")):
            if path.is_symlink() or not path.is_file():
                continue
            dest = target / path.relative_to(source)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest)
        out[name] = target
    return out


def content_pages(root: Path) -> dict[str, int]:
    """id -> words of the extracted text, for the pages with at least CONTENT_WORDS."""
    out = {}
    for path in sorted(root.rglob("*.html")):
        text = filters.extract_html(path.read_text(encoding="utf-8", errors="replace"), "recall")
        words = len(text.split()) if isinstance(text, str) else 0
        if words >= CONTENT_WORDS:
            out[f"{root.name}/{path.relative_to(root).as_posix()}"] = words
    return out


def run_set(root: Path, languages: list[str]) -> dict:
    data = DataConfig(inputs=[str(root)], languages=languages)
    assert data == DataConfig(inputs=[str(root)], languages=languages, profile="docs")  # the defaults, nothing else
    s = Stage(name="data", cfg=ForgeConfig(run_name=root.name, data=data), sections=("data",))
    start = time.time()
    stage.build(s)
    wall = time.time() - start
    kept = {}
    for shard in sorted(s.dir.glob("*-*.parquet")):
        for row in pq.read_table(shard, columns=["id"]).to_pylist():
            kept[row["id"]] = shard.name.split("-")[0]
    with open(s.dir / "removed.jsonl.zst", "rb") as fh:
        lines = io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(fh), encoding="utf-8").read().splitlines()
    removed = {r["id"]: r for r in map(json.loads, lines)}
    report = json.loads((s.dir / "report.json").read_text())
    return {"kept": kept, "removed": removed, "report": report, "wall_s": wall, "dir": s.dir,
            "min": data.min_eval_tokens}  # fmt: skip


@pytest.mark.parametrize("name", list(SETS))
def test_defaults_keep_the_content_pages_and_size_val_and_test(name, debian_sets):
    root = debian_sets[name]
    pages = sorted(p for p in root.rglob("*.html"))
    content = content_pages(root)
    result = run_set(root, SETS[name][2])
    kept, removed, report = result["kept"], result["removed"], result["report"]
    assert set(kept) | set(removed) == {f"{root.name}/{p.relative_to(root).as_posix()}" for p in pages}

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
    print(
        f"\n{name}: {len(pages)} pages in, {len(content)} content pages ({len(copies)} removed as copies of a kept "
        f"page), kept {len(kept)} pages: {len(unique) - len(dropped)} of the {len(unique)} other content pages "
        f"= {100 * share:.1f}% ({100 * sum(i in kept for i in content) / len(content):.1f}% of all content pages), "
        f"wall {result['wall_s']:.1f}s\n"
        f"  dropped by rule: {by_rule}\n"
        f"  val {splits['val']['docs']} docs ~{splits['val']['est_tokens']:,} tokens "
        f"(~{report['split_plan']['assigned_tokens']['val']:,} as read), "
        f"test {splits['test']['docs']} docs ~{splits['test']['est_tokens']:,} tokens "
        f"(~{report['split_plan']['assigned_tokens']['test']:,} as read) "
        f"(ratios {', '.join(f'{k} {v:.3f}' for k, v in report['split_plan']['ratios'].items())}); "
        f"markup {report['markup']['pct_raw_chars']:.0f}% of raw, {report['removed_pct_chars']:.1f}% of text removed; "
        f"flagged rules: {report['calibration']['flagged']}\n"
        + "".join(f"  dropped content page {i} ({content[i]} words): {r['filter']}: {r['reason']}\n"
                  for i, r in sorted(dropped.items()))
    )  # fmt: skip
    assert share >= 0.90, dropped
    for split in ("val", "test"):
        assert splits[split]["est_tokens"] >= result["min"], (split, splits[split], report["split_plan"])
    assert not report["split_plan"]["notes"]
    # markup is counted apart, and the characters still add up
    filters_chars = sum(f["chars"] for f in report["filters"].values())
    assert report["markup"]["chars"] + filters_chars + report["kept"]["chars"] == report["raw"]["chars"]
    assert report["markup"]["pct_raw_chars"] > 30  # HTML: most raw characters are tags, scripts and styles
    assert (result["dir"] / "removed_by_filter.png").exists() and (result["dir"] / "calibration.png").exists()
