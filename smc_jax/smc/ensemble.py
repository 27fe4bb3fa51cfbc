"""f-ensembles: the aggregation function f that combines K experts' string probabilities.

The target of every sampler in this library is the *global* f-ensemble (paper Def. 4.1)

    Phi(x) = f(p_1(x), ..., p_K(x)) / Z,

and the SMC shaping function is psi(x) = f(P_1(x), ..., P_K(x)) on prefix probabilities P_k
(Sec. 5.2). Both only need f, evaluated in log space on a trailing expert axis:

* `log_target(log_p)`  = log f(p)        (log phi, on complete-string log-probabilities)
* `log_shaping(log_p)` = log psi-style f (on prefix log-probabilities)

For the generalized means (Table 1) the two coincide. For a non-annihilative f (e.g. the
contrastive (p1 - p2)^2) the shaping is ``|f|`` + epsilon (App. C.2), which keeps the proposal
absolutely continuous with respect to the target.

Ensembles are pytrees (their exponent and weights are array leaves), so they can be passed to
jitted samplers and differentiated (`smc_jax.smc.learn` fits weights and tau with optax).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, Float

#: The named members of the generalized-mean family (paper Table 1) and their exponents tau.
NAMED_TAUS: dict[str, float] = {
    "min": -math.inf,
    "harmonic": -1.0,
    "product": 0.0,
    "mixture": 1.0,
    "sum": 1.0,
    "quadratic": 2.0,
    "max": math.inf,
}

#: Regimes of x = |tau| * (spread of the log-probabilities around their weighted mean m):
#: x < _TAYLOR_LIMIT: the cumulant expansion m + tau k2/2 + tau^2 k3/6 (exact value and gradient
#: at tau = 0, where the other forms are 0/0); x < _SERIES_LIMIT: m + log1p(sum w expm1(tau d))/tau
#: (no cancellation); otherwise a max-shifted logsumexp (no overflow as tau * log p grows).
_TAYLOR_LIMIT = 1e-2
_SERIES_LIMIT = 1.0

#: Tolerance on the sum of expert weights (they must lie on the simplex).
WEIGHT_SUM_TOLERANCE = 1e-5


@runtime_checkable
class Ensemble(Protocol):
    """What a sampler needs from an f-ensemble. Inputs have the expert axis last."""

    num_experts: int

    def log_target(self, log_p: Float[Array, "... K"]) -> Float[Array, "..."]:
        """log f(p_1, ..., p_K) on complete-string log-probabilities."""

    def log_shaping(self, log_p: Float[Array, "... K"]) -> Float[Array, "..."]:
        """log psi on prefix log-probabilities (equals log_target for annihilative f)."""


def validate_weights(weights: Sequence[float] | np.ndarray, num_experts: int) -> np.ndarray:
    """Checks expert weights on the host: finite, non-negative, one per expert, summing to 1.

    Parameters
    ----------
    weights : sequence of float
        The weights.
    num_experts : int
        K.

    Returns
    -------
    numpy.ndarray, shape [K]
        The weights as float32.
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or w.shape[0] != num_experts:
        raise ValueError(
            f"expected one weight per expert ({num_experts}), got an array of shape {w.shape}"
        )
    if not np.all(np.isfinite(w)):
        raise ValueError(f"expert weights must be finite numbers, got {w.tolist()}")
    if np.any(w < 0):
        raise ValueError(f"expert weights must be non-negative, got {w.tolist()}")
    total = float(w.sum())
    if abs(total - 1.0) > WEIGHT_SUM_TOLERANCE:
        raise ValueError(
            f"expert weights must lie on the simplex (sum to 1), got sum {total:.6g} for "
            f"{w.tolist()}; normalize them first, e.g. w / w.sum()"
        )
    return w


