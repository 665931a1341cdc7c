"""A synthetic domain a tiny model learns in a minute on 2 cores: a parts catalogue, for tests that need a model that
honestly passes the gate (and one that honestly fails it) without a long training run.

    python tests/catalogue.py DIR      # DIR/docs/catalogue-NN.pdf and DIR/qa.jsonl

The pages are printed as PDFs, 20 to a file, the way a parts catalogue reaches a team: a heading per page, the
sentences as paragraphs, a running header and page numbers (tests/pdfs.py). So every pipeline test on
configs/ci-smoke.yaml reads a folder holding only PDFs.

Each part (a made-up word) has a material and a colour, stated in many catalogue pages in varied sentences; the Q&A
file asks for both ("What is the dravik made of?" -> "brass", qtype material / colour). Every fact recurs in every
split, so held-out questions are answerable by a model that learnt the catalogue, and by nothing else: the answers
are among eight values of the same kind, so multiple choice sits at chance for an untrained model.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from pdfs import write_pdf  # noqa: E402

PAGES_PER_PDF = 20

MATERIALS = ["steel", "brass", "copper", "nylon", "rubber", "glass", "cedar", "carbon"]
COLOURS = ["red", "blue", "green", "yellow", "black", "white", "orange", "purple"]
SENTENCES = [
    "The {part} is made of {material} and painted {colour}.",
    "Every {part} in this range is {colour}, cut from {material}.",
    "Our {part} comes in {colour} only; its body is {material}.",
    "A {part} is a {colour} part made of {material}.",
    "Order the {part} ({material}, {colour}) from the front desk.",
    "We machine each {part} from solid {material} and finish it in {colour}.",
    "Looking for a {colour} part in {material}? The {part} fits most frames.",
    "The {colour} {part} is built from {material} for a long service life.",
]
FILLER = [
    "All parts ship within two days of the order.",
    "Prices on this page include the standard fittings.",
    "Ask the workshop if you need a part that is not listed here.",
    "The catalogue is updated at the start of every month.",
    "Spare screws and washers are sold separately.",
    "Returns are accepted for thirty days if the part is unused.",
    "Bulk orders of more than fifty parts get a discount.",
    "Each part is checked by hand before it leaves the workshop.",
]


def parts(n: int, rng: random.Random) -> list[str]:
    onsets, vowels, codas = "bdfgklmnprstvz", "aeiou", ["", "n", "k", "r", "l", "x", "sh"]
    names: set[str] = set()
    while len(names) < n:
        names.add("".join(rng.choice(onsets) + rng.choice(vowels) for _ in range(2)) + rng.choice(codas))
    return sorted(names)


def write_catalogue(out: Path, n_parts: int = 64, pages: int = 500, seed: int = 0) -> tuple[Path, Path]:
    """Write the pages and the Q&A file under `out`; returns (docs directory, qa.jsonl)."""
    rng = random.Random(seed)
    facts = {p: (rng.choice(MATERIALS), rng.choice(COLOURS)) for p in parts(n_parts, rng)}
    docs = out / "docs"
    docs.mkdir(parents=True, exist_ok=True)
    names = list(facts)
    blocks: list[tuple[str, str]] = []
    for i in range(pages):
        blocks.append(("h1", f"Catalogue page {i + 1}"))
        for part in rng.sample(names, 6):
            material, colour = facts[part]
            blocks.append(("p", rng.choice(SENTENCES).format(part=part, material=material, colour=colour)))
        blocks += [("p", line) for line in rng.sample(FILLER, 2)]
        if (i + 1) % PAGES_PER_PDF == 0 or i + 1 == pages:
            write_pdf(docs / f"catalogue-{i // PAGES_PER_PDF:02d}.pdf", blocks, header="Parts catalogue")
            blocks = []
    qa = out / "qa.jsonl"
    with qa.open("w", encoding="utf-8") as fh:
        for part, (material, colour) in facts.items():
            for question, answer, qtype in ((f"What is the {part} made of?", material, "material"),
                                            (f"What colour is the {part}?", colour, "colour")):  # fmt: skip
                fh.write(json.dumps({"question": question, "answer": answer, "qtype": qtype}) + "\n")
    return docs, qa


if __name__ == "__main__":
    print(*write_catalogue(Path(sys.argv[1])))
