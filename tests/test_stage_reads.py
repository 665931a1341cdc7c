"""Skipping that cannot go stale: a stage's skip key is the config it declares (forge.stages), its inputs and its code.

The declarations are checked against the code that reads the config; the fingerprint against real edits of a copy
of the project; and `forge plan` is run on such a copy to see a stage re-run or skipped for the right reasons.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from forge.code import code_closure, code_fingerprint
from forge.config import ForgeConfig, load_config
from forge.stages import STAGES

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = set(ForgeConfig.model_fields) - {"run_name", "seed"}  # the seed is in every key; the name is the directory
STAGE_MODULES = {spec.module for spec in STAGES.values()}


def config_reads(path: Path) -> dict[str, int]:
    """Every `cfg.<section>` or `cfg.<section>.<field>` the source reads, with a line where it does."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    inner = set()  # `cfg.model` nodes that are part of a longer `cfg.model.init_from`
    reads: dict[str, int] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        value = node.value
        if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) and value.value.id == "cfg":
            if value.attr in SECTIONS:
                reads.setdefault(f"{value.attr}.{node.attr}", node.lineno)
                inner.add(id(value))
        elif isinstance(value, ast.Name) and value.id == "cfg" and node.attr in SECTIONS and id(node) not in inner:
            reads.setdefault(node.attr, node.lineno)
    return reads


def own_modules(module: str) -> dict[str, Path]:
    """The stage's module and the modules of its own package it runs (not other stages' modules)."""
    package = module.rpartition(".")[0]
    return {
        name: path
        for name, path in code_closure(module).items()
        if name == module or (name.startswith(package + ".") and name not in STAGE_MODULES)
    }


@pytest.mark.parametrize("stage", [name for name, spec in STAGES.items() if spec.settings])
def test_every_setting_a_stage_reads_is_in_its_declared_settings(stage):
    spec = STAGES[stage]
    undeclared = []
    for name, path in own_modules(spec.module).items():
        for read, line in config_reads(path).items():
            if read not in spec.settings and read.partition(".")[0] not in spec.settings:
                undeclared.append(f"{name}:{line} reads cfg.{read}")
    assert not undeclared, f"add to STAGES[{stage!r}].settings in forge/stages.py: {undeclared}"


def test_the_scan_sees_a_field_read_through_its_section(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("def f(cfg):\n    return cfg.sft.system_prompt, cfg.eval\n")
    assert config_reads(source) == {"sft.system_prompt": 2, "eval": 2}


def test_a_declared_field_is_hashed_alone_and_a_section_whole():
    base = load_config(None)
    prompt = load_config(None, ["sft.system_prompt=You answer questions about git."])
    lr = load_config(None, ["sft.lr=1e-5"])
    assert base.section_hash("sft.system_prompt") != prompt.section_hash("sft.system_prompt")
    assert base.section_hash("sft.system_prompt") == lr.section_hash("sft.system_prompt")
    assert base.section_hash("sft") != lr.section_hash("sft")


# ----------------------------------------------------------------------------------------------------------------
# the code fingerprint


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def fingerprint(module: str, root: Path) -> str:
    code_fingerprint.cache_clear()  # the cache is per process; these edits happen within one
    return code_fingerprint(module, root)


def test_the_fingerprint_follows_imports_and_ignores_comments_and_libraries(tmp_path):
    write(tmp_path, {
        "pretrain/__init__.py": "",
        "pretrain/stage.py": "import json\nfrom pretrain import rules\n\ndef run():\n    return rules.LIMIT\n",
        "pretrain/rules.py": "def later():\n    from models.family import NAME\n\nLIMIT = 3\n",
        "pretrain/unused.py": "X = 1\n",
        "models/__init__.py": "",
        "models/family.py": "NAME = 'llama'\n",
    })  # fmt: skip
    closure = code_closure("pretrain.stage", tmp_path)
    assert set(closure) == {"pretrain", "pretrain.stage", "pretrain.rules", "models", "models.family"}
    first = fingerprint("pretrain.stage", tmp_path)

    write(tmp_path, {"pretrain/rules.py": "def later():\n    from models.family import NAME  # why\n\n\nLIMIT = 3\n"})
    assert fingerprint("pretrain.stage", tmp_path) == first, "a comment and a blank line change nothing"
    write(tmp_path, {"pretrain/unused.py": "X = 2\n"})
    assert fingerprint("pretrain.stage", tmp_path) == first, "a module the stage does not import is not its code"
    write(tmp_path, {"models/family.py": "NAME = 'qwen2'\n"})
    assert fingerprint("pretrain.stage", tmp_path) != first, "an import inside a function is followed"


# ----------------------------------------------------------------------------------------------------------------
# the real CLI on a copy of the project: a stage re-runs exactly when what it reads or runs changed


@pytest.fixture
def project_copy(tmp_path):
    copy = tmp_path / "forge-copy"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("forge", "pretrain", "models", "evaluation", "finetune", "serve", "registry", "configs"):
        shutil.copytree(ROOT / name, copy / name, ignore=skip)
    return copy


def forge_plan(copy: Path, runs: Path, *overrides: str) -> str:
    sets = [arg for o in overrides for arg in ("--set", o)]
    env = {**os.environ, "PYTHONPATH": str(copy), "FORGE_RUNS_DIR": str(runs)}
    proc = subprocess.run(
        [sys.executable, "-m", "forge.cli", "plan", "--config", "configs/tiny-cpu.yaml", "--run", "skip", *sets],
        cwd=copy, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout + proc.stderr


@pytest.mark.integration
def test_a_stage_reruns_when_a_setting_it_reads_or_its_code_changes_and_is_skipped_otherwise(project_copy, tmp_path):
    runs = tmp_path / "runs"
    skipped = "plan: up to date, skipped"
    out = forge_plan(project_copy, runs)
    assert skipped not in out and "re-running" not in out

    assert skipped in forge_plan(project_copy, runs, "eval.text_items=150"), "the plan does not read eval"
    out = forge_plan(project_copy, runs, "train.max_steps=77")
    assert "plan: re-running, its settings changed" in out and skipped not in out

    plan = project_copy / "pretrain" / "plan.py"
    plan.write_text(plan.read_text() + "\n# a comment changes nothing\n")
    assert skipped in forge_plan(project_copy, runs, "train.max_steps=77")
    sft = project_copy / "finetune" / "sft.py"
    sft.write_text(sft.read_text() + "\nEDITED = True\n")
    assert skipped in forge_plan(project_copy, runs, "train.max_steps=77"), "SFT's code is not the plan's"
    plan.write_text(plan.read_text() + "\nEDITED = True\n")
    out = forge_plan(project_copy, runs, "train.max_steps=77")
    assert "plan: re-running, its code changed" in out and skipped not in out
    assert skipped in forge_plan(project_copy, runs, "train.max_steps=77")


def test_the_data_stage_code_includes_the_quality_rules_table_but_not_the_framework():
    closure = code_closure("pretrain.data.stage")
    assert "pretrain.data.filters" in closure and "forge.quality_rules" in closure
    assert not [m for m in closure if m.startswith("forge.") and m != "forge.quality_rules"]
    assert "finetune.sft" not in closure
