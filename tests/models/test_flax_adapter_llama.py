"""The Flax adapter on a model that is not ours: a Llama decoder written as a plain linen module
(`flax_llama_reference`, Meta's interleaved rotary layout, no smc_jax import), with random weights,
wrapped by `FlaxLM.from_linen`. The same weights, converted to a Hugging Face checkpoint and
loaded by smc_jax's own Llama port (and by transformers' torch Llama), give the same next-token
log-probs; token- and byte-level SMC runs give the same samples and log Z-hat as the port."""

from __future__ import annotations

from tests.helpers import flax_llama_reference as ref
import jax
import numpy as np
import pytest
from tests.helpers import tiny_checkpoints as tc

import smc_jax
from smc_jax.models import load_model
from smc_jax.models.flax_adapter import FlaxLM

TOLERANCE = 1e-4
PROMPTS = ("ab", "ba a")


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """pairs(tied) -> (the Flax model through the adapter, the same weights through smc_jax's
    Llama port, the checkpoint directory), built once per module."""
    built = {}

    def get(tied: bool):
        if tied not in built:
            config = ref.LlamaConfig(tied=tied)
            variables = ref.init_params(config, seed=3)
            directory = ref.save_hf_checkpoint(config, variables, tmp_path_factory.mktemp("flax_llama"))
            hf_tokenizer = tc.save_tokenizer(directory)
            flax_lm = FlaxLM.from_linen(ref.FlaxLlama(config), variables, config.vocab_size, hf_tokenizer,
                                        name="flax-llama")
            built[tied] = flax_lm, load_model(directory), directory
        return built[tied]

    return get


def _log_probs(logits) -> np.ndarray:
    return np.asarray(jax.nn.log_softmax(np.asarray(logits, np.float32), axis=-1))


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_next_token_log_probs_equal_the_builtin_port_and_transformers(pairs, tied):
    """Every position of three sequences (forward) and the next token after prompts of several
    lengths (prefill, as the samplers call it): within 1e-4 of the port and of torch's Llama."""
    flax_lm, native, directory = pairs(tied)
    tokens = np.random.default_rng(0).integers(3, tc.VOCAB, size=(3, 11)).astype(np.int32)
    got = _log_probs(flax_lm.forward(tokens))
    assert got.std() > 0.5  # logits far from flat: a wrong layout would show
    np.testing.assert_allclose(got, _log_probs(native.forward(tokens)), atol=TOLERANCE)
    for length in (1, 6, 11):
        prompt = tokens[length % 3, :length].tolist()
        np.testing.assert_allclose(_log_probs(flax_lm.prefill(prompt)[1]), _log_probs(native.prefill(prompt)[1]),
                                   atol=TOLERANCE)
    transformers = pytest.importorskip("transformers")
    torch_llama = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    np.testing.assert_allclose(got, _log_probs(tc.torch_logits(torch_llama, tokens)), atol=TOLERANCE)


# The byte level compiles two byte-level SMC programs (about a minute of CPU): slow.
@pytest.mark.parametrize("level", ["token", pytest.param("byte", marks=pytest.mark.slow)])
def test_ensembles_equal_the_builtin_port(pairs, level):
    """A product ensemble of the model under two prompts: the same samples and log Z-hat from the
    adapter (full forward per step) as from the port (prompt caches, key/value pool)."""
    flax_lm, native, _ = pairs(False)
    runs = [smc_jax.sample([(m, PROMPTS[0]), (m, PROMPTS[1])], "product", level=level, num_particles=4,
                           max_length=3 if level == "byte" else 4, beam_width=2, seed=5)
            for m in (flax_lm, native)]
    assert len(runs[0].sequences) == 4
    assert runs[0].sequences == runs[1].sequences
    assert np.isfinite(runs[0].log_Z)
    np.testing.assert_allclose(runs[0].log_Z, runs[1].log_Z, atol=TOLERANCE)
