"""Log-space sum tree: range log-masses against float64 brute force."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smc_jax.bytes.sumtree import build_sum_tree, leaf_logprobs, range_logmass

#: Log-space tolerance: |log m - log m_exact| <= LOG_TOLERANCE * (1 + |log m_exact|), i.e. a
#: relative mass error of 1e-5, loosened where the log itself is large (f32 log-space rounding).
LOG_TOLERANCE = 1e-5

#: Log-probabilities from ordinary to far below exp's f32 range (-103.97), and exact zeros.
LOGPROBS = st.one_of(
    st.floats(-30.0, 0.0), st.floats(-250.0, -100.0), st.just(-math.inf)
)


def exact_logsumexp(values) -> float:
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0 or np.all(np.isneginf(values)):
        return -math.inf
    peak = values.max()
    return float(peak + np.log(np.sum(np.exp(values - peak))))


def assert_log_close(actual, expected) -> None:
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    zero = np.isneginf(expected)
    np.testing.assert_array_equal(np.isneginf(actual), zero)
    error = np.abs(actual[~zero] - expected[~zero])
    assert np.all(error <= LOG_TOLERANCE * (1 + np.abs(expected[~zero]))), error.max(initial=0)


#: Queries per example (fixed, so jit compiles once per vector length).
NUM_QUERIES = 16


@jax.jit
def tree_queries(logp, lo, hi):
    tree = build_sum_tree(logp)
    return range_logmass(tree, lo, hi), leaf_logprobs(tree, jnp.arange(logp.shape[0]))


@settings(max_examples=60, deadline=None)
@given(st.lists(LOGPROBS, min_size=1, max_size=40), st.data())
def test_range_logmass_matches_brute_force(logp, data):
    logp = np.array(logp, dtype=np.float32)
    bounds = st.integers(0, len(logp))
    ranges = data.draw(st.lists(st.tuples(bounds, bounds), min_size=NUM_QUERIES, max_size=NUM_QUERIES))
    lo = np.array([min(a, b) for a, b in ranges])
    hi = np.array([max(a, b) for a, b in ranges])
    masses, leaves = tree_queries(logp, lo, hi)
    assert_log_close(masses, [exact_logsumexp(logp[a:b]) for a, b in zip(lo, hi)])
    np.testing.assert_array_equal(leaves, logp)


def test_tiny_masses_survive_where_linear_f32_underflows():
    logp = np.array([-150.0, -160.0, -170.0, -math.inf, -151.0], dtype=np.float32)
    assert np.all(np.exp(logp) == 0)  # a linear-space f32 sum would give exactly 0
    tree = build_sum_tree(logp)
    actual = range_logmass(tree, np.array([0, 1, 3, 0, 2]), np.array([5, 3, 4, 0, 3]))
    expected = [exact_logsumexp(logp), exact_logsumexp(logp[1:3]), -math.inf, -math.inf, -170.0]
    assert_log_close(actual, expected)


def test_shapes_batches_and_jit():
    logp = np.asarray(jax.nn.log_softmax(jax.random.normal(jax.random.key(0), (3, 37))))
    trees = build_sum_tree(logp)
    assert trees.cells.shape == (3, 2 * 64) and trees.num_leaves == 64
    lo = jnp.array([[0, 5], [10, 36]])
    hi = jnp.array([[37, 9], [10, 37]])
    per_tree = jax.vmap(range_logmass, in_axes=(0, None, None))(trees, lo, hi)
    jitted = jax.jit(jax.vmap(range_logmass, in_axes=(0, None, None)))(trees, lo, hi)
    assert per_tree.shape == (3, 2, 2)
    np.testing.assert_allclose(jitted, per_tree, rtol=1e-6)
    for row in range(3):
        expected = [[exact_logsumexp(logp[row, a:b]) for a, b in zip(*bounds)] for bounds in zip(lo, hi)]
        assert_log_close(per_tree[row], expected)
    np.testing.assert_allclose(per_tree[:, 0, 0], 0.0, atol=1e-6)  # the whole simplex


def _symmetric_pyramid(logp: np.ndarray) -> np.ndarray:
    """The full padded pyramid cell[c] = m + log(e^(a - m) + e^(b - m)) over every pair, padding
    included: the definition that `build_sum_tree`'s one-exp formula and skipped padding must
    reproduce bit for bit."""
    logp = jnp.asarray(logp, jnp.float32)
    num_leaves = 1 << (logp.shape[-1] - 1).bit_length()
    level = jnp.pad(logp, [(0, 0), (0, num_leaves - logp.shape[-1])], constant_values=-jnp.inf)
    levels = [level]
    while level.shape[-1] > 1:
        a, b = level[:, 0::2], level[:, 1::2]
        peak = jnp.maximum(a, b)
        shift = jnp.where(jnp.isfinite(peak), peak, 0.0)
        level = jax.lax.optimization_barrier(shift + jnp.log(jnp.exp(a - shift) + jnp.exp(b - shift)))
        levels.append(level)
    return np.asarray(jnp.concatenate([jnp.full((logp.shape[0], 1), -jnp.inf), *reversed(levels)], axis=-1))


@pytest.mark.parametrize("num_values", [1, 2, 3, 37, 64, 65, 1000, 49135])
def test_build_is_bit_for_bit_the_symmetric_pyramid(num_values):
    """One exp per pair (e^(m - m) = 1 exactly) and padding cells left at -inf change no bit of
    any cell: the byte-level distributions built on the tree are unchanged."""
    rng = np.random.default_rng(num_values)
    logp = (rng.normal(size=(3, num_values)) * 8 - 12).astype(np.float32)
    logp[rng.random(logp.shape) < 0.2] = -np.inf
    logp[0] = -np.inf  # an all-zero row
    logp[1, : num_values // 2] = logp[1, 0]  # ties
    logp[2, ::7] = -150.0  # below exp's f32 range
    cells = np.asarray(jax.jit(lambda x: build_sum_tree(x).cells)(logp))
    np.testing.assert_array_equal(cells.view(np.uint32), _symmetric_pyramid(logp).view(np.uint32))
