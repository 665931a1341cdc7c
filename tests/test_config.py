"""The typed run config: shipped configs load, bad values name the field, overrides apply."""

from __future__ import annotations

from pathlib import Path

import pytest

from forge import ForgeError
from forge.config import ForgeConfig, load_config

CONFIGS = sorted((Path(__file__).resolve().parent.parent / "configs").glob("*.yaml"))


def test_there_are_shipped_configs():
    names = {p.name for p in CONFIGS}
    assert {"tiny-cpu.yaml", "50m.yaml", "125m.yaml", "350m.yaml", "1b.yaml"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_loads(path):
    cfg = load_config(path)
    assert isinstance(cfg, ForgeConfig)
    assert cfg.run_name != "default", "each shipped config names its run"


def test_override_sets_typed_values():
    cfg = load_config(CONFIGS[0], ["train.lr=1e-3", "data.dedup.jaccard_threshold=0.85", "model.dropout=0.2"])
    assert cfg.train.lr == pytest.approx(1e-3)
    assert cfg.data.dedup.jaccard_threshold == pytest.approx(0.85)
    assert cfg.model.dropout == pytest.approx(0.2)


def test_heads_not_dividing_hidden_names_field_value_and_choices():
    with pytest.raises(ForgeError) as err:
        load_config(None, ["model.hidden_size=768", "model.num_attention_heads=10"])
    message = str(err.value)
    assert "model.num_attention_heads=10 does not divide model.hidden_size=768" in message
    assert "12" in message and "\n" not in message


def test_unknown_key_is_an_error_listing_allowed_keys():
    with pytest.raises(ForgeError, match=r"unknown key train\.learning_rate \(allowed: .*\blr\b"):
        load_config(None, ["train.learning_rate=1e-3"])


def test_every_problem_is_reported_at_once():
    with pytest.raises(ForgeError) as err:
        load_config(None, ["train.lr=-1", "model.num_layers=0", "serve.temperature=9"])
    message = str(err.value)
    for field in ("train.lr", "model.num_layers", "serve.temperature"):
        assert field in message


def test_split_must_sum_to_one():
    with pytest.raises(ForgeError, match=r"data\.split=.*sum.* 1"):
        load_config(None, ["data.split={train: 0.9, val: 0.2, test: 0.1}"])


def test_bad_override_syntax_and_bad_yaml_name_the_problem(tmp_path):
    with pytest.raises(ForgeError, match="expected KEY=VALUE"):
        load_config(None, ["train.lr"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  lr: [1\nmodel: {}\n")
    with pytest.raises(ForgeError, match=r"bad\.yaml:\d+ is not valid YAML"):
        load_config(bad)
    with pytest.raises(ForgeError, match="not found"):
        load_config(tmp_path / "missing.yaml")


def test_section_hash_depends_only_on_named_sections():
    base = load_config(None)
    other_train = load_config(None, ["train.lr=1e-2"])
    other_data = load_config(None, ["data.dedup.ngram=7"])
    assert base.section_hash("data") == other_train.section_hash("data")
    assert base.section_hash("data") != other_data.section_hash("data")
    assert base.section_hash("train") != other_train.section_hash("train")


def test_execution_only_fields_leave_the_skip_key_alone():
    base = load_config(None)
    elsewhere = load_config(None, ["data.workers=16", "data.executor=ray", "data.ray_address=head:6379"])
    assert base.section_hash("data") == elsewhere.section_hash("data"), "more cores or a cluster: same documents"
    assert elsewhere.to_yaml() != base.to_yaml(), "but the saved config still records how the stage ran"


def test_resolved_config_round_trips_through_yaml(tmp_path):
    cfg = load_config(CONFIGS[0], ["train.lr=5e-4"])
    saved = tmp_path / "config.yaml"
    saved.write_text(cfg.to_yaml())
    assert load_config(saved) == cfg
