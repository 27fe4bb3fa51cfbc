"""Shaped sequential Monte Carlo for f-ensembles (paper Alg. 1, Sec. 5) as pure jitted steps.

Per active particle x with per-expert prefix log-probabilities log P_k(x), one step computes

    psi(a | x)   = f(P(x) * p(a | x)) / f(P(x))     for a in the alphabet      (shaping)
    psi(EOS | x) = f(P(x) * p(EOS | x)) / f(P(x))   = phi(x) / psi(x)           (Eq. 8)
    q(a | x)     = psi(a | x) / sum_a' psi(a' | x)                              (locally optimal)
    log w       += log sum_a psi(a | x)                                         (independent of a)

so that a finished particle carries w = phi(x) / q(x) (Prop. 5.1) and
Z_hat = mean_m w_m is unbiased for Z = sum_x phi(x). When the effective sample size falls
below `ess_threshold * M`, all particles (finished ones included, as in Alg. 1) are resampled
and every weight is set to the mean weight.

`resample_finished=False` (not in the paper) resamples only the particles still extending: when
their ESS falls below `ess_threshold` times their number n, n ancestors are drawn among them in
proportion to their weights and each gets their mean weight; finished particles keep theirs.
The total weight is unchanged and every particle's expected offspring weight equals its weight,
so Z_hat stays unbiased. Why: a finished particle's weight stops changing while active ones keep
gaining per-step factors (below 1 for consensus f), so Alg. 1's resampling copies finished
strings over active ones -- copies that add no diversity, since a finished string has no future
-- and Z_hat's share of longer strings rests on fewer particles (evaluation/smc_vs_is_toy.py).

At the length limit L the only admissible symbol is EOS: the proposal puts all its mass
there and the weight gains log psi(EOS | x), so the sampler targets phi restricted to strings of
length <= L, unbiasedly (`at_max_length="eos"`). Before that step, experts that give EOS
probability 0 may heal it (`expert_advance_heal_eos`, along with the advance that reaches the
limit: byte beams back off to a token boundary).
`at_max_length="truncate"` instead stops particles at L without that factor; their strings are
marked unfinished and their weights are psi(x) / q(x) - a different (prefix) target, reported,
never hidden. Nothing reads the experts after the last symbol there, so they are not advanced by
it (no model call at the last step).

The experts read a step's symbols at the start of the next step (`SMC.catch_up`), after its
resampling: a particle dropped by resampling is never advanced, and the first step's advance,
which reads nothing, is where experts that start without next-symbol distributions
(`expert_init_deferred`) compute them, with the step's own model calls rather than a program
of their own.

Baselines: importance sampling is `ess_threshold=0`; the token-local ensemble
(`method="local"`) samples q(a | x) ∝ f(p_1(a | x), ..., p_K(a | x)) (f applied to the
experts' next-symbol conditionals, renormalized) and ignores weights.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Literal, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from smc_jax.smc.ensemble import Ensemble
from smc_jax.experts.base import (
    ExpertGroup,
    expert_advance_heal_eos,
    expert_failure,
    expert_init_deferred,
    expert_stats,
    stack_experts,
)
from smc_jax.smc import progress as progress_hooks
from smc_jax.smc.draw import draw_symbols
from smc_jax.smc.resampling import RESAMPLERS, effective_sample_size, get_resampler, resample_within
from smc_jax.smc.result import SMCResult, ZeroWeightError
from smc_jax.smc.state import PAD_SYMBOL, SMCState, Trace, empty_trace
from smc_jax.utils.buckets import multiple_bucket
from smc_jax.utils.compilation import jit, stored_jit

class Proposal(NamedTuple):
    """One step's proposal: the sampled symbols, log sum_a psi(a | x) and whether it is finite."""

    symbols: Int[Array, "M"]
    log_norm: Float[Array, "M"]
    viable: Bool[Array, "M"]


Method = Literal["smc", "local"]
AtMaxLength = Literal["eos", "truncate"]
METHODS = ("smc", "local")
AT_MAX_LENGTH = ("eos", "truncate")


