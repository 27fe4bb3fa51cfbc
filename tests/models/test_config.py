"""ModelConfig: static (hashable), serialisable, and parsed like transformers parses configs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from tests.helpers import tiny_checkpoints as tc

from smc_jax.models.config_parsing import from_hf_config
from smc_jax.models import ModelConfig, RopeConfig


@pytest.mark.parametrize("arch", tc.ARCHITECTURES)
def test_round_trip_and_hashable(arch):
    config = from_hf_config(tc.hf_config(arch).to_dict())
    assert ModelConfig.from_dict(config.to_dict()) == config
    assert hash(config) == hash(ModelConfig.from_dict(config.to_dict()))


@pytest.mark.parametrize("arch", ["llama", "phi3", "gemma3"])
def test_rope_frequencies_match_transformers(arch):
    """inv_freq per layer equals transformers' own (llama3 scaling, partial rotary, linear)."""
    import transformers as tf

    hf = tc.hf_config(arch)
    config = from_hf_config(hf.to_dict())
    model = tf.AutoModelForCausalLM.from_config(hf)
    rotary = model.model.rotary_emb
    table = config.layer_inv_freq()
    for layer, sliding in enumerate(config.sliding_layers):
        name = "sliding_attention_inv_freq" if sliding else "full_attention_inv_freq"
        expected = getattr(rotary, name if arch == "gemma3" else "inv_freq").numpy()
        np.testing.assert_allclose(table[layer], expected, rtol=1e-6)


def test_gemma3_v4_config_and_multimodal_wrapper():
    """Hub configs from transformers v4: rope_local_base_freq, sliding_window_pattern, and the
    multimodal Gemma3ForConditionalGeneration config whose text_config is the language model."""
    text = {
        "model_type": "gemma3_text", "vocab_size": 100, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 12, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 8,
        "rope_theta": 1e6, "rope_local_base_freq": 1e4, "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        "sliding_window": 16, "sliding_window_pattern": 6, "query_pre_attn_scalar": 168,
    }
    config = from_hf_config({"model_type": "gemma3", "text_config": text})
    assert config.sliding_layers == tuple((i + 1) % 6 != 0 for i in range(12))
    assert config.rope == RopeConfig(theta=1e6, scaling="linear", factor=8.0)
    assert config.rope_local == RopeConfig(theta=1e4)
    assert config.query_scale == pytest.approx(168**-0.5)
    assert config.embed_scale == pytest.approx(32**0.5) and config.norm_offset == 1.0


def test_invalid_configs_are_rejected():
    config = from_hf_config(tc.hf_config("qwen2").to_dict())
    with pytest.raises(ValueError, match="sliding layers need a sliding_window"):
        dataclasses.replace(config, sliding_layers=(True, False))
    with pytest.raises(ValueError, match="not a multiple"):
        dataclasses.replace(config, num_kv_heads=3)
