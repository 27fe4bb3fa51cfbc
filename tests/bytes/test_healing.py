"""Token healing (`smc_jax.bytes.healing`) on toy token LMs, against exact sums over tokenizations."""

import itertools

import numpy as np
import pytest

from smc_jax.bytes.beam import BeamConfig
from smc_jax.experts.byte import byte_logprob
from tests.bytes.test_beam import ExactByteLM, make

# Long tokens that a narrow beam commits to and then cannot continue: "abc" vs a|bd, "cab" vs c|ad.
VOCAB = [b"a", b"b", b"c", b"d", b"abc", b"bd", b"cab", b"ad", None]
EOS_ID = 8
STRINGS = [b"".join(s) for n in range(1, 5) for s in itertools.product([b"a", b"b", b"c", b"d"], repeat=n)]


def _make(width, threshold, heal=True, seed=0):
    lm, experts = make(vocab=VOCAB, width=width, threshold=threshold, seed=seed, order=2, max_tokens=8)
    experts = experts.replace(eos_ids=(EOS_ID,), beam=BeamConfig(width=width, threshold=threshold, heal=heal))
    return lm, experts


class _Exact(ExactByteLM):
    def complete(self, x, ctx=()):  # EOS is id 8 here
        terms = [self.logp(ctx)[EOS_ID]] if not x else []
        for t, b in enumerate(self.vocab):
            if b is not None and x and x.startswith(b):
                terms.append(self.logp(ctx)[t] + self.complete(x[len(b):], ctx + (t,)))
        return float(np.logaddexp.reduce(terms)) if terms else -np.inf


@pytest.mark.parametrize("width, threshold", [(1, 0.0), (2, 0.6)])
def test_healing_gives_every_string_positive_probability_below_the_exact_one(width, threshold):
    """Every string has a tokenization (single bytes), so with healing each gets a finite
    prefix and per-byte log-probability under any width and threshold, and never more than the
    exact sum over tokenizations (the end of string is not healed: a threshold can still drop
    the extension that EOS needs, so `complete` is only bounded)."""
    lm, experts = _make(width, threshold, seed=1)
    exact = _Exact(lm, VOCAB, (1,))
    healed = 0
    for x in STRINGS:
        got = byte_logprob(experts, x)
        assert np.isfinite(got.prefix), x
        assert np.all(np.isfinite(got.conditionals)) and np.all(got.conditionals <= 0), (x, got.conditionals)
        assert got.prefix <= exact.prefix(x) + 1e-5, x
        assert got.complete <= exact.complete(x) + 1e-5, x
        assert not np.isnan(got.next_logprobs).any()
        healed += got.healed
    assert healed > 0  # the back-off path ran


def test_without_healing_the_same_beam_loses_strings():
    lm, experts = _make(1, 0.0, heal=False, seed=1)
    lost = sum(not np.isfinite(byte_logprob(experts, x).prefix) for x in STRINGS)
    assert lost > 0


def test_unpruned_beam_never_heals_and_changes_nothing():
    """A beam that never prunes reads every byte that has a tokenization: healing never
    triggers and the values are those without healing (the exact ones)."""
    (lm, on), (_, off) = _make(16, 0.0, heal=True), _make(16, 0.0, heal=False)
    exact = _Exact(lm, VOCAB, (1,))
    for x in STRINGS[:40]:
        a, b = byte_logprob(on, x), byte_logprob(off, x)
        assert a.healed == 0
        np.testing.assert_array_equal(a.conditionals, b.conditionals)
        np.testing.assert_array_equal(a.next_logprobs, b.next_logprobs)
        assert a.prefix == b.prefix
        np.testing.assert_allclose(a.prefix, exact.prefix(x), atol=2e-5)