def log_generalized_mean(
    log_p: Float[Array, "... K"], tau: Float[Array, ""], weights: Float[Array, "K"]
) -> Float[Array, "..."]:
    """log M_tau(p; w) = (1/tau) log sum_k w_k p_k^tau, with its limits, in log space.

    tau = 0 is the weighted product sum_k w_k log p_k; tau = -inf / +inf are min / max over the
    experts with positive weight. Experts of weight 0 are ignored (p^0 = 1 for the product).
    log p = -inf is exact: it annihilates the mean when tau <= 0 and is skipped when tau > 0.
    The value and its gradients with respect to tau, the weights and log_p are finite wherever
    the result is (the branches that are not taken see only safe inputs).

    Parameters
    ----------
    log_p : jax.Array, shape [..., K]
        Log-probabilities, expert axis last.
    tau : jax.Array, shape []
        The exponent.
    weights : jax.Array, shape [K]
        Expert weights on the simplex.

    Returns
    -------
    jax.Array, shape [...]
    """
    log_p = jnp.asarray(log_p, jnp.float32)
    tau = jnp.asarray(tau, jnp.float32)
    weights = jnp.asarray(weights, jnp.float32)
    neg_inf = jnp.array(-jnp.inf, jnp.float32)

    used = weights > 0  # [K]
    finite = jnp.isfinite(log_p)  # [..., K]
    zero_prob = used & jnp.isneginf(log_p)
    any_zero = jnp.any(zero_prob, axis=-1)
    all_zero = jnp.all(zero_prob | ~used, axis=-1)

    # min / max over the experts in use.
    log_min = jnp.min(jnp.where(used, log_p, jnp.inf), axis=-1)
    log_max = jnp.max(jnp.where(used, log_p, -jnp.inf), axis=-1)

    # Centre on the weighted mean m = sum_k w_k l_k of the finite log-probabilities.
    safe_l = jnp.where(finite & used, log_p, 0.0)
    mean = jnp.sum(weights * safe_l, axis=-1) / jnp.sum(jnp.where(used, weights, 0.0))
    dev = jnp.where(finite & used, log_p - mean[..., None], 0.0)
    spread = jnp.max(jnp.abs(dev), axis=-1)

    # Tiny |tau| (tau = 0 included): the cumulant expansion of (1/tau) log E_w[exp(tau d)].
    kappa2 = jnp.sum(weights * dev**2, axis=-1)
    kappa3 = jnp.sum(weights * dev**3, axis=-1)
    finite_tau0 = jnp.where(jnp.isfinite(tau), tau, 0.0)
    taylor_branch = mean + finite_tau0 * kappa2 / 2 + finite_tau0**2 * kappa3 / 6

    # Small |tau| * spread: m + log1p(sum_k w_k expm1(tau d_k)) / tau, free of 0/0 cancellation.
    # (tau = 0 and tau = +-inf never take it: a finite non-zero stand-in keeps its gradient finite.)
    finite_tau = jnp.where((tau == 0) | ~jnp.isfinite(tau), 1.0, tau)
    series_arg = jnp.sum(weights * jnp.expm1(jnp.clip(finite_tau * dev, -_SERIES_LIMIT, _SERIES_LIMIT)), -1)
    series_branch = mean + jnp.log1p(series_arg) / finite_tau

    # Otherwise: a max-shifted logsumexp of log w_k + tau l_k over the experts with p_k > 0.
    log_w = jnp.log(jnp.where(used, weights, 1.0))
    terms = jnp.where(used & finite, log_w + finite_tau * safe_l, -jnp.inf)
    shift = jax.lax.stop_gradient(jnp.max(jnp.where(used & finite, terms, -jnp.inf), axis=-1))
    shift = jnp.where(jnp.isfinite(shift), shift, 0.0)
    sum_exp = jnp.sum(jnp.exp(terms - shift[..., None]), axis=-1)
    lse_branch = (shift + jnp.log(jnp.where(sum_exp > 0, sum_exp, 1.0))) / finite_tau

    x = jnp.abs(finite_tau0) * spread
    general = jnp.where((x < _SERIES_LIMIT) & ~any_zero, series_branch, lse_branch)
    general = jnp.where((x < _TAYLOR_LIMIT) & ~any_zero, taylor_branch, general)
    general = jnp.where(tau == 0, taylor_branch, general)  # the product, -inf entries included
    # Annihilation (tau <= 0) or nothing left to mix (tau > 0).
    general = jnp.where(jnp.where(tau <= 0, any_zero, all_zero), neg_inf, general)

    out = jnp.where(tau == -jnp.inf, log_min, jnp.where(tau == jnp.inf, log_max, general))
    return out


