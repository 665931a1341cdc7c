"""PDFs written for the tests with PDFium itself (pypdfium2, already a dependency): headings in a larger bold font,
paragraphs wrapped and justified-free, code in Courier, a running header and a page number on every page; or a scan
(pages that are only an image).

    write_pdf(path, [("h1", "Widgets"), ("p", "A widget counts sprockets."), ("code", "$ widget --count")])
    write_scan(path, pages=3)
"""

from __future__ import annotations

import ctypes
import textwrap
from pathlib import Path

PAGE_W, PAGE_H, MARGIN = 595, 842, 72
STYLES = {  # kind -> (font, size, space before, characters per line)
    "h1": ("Helvetica-Bold", 18, 28, 50),
    "h2": ("Helvetica-Bold", 14, 22, 60),
    "p": ("Helvetica", 10, 18, 90),
    "li": ("Helvetica", 10, 14, 86),
    "code": ("Courier", 9, 14, 80),
}


def write_pdf(path: Path, blocks: list[tuple[str, str]], header: str = "Test document") -> Path:
    import pypdfium2 as pdfium
    import pypdfium2.raw as c

    pdf = pdfium.PdfDocument.new()
    page, y, number = None, 0.0, 0

    def text(s: str, x: float, y: float, font: str, size: float) -> None:
        obj = c.FPDFPageObj_NewTextObj(pdf.raw, font.encode(), ctypes.c_float(size))
        buf = ctypes.create_string_buffer((s + "\0").encode("utf-16-le"))
        c.FPDFText_SetText(obj, ctypes.cast(buf, ctypes.POINTER(c.FPDF_WCHAR)))
        c.FPDFPageObj_Transform(obj, 1, 0, 0, 1, x, y)
        c.FPDFPage_InsertObject(page.raw, obj)

    def new_page() -> None:
        nonlocal page, y, number
        if page is not None:
            c.FPDFPage_GenerateContent(page.raw)
        number += 1
        page = pdf.new_page(PAGE_W, PAGE_H)
        text(f"{header} {number}", MARGIN, PAGE_H - 40, "Helvetica", 8)  # the running header, page number in it
        text(str(number), PAGE_W / 2, 30, "Helvetica", 8)  # and a footer of just the number
        y = PAGE_H - MARGIN

    new_page()
    for kind, content in blocks:
        font, size, before, width = STYLES[kind]
        lines = content.split("\n") if kind == "code" else textwrap.wrap(content, width)
        if kind == "li":
            lines = ["• " + lines[0], *("  " + x for x in lines[1:])] if lines else []
        y -= before - size * 1.2
        for line in lines:
            if y < MARGIN:
                new_page()
            text(line, MARGIN, y, font, size)
            y -= size * 1.2
    c.FPDFPage_GenerateContent(page.raw)
    pdf.save(str(path))
    return path


def write_scan(path: Path, pages: int = 2) -> Path:
    """A PDF whose pages are only an image (grey noise): what a scanner without OCR gives."""
    import numpy as np
    import pypdfium2 as pdfium
    import pypdfium2.raw as c

    pdf = pdfium.PdfDocument.new()
    for _ in range(pages):
        page = pdf.new_page(PAGE_W, PAGE_H)
        image = pdfium.PdfImage.new(pdf)
        bitmap = pdfium.PdfBitmap.new_native(150, 200, c.FPDFBitmap_BGR)
        bitmap.to_numpy()[:] = np.random.default_rng(0).integers(0, 255, (200, 150, 3), dtype=np.uint8)
        image.set_bitmap(bitmap)
        image.set_matrix(pdfium.PdfMatrix().scale(PAGE_W, PAGE_H))
        page.insert_obj(image)
        page.gen_content()
    pdf.save(str(path))
    return path
