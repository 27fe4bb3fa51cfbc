"""`smc.draw.draw_symbols`: the two-stage draw over large alphabets samples w_a / sum w exactly
(frequencies against the probabilities, chi-square), never draws a zero-weight symbol, and its
log-normalizer is the log-sum-exp; small alphabets keep `jax.random.categorical`'s draws."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from smc_jax.smc.draw import TWO_STAGE_FROM, draw_symbols


def _logits(size: int, seed: int) -> np.ndarray:
    """Uneven weights with zero-weight symbols: whole blocks, scattered ones and the padded tail."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.0, 2.0, size).astype(np.float32)
    logits[rng.random(size) < 0.2] = -np.inf
    logits[64:192] = -np.inf  # blocks 2 and 3 of 32 symbols: all zero
    logits[-5:] = -np.inf
    return logits


@pytest.mark.parametrize("size", [1000, 1023])  # 1023: the last block is padded
def test_two_stage_draw_matches_the_distribution(size):
    logits = _logits(size, seed=size)
    p = np.exp(logits.astype(np.float64))
    p /= p.sum()
    n = 400_000
    rows = jnp.broadcast_to(jnp.asarray(logits), (n, size))
    symbols, log_norm = jax.jit(lambda k, x: draw_symbols(k, x, block=32, two_stage_from=64))(jax.random.key(0), rows)
    symbols = np.asarray(symbols)
    np.testing.assert_allclose(np.asarray(log_norm), np.logaddexp.reduce(logits), rtol=1e-5)
    assert np.all(p[symbols] > 0), "a zero-weight symbol was drawn"
    counts = np.bincount(symbols, minlength=size)
    # Chi-square over the symbols with an expected count >= 5; the rest pooled.
    expected = n * p
    big = expected >= 5
    observed = np.append(counts[big], counts[~big].sum())
    wanted = np.append(expected[big], expected[~big].sum())
    assert stats.chisquare(observed, wanted).pvalue > 1e-4
    # The first stage alone: each block's frequency against its mass.
    blocks = np.bincount(symbols // 32, minlength=-(-size // 32)) / n
    want_blocks = np.add.reduceat(p, np.arange(0, size, 32))
    np.testing.assert_allclose(blocks, want_blocks, atol=5 * np.sqrt(want_blocks.max() / n))


def test_two_stage_draw_is_taken_for_large_alphabets_only():
    key = jax.random.key(3)
    small = jax.random.normal(key, (4, TWO_STAGE_FROM - 1))
    symbols, log_norm = draw_symbols(key, small)
    np.testing.assert_array_equal(symbols, jax.random.categorical(key, small, axis=-1))
    np.testing.assert_allclose(log_norm, jax.nn.logsumexp(small, axis=-1), rtol=1e-6)
    large = jax.random.normal(key, (4, 49_153))  # SmolLM2's vocabulary plus EOS
    symbols, log_norm = jax.jit(draw_symbols)(key, large)
    assert symbols.dtype == jnp.int32 and symbols.shape == (4,) and int(symbols.max()) < 49_153
    np.testing.assert_allclose(log_norm, jax.nn.logsumexp(large, axis=-1), rtol=1e-5)


def test_all_zero_row_gives_minus_infinity():
    logits = jnp.full((2, 3000), -jnp.inf).at[1, 2999].set(0.0)
    symbols, log_norm = draw_symbols(jax.random.key(0), logits)
    assert np.asarray(log_norm)[0] == -np.inf and np.asarray(log_norm)[1] == 0.0
    assert int(symbols[1]) == 2999


def _padded_two_stage(key, logits, block):
    """The two-stage draw over the alphabet padded with -inf to whole blocks (the definition)."""
    rows, size = logits.shape
    blocks = -(-size // block)
    padded = jnp.pad(logits, ((0, 0), (0, blocks * block - size)), constant_values=-jnp.inf).reshape(rows, blocks, block)
    block_lse = jax.nn.logsumexp(padded, axis=-1)
    key_block, key_symbol = jax.random.split(key)
    b = jax.random.categorical(key_block, block_lse, axis=-1)
    a = jax.random.categorical(key_symbol, jnp.take_along_axis(padded, b[:, None, None], axis=1)[:, 0], axis=-1)
    return (b * block + a).astype(jnp.int32), jax.nn.logsumexp(block_lse, axis=-1)


@pytest.mark.parametrize("size, block", [(1024, 256), (1025, 256), (1324, 256), (2047, 256), (49153, 256), (1100, 2048)])
def test_unpadded_blocks_draw_what_the_padded_alphabet_draws(size, block):
    """Only a partial last block is padded: same key, same symbols and log-normalizers, bit for
    bit, as the draw over the padded alphabet (also when the last block is drawn, and when the
    whole alphabet is one partial block)."""
    rng = np.random.default_rng(size)
    logits = (rng.normal(size=(6, size)) * 4).astype(np.float32)
    logits[rng.random(logits.shape) < 0.3] = -np.inf
    logits[0, -1] = 60.0  # row 0 almost surely draws the last symbol (in the partial block)
    logits = jnp.asarray(logits)
    draw = jax.jit(lambda k: draw_symbols(k, logits, block=block, two_stage_from=1024))
    reference = jax.jit(lambda k: _padded_two_stage(k, logits, block))
    for seed in range(20):
        (symbols, log_norm), (ref_symbols, ref_log_norm) = draw(jax.random.key(seed)), reference(jax.random.key(seed))
        np.testing.assert_array_equal(symbols, ref_symbols)
        np.testing.assert_array_equal(np.asarray(log_norm).view(np.uint32), np.asarray(ref_log_norm).view(np.uint32))
    assert int(symbols[0]) == size - 1
