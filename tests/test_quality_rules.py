"""The quality rules' one table (forge/quality_rules.py) is what the config, profiles and filters are made of."""

from __future__ import annotations

import pickle

from forge.config import DATA_PROFILES, DataConfig, QualityConfig
from forge.quality_rules import QUALITY_RULES
from pretrain.data import quality


def test_every_rule_is_a_setting_of_the_config_in_table_order():
    settings = [r.setting for r in QUALITY_RULES]
    assert list(QualityConfig.model_fields) == ["enabled", "measure_on", *settings]


def test_every_threshold_has_a_value_in_every_profile_and_flags_keep_their_defaults():
    thresholds = {f"quality.{r.setting}" for r in QUALITY_RULES if r.kind != "flag"}
    for profile in ("docs", "web"):
        assert thresholds <= set(DATA_PROFILES[profile])
        q = DataConfig(profile=profile).quality
        assert all(getattr(q, r.setting) is not None for r in QUALITY_RULES)
    assert QualityConfig().c4_drop_lorem_ipsum is True and QualityConfig().c4_drop_curly_brace is False


def test_the_checks_follow_the_table_and_measure_every_metric():
    q = DataConfig(profile="web").quality
    checks = quality.rules(q)
    assert list(dict.fromkeys(c.setting for c in checks)) == [r.setting for r in QUALITY_RULES]
    assert [c.name for c in checks if c.key is not None][:3] == [f"max_top_ngram_chars_ratio[{n}]" for n in (2, 3, 4)]
    values = quality.measure("The cat sat on the mat. " * 40, q)
    assert {c.metric for c in checks} <= set(values)


def test_the_made_config_pickles_for_the_worker_pools():
    data = DataConfig(profile="web", quality=QualityConfig(min_words=7))
    again = pickle.loads(pickle.dumps(data))
    assert again == data and again.quality.min_words == 7 and again.quality.model_fields_set == {"min_words"}
