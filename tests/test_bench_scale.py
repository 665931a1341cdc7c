"""bench/scale.py's growth fit and extrapolation, and bench/scale_corpus.py's generator: unique paragraphs, and the
near and exact copies in the shares asked for, each caught by the data stage's own dedup measures."""

from __future__ import annotations

import math
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import scale  # noqa: E402
import scale_corpus  # noqa: E402

from pretrain.data.dedup import exact_hash, normalized_words  # noqa: E402
from pretrain.data.stdlib_corpus import stdlib_root  # noqa: E402


def test_growth_per_doubling_and_exponent_of_known_series():
    sizes = [1000, 2000, 4000, 8000]
    linear = scale.fit_growth(sizes, [3.0 * n for n in sizes])
    assert linear.exponent == pytest.approx(1.0) and linear.per_doubling == pytest.approx(2.0)
    n_log_n = scale.fit_growth(sizes, [n * math.log(n) for n in sizes])
    assert 1.05 < n_log_n.exponent < 1.15, "n log n grows a little faster than linear at these sizes"
    flat = scale.fit_growth(sizes, [42.0] * 4)
    assert flat.exponent == pytest.approx(0.0) and flat.per_doubling == pytest.approx(1.0)
    square_root = scale.fit_growth(sizes, [n**0.5 for n in sizes])
    assert square_root.per_doubling == pytest.approx(2**0.5)


def test_fit_is_least_squares_over_noisy_points():
    # a linear series with the middle point 20% high: the slope through all three, not the last two
    growth = scale.fit_growth([1000, 2000, 4000], [10.0, 24.0, 40.0])
    expected = (math.log(40) - math.log(10)) / (math.log(4000) - math.log(1000))
    assert growth.exponent == pytest.approx(expected)
    two_last = (math.log(40) - math.log(24)) / math.log(2)
    assert growth.exponent != pytest.approx(two_last)


def test_extrapolation_starts_from_the_largest_size_along_the_slope():
    sizes, seconds = [4000, 1000, 2000], [40.0, 10.0, 20.0]  # any order
    growth = scale.fit_growth(sizes, seconds)
    assert scale.extrapolate(sizes, seconds, growth, 4000) == pytest.approx(40.0)
    assert scale.extrapolate(sizes, seconds, growth, 4_000_000) == pytest.approx(40_000.0)
    quadratic = scale.fit_growth([1000, 2000], [1.0, 4.0])
    assert scale.extrapolate([1000, 2000], [1.0, 4.0], quadratic, 20_000) == pytest.approx(400.0)
    # 500M tokens at 500 tokens per document are a million documents
    assert scale.documents_for(500e6, 500.0) == pytest.approx(1e6)


def test_a_falling_value_is_not_extrapolated_and_the_line_gives_fixed_and_marginal_costs():
    sizes = [1000, 2000, 4000]
    falling = scale.fit_growth(sizes, [30.0, 18.0, 21.0])  # a fixed-work stage on a noisy machine
    assert falling.exponent < 0 and scale.extrapolate(sizes, [30.0, 18.0, 21.0], falling, 1e6) is None
    line = scale.fit_linear(sizes, [20.0 + 0.005 * n for n in sizes])  # 20 s of start-up, 5 ms a document
    assert line.fixed == pytest.approx(20.0) and line.per_doc == pytest.approx(0.005)
    assert line.at(1_000_000) == pytest.approx(5020.0)
    assert scale.fit_linear(sizes, [30.0, 18.0, 21.0]).at(1e6) is None
    # start-up dominates: the log-log slope is well under the linear growth that larger corpora will show
    assert scale.fit_growth(sizes, [20.0 + 0.005 * n for n in sizes]).exponent < 0.5


def test_fit_refuses_what_has_no_slope():
    with pytest.raises(ValueError, match="two or more distinct sizes"):
        scale.fit_growth([1000, 1000], [1.0, 2.0])
    with pytest.raises(ValueError, match="positive"):
        scale.fit_growth([1000, 2000], [0.0, 2.0])


def test_human_units_of_the_table():
    assert scale.human_seconds(12.34) == "12.3 s"
    assert scale.human_seconds(3 * 3600) == "3.0 h"
    assert scale.human_bytes(3 * 2**30) == "3.0 GB" and scale.human_bytes(512 * 2**20) == "512 MB"


@pytest.fixture(scope="module")
def chain() -> scale_corpus.MarkovChain:
    """A chain of the json and email packages' prose and the language-reference topics: parsing every stdlib
    source takes ~10 s on 2 busy cores; this takes ~1 s and is the same kind of text."""
    return scale_corpus.MarkovChain.from_paragraphs(
        [p for package in ("json", "email") for p in scale_corpus.stdlib_prose(stdlib_root() / package)]
    )


def paragraphs(text: str) -> list[str]:
    return [p for p in text.split("\n\n") if not p.startswith("#")]


def shingles(text: str, n: int = 5) -> set[tuple[str, ...]]:
    words = normalized_words(text)
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def test_generated_paragraphs_are_unique_and_copies_come_in_their_shares(chain):
    docs = list(scale_corpus.generate(chain, 400, seed=3, near_dup_share=0.1, exact_dup_share=0.05))
    kinds = Counter(d.kind for d in docs)
    assert kinds == {"unique": 340, "near_dup": 40, "exact_dup": 20}
    assert len({d.id for d in docs}) == 400
    unique = [d for d in docs if d.kind == "unique"]
    normalised = [" ".join(normalized_words(p)) for d in unique for p in paragraphs(d.text)]
    assert len(normalised) >= 3 * len(unique), "an intro and two or more sections of paragraphs each"
    assert len(set(normalised)) == len(normalised), "no paragraph twice, under the dedup stage's normalisation"
    assert len({exact_hash(d.text) for d in unique}) == len(unique)
    words = [len(d.text.split()) for d in unique]
    assert 200 < sum(words) / len(words) < 600, "documents of a few hundred words"
    assert all(d.text.startswith("# ") and "\n\n## " in d.text for d in unique), "a title and sections"

    by_id = {d.id: d for d in docs}
    for doc in docs:
        if doc.kind == "unique":
            continue
        original = by_id[doc.source]
        assert original.kind == "unique" and int(doc.id[4:]) > int(original.id[4:]), "copies of earlier documents"
        if doc.kind == "exact_dup":
            assert doc.text == original.text
        else:
            assert exact_hash(doc.text) != exact_hash(original.text)
            a, b = shingles(doc.text), shingles(original.text)
            assert 0.8 <= len(a & b) / len(a | b) < 1.0, "near copies are near duplicates at the stage's threshold"


def test_generation_is_a_function_of_the_seed(chain):
    def texts(seed: int) -> list[str]:
        return [d.text for d in scale_corpus.generate(chain, 60, seed, 0.05, 0.02)]

    assert texts(1) == texts(1) and texts(1) != texts(2)


def test_bad_shares_and_an_exhausted_chain_are_errors(chain):
    with pytest.raises(ValueError, match="near_dup_share"):
        list(scale_corpus.generate(chain, 10, 0, 0.6, 0.5))
    small = scale_corpus.MarkovChain.from_paragraphs(["The parser reads the file. The file is closed by the parser."])
    with pytest.raises(RuntimeError, match="train it on more paragraphs"):
        list(scale_corpus.generate(small, 50, 0, 0.0, 0.0))
