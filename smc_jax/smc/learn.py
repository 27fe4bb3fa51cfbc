"""Differentiable ensembles: fit the expert weights and the exponent tau of a generalized-mean
f-ensemble to reference strings by maximum likelihood, with optax.

Parameters theta = (weight logits l, tau) give f_theta = M_tau(.; w) with w = softmax(l) on the
simplex. Either part can be held fixed. tau is learned over the reals: the named limits min
(tau = -inf) and max (+inf) are not reachable by gradient descent (only approached, with a
gradient in tau that vanishes as ``|tau|`` grows); likewise a weight of exactly 0 is only a limit
(logit -> -inf). A fixed tau may be +-inf.

Global objective: the f-ensemble over strings of at most L = max_length symbols,

    log Phi_theta(x) = log phi_theta(x) - log Z_theta,      phi_theta(x) = f_theta(p_1(x), ..., p_K(x)),
    d/dtheta log Z_theta = E_{x ~ Phi_theta}[d/dtheta log phi_theta(x)].

The first term is exact (autodiff of log f_theta at the experts' log p_k(x), which do not depend
on theta). The expectation is estimated with SMC run at theta and held fixed (no gradient
through sampling): sum_m wbar_m d/dtheta log phi_theta(x_m) over the finished particles, with
their per-expert log p_k(x_m) and normalized weights wbar_m. This self-normalized estimate is
consistent with an O(1/M) bias; (1/M) sum_m w_m d/dtheta log phi_theta(x_m) = Z_hat * estimate
is unbiased for dZ/dtheta.

The reported loss is the mean negative log-likelihood -mean_i log phi_theta(x_i) + log Z_hat.
log Z_hat is a consistent but biased estimate of log Z (Z_hat is unbiased, so by Jensen
E[log Z_hat] <= log Z): fine for a learning curve, not for comparing models at few particles.

Local objective: the token-local ensemble as sampled by `SMC(method="local")`::

    log q_theta(x) = sum_{t=0}^{|x|} [log f_theta(p(x_t | x_<t)) - log sum_a f_theta(p(a | x_<t))]

with ``x_|x|`` = EOS, except that EOS is forced (probability 1) after L symbols, so q_theta is a
distribution over the same strings as Phi_theta. Exact: teacher forcing gives every p_k(. | x_<t).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from jaxtyping import Array, Float, Int, PRNGKeyArray
from tqdm.auto import tqdm

from smc_jax.smc.ensemble import GeneralizedMean
from smc_jax.experts.base import ExpertGroup, stack_experts
from smc_jax.experts.teacher_forcing import pad_sequences, target_symbols, teacher_force
from smc_jax.smc.engine import SMC
from smc_jax.smc.result import ZeroWeightError
from smc_jax.smc.state import SMCState
from smc_jax.utils.compilation import jit

Objective = Literal["global", "local"]
OBJECTIVES = ("global", "local")


@struct.dataclass
class EnsembleParams:
    """Free parameters of a generalized mean; a field that is None is held fixed (see `to_ensemble`).

    Attributes
    ----------
    weight_logits : jax.Array, shape [K], or None
        log w up to a constant (None: weights fixed).
    tau : jax.Array, shape [], or None
        The exponent (None: fixed).
    """

    weight_logits: Float[Array, "K"] | None  # w = softmax(weight_logits)
    tau: Float[Array, ""] | None  # any real


def init_params(ensemble: GeneralizedMean, learn_weights: bool = True, learn_tau: bool = True) -> EnsembleParams:
    """The free parameters at `ensemble`: logits log w (weights must be > 0) and tau (finite).

    Parameters
    ----------
    ensemble : GeneralizedMean
        The starting ensemble.
    learn_weights, learn_tau : bool
        Which parts are free (the others are None).
    """
    if not isinstance(ensemble, GeneralizedMean):
        raise TypeError(f"only generalized means can be learned, got {type(ensemble).__name__}")
    if not (learn_weights or learn_tau):
        raise ValueError("nothing to learn: learn_weights and learn_tau are both False")
    weights = np.asarray(ensemble.weights, np.float64)
    tau = float(ensemble.tau)
    if learn_weights and np.any(weights <= 0):
        raise ValueError(
            f"learning weights needs every initial weight > 0 (a zero weight is a softmax limit "
            f"that gradient descent cannot leave), got {weights.tolist()}"
        )
    if learn_tau and not math.isfinite(tau):
        raise ValueError(f"tau is learned over the reals; start from a finite tau, got {tau}")
    return EnsembleParams(
        weight_logits=jnp.log(jnp.asarray(weights, jnp.float32)) if learn_weights else None,
        tau=jnp.asarray(tau, jnp.float32) if learn_tau else None,
    )


def to_ensemble(params: EnsembleParams, base: GeneralizedMean) -> GeneralizedMean:
    """f_theta: weights softmax(weight_logits) and tau from `params`, fixed parts from `base`.

    Parameters
    ----------
    params : EnsembleParams
        The free parameters.
    base : GeneralizedMean
        The ensemble the fixed parts come from.
    """
    weights = base.weights if params.weight_logits is None else jax.nn.softmax(params.weight_logits)
    tau = base.tau if params.tau is None else params.tau
    return GeneralizedMean(tau=tau, weights=weights)


class Targets(NamedTuple):
    """N target strings sharing one expert group (e.g. one prompt), padded with PAD_SYMBOL.

    Attributes
    ----------
    experts : ExpertGroup
        The K experts the strings are scored under.
    symbols : jax.Array, shape [N, T]
        The strings, padded with PAD_SYMBOL.
    lengths : jax.Array, shape [N]
        Their lengths.
    """

    experts: ExpertGroup
    symbols: Int[Array, "N T"]
    lengths: Int[Array, "N"]

    @classmethod
    def from_sequences(cls, experts: ExpertGroup | Sequence[ExpertGroup], sequences: Sequence[Sequence[int]]) -> "Targets":
        """Parameters
        ----------
        experts : ExpertGroup
            The K experts.
        sequences : sequence of sequences of int
            N strings over the experts' alphabet.
        """
        experts = stack_experts(experts)
        symbols, lengths = pad_sequences(sequences, experts.alphabet_size)
        return cls(experts=experts, symbols=jnp.asarray(symbols), lengths=jnp.asarray(lengths))

    @property
    def num_targets(self) -> int:
        return int(self.lengths.shape[0])


# ---------------------------------------------------------------- the two objectives


def particle_weights(state: SMCState) -> tuple[Float[Array, "M"], Float[Array, "M K"]]:
    """Normalized weights wbar_m of the complete (EOS-finished) particles and their log p_k(x_m).

    Other particles get weight 0 and placeholder log-probabilities 0 (finite, so that gradients
    taken at them are finite and then multiplied by 0). All zeros when no particle has weight.

    Parameters
    ----------
    state : SMCState
        A finished run's state.

    Returns
    -------
    tuple of jax.Array, shapes [M] and [M, K]
    """
    keep = state.eos & jnp.isfinite(state.log_weights)
    log_w = jnp.where(keep, state.log_weights, -jnp.inf)
    total = jax.nn.logsumexp(log_w)
    wbar = jnp.where(keep, jnp.exp(log_w - jnp.where(jnp.isfinite(total), total, 0.0)), 0.0)
    return wbar, jnp.where(keep[:, None], state.log_prefix, 0.0)


def log_normalizer_and_grad(
    params: EnsembleParams, base: GeneralizedMean, key: PRNGKeyArray, experts: ExpertGroup, smc: SMC
) -> tuple[Float[Array, ""], EnsembleParams]:
    """One SMC run at theta: log Z_hat and the estimate sum_m wbar_m d/dtheta log phi_theta(x_m)
    of d/dtheta log Z_theta (particles and weights held fixed).

    Parameters
    ----------
    params : EnsembleParams
        theta.
    base : GeneralizedMean
        The fixed parts.
    key : jax.Array
        PRNG key of the SMC run.
    experts : ExpertGroup
        The K experts.
    smc : SMC
        The sampler.
    """
    state = smc.run(key, experts, jax.lax.stop_gradient(to_ensemble(params, base)))
    log_z_hat = jax.nn.logsumexp(state.log_weights) - math.log(smc.num_particles)
    wbar, log_p = particle_weights(state)
    grad = jax.grad(lambda p: jnp.sum(wbar * to_ensemble(p, base).log_target(log_p)))(params)
    return log_z_hat, grad


def global_loss_and_grad(
    params: EnsembleParams,
    base: GeneralizedMean,
    key: PRNGKeyArray,
    experts: ExpertGroup,
    target_logprobs: Float[Array, "N K"],
    smc: SMC,
) -> tuple[Float[Array, ""], Float[Array, ""], EnsembleParams]:
    """(loss, log Z_hat, gradient) of loss = -mean_i log phi_theta(x_i) + log Z_theta, with
    log Z and its gradient estimated by one SMC run; `target_logprobs` = log p_k(x_i).

    Parameters
    ----------
    params : EnsembleParams
        theta.
    base : GeneralizedMean
        The fixed parts.
    key : jax.Array
        PRNG key of the SMC run.
    experts : ExpertGroup
        The K experts.
    target_logprobs : jax.Array, shape [N, K]
        log p_k(x_i) of the targets.
    smc : SMC
        The sampler.
    """
    log_z_hat, grad_log_z = log_normalizer_and_grad(params, base, key, experts, smc)

    def mean_log_phi(p: EnsembleParams) -> Float[Array, ""]:
        return jnp.mean(to_ensemble(p, base).log_target(target_logprobs))

    data, grad_data = jax.value_and_grad(mean_log_phi)(params)
    grad = jax.tree.map(lambda z, d: z - d, grad_log_z, grad_data)
    return log_z_hat - data, log_z_hat, grad


def local_log_likelihood(
    ensemble: GeneralizedMean,
    step_logprobs: Float[Array, "N T1 K A1"],
    sequences: Int[Array, "N T"],
    lengths: Int[Array, "N"],
    max_length: int,
) -> Float[Array, "N"]:
    """log q(x) of the token-local ensemble q(a | x_<t) ∝ f(p_1(a | x_<t), ..., p_K(a | x_<t)),
    EOS included and forced after `max_length` symbols (as `SMC(method="local")` samples it).

    Parameters
    ----------
    ensemble : GeneralizedMean
        f.
    step_logprobs : jax.Array, shape [N, T + 1, K, A + 1]
        Teacher-forced next-symbol log-probabilities (`teacher_force`).
    sequences : jax.Array, shape [N, T]
        The strings, padded.
    lengths : jax.Array, shape [N]
        Their lengths.
    max_length : int
        L.

    Returns
    -------
    jax.Array, shape [N]
    """
    alphabet = step_logprobs.shape[-1] - 1
    symbols = target_symbols(sequences, lengths, alphabet)  # [N, T+1]
    t = jnp.arange(symbols.shape[1])[None, :]
    scored = (t <= lengths[:, None]) & (t < max_length)  # the forced EOS at t = L has log q = 0
    # Placeholder log-probabilities 0 where unscored: finite values and gradients, then masked.
    logp = jnp.where(scored[..., None, None], step_logprobs, 0.0)
    log_f = ensemble.log_target(jnp.swapaxes(logp, -1, -2))  # [N, T+1, A+1]
    picked = jnp.take_along_axis(log_f, symbols[..., None], axis=-1)[..., 0]
    log_norm = jax.nn.logsumexp(log_f, axis=-1)
    # A dead end (every symbol annihilated, possible for tau <= 0) gives the target probability 0.
    terms = jnp.where(jnp.isfinite(log_norm), picked - log_norm, -jnp.inf)
    return jnp.sum(jnp.where(scored, terms, 0.0), axis=-1)


def local_loss_and_grad(
    params: EnsembleParams,
    base: GeneralizedMean,
    step_logprobs: Float[Array, "N T1 K A1"],
    sequences: Int[Array, "N T"],
    lengths: Int[Array, "N"],
    max_length: int,
) -> tuple[Float[Array, ""], EnsembleParams]:
    """Exact (loss, gradient) of loss = -mean_i log q_theta(x_i) (token-local ensemble).

    Parameters
    ----------
    params : EnsembleParams
        theta.
    base : GeneralizedMean
        The fixed parts.
    step_logprobs : jax.Array, shape [N, T + 1, K, A + 1]
        Teacher-forced next-symbol log-probabilities.
    sequences : jax.Array, shape [N, T]
        The strings, padded.
    lengths : jax.Array, shape [N]
        Their lengths.
    max_length : int
        L.
    """

    def loss(p: EnsembleParams) -> Float[Array, ""]:
        ens = to_ensemble(p, base)
        return -jnp.mean(local_log_likelihood(ens, step_logprobs, sequences, lengths, max_length))

    return jax.value_and_grad(loss)(params)


global_step = jit(global_loss_and_grad, static_argnames="smc")
global_step.__doc__ = "`global_loss_and_grad` jitted (once per sampler configuration and expert structure)."
local_step = jit(local_loss_and_grad, static_argnames="max_length")
local_step.__doc__ = "`local_loss_and_grad` jitted."


# ---------------------------------------------------------------- fit


class FitResult(NamedTuple):
    """Fitted parameters and the learning curve (host arrays).

    losses[s]: the mean negative log-likelihood at the parameters before update s (global: with
    log Z_hat; local: exact). log_Z[s, g]: log Z_hat of target group g at step s (global only).

    Attributes
    ----------
    params : EnsembleParams
        The fitted parameters.
    ensemble : GeneralizedMean
        The fitted ensemble.
    losses : numpy.ndarray, shape [S]
        The loss before each update.
    log_Z : numpy.ndarray, shape [S, G], or None
        log Z-hat per step and target group (global objective).
    """

    params: EnsembleParams
    ensemble: GeneralizedMean
    losses: np.ndarray
    log_Z: np.ndarray | None


def _describe(targets: Targets, group: int, index: int) -> str:
    length = int(targets.lengths[index])
    seq = np.asarray(targets.symbols[index, :length]).tolist()
    return f"target {index} of group {group} ({seq})"


def _validate(data: Sequence[Targets], ensemble: GeneralizedMean, smc: SMC, objective: str) -> None:
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; use one of {OBJECTIVES}")
    if objective == "global" and (smc.method != "smc" or smc.at_max_length != "eos"):
        raise ValueError(
            "the global objective needs the global sampler with EOS forced at the limit "
            f"(method='smc', at_max_length='eos'), got method={smc.method!r}, at_max_length={smc.at_max_length!r}"
        )
    if not data or any(t.num_targets == 0 for t in data):
        raise ValueError("the data set is empty: give at least one target string per group")
    for g, targets in enumerate(data):
        if targets.experts.num_experts != ensemble.num_experts:
            raise ValueError(
                f"group {g} has {targets.experts.num_experts} experts, the ensemble is for {ensemble.num_experts}"
            )
        too_long = np.flatnonzero(np.asarray(targets.lengths) > smc.max_length)
        if too_long.size:
            raise ValueError(
                f"{_describe(targets, g, int(too_long[0]))} has {int(targets.lengths[too_long[0]])} symbols, more "
                f"than max_length = {smc.max_length} ({too_long.size} such targets): the ensemble gives it "
                "probability 0; raise max_length or drop it"
            )


def _check_support(log_lik: np.ndarray, targets: Targets, group: int, what: str) -> None:
    bad = np.flatnonzero(~np.isfinite(log_lik))
    if bad.size:
        raise ValueError(
            f"{_describe(targets, group, int(bad[0]))} has probability 0 under the initial {what} "
            f"(log-likelihood {log_lik[bad[0]]}; {bad.size} such targets), so its loss is infinite; "
            "for consensus ensembles (tau <= 0) every expert must give it positive probability"
        )


def fit(
    data: Targets | Sequence[Targets],
    init: GeneralizedMean,
    optimizer: optax.GradientTransformation,
    num_steps: int,
    key: PRNGKeyArray,
    smc: SMC,
    *,
    objective: Objective = "global",
    learn_weights: bool = True,
    learn_tau: bool = True,
    verbose: bool = False,
) -> FitResult:
    """Minimizes the mean negative log-likelihood of the targets over (weights, tau) with optax.

    data: one `Targets` (strings sharing an expert group) or several (e.g. one per prompt, each
    with its own normalizer Z); the loss is the mean over all targets. init: the starting
    generalized mean (its fixed parts stay). smc: the sampler for the global objective's
    gradient (its max_length bounds the strings for both objectives). Step s uses the key
    split(key, num_steps)[s] folded with the group index: same key, same result.

    Parameters
    ----------
    data : Targets or sequence of Targets
        The target strings, one `Targets` per expert group.
    init : GeneralizedMean
        The starting ensemble (every weight > 0).
    optimizer : optax.GradientTransformation
        The optimizer.
    num_steps : int
        S.
    key : jax.Array
        PRNG key (one SMC run per step and group).
    smc : SMC
        The sampler estimating d log Z (global objective) and bounding lengths.
    objective : {"global", "local"}
        The global f-ensemble or the token-local ensemble.
    learn_weights, learn_tau : bool
        Which parts are free.
    verbose : bool
        Show a progress bar.

    Returns
    -------
    FitResult
    """
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    data = [data] if isinstance(data, Targets) else list(data)
    if not isinstance(init, GeneralizedMean):
        raise TypeError(f"only generalized means can be learned, got {type(init).__name__}")
    _validate(data, init, smc, objective)
    params = init_params(init, learn_weights, learn_tau)
    base = init
    total = sum(t.num_targets for t in data)
    shares = [t.num_targets / total for t in data]

    if objective == "global":
        constants = [teacher_force(t.experts, t.symbols, t.lengths, keep_steps=False).string_logprobs for t in data]
        for g, (targets, log_p) in enumerate(zip(data, constants)):
            _check_support(np.asarray(init.log_target(log_p)), targets, g, "ensemble")
    else:
        constants = [teacher_force(t.experts, t.symbols, t.lengths).step_logprobs for t in data]
        for g, (targets, steps) in enumerate(zip(data, constants)):
            log_q = local_log_likelihood(init, steps, targets.symbols, targets.lengths, smc.max_length)
            _check_support(np.asarray(log_q), targets, g, "token-local ensemble")

    @jit
    def update(grads, opt_state, params):
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    opt_state = optimizer.init(params)
    step_keys = jax.random.split(key, num_steps)
    losses = np.zeros(num_steps)
    log_zs = np.zeros((num_steps, len(data))) if objective == "global" else None
    progress = tqdm(range(num_steps), disable=not verbose, desc=f"fit ({objective})")
    for s in progress:
        grads = jax.tree.map(jnp.zeros_like, params)
        loss = 0.0
        for g, (targets, const, share) in enumerate(zip(data, constants, shares)):
            if objective == "global":
                key_g = jax.random.fold_in(step_keys[s], g)
                loss_g, log_z, grad_g = global_step(params, base, key_g, targets.experts, const, smc)
                log_zs[s, g] = float(log_z)
                if not np.isfinite(log_zs[s, g]):
                    raise ZeroWeightError(
                        f"step {s}: every particle for group {g} ended with zero weight, so there is no "
                        "gradient estimate; use more particles or a coverage ensemble (tau > 0)"
                    )
            else:
                loss_g, grad_g = local_step(params, base, const, targets.symbols, targets.lengths, smc.max_length)
            loss += share * float(loss_g)
            grads = jax.tree.map(lambda acc, new: acc + share * new, grads, grad_g)
        losses[s] = loss
        if not (np.isfinite(loss) and all(np.all(np.isfinite(x)) for x in jax.tree.leaves(grads))):
            raise FloatingPointError(
                f"step {s}: non-finite loss {loss} or gradient at {to_ensemble(params, base)}; a target "
                "may have left the support (tau crossed 0 with an expert giving it probability 0), or "
                "the learning rate is too large"
            )
        params, opt_state = update(grads, opt_state, params)
        progress.set_postfix(loss=f"{loss:.4f}")
    return FitResult(params=params, ensemble=to_ensemble(params, base), losses=losses, log_Z=log_zs)
