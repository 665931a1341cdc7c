"""A stage's inputs are checked in one place before it writes anything (forge.lineage.require_reads): run on an empty
run, every stage refuses with one message naming each stage it still needs and the command that makes it, and needs
only what its settings and options make it read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forge import ForgeError
from forge.config import load_config
from forge.lineage import Stage, require_reads, stage_of
from forge.paths import run_dir
from forge.stages import STAGES


def complete(cfg, directory: str, status: str = "complete") -> Path:
    stage_dir = run_dir(cfg) / directory
    stage_dir.mkdir(parents=True, exist_ok=True)
    (stage_dir / "manifest.json").write_text(json.dumps({"stage": directory, "status": status}), encoding="utf-8")
    return stage_dir


def refusal(name: str, cfg, **options) -> str:
    with pytest.raises(ForgeError) as refused:
        STAGES[name].load()(cfg, **options)
    return str(refused.value)


@pytest.mark.parametrize(
    ("name", "options", "needs"),
    [
        ("qa", {}, ["data"]),
        ("tokenizer", {}, ["data"]),
        ("pretrain", {}, ["tokenizer"]),
        ("eval", {"target": "pretrain"}, ["data", "qa", "pretrain"]),
        ("eval", {"target": "sft"}, ["data", "qa", "sft"]),
        ("sft", {}, ["qa", "pretrain"]),
        ("promote", {}, ["register"]),
    ],
)
def test_a_stage_on_an_empty_run_names_every_stage_it_needs_and_writes_nothing(name, options, needs):
    cfg = load_config(None)
    message = refusal(name, cfg, **options)
    for need in needs:
        assert f"{need} has not run" in message and f"`forge {need}" in message
    assert all(f"{other} has not run" not in message for other in STAGES if other not in needs)
    assert not run_dir(cfg).exists() or not any(run_dir(cfg).iterdir())


def test_the_missing_stages_are_named_in_pipeline_order_with_what_went_wrong():
    cfg = load_config(None)
    complete(cfg, "data")
    complete(cfg, "qa", status="failed")
    message = refusal("eval", cfg, target="pretrain")
    assert "qa is 'failed'" in message and "pretrain has not run" in message
    assert "data has not run" not in message and "data is" not in message
    assert message.index("`forge qa`") < message.index("`forge pretrain`")


def test_settings_decide_what_is_needed():
    # SFT from a base model of your own needs no pretrain stage; Q&A from your own JSONL needs no data stage
    cfg = load_config(None, ["sft.base_model=/nowhere/base"])
    message = refusal("sft", cfg)
    assert "qa has not run" in message and "pretrain" not in message
    cfg = load_config(None, ["qa.source=/nowhere/pairs.jsonl"])
    message = refusal("qa", cfg)
    assert "has not run" not in message and "/nowhere/pairs.jsonl" in message  # the file's own error instead


def test_complete_stages_pass_and_eval_directories_map_to_the_eval_stage(tmp_path):
    cfg = load_config(None)
    dirs = {d: complete(cfg, d) for d in ("eval-sft", "quantize", "sft")}
    assert require_reads(cfg, "register", ["sft", "eval-sft", "quantize"]) == dirs
    assert stage_of("eval-sft") == "eval" and stage_of("eval-pretrain") == "eval"
    with pytest.raises(ForgeError, match=r"eval-pretrain has not run .*run `forge eval --target pretrain`"):
        require_reads(cfg, "register", ["eval-pretrain", "eval-sft"])


def test_a_read_the_stage_does_not_declare_is_a_bug_named_with_its_fix():
    cfg = load_config(None)
    with pytest.raises(ValueError, match=r"STAGES\['tokenizer'\]\.reads"):
        require_reads(cfg, "tokenizer", ["pretrain"])
    with pytest.raises(ValueError, match=r"from pretrain .*STAGES\['tokenizer'\]\.reads"):
        Stage(name="tokenizer", cfg=cfg, inputs={"model": run_dir(cfg) / "pretrain" / "model"})
    Stage(name="pretrain", cfg=cfg, inputs={"shards": run_dir(cfg) / "tokenizer" / "shards", "id": "literal"})
