"""Resampling schemes with one signature, `(key, weights, n) -> ancestor indices`.

`weights` are normalized linear weights [M]; the result holds n indices into 0..M-1 whose
expected offspring counts are n * weights for every scheme (unbiased resampling). They differ
in variance: multinomial (the paper's default) > residual > stratified >= systematic.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

Resampler = Callable[[PRNGKeyArray, Float[Array, "M"], int], Int[Array, "n"]]


def _inverse_cdf(weights: Float[Array, "M"], points: Float[Array, "n"]) -> Int[Array, "n"]:
    """Indices i with cdf[i-1] <= u < cdf[i] for sorted points u in [0, 1)."""
    cdf = jnp.cumsum(weights)
    cdf = cdf / cdf[-1]
    idx = jnp.searchsorted(cdf, points, side="right")
    return jnp.clip(idx, 0, weights.shape[0] - 1).astype(jnp.int32)


def multinomial(key: PRNGKeyArray, weights: Float[Array, "M"], n: int) -> Int[Array, "n"]:
    """n independent draws from Categorical(weights)."""
    log_w = jnp.log(jnp.where(weights > 0, weights, 1.0))
    log_w = jnp.where(weights > 0, log_w, -jnp.inf)
    return jax.random.categorical(key, log_w, shape=(n,)).astype(jnp.int32)


def stratified(key: PRNGKeyArray, weights: Float[Array, "M"], n: int) -> Int[Array, "n"]:
    """One uniform draw in each stratum [i/n, (i+1)/n)."""
    u = (jnp.arange(n) + jax.random.uniform(key, (n,))) / n
    return _inverse_cdf(weights, u)


def systematic(key: PRNGKeyArray, weights: Float[Array, "M"], n: int) -> Int[Array, "n"]:
    """One uniform shift shared by the n evenly spaced points (i + U)/n."""
    u = (jnp.arange(n) + jax.random.uniform(key, ())) / n
    return _inverse_cdf(weights, u)


def residual(key: PRNGKeyArray, weights: Float[Array, "M"], n: int) -> Int[Array, "n"]:
    """floor(n w_i) deterministic copies of particle i, the rest multinomial on the residuals."""
    m = weights.shape[0]
    scaled = n * weights
    counts = jnp.floor(scaled).astype(jnp.int32)
    num_det = jnp.sum(counts)
    det = jnp.repeat(jnp.arange(m, dtype=jnp.int32), counts, total_repeat_length=n)
    rest = scaled - counts
    rest = jnp.where(jnp.sum(rest) > 0, rest, weights)  # all mass deterministic: any valid draw
    rand = multinomial(key, rest / jnp.sum(rest), n)
    return jnp.where(jnp.arange(n) < num_det, det, rand)


def resample_within(
    resampler: Resampler, key: PRNGKeyArray, weights: Float[Array, "M"], pool: Bool[Array, "M"]
) -> Int[Array, "M"]:
    """Ancestors when only the `pool` members are resampled (weights: normalized over the pool,
    zero outside it): the k-th pool member takes the k-th of M draws in a random order, others
    keep themselves. Shuffled, each draw is marginally Categorical(weights) for every scheme, so
    with n pool members each one's expected offspring count is n * weights."""
    m = weights.shape[0]
    key_draw, key_order = jax.random.split(key)
    drawn = jax.random.permutation(key_order, resampler(key_draw, weights, m))
    rank = jnp.cumsum(pool) - 1
    return jnp.where(pool, drawn[jnp.clip(rank, 0, m - 1)], jnp.arange(m, dtype=jnp.int32)).astype(jnp.int32)


RESAMPLERS: dict[str, Resampler] = {
    "multinomial": multinomial,
    "stratified": stratified,
    "systematic": systematic,
    "residual": residual,
}


def get_resampler(name: str) -> Resampler:
    """The resampler called `name` (one of `RESAMPLERS`): ``(key, weights [M], n) -> indices [n]``.

    Parameters
    ----------
    name : str
        "multinomial", "systematic", "stratified" or "residual".
    """
    try:
        return RESAMPLERS[name]
    except KeyError:
        raise ValueError(f"unknown resampler {name!r}; use one of {sorted(RESAMPLERS)}") from None


def effective_sample_size(log_weights: Float[Array, "M"]) -> Float[Array, ""]:
    """ESS = (sum w)^2 / sum w^2 from log weights; 0 when every weight is 0.

    Parameters
    ----------
    log_weights : jax.Array, shape [M]
    """
    top = jnp.max(log_weights)
    w = jnp.exp(log_weights - jnp.where(jnp.isfinite(top), top, 0.0))  # max-shifted, in [0, 1]
    total = jnp.sum(w)
    return jnp.where(total > 0, total**2 / jnp.where(total > 0, jnp.sum(w**2), 1.0), 0.0)
