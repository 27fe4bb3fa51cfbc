"""Generalized means: closed forms, limits, -inf handling, gradients, validation, custom f."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from smc_jax.smc.ensemble import (
    NAMED_TAUS,
    CustomEnsemble,
    GeneralizedMean,
    contrastive,
    log_generalized_mean,
    make_ensemble,
)

P = np.array([[0.2, 0.5, 0.05], [0.9, 0.01, 0.3], [1e-30, 0.7, 0.2], [1e-8, 1e-9, 1e-10]])
W = np.array([0.2, 0.5, 0.3])


def closed_form(p: np.ndarray, w: np.ndarray, tau: float) -> np.ndarray:
    """Table 1 in float64."""
    if tau == -math.inf:
        return p.min(-1)
    if tau == math.inf:
        return p.max(-1)
    if tau == 0:
        return np.prod(p**w, -1)
    return (np.sum(w * p**tau, -1)) ** (1 / tau)


@pytest.mark.parametrize("name", sorted(NAMED_TAUS))
def test_named_closed_forms(name):
    ens = make_ensemble(name, 3, W)
    got = np.asarray(ens.log_target(jnp.log(P)))
    want = np.log(closed_form(P, W, NAMED_TAUS[name]))
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("tau", [-7.5, -2.0, -0.3, 0.3, 0.7, 3.0, 11.0])
def test_arbitrary_tau_closed_form(tau):
    got = np.asarray(log_generalized_mean(jnp.log(P), tau, W))
    np.testing.assert_allclose(got, np.log(closed_form(P, W, tau)), rtol=2e-6, atol=2e-6)


def test_limits_are_continuous():
    lp = jnp.log(P)
    for tau, limit in [(1e-6, 0.0), (-1e-6, 0.0), (1e4, math.inf), (-1e4, -math.inf)]:
        near = np.asarray(log_generalized_mean(lp, tau, W))
        at = np.asarray(log_generalized_mean(lp, limit, W))
        np.testing.assert_allclose(near, at, atol=2e-3, rtol=1e-3)
    # monotone in tau (power-mean inequality)
    taus = [-math.inf, -4, -1, -0.1, 0.0, 0.1, 1, 4, math.inf]
    vals = np.stack([np.asarray(log_generalized_mean(lp, t, W)) for t in taus])
    assert np.all(np.diff(vals, axis=0) >= -1e-6)


def test_zero_probabilities_annihilate_or_are_covered():
    lp = jnp.log(jnp.array([[0.0, 0.5, 0.2], [0.0, 0.0, 0.0], [0.3, 0.3, 0.3]]))
    for name in ["min", "harmonic", "product"]:
        out = np.asarray(make_ensemble(name, 3, W).log_target(lp))
        assert out[0] == -np.inf and out[1] == -np.inf and np.isfinite(out[2])
    for name in ["mixture", "quadratic", "max"]:
        out = np.asarray(make_ensemble(name, 3, W).log_target(lp))
        assert np.isfinite(out[0]) and out[1] == -np.inf
        np.testing.assert_allclose(out[2], np.log(0.3), rtol=1e-6)
    for tau in [-3.0, -1e-4, 0.0, 1e-4, 0.5, 2.5]:
        out = np.asarray(log_generalized_mean(lp, tau, W))
        assert not np.isnan(out).any()


def test_zero_weight_expert_is_ignored():
    lp = jnp.log(jnp.array([[0.0, 0.5, 0.2]]))
    w = jnp.array([0.0, 0.5, 0.5])
    for tau in [-math.inf, -1.0, 0.0, 1.0, math.inf]:
        out = float(log_generalized_mean(lp, tau, w)[0])
        want = np.log(closed_form(np.array([[0.5, 0.2]]), np.array([0.5, 0.5]), tau))[0]
        np.testing.assert_allclose(out, want, rtol=1e-6)


def test_single_expert_is_identity():
    lp = jnp.log(jnp.array([[0.3], [1e-20], [0.0]]))
    for tau in NAMED_TAUS.values():
        np.testing.assert_allclose(np.asarray(log_generalized_mean(lp, tau, jnp.ones(1))), np.asarray(lp[:, 0]))


def test_vectorized_over_leading_axes_and_many_experts():
    rng = np.random.default_rng(0)
    k = 7
    p = rng.dirichlet(np.ones(k), size=(4, 5))
    w = rng.dirichlet(np.ones(k))
    for tau in [-2.0, 0.0, 1.0, 2.0]:
        out = np.asarray(log_generalized_mean(jnp.log(p), tau, w))
        assert out.shape == (4, 5)
        np.testing.assert_allclose(out, np.log(closed_form(p, w, tau)), rtol=1e-5)


def test_gradients_are_finite_and_match_finite_differences():
    lp = jnp.log(jnp.array([0.2, 0.5, 0.05]))
    f = lambda tau: log_generalized_mean(lp, tau, W)
    for tau in [0.0, 1e-5, 0.02, 0.5, 1.0, -1.0, 3.0]:
        g = float(jax.grad(f)(jnp.float32(tau)))
        fd = (closed_form_log(tau + 1e-4) - closed_form_log(tau - 1e-4)) / 2e-4
        assert math.isfinite(g)
        np.testing.assert_allclose(g, fd, rtol=2e-3, atol=1e-5)
    gw = jax.grad(lambda w: log_generalized_mean(lp, 1.0, w))(jnp.asarray(W, jnp.float32))
    np.testing.assert_allclose(np.asarray(gw), np.exp(lp) / float(np.exp(lp) @ W), rtol=1e-5)


def closed_form_log(tau: float) -> float:
    p = np.array([0.2, 0.5, 0.05])
    if abs(tau) < 1e-12:
        return float(W @ np.log(p))
    return float(np.log(np.sum(W * p**tau)) / tau)


@pytest.mark.parametrize(
    "weights, match",
    [
        ([0.5, -0.1, 0.6], "non-negative"),
        ([0.5, float("nan"), 0.5], "finite"),
        ([0.5, 0.5, 0.5], "simplex"),
        ([0.5, 0.5], "one weight per expert"),
    ],
)
def test_bad_weights_are_rejected(weights, match):
    with pytest.raises(ValueError, match=match):
        make_ensemble("product", 3, weights)


def test_bad_f_is_rejected():
    with pytest.raises(ValueError, match="NaN"):
        make_ensemble(float("nan"), 2)
    with pytest.raises(ValueError, match="unknown ensemble function 'avg'.*mixture"):
        make_ensemble("avg", 2)
    with pytest.raises(ValueError, match="at least one expert"):
        make_ensemble("product", 0)
    with pytest.raises(TypeError):
        make_ensemble([1.0], 2)


def test_contrastive_and_epsilon_shaping():
    ens = contrastive(epsilon=1e-3)
    p = np.array([[0.5, 0.2], [0.3, 0.3], [0.0, 0.4]])
    with np.errstate(divide="ignore"):
        lp = jnp.log(p)
    target = np.asarray(ens.log_target(lp))
    with np.errstate(divide="ignore"):
        np.testing.assert_allclose(target, np.log((p[:, 0] - p[:, 1]) ** 2), rtol=1e-5)
    shaping = np.asarray(ens.log_shaping(lp))
    np.testing.assert_allclose(shaping, np.log((p[:, 0] - p[:, 1]) ** 2 + 1e-3), rtol=1e-5)
    assert np.all(np.isfinite(shaping))  # strictly positive everywhere: absolute continuity
    with pytest.raises(ValueError, match="epsilon > 0"):
        contrastive(0.0)


def test_custom_ensemble_passes_through_make_ensemble():
    ens = CustomEnsemble(log_abs_f=lambda lp: lp.max(-1), num_experts=2)
    assert make_ensemble(ens, 2) is ens
    with pytest.raises(ValueError, match="for 2 experts"):
        make_ensemble(ens, 3)


def test_ensemble_is_a_pytree():
    ens = make_ensemble("mixture", 2)
    leaves = jax.tree.leaves(ens)
    assert len(leaves) == 2
    assert isinstance(jax.tree.map(lambda x: x, ens), GeneralizedMean)


def test_weight_gradients_are_finite_at_infinite_tau():
    """min / max do not depend on the weights: gradient 0, not NaN (learning with tau fixed at +-inf)."""
    lp = jnp.log(jnp.array([[0.2, 0.5, 0.05], [0.0, 0.3, 0.1]]))
    for tau in [-math.inf, math.inf]:
        g = jax.grad(lambda w: jnp.sum(log_generalized_mean(lp, tau, w)))(jnp.asarray(W, jnp.float32))
        np.testing.assert_array_equal(np.asarray(g), 0.0)
