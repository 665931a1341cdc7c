"""Documents as users hold them: PDF, DOCX, ODT and EPUB read with their structure, long documents cut into sections
before the split, and Chinese and Japanese words found by their segmenters.

The PDFs are written by PDFium (tests/pdfs.py); DOCX, ODT and EPUB by pandoc from one Markdown source, the way a
team's documents are exported (.ci/run installs pandoc from Debian). The real document sets (the Debian Reference as
PDF and HTML in English, Spanish and Chinese) are in tests/test_data_debian.py.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from forge.config import DataConfig, ForgeConfig, QualityConfig
from forge.lineage import Stage
from pretrain.data import documents, filters, formats, sections, stage, words
from pretrain.data.textblocks import Unreadable

sys.path.insert(0, str(Path(__file__).parent))
from pdfs import write_pdf, write_scan  # noqa: E402

PARAGRAPH = (
    "The gearbox counter reads every sprocket as it passes the sensor and adds it to the running total. "
    "When the shift ends, the counter writes the total to the log and resets itself for the next operator."
)


def manual(chapters: int, sections_per_chapter: int, paragraphs: int) -> list[tuple[str, str]]:
    """A service manual whose paragraphs all differ (the quality rules drop repeated text)."""
    blocks = []
    for c in range(1, chapters + 1):
        blocks.append(("h1", f"Chapter {c} Gearbox model {c}"))
        for s in range(1, sections_per_chapter + 1):
            blocks.append(("h2", f"{c}.{s} Servicing step {s} of model {c}"))
            blocks += [("p", varied_paragraph(c * 1000 + s * 10 + k)) for k in range(paragraphs)]
            blocks.append(("code", f"$ gearbox --model {c} --step {s}\nok"))
    return blocks


PARTS = (
    "sprocket",
    "bearing",
    "shaft",
    "housing",
    "sensor",
    "clutch",
    "gasket",
    "spindle",
    "pulley",
    "flange",
    "bushing",
    "coupling",
    "seal",
    "lever",
    "spring",
    "valve",
    "rotor",
    "stator",
    "washer",
    "bracket",
)
VERBS = ("inspect", "replace", "tighten", "clean", "lubricate", "measure", "align", "check", "adjust", "secure")
WHY = (
    "before the next shift starts",
    "after every thousand hours of use",
    "whenever the warning light is on",
    "when the operator reports a noise",
    "before the unit is shipped back",
    "once the housing has cooled down",
)


def varied_paragraph(seed: int) -> str:
    import random

    rng = random.Random(seed)
    out = []
    for _ in range(4):
        a, b = rng.sample(PARTS, 2)
        out.append(f"The technician must {rng.choice(VERBS)} the {a} and the {b} {rng.choice(WHY)}, and note "
                   f"{rng.randint(2, 97)} readings of the {rng.choice(PARTS)} in the service log.")  # fmt: skip
    return " ".join(out)


def run_data(root: Path, name: str, **data: object) -> tuple[Path, dict]:
    cfg = ForgeConfig(run_name=name, data=DataConfig(inputs=[str(root)], workers=1, **data))
    s = Stage(name="data", cfg=cfg)
    stage.build(s)
    return s.dir, json.loads((s.dir / "report.json").read_text())


def kept(out: Path) -> dict[str, tuple[str, dict]]:
    rows = {}
    for shard in sorted(out.glob("*-*.parquet")):
        for row in pq.read_table(shard).to_pylist():
            rows[row["id"]] = (shard.name.split("-")[0], json.loads(row["meta"]), row["text"])
    return rows


# ----------------------------------------------------------------------------------------------------------------
# PDF


def test_a_pdf_keeps_its_headings_paragraphs_and_code_and_loses_its_page_furniture(tmp_path):
    path = write_pdf(tmp_path / "gearbox.pdf", manual(2, 3, 4), header="Gearbox Service Manual")
    record = formats.read_document(path, "gearbox.pdf")[0]
    text = record["text"]
    assert text.startswith("# Chapter 1 Gearbox model 1\n\n## 1.1 Servicing step 1 of model 1\n\n")
    assert "```\n$ gearbox --model 1 --step 1\nok\n```" in text
    assert varied_paragraph(2033) in text  # a paragraph wrapped over lines is one line again
    assert "Gearbox Service Manual" not in text  # the running header, on every page
    lines = text.split("\n")
    assert not [x for x in lines if x.strip().isdigit()]  # nor a bare page number
    pages = record["pages"]
    assert len(pages) >= 2 and [p[1] for p in pages] == [str(i + 1) for i in range(len(pages))]
    assert all(p[2] > len("Gearbox Service Manual") for p in pages)  # each page's furniture, counted
    assert record["meta"]["pages"] == f"1-{len(pages)}"


def test_a_scanned_pdf_is_reported_with_what_ocr_would_take_and_the_rest_is_read(tmp_path):
    root = tmp_path / "docs"
    root.mkdir()
    write_scan(root / "scanned-contract.pdf", pages=3)
    write_pdf(root / "manual.pdf", manual(1, 2, 3))
    with pytest.raises(Unreadable, match="scanned: no text layer on 3 of 3 pages.*OCR"):
        formats.read_document(root / "scanned-contract.pdf", "x")
    out, report = run_data(root, "scan", min_eval_tokens=0, quality=QualityConfig(enabled=False))
    assert report["scanned"] == ["docs/scanned-contract.pdf"]
    assert report["unreadable"][0]["rule"] == "scanned"
    assert "**Scanned PDFs** (1)" in (out / "report.md").read_text() and "ocrmypdf" in (out / "report.md").read_text()
    assert report["by_format"]["pdf"]["documents"] == 2 and report["by_format"]["pdf"]["kept_sections"] >= 1
    assert all(meta["format"] == "pdf" and meta["pages"] for _, meta, _ in kept(out).values())


def test_an_encrypted_or_damaged_pdf_is_refused_by_name_with_the_fix(tmp_path):
    damaged = tmp_path / "damaged.pdf"
    damaged.write_bytes(b"%PDF-1.7\n not really a pdf")
    with pytest.raises(Unreadable, match="damaged: PDFium cannot open it"):
        formats.read_document(damaged, "x")


# ----------------------------------------------------------------------------------------------------------------
# DOCX, ODT, EPUB (exported by pandoc)

SOURCE = """# Gearbox counter

