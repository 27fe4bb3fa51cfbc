"""Fixed-shape sampler state: M particles, strings of at most L symbols, T = L + 1 steps."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from smc_jax.experts.base import PAD_SYMBOL  # noqa: F401 (re-exported for the engine)


class Trace(NamedTuple):
    """Per-step diagnostics, indexed by SMC step (rows past the last step stay at their fill).

    Attributes
    ----------
    ess, resampled, num_active : jax.Array, shape [T]
    ancestors, log_weights : jax.Array, shape [T, M]
    """

    ess: Float[Array, "T"]  # effective sample size after the step's weight update
    resampled: Bool[Array, "T"]  # whether the step resampled
    ancestors: Int[Array, "T M"]  # ancestor of each particle after the step (identity if none)
    log_weights: Float[Array, "T M"]  # log weights after the update, before resampling
    num_active: Int[Array, "T"]  # particles still extending at the start of the step


class SMCState(NamedTuple):
    """The sampler's state between steps. Every particle-major array has M rows.

    Attributes
    ----------
    key : jax.Array
        PRNG key.
    step : jax.Array, shape []
    symbols : jax.Array, shape [M, L]
    lengths, done, eos : jax.Array, shape [M]
        Lengths, finished flags, and whether the particle ended with EOS.
    log_weights : jax.Array, shape [M]
    log_prefix : jax.Array, shape [M, K]
        log P_k(x_m) of each particle's prefix.
    expert_state : pytree
        The expert group's state.
    trace : Trace
    """

    key: PRNGKeyArray
    step: Int[Array, ""]
    symbols: Int[Array, "M L"]  # PAD_SYMBOL after each string's end
    lengths: Int[Array, "M"]
    done: Bool[Array, "M"]  # finished: EOS sampled, or zero weight, or stopped at the limit
    eos: Bool[Array, "M"]  # finished by EOS (a complete string)
    log_weights: Float[Array, "M"]
    log_prefix: Float[Array, "M K"]  # log P_k(x) per expert; log p_k(x) once EOS is sampled
    expert_state: Any
    trace: Trace

    @property
    def num_particles(self) -> int:
        return self.log_weights.shape[0]

    @property
    def active(self) -> Bool[Array, "M"]:
        return ~self.done


def empty_trace(num_steps: int, num_particles: int) -> Trace:
    return Trace(
        ess=jnp.zeros((num_steps,), jnp.float32),
        resampled=jnp.zeros((num_steps,), bool),
        ancestors=jnp.broadcast_to(jnp.arange(num_particles, dtype=jnp.int32), (num_steps, num_particles)),
        log_weights=jnp.full((num_steps, num_particles), -jnp.inf, jnp.float32),
        num_active=jnp.zeros((num_steps,), jnp.int32),
    )
