"""bench/gpu_check.sh: the CPU dry run writes the JSON the GPU run will (every part, its status, seconds and
figures; what needs CUDA skipped), and one part's failure is recorded without stopping the others."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import gpu_check  # noqa: E402


@pytest.fixture(autouse=True)
def no_leftover_work_dirs(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_check.tempfile, "mkdtemp", lambda prefix: str(tmp_path / "work"))


def args_for(out: Path, budget: float = 450.0) -> argparse.Namespace:
    return argparse.Namespace(out=out, dry_run=True, budget=budget, demo_train_seconds=None, vllm_concurrency=4,
                              vllm_max_tokens=8)  # fmt: skip


def test_a_failed_part_is_recorded_and_the_next_one_still_runs(tmp_path, monkeypatch):
    calls = []

    def child(self, name, extra, timeout):
        calls.append(name)
        if name == "train_bf16":
            return "failed: RuntimeError: CUDA out of memory", {}, "Traceback ...\nRuntimeError: CUDA out of memory"
        return "ok", {"tokens_per_s": 100}, ""

    monkeypatch.setattr(gpu_check.Check, "child", child)
    check = gpu_check.Check(args_for(tmp_path / "gpu.json"))
    assert check.part("train_bf16") == {}
    assert check.part("train_compile") == {"tokens_per_s": 100}
    written = json.loads((tmp_path / "gpu.json").read_text())  # rewritten after every part
    assert calls == ["train_bf16", "train_compile"]
    assert written["parts"]["train_bf16"]["status"].startswith("failed: RuntimeError")
    assert "out of memory" in written["parts"]["train_bf16"]["log_tail"]
    assert written["parts"]["train_compile"] == {"status": "ok", "seconds": 0.0, "figures": {"tokens_per_s": 100}}


def test_a_spent_budget_skips_the_parts_left(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check.Check, "child", lambda *a: pytest.fail("no part may start"))
    check = gpu_check.Check(args_for(tmp_path / "gpu.json", budget=10))
    check.part("bnb")
    assert check.report["parts"]["bnb"]["status"] == "skipped: the budget of 10s was spent"


def test_lock_versions_reads_pinned_names_as_pip_spells_them(tmp_path):
    lock = tmp_path / "requirements.lock"
    lock.write_text(
        "pydantic-core==2.50.5 \\\n    --hash=sha256:ab\n    # via pydantic\nPyYAML==6.0.3 ; python_version >= '3.8'\n"
    )
    assert gpu_check.lock_versions(lock) == {"pydantic-core": "2.50.5", "pyyaml": "6.0.3"}
    shipped = gpu_check.lock_versions(ROOT / "requirements.lock")
    assert all(name in shipped for name in gpu_check.WHEELS), "every wheel --download-wheels fetches is locked"


def test_a_dry_run_json_is_refused_for_results(tmp_path, monkeypatch):
    report = tmp_path / "gpu.json"
    report.write_text(json.dumps({"dry_run": True}))
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--record", str(report)])
    with pytest.raises(SystemExit, match="dry run on CPU"):
        gpu_check.main()


@pytest.mark.integration
def test_the_dry_run_runs_every_part_on_cpu_and_writes_the_json(tmp_path):
    out = tmp_path / "out" / "gpu_check.json"
    done = subprocess.run(["bash", "bench/gpu_check.sh", "--dry-run", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["schema"] == "forge-gpu-check/1" and report["dry_run"] is True
    assert report["setup"] == {}, "a dry run installs nothing"
    assert list(report["parts"]) == list(gpu_check.PARTS)
    for name, part in report["parts"].items():
        assert set(part) >= {"status", "seconds", "figures"}, name
        if name != "vllm":
            assert part["status"] == "ok", f"{name}: {part['status']}\n{part.get('log_tail')}"
    assert report["environment"]["cuda_available"] is False and report["environment"]["torch"]
    parts = {name: part["figures"] for name, part in report["parts"].items()}
    assert report["parts"]["vllm"]["status"] == "skipped: no CUDA"
    eager, compiled = parts["train_bf16"], parts["train_compile"]
    assert eager["tokens_per_s"] > 0 and 0 < eager["mfu"] < 1 and eager["model"].startswith("gpt2 ")
    assert eager["forge_tokens_per_s"] > 0 and "forge_over_plain" in eager  # Forge's own loop ran too
    assert compiled["compile_backend"] == "eager" and compiled["speedup_over_eager"] > 0
    assert parts["demo_model"]["steps"] >= 1 and parts["demo_model"]["vocab"] == 512
    bnb = parts["bnb"]
    for name in ("int8", "nf4"):  # quantized for real: smaller in memory, perplexity still a number
        assert bnb[name]["footprint_mb"] < bnb["bf16"]["footprint_mb"], name
        assert math.isfinite(bnb[name]["perplexity"]) and bnb[name]["perplexity_ratio"] > 0
    assert bnb["nf4"]["footprint_mb"] < bnb["int8"]["footprint_mb"]
    assert "===== bnb" in out.with_suffix(".log").read_text()
