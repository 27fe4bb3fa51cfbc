"""Resamplers: one signature, unbiased offspring counts, scheme-specific guarantees; ESS."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from smc_jax.smc.resampling import RESAMPLERS, effective_sample_size, get_resampler, resample_within

WEIGHTS = np.array([0.05, 0.4, 0.01, 0.3, 0.24], np.float32)


def offspring_counts(name: str, weights: np.ndarray, n: int, runs: int) -> np.ndarray:
    fn = get_resampler(name)
    keys = jax.random.split(jax.random.key(42), runs)
    idx = jax.jit(jax.vmap(lambda k: fn(k, jnp.asarray(weights), n)))(keys)
    idx = np.asarray(idx)
    assert idx.shape == (runs, n) and idx.min() >= 0 and idx.max() < len(weights)
    return np.stack([(idx == i).sum(1) for i in range(len(weights))], axis=1)  # [runs, M]


@pytest.mark.parametrize("name", sorted(RESAMPLERS))
@pytest.mark.parametrize("n", [5, 12])
def test_expected_offspring_equals_n_times_weight(name, n):
    counts = offspring_counts(name, WEIGHTS, n, runs=20000)
    mean = counts.mean(0)
    se = counts.std(0) / np.sqrt(counts.shape[0]) + 1e-3
    assert np.all(np.abs(mean - n * WEIGHTS) < 5 * se), (mean, n * WEIGHTS)
    assert np.all(counts.sum(1) == n)


@pytest.mark.parametrize("name", sorted(RESAMPLERS))
def test_resampling_within_a_pool(name):
    """Pool members (n of M) are refilled from the pool with expected offspring n * weight; the
    others keep themselves. Without the shuffle, systematic draws would give the n members only
    the first n of M evenly spaced points and never pick the last pool particle."""
    pool = np.array([True, False, True, True, False, True, False])
    weights = np.where(pool, [0.1, 0.0, 0.5, 0.05, 0.0, 0.35, 0.0], 0.0).astype(np.float32)
    keys = jax.random.split(jax.random.key(7), 20000)
    fn = jax.jit(jax.vmap(lambda k: resample_within(get_resampler(name), k, jnp.asarray(weights), jnp.asarray(pool))))
    idx = np.asarray(fn(keys))
    np.testing.assert_array_equal(idx[:, ~pool], np.broadcast_to(np.flatnonzero(~pool), (len(keys), (~pool).sum())))
    assert pool[idx[:, pool]].all()
    counts = np.stack([(idx[:, pool] == i).sum(1) for i in range(len(weights))], axis=1)
    se = counts.std(0) / np.sqrt(len(keys)) + 1e-3
    assert np.all(np.abs(counts.mean(0) - pool.sum() * weights) < 5 * se), (counts.mean(0), pool.sum() * weights)


@pytest.mark.parametrize("name", ["systematic", "stratified", "residual"])
def test_low_variance_schemes_keep_the_floor(name):
    n = 10
    counts = offspring_counts(name, WEIGHTS, n, runs=2000)
    floors = np.floor(n * WEIGHTS - 1e-6)
    if name == "residual":
        assert np.all(counts >= floors)
    if name == "systematic":
        assert np.all(counts >= floors) and np.all(counts <= np.ceil(n * WEIGHTS + 1e-6))


def test_variance_ordering():
    var = {name: offspring_counts(name, WEIGHTS, 10, runs=4000).var(0).sum() for name in RESAMPLERS}
    assert var["systematic"] < var["multinomial"]
    assert var["stratified"] < var["multinomial"]
    assert var["residual"] < var["multinomial"]


@pytest.mark.parametrize("name", sorted(RESAMPLERS))
def test_zero_weights_never_chosen_and_degenerate_weights(name):
    w = np.array([0.0, 1.0, 0.0, 0.0], np.float32)
    counts = offspring_counts(name, w, 4, runs=200)
    assert np.all(counts[:, 1] == 4)


def test_unknown_resampler():
    with pytest.raises(ValueError, match="unknown resampler 'bogus'.*systematic"):
        get_resampler("bogus")


def test_ess_edge_cases():
    assert float(effective_sample_size(jnp.zeros(8))) == pytest.approx(8.0)
    one = jnp.array([-jnp.inf, 3.0, -jnp.inf, -jnp.inf])
    assert float(effective_sample_size(one)) == pytest.approx(1.0)
    assert float(effective_sample_size(jnp.full(4, -jnp.inf))) == 0.0
    big = jnp.array([1000.0, 1000.0, -1000.0])
    assert float(effective_sample_size(big)) == pytest.approx(2.0)
    w = np.array([0.1, 0.2, 0.7])
    assert float(effective_sample_size(jnp.log(w))) == pytest.approx(1 / np.sum(w**2), rel=1e-5)