@dataclasses.dataclass(frozen=True)
class SMC:
    """A sampler configuration; hashable, so it is a static argument of the jitted run.

    num_particles: M. max_length: L, the longest string (in symbols) a particle may produce.
    ess_threshold: resample when ESS < ess_threshold * M (0 = importance sampling, 1 = always
    when weights differ). resampler: multinomial (paper default), systematic, stratified or
    residual. method: "smc" (global f-ensemble) or "local" (token-local baseline).

    Parameters
    ----------
    num_particles : int
        M.
    max_length : int
        L, in symbols.
    ess_threshold : float
        Resample when ESS < ess_threshold * M.
    resampler : str
        "multinomial", "systematic", "stratified" or "residual".
    method : {"smc", "local"}
        Shaped SMC, or the token-local baseline.
    at_max_length : {"eos", "truncate"}
        Force EOS at L with its weight factor, or stop there without it.
    progress : bool
        Report each step to `smc_jax.smc.progress` listeners: the loop runs one step per
        dispatch and reads the step counter between them (no host call inside the program,
        which stays cacheable).
    resample_finished : bool
        True: resample all particles (Alg. 1); False: only the active ones.
    """

    num_particles: int
    max_length: int
    ess_threshold: float = 0.9
    resampler: str = "multinomial"
    method: Method = "smc"
    at_max_length: AtMaxLength = "eos"
    progress: bool = False  # report each step to `smc_jax.smc.progress` listeners (see above)
    resample_finished: bool = True  # Alg. 1; False: resample only the active particles (see above)

    def __post_init__(self):
        if not isinstance(self.num_particles, int) or self.num_particles < 1:
            raise ValueError(f"num_particles (M) must be an integer >= 1, got {self.num_particles!r}")
        if not isinstance(self.max_length, int) or self.max_length < 1:
            raise ValueError(f"max_length must be an integer >= 1, got {self.max_length!r}")
        if not (isinstance(self.ess_threshold, (int, float)) and 0.0 <= self.ess_threshold <= 1.0):
            raise ValueError(f"ess_threshold must be in [0, 1], got {self.ess_threshold!r}")
        get_resampler(self.resampler)
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r}; use one of {METHODS}")
        if self.at_max_length not in AT_MAX_LENGTH:
            raise ValueError(f"unknown at_max_length {self.at_max_length!r}; use one of {AT_MAX_LENGTH}")

    @property
    def num_steps(self) -> int:
        """The upper bound on the number of steps (L symbols, plus the forced EOS step)."""
        return self.max_length + (1 if self.at_max_length == "eos" else 0)

    @property
    def limit(self) -> int | Int[Array, ""]:
        """L as the step reads it: `max_length`, or in a dispatched run the run-time value
        (`_Knobs.max_length`; `max_length` is then its bucket, the arrays' width)."""
        knob = getattr(self.ess_threshold, "max_length", None)
        return self.max_length if knob is None else knob

    @property
    def forces_eos(self) -> bool | Bool[Array, ""]:
        """Whether EOS is forced at the limit (`at_max_length == "eos"`), as the step reads it:
        in a dispatched run the run-time value (`_Knobs.forces_eos`; the program then holds both
        modes' code and `num_steps` is the eos mode's)."""
        knob = getattr(self.ess_threshold, "forces_eos", None)
        return self.at_max_length == "eos" if knob is None else knob

    @property
    def step_limit(self) -> int | Int[Array, ""]:
        """`num_steps` as the step reads it (see `limit`)."""
        forces = self.forces_eos
        return self.limit + (forces.astype(jnp.int32) if isinstance(forces, jax.Array) else int(forces))

    # ---------------------------------------------------------------- pure functions

    def init(self, key: PRNGKeyArray, experts: ExpertGroup, ensemble: Ensemble) -> SMCState:
        """All particles at the empty string with weight psi(epsilon) = f(1, ..., 1).

        Parameters
        ----------
        key : jax.Array
            PRNG key.
        experts : ExpertGroup
            The K experts.
        ensemble : Ensemble
            The f-ensemble.

        Returns
        -------
        SMCState
        """
        m, k = self.num_particles, experts.num_experts
        if ensemble.num_experts != k:
            raise ValueError(f"the ensemble is for {ensemble.num_experts} experts, but {k} were given")
        log_prefix = jnp.zeros((m, k), jnp.float32)
        if self.method == "smc":
            log_weights = jnp.broadcast_to(ensemble.log_shaping(jnp.zeros((k,), jnp.float32)), (m,))
        else:
            log_weights = jnp.zeros((m,), jnp.float32)
        return SMCState(
            key=key,
            step=jnp.zeros((), jnp.int32),
            symbols=jnp.full((m, self.max_length), PAD_SYMBOL, jnp.int32),
            lengths=jnp.zeros((m,), jnp.int32),
            done=jnp.zeros((m,), bool),
            eos=jnp.zeros((m,), bool),
            log_weights=log_weights.astype(jnp.float32),
            log_prefix=log_prefix,
            expert_state=expert_init_deferred(experts, m),
            trace=empty_trace(self.num_steps, m),
        )

    def proposal_logits(
        self, state: SMCState, logp: Float[Array, "M K A1"], ensemble: Ensemble
    ) -> Float[Array, "M A1"]:
        """log psi(a | x) for method "smc" (log f(p(a | x)) for "local"), -inf where inadmissible.

        Parameters
        ----------
        state : SMCState
            The current state.
        logp : jax.Array, shape [M, K, A + 1]
            The experts' next-symbol log-probabilities.
        ensemble : Ensemble
            The f-ensemble.

        Returns
        -------
        jax.Array, shape [M, A + 1]
        """
        a = logp.shape[-1] - 1
        if self.method == "smc":
            log_next = state.log_prefix[:, :, None] + logp  # [M, K, A+1]
            # Mapped over the symbols rather than transposed to [M, A+1, K]: the reduction over
            # the experts then reads rows of A symbols (a transposed copy over a token vocabulary
            # cost a millisecond per step).
            log_psi_sym = jax.vmap(ensemble.log_shaping, in_axes=2, out_axes=1)(log_next[:, :, :a])
            log_phi = ensemble.log_target(log_next[:, :, a])
            log_psi_x = ensemble.log_shaping(state.log_prefix)
            logits = jnp.concatenate([log_psi_sym, log_phi[:, None]], axis=-1) - log_psi_x[:, None]
            logits = jnp.where(jnp.isfinite(log_psi_x)[:, None], logits, -jnp.inf)
        else:
            logits = jax.vmap(ensemble.log_target, in_axes=2, out_axes=1)(logp)
        is_eos = jnp.arange(a + 1) == a
        at_limit = state.step >= self.limit
        return jnp.where(at_limit & ~is_eos, -jnp.inf, logits)

    def step(self, state: SMCState, experts: ExpertGroup, ensemble: Ensemble) -> SMCState:
        """Extends every active particle by one symbol, updates weights, maybe resamples.

        Parameters
        ----------
        state : SMCState
            The current state.
        experts : ExpertGroup
            The K experts.
        ensemble : Ensemble
            The f-ensemble.

        Notes
        -----
        The five parts, in order: `catch_up` (the experts read the previous step's symbols),
        `propose` (sample each particle's next symbol from q), `reweight` (the incremental
        weights and the extended particles), `resample` (when the ESS is low) and `record` (the
        trace row of this step).
        """
        key, key_sample, key_resample = jax.random.split(state.key, 3)
        state = state._replace(expert_state=self.catch_up(state, experts))
        logp = experts.logprobs(state.expert_state)
        # The expert-group contract at the engine's boundary (static shapes: no run-time cost).
        chex.assert_shape(logp, (self.num_particles, experts.num_experts, experts.alphabet_size + 1))
        chex.assert_type(logp, float)
        logp = logp.astype(jnp.float32)  # [M, K, A+1]
        proposal = self.propose(key_sample, state, logp, ensemble)
        moved = self.reweight(state, logp, proposal)
        ess = effective_sample_size(moved.log_weights)
        resampled, ancestors, moved, pre_resample_log_weights = self.resample(key_resample, moved, experts, ess)
        trace = self.record(state, ess=ess, resampled=resampled, ancestors=ancestors,
                            log_weights=pre_resample_log_weights)
        return moved._replace(key=key, step=state.step + 1, trace=trace)

    def catch_up(self, state: SMCState, experts: ExpertGroup) -> Any:
        """The experts' state after reading each particle's last symbol, the one the previous
        step appended (after its resampling, so only surviving particles are read). A particle
        still extending at step t >= 1 extended at step t - 1 (each step extends or finishes
        every active particle), so nothing else needs recording. At the length limit under a
        forced EOS the particles that reach it are EOS-healed along with their advance. At
        step 0 nothing is read: experts that start deferred compute their first
        distributions here (`expert_init_deferred`).

        Parameters
        ----------
        state : SMCState
            The particles at the step's start.
        experts : ExpertGroup
            The K experts.
        """
        last = jnp.take_along_axis(state.symbols, jnp.maximum(state.lengths - 1, 0)[:, None], axis=1)[:, 0]
        read = ~state.done & (state.step >= 1)
        forces_eos = self.forces_eos
        if forces_eos is False:
            return experts.advance(state.expert_state, last, read)
        forced = read & (state.step >= self.limit) & forces_eos
        return expert_advance_heal_eos(experts, state.expert_state, last, read, forced)

    @jax.named_scope("proposal")
    def propose(self, key: PRNGKeyArray, state: SMCState, logp: Float[Array, "M K A1"], ensemble: Ensemble) -> Proposal:
        """Samples each active particle's next symbol from q(a | x) ∝ psi(a | x) (EOS for the
        finished ones and, with log-normalizer -inf, for the dead ones).

        Parameters
        ----------
        key : PRNGKeyArray
            The step's sampling key.
        state : SMCState
            The particles before the step.
        logp : jax.Array, shape [M, K, A + 1]
            log p_k(a | x_m) of every expert and symbol (EOS last).
        ensemble : Ensemble
            The f-ensemble giving the shaping psi.

        Returns
        -------
        Proposal
            The sampled symbols [M], log sum_a psi(a | x) [M] and whether it is finite [M].
        """
        eos = logp.shape[-1] - 1
        logits = self.proposal_logits(state, logp, ensemble)
        symbols, log_norm = draw_symbols(key, logits)  # a ~ q(a | x), log sum_a psi(a | x)
        viable = jnp.isfinite(log_norm)
        symbols = jnp.where(~state.done & viable, symbols, eos)
        return Proposal(symbols=symbols, log_norm=log_norm, viable=viable)

    @jax.named_scope("reweighting")
    def reweight(self, state: SMCState, logp: Float[Array, "M K A1"], proposal: Proposal) -> SMCState:
        """The particles after their proposed symbols: weights times sum_a psi(a | x), prefixes,
        strings, lengths and finished flags (key, step, trace and expert states unchanged: the
        experts read the symbols in the next step's `catch_up`).

        Parameters
        ----------
        state : SMCState
            The particles before the step.
        logp : jax.Array, shape [M, K, A + 1]
            The experts' next-symbol log-probabilities of this step.
        proposal : Proposal
            What `propose` returned.
        """
        active = ~state.done
        symbols, log_norm, viable = proposal
        eos = logp.shape[-1] - 1
        # A particle whose every continuation has zero shaping is dead: zero weight, finished.
        dead = active & ~viable
        took_eos = active & viable & (symbols == eos)
        extend = active & viable & ~took_eos

        if self.method == "smc":
            log_weights = jnp.where(active, state.log_weights + jnp.where(viable, log_norm, -jnp.inf), state.log_weights)
        else:
            log_weights = jnp.where(dead, -jnp.inf, state.log_weights)
        sym_logp = jnp.take_along_axis(logp, symbols[:, None, None], axis=2)[..., 0]  # [M, K]
        log_prefix = jnp.where((extend | took_eos)[:, None], state.log_prefix + sym_logp, state.log_prefix)
        # Elementwise (a scatter at [m, lengths[m]] would make a sharded run gather its indices).
        write = extend[:, None] & (jnp.arange(state.symbols.shape[1])[None, :] == state.lengths[:, None])
        return state._replace(
            symbols=jnp.where(write, symbols[:, None], state.symbols),
            lengths=state.lengths + extend.astype(jnp.int32),
            done=state.done | took_eos | dead,
            eos=state.eos | took_eos,
            log_weights=log_weights,
            log_prefix=log_prefix,
        )

    @jax.named_scope("resampling")
    def resample(
        self, key: PRNGKeyArray, state: SMCState, experts: ExpertGroup, ess: Float[Array, ""]
    ) -> tuple[Array, Array, SMCState, Array]:
        """Resamples the pool (all particles, or only the active ones) when its ESS is low.

        Returns (resampled flag, ancestors, the state after resampling, the log weights before
        it); without resampling (importance sampling, the local baseline) the state is unchanged
        and the ancestors are the identity.

        Parameters
        ----------
        key : PRNGKeyArray
            The resampling key.
        state : SMCState
            The particles after `reweight`.
        experts : ExpertGroup
            The experts (their states are reordered along with the particles).
        ess : jax.Array, shape []
            The effective sample size after the weight update.
        """
        m = self.num_particles
        ancestors = jnp.arange(m, dtype=jnp.int32)
        log_weights, done = state.log_weights, state.done
        traced = not isinstance(self.ess_threshold, (int, float))  # a run-time value (see `_dispatched`)
        if self.method != "smc" or (not traced and self.ess_threshold <= 0):
            return jnp.zeros((), bool), ancestors, state, log_weights
        # The resampled pool: every particle (Alg. 1), or only those still extending.
        if self.resample_finished:
            pool, pool_count, pool_ess, log_pool_size = jnp.ones((m,), bool), m, ess, math.log(m)
        else:
            pool = ~done
            pool_count = jnp.sum(pool)  # >= 1 whenever a particle is active (else no resampling)
            pool_ess = effective_sample_size(jnp.where(pool, log_weights, -jnp.inf))
            log_pool_size = jnp.log(jnp.maximum(pool_count, 1).astype(jnp.float32))
        pool_log_weights = jnp.where(pool, log_weights, -jnp.inf)
        total = jax.nn.logsumexp(pool_log_weights)
        # A static threshold times the static M is a Python product; a traced one comes as that
        # product already (`_Knobs.ess_limit`), so both compare the same float32 number.
        if not traced:
            limit = self.ess_threshold * pool_count
        else:
            limit = self.ess_threshold.ess_limit if self.resample_finished else self.ess_threshold.value * pool_count
        resampled = (pool_ess < limit) & jnp.any(~done) & jnp.isfinite(total)
        weights = jnp.exp(pool_log_weights - jnp.where(jnp.isfinite(total), total, 0.0))
        resampler = get_resampler(self.resampler)
        if traced and self.ess_threshold.resampler is not None:  # the resampler is a run-time choice too
            choice, branches = self.ess_threshold.resampler, list(RESAMPLERS.values())
            resampler = lambda key, w, n: jax.lax.switch(choice, [partial(f, n=n) for f in branches], key, w)  # noqa: E731
        if self.resample_finished:
            drawn = resampler(key, weights, m)
        else:
            drawn = resample_within(resampler, key, weights, pool)
        ancestors = jnp.where(resampled, drawn, ancestors)

        @jax.named_scope("resample")  # names the ancestor gathers (and their collectives) in HLO
        def gather(carry):
            sym_, len_, done_, eos_, pre_, exp_ = carry
            take = lambda x: jnp.take(x, ancestors, axis=0)
            return (take(sym_), take(len_), take(done_), take(eos_), take(pre_), experts.reorder(exp_, ancestors))

        carry = (state.symbols, state.lengths, done, state.eos, state.log_prefix, state.expert_state)
        symbols, lengths, done, eos, log_prefix, expert_state = jax.lax.cond(resampled, gather, lambda c: c, carry)
        mean_log_weight = total - log_pool_size
        new_log_weights = jnp.where(resampled & pool, mean_log_weight, log_weights)
        state = state._replace(symbols=symbols, lengths=lengths, done=done, eos=eos, log_prefix=log_prefix,
                               expert_state=expert_state, log_weights=new_log_weights)
        return resampled, ancestors, state, log_weights

    @jax.named_scope("recording")
    def record(self, state: SMCState, *, ess, resampled, ancestors, log_weights) -> Trace:
        """The trace with this step's row (ESS after the weight update, the resampling flag,
        ancestors, log weights before resampling, particles active at the step's start).

        Parameters
        ----------
        state : SMCState
            The particles at the step's start (their trace gets the row).
        ess : jax.Array, shape []
            The ESS after the weight update.
        resampled : jax.Array, shape []
            Whether the step resampled.
        ancestors : jax.Array, shape [M]
            Each particle's ancestor (the identity without resampling).
        log_weights : jax.Array, shape [M]
            The log weights before resampling.
        """
        t = state.step
        return Trace(
            ess=state.trace.ess.at[t].set(ess),
            resampled=state.trace.resampled.at[t].set(resampled),
            ancestors=state.trace.ancestors.at[t].set(ancestors),
            log_weights=state.trace.log_weights.at[t].set(log_weights),
            num_active=state.trace.num_active.at[t].set(jnp.sum(~state.done).astype(jnp.int32)),
        )

    def run(
        self,
        key: PRNGKeyArray,
        experts: ExpertGroup,
        ensemble: Ensemble,
        constrain: Callable[[SMCState], SMCState] | None = None,
    ) -> SMCState:
        """Steps until every particle is finished (or the length limit), in a lax.while_loop.

        `constrain`, when given, is applied to the state after init and after every step (the
        sharded run pins each array's sharding with it; see `smc_jax.smc.sharding`).

        Parameters
        ----------
        key : jax.Array
            PRNG key.
        experts : ExpertGroup
            The K experts.
        ensemble : Ensemble
            The f-ensemble.
        constrain : callable, optional
            SMCState -> SMCState, applied after init and every step.

        Returns
        -------
        SMCState
            The final state (device arrays).
        """
        constrain = constrain or (lambda s: s)
        state = constrain(self.init(key, experts, ensemble))
        return finish(self.advance(state, experts, ensemble, self.num_steps, constrain))

    def advance(
        self,
        state: SMCState,
        experts: ExpertGroup,
        ensemble: Ensemble,
        stop: int | Int[Array, ""],
        constrain: Callable[[SMCState], SMCState] | None = None,
    ) -> SMCState:
        """Steps until step `stop` (at most the length limit) or until every particle is
        finished, in a lax.while_loop; `stop` may be traced, so one program serves every chunk.

        Parameters
        ----------
        state : SMCState
            The particles.
        experts : ExpertGroup
            The K experts.
        ensemble : Ensemble
            The f-ensemble.
        stop : int or jax.Array
            The step index to stop at.
        constrain : callable, optional
            SMCState -> SMCState, applied after every step.

        Returns
        -------
        SMCState
        """
        constrain = constrain or (lambda s: s)
        stop = jnp.minimum(jnp.asarray(stop, jnp.int32), self.step_limit)

        def cond(s: SMCState):
            return (s.step < stop) & jnp.any(~s.done)

        return jax.lax.while_loop(cond, lambda s: constrain(self.step(s, experts, ensemble)), state)

    # ---------------------------------------------------------------- convenience

    def __call__(
        self,
        key: PRNGKeyArray,
        experts: ExpertGroup | Sequence[ExpertGroup],
        ensemble: Ensemble,
        *,
        decode: Callable | None = None,
        jit: bool = True,
        allow_zero_weight: bool = False,
    ) -> SMCResult:
        """Runs the sampler and returns host-side results.

        Raises `ZeroWeightError` when every particle ends at zero weight (the experts share no
        string the ensemble gives mass to), unless `allow_zero_weight`.

        Parameters
        ----------
        key : jax.Array
            PRNG key.
        experts : ExpertGroup or sequence of ExpertGroup
            The K experts.
        ensemble : Ensemble
            The f-ensemble (`make_ensemble`).
        decode : callable, optional
            Maps a particle's symbols [n] to its text (`SMCResult.texts`).
        jit : bool
            Run the compiled loop (False: step by step, for debugging).
        allow_zero_weight : bool
            Return the result even when every particle ends at zero weight.

        Returns
        -------
        SMCResult
        """
        experts = stack_experts(experts)
        if ensemble.num_experts != experts.num_experts:
            raise ValueError(
                f"the ensemble is for {ensemble.num_experts} experts, but {experts.num_experts} were given"
            )
        state = self._dispatched(key, experts, ensemble) if jit else _run(self, key, experts, ensemble)
        return self.result(state, experts, decode=decode, allow_zero_weight=allow_zero_weight)

    def _dispatched(self, key: PRNGKeyArray, experts: ExpertGroup, ensemble: Ensemble) -> SMCState:
        """`run` as three jitted programs (init, advance, finish) that serve both settings of
        `progress`: without it, one `advance` runs the whole loop; with it, each dispatch of
        `advance` runs one step and the step is reported to the listeners (a host sync between
        steps, none inside one). The same steps and results either way."""
        quiet, knobs = self.split_knobs()
        state = _init_jitted(quiet, key, experts, ensemble)
        if not self.progress:
            return _finish_jitted(_advance_jitted(quiet, knobs, state, experts, ensemble, np.int32(self.num_steps)))
        step = 0
        while step < self.num_steps:
            state = _advance_jitted(quiet, knobs, state, experts, ensemble, np.int32(step + 1))
            step, active = int(state.step), int(np.sum(~np.asarray(state.done)))  # host arithmetic: no program
            progress_hooks.report(step - 1, active)
            if active == 0:
                break
        return _finish_jitted(state)

    def split_knobs(self) -> tuple["SMC", "_Knobs"]:
        """(this sampler with its run-time settings at fixed placeholders, those settings as
        arrays): the compiled programs are keyed by the first alone, so a sweep over the
        threshold, the resampler, the length limit within its bucket (`length_bucket`) or
        `at_max_length` reuses them (`with_knobs` puts the values back, traced)."""
        quiet = dataclasses.replace(self, progress=False, ess_threshold=1.0, resampler="multinomial",
                                    max_length=length_bucket(self.max_length), at_max_length="eos")
        knobs = _Knobs(value=np.float32(self.ess_threshold), ess_limit=np.float32(self.ess_threshold * self.num_particles),
                       resampler=np.int32(list(RESAMPLERS).index(self.resampler)), max_length=np.int32(self.max_length),
                       forces_eos=np.bool_(self.at_max_length == "eos"))
        return quiet, knobs

    def with_knobs(self, knobs: "_Knobs") -> "SMC":
        """This sampler reading its threshold, resampler, length limit and forced EOS from `knobs`
        (traced values).

        Parameters
        ----------
        knobs : _Knobs
            The run-time settings (from `split_knobs`).
        """
        traced = copy.copy(self)
        object.__setattr__(traced, "ess_threshold", knobs)  # past the checks of a Python number
        return traced

    def result(
        self,
        state: SMCState,
        experts: ExpertGroup,
        *,
        decode: Callable | None = None,
        allow_zero_weight: bool = False,
    ) -> SMCResult:
        """Host-side results of a finished run's state (see `__call__` for the errors raised).

        Parameters
        ----------
        state : SMCState
            A finished run's state.
        experts : ExpertGroup
            The experts it ran with (for their counters and failure checks).
        decode : callable, optional
            Maps a particle's symbols to its text.
        allow_zero_weight : bool
            Return the result even when every particle ends at zero weight.
        """
        problem = expert_failure(experts, state.expert_state)
        if problem is not None:
            raise problem
        # A dispatched run's arrays are its length bucket wide; cut on the host (no program per L).
        state = state._replace(symbols=np.asarray(state.symbols)[:, : self.max_length])
        stats = {"steps": int(state.step), **expert_stats(experts, state.expert_state)}
        result = SMCResult.from_state(state, method=self.method, decode=decode, stats=stats)
        if not allow_zero_weight and result.log_Z is not None and result.log_Z == -math.inf:
            raise ZeroWeightError(
                "every particle ended with zero weight: no sampled string has positive probability "
                "under the ensemble (for consensus f such as min/product, the experts may share no "
                "string). Try more particles, a coverage f (mixture/max), or a longer max_length."
            )
        if result.log_Z is None and not result.weights.sum() > 0:
            raise ZeroWeightError("every particle of the local sampler hit a symbol no expert allows")
        return result


