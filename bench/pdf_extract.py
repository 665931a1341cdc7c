"""Benchmark: Forge's PDF reader against pypdfium2 used plainly, on the same PDFs, in one run.

    .venv/bin/python bench/pdf_extract.py PDF [PDF ...]     # e.g. /usr/share/debian-reference/*.pdf
    .venv/bin/python bench/pdf_extract.py --debian           # the Debian Reference PDFs (en, es, zh-cn) from the
                                                             # test cache (tests/conftest.py's debian_docs)

  plain: pypdfium2 as its README shows it: each page's text page, get_text_range(), the pages joined.
  forge: pretrain/data/pdf.py's read_pdf: the same PDFium text plus every character's font (size, monospace, bold)
         and position, page furniture removed, headings from the outline and the font sizes, code fenced,
         paragraphs rejoined: the Markdown-like text the data stage and the Q&A stage read.
Each PDF is read by each method twice; the faster run counts (the machine is shared). Printed: pages/s of each,
their ratio, and what the structure buys (headings, code blocks and running lines found by forge).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pretrain.data.pdf import read_pdf  # noqa: E402


def plain(path: Path) -> tuple[int, int]:
    """(pages, characters) of pypdfium2's plain text extraction."""
    import pypdfium2 as pdfium

    document = pdfium.PdfDocument(str(path))
    try:
        texts = []
        for page in document:
            textpage = page.get_textpage()
            texts.append(textpage.get_text_range())
            textpage.close()
        return len(document), len("\n".join(texts))
    finally:
        document.close()


def forge(path: Path) -> tuple[int, int, dict[str, int]]:
    record = read_pdf(path, path.name)
    text = record["text"]
    found = {"headings": sum(line.startswith("#") for line in text.split("\n")), "code blocks": text.count("```") // 2,
             "running-line chars": sum(p[2] for p in record["pages"])}  # fmt: skip
    return len(record["pages"]), len(text), found


def best_of(fn, path: Path, runs: int = 2) -> tuple[float, tuple]:
    times, result = [], None
    for _ in range(runs):
        start = time.perf_counter()
        result = fn(path)
        times.append(time.perf_counter() - start)
    return min(times), result  # type: ignore[return-value]


def debian_pdfs() -> list[Path]:
    import os
    import subprocess

    cache = Path(os.environ.get("FORGE_TEST_CACHE", Path.home() / ".cache" / "forge-tests")) / "debian"
    out = []
    for lang in ("en", "es", "zh-cn"):
        root = cache / f"debian-reference-{lang}"
        if not (root / ".extracted").is_file():
            debs = sorted(Path(os.environ.get("FORGE_DEBIAN_DEBS", cache / "debs")).glob(
                f"debian-reference-{lang}_*.deb"))  # fmt: skip
            if not debs:
                sys.exit(f"no debian-reference-{lang} .deb: `apt-get download debian-reference-{lang}` into "
                         "$FORGE_DEBIAN_DEBS, or run the tests once")  # fmt: skip
            subprocess.run(["dpkg", "-x", str(debs[-1]), str(root)], check=True)
            (root / ".extracted").write_text(debs[-1].name)
        out += sorted((root / "usr/share/debian-reference").glob("*.pdf"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("pdfs", nargs="*", type=Path)
    parser.add_argument("--debian", action="store_true", help="the Debian Reference PDFs (en, es, zh-cn)")
    args = parser.parse_args()
    pdfs = (debian_pdfs() if args.debian else []) + list(args.pdfs)
    if not pdfs:
        parser.error("give PDF files or --debian")
    print(f"{'pdf':<34} {'pages':>5} {'plain pages/s':>14} {'forge pages/s':>14} {'ratio':>6}  forge found")
    totals = [0, 0.0, 0.0]
    for path in pdfs:
        plain_s, (pages, _) = best_of(plain, path)
        forge_s, (_, _, found) = best_of(forge, path)
        totals = [totals[0] + pages, totals[1] + plain_s, totals[2] + forge_s]
        print(f"{path.name:<34} {pages:>5} {pages / plain_s:>14.0f} {pages / forge_s:>14.0f} "
              f"{plain_s / forge_s:>6.2f}  {', '.join(f'{v:,} {k}' for k, v in found.items())}")  # fmt: skip
    pages, plain_s, forge_s = totals
    print(f"{'all':<34} {pages:>5} {pages / plain_s:>14.0f} {pages / forge_s:>14.0f} {plain_s / forge_s:>6.2f}")


if __name__ == "__main__":
    from results import recorded  # bench/results.py: the output goes to RESULTS.md too

    with recorded(__file__):
        main()