@struct.dataclass
class GeneralizedMean:
    """The weighted generalized mean f(p) = (sum_k w_k p_k^tau)^(1/tau) (paper Eq. 6, Table 1).

    tau <= 0 is consensus-seeking (annihilative: one zero expert zeroes the ensemble), tau >= 1
    coverage-seeking. All generalized means are annihilative, so shaping = target.

    Attributes
    ----------
    tau : jax.Array, shape []
        The exponent (+-inf for max / min, 0 for the product).
    weights : jax.Array, shape [K]
        Expert weights on the simplex.
    """

    tau: Float[Array, ""]
    weights: Float[Array, "K"]

    @property
    def num_experts(self) -> int:
        return int(self.weights.shape[-1])

    def log_target(self, log_p: Float[Array, "... K"]) -> Float[Array, "..."]:
        """log f(p) on complete-string log-probabilities `log_p` [..., K]; returns [...]."""
        return log_generalized_mean(log_p, self.tau, self.weights)

    def log_shaping(self, log_p: Float[Array, "... K"]) -> Float[Array, "..."]:
        """log psi on prefix log-probabilities `log_p` [..., K] (the same as `log_target`)."""
        return log_generalized_mean(log_p, self.tau, self.weights)


@struct.dataclass
class CustomEnsemble:
    """A user-supplied f given as log|f| on log-probabilities (trailing expert axis).

    For a non-annihilative f, pass `epsilon > 0`: the shaping becomes psi = ``|f(P)|`` + epsilon
    (paper App. C.2), which is positive everywhere; the target stays phi = f(p), which must be
    non-negative. With `epsilon = 0` the user asserts f is annihilative (shaping = f).

    Attributes
    ----------
    log_abs_f : callable
        ``log |f|`` of log-probabilities [..., K] -> [...].
    num_experts : int
        K.
    epsilon : float
        The shaping offset (0 for an annihilative f).
    """

    log_abs_f: Callable[[Array], Array] = struct.field(pytree_node=False)
    num_experts: int = struct.field(pytree_node=False)
    epsilon: float = struct.field(pytree_node=False, default=0.0)

    def log_target(self, log_p: Float[Array, "... K"]) -> Float[Array, "..."]:
        """log f(p) on complete-string log-probabilities `log_p` [..., K]; returns [...]."""
        return self.log_abs_f(log_p)

    def log_shaping(self, log_p: Float[Array, "... K"]) -> Float[Array, "..."]:
        """log (``|f(P)|`` + epsilon) on prefix log-probabilities `log_p` [..., K]; returns [...]."""
        value = self.log_abs_f(log_p)
        if self.epsilon > 0:
            value = jnp.logaddexp(value, math.log(self.epsilon))
        return value


@struct.dataclass
class ConstrainedEnsemble:
    """An f-ensemble of K language models times J hard constraints (0/1 potentials).

    The expert axis holds the K models first, then the J constraints, whose log-potentials are
    0 or -inf. The target and the shaping are (reference/constraints.md, option 1)

        log phi(x) = log f_w(p_1(x), ..., p_K(x)) + sum_j log C_j(x),
        log psi(x) = log psi_f(P_1(x), ..., P_K(x)) + sum_j log C^_j(x),

    so the weights stay on the models and every f (mixture and max included) is restricted to
    the constraints' languages. Locally (method "local") the same formula on next-symbol
    conditionals masks f(p(. | x)) to the viable symbols, which the sampler renormalizes:
    locally constrained decoding.

    Parameters
    ----------
    base : Ensemble
        The f-ensemble of the K language models.
    num_constraints : int
        J, the constraints after the models on the expert axis.
    """

    base: Ensemble
    num_constraints: int = struct.field(pytree_node=False)

    @property
    def num_experts(self) -> int:
        return self.base.num_experts + self.num_constraints

    @property
    def num_models(self) -> int:
        return self.base.num_experts

    def _split(self, log_p: Float[Array, "... K"]) -> tuple[Array, Array]:
        k = self.base.num_experts
        # A potential's log-value is 0 or -inf; the sum is -inf as soon as one constraint fails.
        return log_p[..., :k], jnp.sum(log_p[..., k:], axis=-1)

    def log_target(self, log_p: Float[Array, "... K"]) -> Float[Array, "..."]:
        models, constraints = self._split(log_p)
        return self.base.log_target(models) + constraints

    def log_shaping(self, log_p: Float[Array, "... K"]) -> Float[Array, "..."]:
        models, constraints = self._split(log_p)
        return self.base.log_shaping(models) + constraints