The gearbox counter reads every sprocket as it passes the sensor.

## Installing

- Mount the sensor on the housing.
- Connect the counter to the sensor.

| Setting | Meaning |
|---|---|
| interval | seconds between two reports |

```
$ gearbox --install
```
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, Path]:
    pandoc = shutil.which("pandoc")
    assert pandoc, "pandoc is needed to write the DOCX/ODT/EPUB test documents: apt-get install pandoc (.ci/run does)"
    root = tmp_path_factory.mktemp("exported")
    (root / "source.md").write_text(SOURCE)
    out = {}
    for fmt in ("docx", "odt", "epub"):
        out[fmt] = root / f"gearbox.{fmt}"
        subprocess.run([pandoc, "-f", "markdown", "-t", fmt, "-o", str(out[fmt]), str(root / "source.md")], check=True)
    return out


@pytest.mark.parametrize("fmt", ["docx", "odt"])
def test_office_documents_keep_headings_lists_tables_and_code(exported, fmt):
    (record,) = formats.read_document(exported[fmt], f"gearbox.{fmt}")
    text = record["text"]
    assert "# Gearbox counter" in text.split("\n") and "## Installing" in text.split("\n")
    assert "- Mount the sensor on the housing." in text and "- Connect the counter to the sensor." in text
    assert "interval | seconds between two reports" in text
    assert "```\n$ gearbox --install\n```" in text
    assert text.index("## Installing") < text.index("- Mount") < text.index("interval |") < text.index("```")


def test_an_epub_is_its_chapters_in_reading_order_each_read_as_html(exported):
    records = formats.read_document(exported["epub"], "gearbox.epub")
    assert all(r["format"] == "html" and r["id"].startswith("gearbox.epub#") for r in records)
    body = [r for r in records if "sprocket" in r["text"]]
    assert body and body[0]["meta"]["document"] == "gearbox.epub"
    text = filters.extract_html(body[0]["text"], "recall")
    assert "The gearbox counter reads every sprocket as it passes the sensor." in text
    assert "Mount the sensor on the housing." in text and "$ gearbox --install" in text


