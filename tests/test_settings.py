"""The one settings object: defaults defined once, checks before any model work, and the
sampler's keyword arguments still accepted (no model needed)."""

from __future__ import annotations

import dataclasses

import pytest

from smc_jax.models.tokenizer import InvalidPromptError, check_prompt
from smc_jax.settings import DEFAULTS, SamplerSettings, names


def test_sample_defaults_are_the_settings_defaults():
    import inspect

    from smc_jax.sampler import logprob, sample

    for fn in (sample, logprob):
        for name, param in inspect.signature(fn).parameters.items():
            if name in names():
                assert param.default == getattr(DEFAULTS, name), (fn.__name__, name)


@pytest.mark.parametrize("changes, message", [
    ({"num_particles": 0}, "num_particles"),
    ({"max_length": 0}, "max_length"),
    ({"ess_threshold": 2.0}, "ess_threshold"),
    ({"resampler": "nope"}, "resampler"),
    ({"at_max_length": "stop"}, "at_max_length"),
    ({"level": "word"}, "level"),
    ({"temperature": 0.0}, "temperature"),
    ({"beam_width": 0}, "beam_width"),
    ({"prompt_as_bytes": True, "level": "token"}, "prompt_as_bytes.*needs level='byte'"),
    ({"heal": False, "level": "token"}, "heal=False.*needs level='byte'"),
    ({"row_buckets": True, "level": "token"}, "row_buckets.*needs level='byte'"),
    ({"heal": "no"}, "heal"),
    ({"prefetch": 16, "level": "token"}, "prefetch.*needs level='byte'"),
    ({"prefetch": -1, "level": "byte"}, "prefetch"),
    ({"prefetch": 16, "prefetch_rows": 1.5, "level": "byte"}, "prefetch_rows"),
    ({"prefetch": 8, "prefetch_slots": -1, "level": "byte"}, "prefetch_slots"),
    ({"prefetch": 8, "prefetch_slots": 0, "level": "byte"}, "prefetch_slots >= 1"),
    ({"prefetch": 8, "prefetch_children": 2.0, "level": "byte"}, "prefetch_children"),
])
def test_bad_settings_are_rejected_on_construction(changes, message):
    with pytest.raises(ValueError, match=message):
        DEFAULTS.replace(**changes)


def test_unknown_setting_is_a_type_error():
    with pytest.raises(TypeError, match="num_particle"):
        DEFAULTS.replace(num_particle=3)


def test_settings_are_frozen_and_build_the_engine():
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULTS.max_length = 3  # type: ignore[misc]
    smc = SamplerSettings(level="local", num_particles=3, max_length=5).smc()
    assert (smc.num_particles, smc.max_length, smc.method) == (3, 5, "local")
    assert DEFAULTS.beam().width == DEFAULTS.beam_width


@pytest.mark.parametrize("prompt", ["\ud800", b"bytes", 3, [{"role": "user"}], [{"role": "user", "content": "a\udfff"}]])
def test_prompts_that_are_not_text_get_a_clear_error(prompt):
    with pytest.raises(InvalidPromptError):
        check_prompt(prompt)


def test_valid_prompts_pass():
    check_prompt("héllo ✓")
    check_prompt([{"role": "user", "content": "hi"}])


def test_expert_with_a_prompt_that_is_not_text_fails_on_construction():
    from smc_jax.sampler import Expert

    with pytest.raises(InvalidPromptError, match="not valid text"):
        Expert(model=None, prompt="\ud800")


def test_sampler_options_are_settings_checked_before_the_experts():
    from smc_jax.sampler import EnsembleSampler

    with pytest.raises(TypeError, match="num_particle"):
        EnsembleSampler([], num_particle=3)  # a misspelt option is named, whatever the experts
    with pytest.raises(ValueError, match="num_particles"):
        EnsembleSampler([], settings=DEFAULTS, num_particles=0)


@pytest.mark.parametrize("weights", [[1.0], [0.2, 0.3, 0.5]])
def test_weights_for_another_number_of_experts_are_refused_before_any_model_work(weights):
    import smc_jax as sj
    from smc_jax.models.lm import LanguageModel

    model = object.__new__(LanguageModel)  # no config, weights or tokenizer: any model work would fail
    with pytest.raises(ValueError, match=rf"{len(weights)} weights given for K = 2 experts"):
        sj.sample([(model, "a"), (model, "b")], "product", weights=weights, level="token")
