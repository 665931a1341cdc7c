"""The architectures: exact parameter counts, validation that fails before any allocation, the HF models."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from forge import ForgeError
from forge.config import ModelConfig, load_config
from pretrain.model import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    build_model,
    count_parameters,
    hf_config,
    validate,
)

CONFIGS = sorted((Path(__file__).resolve().parent.parent / "configs").glob("*.yaml"))
SHIPPED = CONFIGS


def _variant(model: ModelConfig, architecture: str, tie: bool) -> ModelConfig:
    data = model.model_dump(exclude_unset=True) | {"architecture": architecture, "tie_word_embeddings": tie}
    if architecture == "gpt2":
        data.pop("num_key_value_heads", None)
    return ModelConfig(**data)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
@pytest.mark.parametrize("architecture", ["llama", "gpt2"])
@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_parameter_count_matches_built_model(path, architecture, tie):
    """Counted from the config alone == counted on the built model (on the meta device: nothing allocated)."""
    cfg = load_config(path)
    model_cfg = _variant(cfg.model, architecture, tie)
    vocab = cfg.tokenizer.vocab_size
    model = build_model(model_cfg, vocab, device="meta")
    assert count_parameters(model_cfg, vocab) == model.num_parameters()  # HF counts a tied tensor once


def test_shipped_configs_land_near_their_names():
    sizes = {p.stem: count_parameters(load_config(p).model, load_config(p).tokenizer.vocab_size) for p in SHIPPED}
    assert 45e6 <= sizes["50m"] <= 55e6
    assert 320e6 <= sizes["350m"] <= 380e6
    assert 0.95e9 <= sizes["1b"] <= 1.1e9


_shipped_125m = load_config(Path(__file__).resolve().parent.parent / "configs" / "125m.yaml")


def test_125m_config_lands_within_120_130m():
    n = count_parameters(_shipped_125m.model, _shipped_125m.tokenizer.vocab_size)
    assert 120e6 <= n <= 130e6


def test_gpt2_small_shape_is_124m():
    """The reference point: GPT-2 small (50,257 tokens, 12 x 768, tied) is 124,439,808 parameters."""
    gpt2_small = ModelConfig(architecture="gpt2", hidden_size=768, num_layers=12, num_attention_heads=12,
                             intermediate_size=3072, context_length=1024)  # fmt: skip
    assert count_parameters(gpt2_small, 50257) == 124_439_808


def test_shipped_configs_have_no_warnings():
    for path in SHIPPED:
        cfg = load_config(path)
        if cfg.model.init_from:  # the shape is the base's (tests/test_base_model.py); the path is what make fills
            assert cfg.model.init_from == ".cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", path.name
            continue
        assert validate(cfg.model, cfg.tokenizer.vocab_size) == [], path.name


def test_warnings_for_head_dim_feed_forward_and_quantization():
    m = ModelConfig(hidden_size=320, num_layers=2, num_attention_heads=4, intermediate_size=2000)
    text = "\n".join(validate(m, 4096))
    assert "head dim 80" in text
    assert "intermediate_size=2000 is 6.25x" in text
    assert "hidden_size=320 is not a multiple of 256" in text
    assert "intermediate_size=2000 is not a multiple of 256" in text
    gpt2 = ModelConfig(architecture="gpt2", hidden_size=256, num_layers=2, num_attention_heads=4, intermediate_size=768)
    assert any("gpt2 uses about 4x" in w for w in validate(gpt2, 4096))


def test_activation_follows_the_architecture_unless_set():
    assert ModelConfig(architecture="gpt2").activation == "gelu_new"
    assert ModelConfig(architecture="llama").activation == "silu"
    assert ModelConfig(architecture="gpt2", activation="relu").activation == "relu"
    cfg = load_config(None, ["model.architecture=gpt2"])
    assert cfg.model.activation == "gelu_new"


@pytest.mark.parametrize(
    "override, needle",
    [
        ("model.num_attention_heads=7", "model.num_attention_heads=7 does not divide model.hidden_size=768"),
        ("model.hidden_size=-768", "model.hidden_size=-768"),
        ("model.num_layers=-2", "model.num_layers=-2"),
        ("model.intermediate_size=0", "model.intermediate_size=0"),
        ("model.num_key_value_heads=5", "model.num_key_value_heads=5 does not divide"),
    ],
)
def test_bad_shapes_fail_at_load_with_one_line(override, needle):
    with pytest.raises(ForgeError) as err:
        load_config(None, [override])
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_vocab_mismatch_fails_before_any_allocation(monkeypatch):
    import transformers

    def boom(*args, **kwargs):
        raise AssertionError("a model was built")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", boom)
    m = ModelConfig(vocab_size=32001, hidden_size=256, num_layers=2, num_attention_heads=4, intermediate_size=768)
    for call in (lambda: validate(m, 32000), lambda: build_model(m, 32000), lambda: count_parameters(m, 32000)):
        with pytest.raises(ForgeError) as err:
            call()
        message = str(err.value)
        assert "model.vocab_size=32001" in message and "32000" in message and "\n" not in message


def test_bad_configs_through_the_cli_print_one_line():
    from forge.cli import app

    runner = CliRunner()
    for override in ("model.num_attention_heads=5", "model.hidden_size=-1", "model.vocab_size=4097"):
        result = runner.invoke(app, ["plan", "--config", "configs/tiny-cpu.yaml", "--set", override])
        assert result.exit_code == 2, result.output
        lines = [line for line in result.output.splitlines() if line.startswith("error:")]
        assert len(lines) == 1, result.output


@pytest.mark.parametrize("architecture", ["llama", "gpt2"])
def test_built_model_trains_and_carries_the_token_convention(architecture):
    import torch

    m = ModelConfig(architecture=architecture, hidden_size=64, num_layers=2, num_attention_heads=2,
                    intermediate_size=256 if architecture == "gpt2" else 192, context_length=32)  # fmt: skip
    model = build_model(m, 300)
    cfg = model.config
    assert (cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id) == (PAD_ID, BOS_ID, EOS_ID) == (0, 2, 3)
    assert cfg.model_type == architecture
    names = {type(mod).__name__ for mod in model.modules()}
    if architecture == "llama":
        assert {"LlamaRMSNorm", "LlamaRotaryEmbedding"} <= names
        assert cfg.hidden_act == "silu"
    else:
        assert "LayerNorm" in names and "Dropout" in names
        assert model.transformer.wpe.weight.shape == (32, 64)  # learned positions
        assert cfg.activation_function == "gelu_new"
    assert model.get_input_embeddings().weight.data_ptr() == model.get_output_embeddings().weight.data_ptr()
    ids = torch.randint(0, 300, (2, 16))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss)


def test_hf_config_saves_and_reloads(tmp_path):
    from transformers import AutoConfig

    m = ModelConfig(architecture="llama", hidden_size=128, num_layers=2, num_attention_heads=2,
                    num_key_value_heads=1, intermediate_size=384, rope_theta=50000.0)  # fmt: skip
    hf_config(m, 512).save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert loaded.num_key_value_heads == 1 and loaded.vocab_size == 512
    assert loaded.rope_parameters["rope_theta"] == 50000.0