def test_a_folder_of_office_documents_goes_through_the_data_stage_with_its_formats_counted(exported, tmp_path):
    root = tmp_path / "office"
    root.mkdir()
    for path in exported.values():
        shutil.copy(path, root / path.name)
    (root / "notes.odt").write_bytes(b"PK\x03\x04 not a zip")
    out, report = run_data(root, "office", min_eval_tokens=0, quality=QualityConfig(enabled=False))
    assert set(report["by_format"]) == {"docx", "odt", "epub"}
    assert report["by_format"]["odt"]["documents"] == 2 and report["by_format"]["docx"]["documents"] == 1
    # the three hold the same text: one is kept, the others removed as its copies
    assert len({meta["format"] for _, meta, _ in kept(out).values()}) == 1
    assert report["filters"]["exact_dedup"]["docs"] + report["filters"]["near_dedup"]["docs"] >= 2
    assert [u["id"] for u in report["unreadable"]] == ["office/notes.odt"]
    assert report["unreadable"][0]["rule"] == "damaged"
    assert "not a readable ODT file" in report["unreadable"][0]["reason"]


# ----------------------------------------------------------------------------------------------------------------
# sections


def test_a_long_document_is_cut_into_sections_by_its_headings_and_each_lies_in_one_split(tmp_path):
    root = tmp_path / "one-book"
    root.mkdir()
    write_pdf(root / "book.pdf", manual(4, 6, 10))
    out, report = run_data(root, "book", min_eval_tokens=1500, max_section_tokens=600, quality=QualityConfig(
        enabled=False))  # fmt: skip
    rows = kept(out)
    splits = {split for split, _, _ in rows.values()}
    assert splits == {"train", "val", "test"}, "one document gave val and test their share"
    assert all(i.startswith("one-book/book.pdf#") for i in rows) and len(rows) == report["raw"]["docs"]
    for split in ("val", "test"):
        assert report["splits"][split]["est_tokens"] >= 1500
    for doc_id, (split, meta, text) in rows.items():
        assert meta["document"] == "one-book/book.pdf" and meta["part"].endswith(f"/{len(rows)}")
        assert meta["pages"] and stage.split_of(doc_id, report["split_plan"]["ratios"]) == split
        assert words.est_tokens(text) <= 600 + 100  # a section holds one heading's text at most, or the limit
    # the same input, the same sections and splits, whatever the cleaning settings
    out2, _ = run_data(
        root,
        "book-again",
        min_eval_tokens=1500,
        max_section_tokens=600,
        boilerplate=False,
        quality=QualityConfig(enabled=False),
        dedup={"near": False},
    )
    assert {i: s for i, (s, _, _) in kept(out2).items()} == {i: s for i, (s, _, _) in rows.items()}


def test_sections_follow_the_headings_and_never_cut_inside_code():
    code = "```\ncode line\n\n# not a heading\n```\n\n"
    text = (
        "# Book\n\nIntro "
        + "word " * 30
        + "\n\n"
        + "".join(f"## Part {p}\n\n" + ("para " * 80 + "\n\n") * 3 + code for p in range(3))
    )
    parts = sections.cut({"id": "d", "text": text, "format": "text", "meta": {}}, max_tokens=250)
    assert [p["id"] for p in parts][:3] == ["d#book", "d#part-0", "d#part-0~2"]
    assert "".join(p["text"] for p in parts).replace("\n", "") == text.replace("\n", "").strip()
    for p in parts:
        assert p["text"].count("```") % 2 == 0, p["text"]
    assert sections.cut({"id": "short", "text": "a few words", "format": "text", "meta": {}}, 250)[0]["id"] == "short"


