"""bench/results.py: each bench script's latest output replaces its own block of RESULTS.md, and only on success."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import results  # noqa: E402


def test_a_run_replaces_its_own_block_and_leaves_the_others(tmp_path, monkeypatch):
    out = tmp_path / "RESULTS.md"
    out.write_text("# Results\n\nHand-measured figures.\n")
    monkeypatch.setattr(results, "RESULTS", out)
    monkeypatch.setattr(sys, "argv", ["pdf_extract.py", "--debian"])
    with results.recorded("/x/bench/pdf_extract.py"):
        print("all  61  838  136  0.16")
    monkeypatch.setattr(sys, "argv", ["dedup.py"])
    with results.recorded("/x/bench/dedup.py"):
        print("throughput ratio 3.1x")
    monkeypatch.setattr(sys, "argv", ["pdf_extract.py", "--debian"])
    with results.recorded("/x/bench/pdf_extract.py"):
        print("all  61  800  140  0.18")
    text = out.read_text()
    assert text.startswith("# Results\n\nHand-measured figures.\n")
    assert text.count("<!-- bench/pdf_extract.py -->") == 1 and "0.18" in text and "0.16" not in text
    assert "`python bench/pdf_extract.py --debian` (" in text and "throughput ratio 3.1x" in text
    assert text.index("bench/pdf_extract.py -->") < text.index("bench/dedup.py -->"), "a block keeps its place"


def test_a_failed_run_a_trial_run_and_a_child_process_record_nothing(tmp_path, monkeypatch):
    out = tmp_path / "RESULTS.md"
    monkeypatch.setattr(results, "RESULTS", out)
    monkeypatch.setattr(sys, "argv", ["dedup.py"])
    with pytest.raises(RuntimeError), results.recorded("bench/dedup.py"):
        print("half a table")
        raise RuntimeError("interrupted")
    for argv in (["dedup.py", "--no-record"], ["dedup.py", "--child", "forge"]):
        monkeypatch.setattr(sys, "argv", argv)
        with results.recorded("bench/dedup.py"):
            print("a figure")
    assert not out.exists()