#: Length limits are rounded up to a multiple of this for the arrays' width (`length_bucket`).
LENGTH_BUCKET = 16


def length_bucket(max_length: int) -> int:
    """The width of the arrays of a run up to `max_length` symbols: the next multiple of
    `LENGTH_BUCKET`, so runs whose limits share it share their compiled programs.

    Parameters
    ----------
    max_length : int
        L.
    """
    return multiple_bucket(max_length, LENGTH_BUCKET)


def finish(state: SMCState) -> SMCState:
    """The state after the last step: particles still extending at the limit (truncate mode)
    stop unfinished."""
    return state._replace(done=jnp.ones_like(state.done))


def _run(smc: SMC, key: PRNGKeyArray, experts: ExpertGroup, ensemble: Ensemble) -> SMCState:
    return smc.run(key, experts, ensemble)


def _init(smc: SMC, key: PRNGKeyArray, experts: ExpertGroup, ensemble: Ensemble) -> SMCState:
    return smc.init(key, experts, ensemble)


class _Knobs(NamedTuple):
    """Settings as run-time values: a sweep over them reuses one program."""

    value: Float[Array, ""]  # ess_threshold
    ess_limit: Float[Array, ""]  # ess_threshold * M, rounded from the exact product
    resampler: Int[Array, ""] | None = None  # index into `RESAMPLERS`; None: the SMC's own
    max_length: Int[Array, ""] | None = None  # L; None: the SMC's own (else its max_length is L's bucket)
    forces_eos: Bool[Array, ""] | None = None  # at_max_length == "eos"; None: the SMC's own


