"""Teacher forcing against the enumeration reference (smc_jax.smc.exact.string_logprobs)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from smc_jax.smc.exact import enumerate_strings, string_logprobs
from smc_jax.experts import ExpertStack, eos_symbol, pad_sequences, sequence_logprobs, teacher_force
from smc_jax.smc.state import PAD_SYMBOL


@pytest.mark.parametrize("which", ["tables", "ngrams"])
def test_teacher_forcing_matches_enumeration(overlapping_tables, ngram_experts, which):
    experts = ExpertStack(groups=overlapping_tables if which == "tables" else ngram_experts)
    strings = enumerate_strings(experts.alphabet_size, 4)
    symbols, lengths = pad_sequences(strings, experts.alphabet_size)
    scores = teacher_force(experts, symbols, lengths)
    want = string_logprobs(experts, strings)
    got = np.asarray(scores.string_logprobs, np.float64)
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(sequence_logprobs(experts, symbols, lengths)), got)

    # Step t holds p_k(. | x_<t): a distribution wherever the prefix is in the expert's support,
    # and the chain rule along each string reproduces log p_k(x).
    steps = np.asarray(scores.step_logprobs, np.float64)
    assert steps.shape == (len(strings), symbols.shape[1] + 1, experts.num_experts, experts.alphabet_size + 1)
    norm = np.logaddexp.reduce(steps, axis=-1)
    assert np.all((np.abs(norm) < 1e-5) | np.isneginf(norm))
    i = strings.index((1, 0))
    chain = steps[i, 0, :, 1] + steps[i, 1, :, 0] + steps[i, 2, :, eos_symbol(experts.alphabet_size)]
    np.testing.assert_allclose(chain, want[i], rtol=1e-6)


def test_padding_and_validation():
    symbols, lengths = pad_sequences([[0, 1], [], [2]], alphabet_size=3, width=3)
    np.testing.assert_array_equal(symbols, [[0, 1, PAD_SYMBOL], [PAD_SYMBOL] * 3, [2, PAD_SYMBOL, PAD_SYMBOL]])
    np.testing.assert_array_equal(lengths, [2, 0, 1])
    with pytest.raises(ValueError, match=r"sequence 1 \(\[0, 3\]\) has symbols outside 0..2"):
        pad_sequences([[0], [0, 3]], alphabet_size=3)
    with pytest.raises(ValueError, match="shorter than the longest"):
        pad_sequences([[0, 1, 2]], alphabet_size=3, width=2)


def test_jittable_and_empty_strings(overlapping_tables):
    experts = ExpertStack(groups=overlapping_tables)
    symbols, lengths = pad_sequences([[], []], experts.alphabet_size)
    assert symbols.shape == (2, 0)
    inside = jax.jit(lambda e, s, n: jnp.sum(sequence_logprobs(e, s, n), axis=1))
    want = string_logprobs(experts, [()]).sum(1)
    np.testing.assert_allclose(np.asarray(inside(experts, symbols, lengths)), np.repeat(want, 2), rtol=1e-6)