def test_html_is_cut_in_its_markup_and_every_section_keeps_the_title():
    body = "".join(f"<h2>Topic {i}</h2>" + f"<p>{'sentence of content here. ' * 60}</p>" * 2 for i in range(4))
    html = f"<html><head><title>Gearbox guide</title></head><body><h1>Guide</h1>{body}</body></html>"
    parts = sections.cut({"id": "g.html", "text": html, "format": "html", "meta": {}}, max_tokens=400)
    assert [p["id"] for p in parts] == [
        "g.html#guide",
        "g.html#topic-0~2",
        "g.html#topic-1",
        "g.html#topic-1~2",
        "g.html#topic-2",
        "g.html#topic-2~2",
        "g.html#topic-3",
        "g.html#topic-3~2",
    ]
    for p in parts:
        assert "<title>Gearbox guide</title>" in p["text"]
        assert 0 < documents.size_of(p) <= 400


# ----------------------------------------------------------------------------------------------------------------
# scripts without spaces

CHINESE = ("软件包管理系统是Debian的核心部分，它在安装软件时会自动处理依赖关系和配置文件。系统管理员可以使用命令行"
           "工具来升级整个系统，也可以只安装单个软件包。")  # fmt: skip
JAPANESE = "パッケージ管理システムは依存関係を使ってソフトウェアをインストールします。"


def test_chinese_and_japanese_are_cut_into_words_by_their_segmenters():
    assert words.segment(CHINESE, "zh")[:6] == ["软件包", "管理系统", "是", "Debian", "的", "核心"]
    assert words.segment(JAPANESE, "ja")[:4] == ["パッケージ", "管理", "システム", "は"]
    assert words.segment("运行mount(8)。", "zh") == ["运行", "mount(8)"]
    assert words.segmenter_name("zh") == "rjieba" and words.segmenter_name("ja") == "sudachipy (mode A)"
    assert words.segmenter_name("th") == "none: word-based rules skipped"


def test_the_token_estimate_counts_cjk_by_the_character():
    assert words.est_tokens("one two three four five six seven eight nine ten") == 13
    han = sum(words.has_cjk(c) for c in CHINESE)
    assert words.est_tokens(CHINESE) == round(han * 1.0 + 5 * 1.3)  # Debian and four CJK punctuation marks: words
    assert words.est_tokens(JAPANESE) < len(JAPANESE)  # 0.7 a character: kana make it Japanese


CHINESE_PAGE = [
    CHINESE,
    "在安装新的软件包之前，建议先更新软件包列表，这样可以获得最新的版本信息。",
    "如果某个软件包出现了问题，可以使用日志文件来查找错误的原因。",
    "每个软件包都有自己的配置脚本，它会在安装过程中询问用户一些问题。",
    "网络配置文件保存在系统目录中，修改之后需要重新启动相关的服务。",
    "用户的个人设置通常保存在主目录下的隐藏文件里，这些文件不会影响其他用户。",
    "备份重要的数据是系统维护的一部分，应该定期检查备份是否完整。",
]


def test_cjk_prose_is_prose_and_judged_in_its_language():
    text = "\n".join([*CHINESE_PAGE, "apt-get install foo", "$ dpkg -l"])
    assert filters.prose_view(text, "zh").split("\n") == CHINESE_PAGE
    lang, score, count = filters.judge_language(text, DataConfig(languages=["zh"]))
    assert lang == "zh" and score > 0.9 and count >= 20
    values = filters.measure(text, DataConfig(languages=["zh"]).quality, "zh")
    assert values["words"] > 100 and values["stop_words"] >= 8 and math.isnan(values["mean_word_length"])
    assert filters.first_failure(values, DataConfig(languages=["zh"]).quality) is None


def test_a_language_without_a_segmenter_skips_the_word_rules_and_the_report_says_so():
    thai = "ระบบจัดการแพ็กเกจใช้การพึ่งพาเพื่อติดตั้งซอฟต์แวร์ " * 20
    q = DataConfig().quality
    values = filters.measure(thai, q, "th")
    word_based = [r for r in filters.rules(q) if r.metric in filters.WORD_METRICS or "gram" in r.metric]
    assert word_based and all(math.isnan(values[r.metric]) and not r.fails(values[r.metric], q) for r in word_based)