def _advance(smc: SMC, knobs: _Knobs, state: SMCState, experts: ExpertGroup, ensemble: Ensemble,
             stop: Int[Array, ""]) -> SMCState:
    return smc.with_knobs(knobs).advance(state, experts, ensemble, stop)


_init_jitted = jit(_init, static_argnums=0)
# The state is donated: a chunk updates the particles (and the experts' caches) in place. The
# traced program is kept on disk: a new process skips tracing (tens of seconds for bytes).
_advance_jitted = stored_jit(_advance, static_argnums=(0,), donate_argnums=(2,))
_finish_jitted = jit(finish)


run_jitted = jit(_run, static_argnums=0)
run_jitted.__doc__ = "`SMC.run` jitted once per sampler configuration and expert structure."


def importance_sampling(num_particles: int, max_length: int, **kwargs) -> SMC:
    """Sequential importance sampling: the same sampler, never resampling.

    Parameters
    ----------
    num_particles : int
        M.
    max_length : int
        L.
    **kwargs
        Other `SMC` arguments.
    """
    return SMC(num_particles=num_particles, max_length=max_length, ess_threshold=0.0, **kwargs)


def local_ensemble(num_particles: int, max_length: int, **kwargs) -> SMC:
    """The token-local baseline: sample f of the next-symbol conditionals, ignore weights.

    Parameters
    ----------
    num_particles : int
        M.
    max_length : int
        L.
    **kwargs
        Other `SMC` arguments.
    """
    return SMC(num_particles=num_particles, max_length=max_length, method="local", **kwargs)


@partial(jit, static_argnums=0)
def run_batch(smc: SMC, keys: PRNGKeyArray, experts: ExpertGroup, ensemble: Ensemble) -> SMCState:
    """Independent runs for a batch of keys (leading axis), vmapped in one jitted call."""
    return jax.vmap(lambda k: smc.run(k, experts, ensemble))(keys)