def constrained(ensemble: Ensemble, num_constraints: int) -> Ensemble:
    """`ensemble` times `num_constraints` constraint factors (the ensemble itself when 0).

    Parameters
    ----------
    ensemble : Ensemble
        The f-ensemble of the language models.
    num_constraints : int
        J >= 0 constraints placed after the models on the expert axis.
    """
    if num_constraints < 0:
        raise ValueError(f"num_constraints must be >= 0, got {num_constraints}")
    return ConstrainedEnsemble(base=ensemble, num_constraints=num_constraints) if num_constraints else ensemble


def log_abs_diff(log_a: Array, log_b: Array) -> Array:
    """log ``|a - b|`` from log a and log b, without leaving log space.

    Parameters
    ----------
    log_a, log_b : jax.Array
        Log-values of the same shape.
    """
    hi = jnp.maximum(log_a, log_b)
    lo = jnp.minimum(log_a, log_b)
    gap = jnp.where(jnp.isfinite(hi), lo - hi, -jnp.inf)  # <= 0
    safe_gap = jnp.where(gap < 0, gap, -1.0)
    out = hi + jnp.log(-jnp.expm1(safe_gap))  # log(1 - e^gap)
    return jnp.where(gap < 0, out, -jnp.inf)


def contrastive(epsilon: float = 1e-6) -> CustomEnsemble:
    """The contrastive ensemble f(p1, p2) = (p1 - p2)^2, non-annihilative, with eps-shaping.

    Parameters
    ----------
    epsilon : float
        The shaping offset, > 0.
    """
    if not epsilon > 0:
        raise ValueError(f"the contrastive ensemble needs epsilon > 0 for its shaping, got {epsilon}")

    def log_abs_f(log_p: Array) -> Array:
        return 2.0 * log_abs_diff(log_p[..., 0], log_p[..., 1])

    return CustomEnsemble(log_abs_f=log_abs_f, num_experts=2, epsilon=epsilon)


def make_ensemble(
    f: str | float | Ensemble,
    num_experts: int,
    weights: Sequence[float] | np.ndarray | None = None,
) -> Ensemble:
    """Builds an f-ensemble from a name (`min`, `harmonic`, `product`, `mixture`/`sum`,
    `quadratic`, `max`), an exponent tau (any float, +-inf included) or an `Ensemble`.

    `weights` default to uniform (1/K each) and must lie on the simplex.

    Parameters
    ----------
    f : str, float or Ensemble
        A name, an exponent tau, or an ensemble (returned as is after a size check).
    num_experts : int
        K.
    weights : sequence of float, optional
        K weights on the simplex (default uniform).

    Returns
    -------
    Ensemble
        A `GeneralizedMean` for names and exponents.
    """
    if num_experts < 1:
        raise ValueError(f"an ensemble needs at least one expert, got {num_experts}")
    if isinstance(f, (GeneralizedMean, CustomEnsemble, ConstrainedEnsemble)) or (
        isinstance(f, Ensemble) and not isinstance(f, (str, float, int))
    ):
        if weights is not None:
            raise ValueError("weights are part of the ensemble object; do not pass them twice")
        if f.num_experts != num_experts:
            raise ValueError(f"the ensemble is for {f.num_experts} experts, but {num_experts} were given")
        return f
    if isinstance(f, str):
        key = f.strip().lower()
        if key not in NAMED_TAUS:
            raise ValueError(
                f"unknown ensemble function {f!r}; use one of {sorted(NAMED_TAUS)}, a number tau "
                "(the generalized-mean exponent), or an Ensemble object"
            )
        tau = NAMED_TAUS[key]
    elif isinstance(f, (int, float, np.floating, np.integer)) and not isinstance(f, bool):
        tau = float(f)
        if math.isnan(tau):
            raise ValueError("the generalized-mean exponent tau must be a number or +-inf, got NaN")
    else:
        raise TypeError(f"f must be a name, a number tau or an Ensemble, got {type(f).__name__}")
    w = np.full(num_experts, 1.0 / num_experts) if weights is None else validate_weights(weights, num_experts)
    chex.assert_shape(w, (num_experts,))
    return GeneralizedMean(tau=jnp.asarray(tau, jnp.float32), weights=jnp.asarray(w, jnp.float32))
