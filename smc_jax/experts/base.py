"""The expert interface the SMC engine calls.

An *expert group* is one or more experts that advance together over a shared alphabet of A
symbols plus end-of-string. Symbols are integers 0..A-1 and EOS is the integer A
(`eos_symbol(alphabet_size)`), so next-symbol arrays have A + 1 entries.

Contract (checked by the reusable tests in tests/experts_contract.py):
* `init(M)` returns a state pytree for M particles at the empty string; every leaf that belongs
  to a particle has the particle axis first (the default `reorder` relies on it).
* `logprobs(state)` returns log p_k(a | x) for every particle m, expert k of the group and
  symbol a in alphabet + EOS: shape [M, K, A + 1], float32, each row a normalized
  distribution (logsumexp = 0) or, for a string the expert cannot produce, anything <= 0
  (the engine multiplies by the expert's prefix probability, which is then 0).
  *Potentials* relax this: a group with `is_potential = True` (a hard constraint,
  `smc_jax.experts.constraint.ConstraintExpert`) returns log phi(xa) / phi^(x) for a potential
  phi that need not sum to 1 over continuations -- for a 0/1 constraint, 0 where xa can still be
  completed in the language (EOS: where x is in it) and -inf elsewhere, so a row's logsumexp is
  the log of the number of viable symbols. The engine treats every column alike (it multiplies
  prefix values), and `smc_jax.smc.ensemble.ConstrainedEnsemble` decides how potentials enter f.
* `advance(state, symbols, active)` appends `symbols[m]` to particle m where `active[m]`, and
  leaves the other particles unchanged (their symbol is arbitrary, e.g. EOS or padding).
* `reorder(state, ancestors)` returns the state of particles `ancestors` (resampling).
* optionally, `failure(state)` (host side, after a run) returns an exception (or a message) when the group
  could not represent the run faithfully (e.g. a cache ran out of room), else None.
* optionally, `init_deferred(M)` returns a state whose `logprobs` are valid only after the
  next `advance` (with any `active`, none included): the SMC engine advances at the start of
  every step (`SMC.catch_up`), so a group can leave its first distributions to that advance's
  model calls instead of a program of their own (`expert_init_deferred`).
* optionally, `heal_eos(state, forced)` gives EOS a probability where it had 0 for the particles
  that must read it next (`expert_heal_eos`), and `advance_heal_eos(state, symbols, active,
  forced)` does `advance` and then that in one pass (`expert_advance_heal_eos`).

Everything is pure and jittable; groups are pytrees so that their parameters are arguments of
the jitted sampler rather than constants baked into it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import chex
import jax
import jax.numpy as jnp
from flax import struct
from jaxtyping import Array, Bool, Float, Int

PyTree = Any

#: Symbol stored past the end of a string (sampled strings and padded teacher-forcing targets).
PAD_SYMBOL = -1


def eos_symbol(alphabet_size: int) -> int:
    """The end-of-string symbol of an alphabet of `alphabet_size` symbols: the next integer.

    Parameters
    ----------
    alphabet_size : int
        A.
    """
    return alphabet_size


@runtime_checkable
class ExpertGroup(Protocol):
    """K experts that advance together over an alphabet of A symbols plus EOS (symbol A).

    The contract is in this module's docstring. `ExpertStack` combines several groups;
    `smc_jax.experts.TableExpert` and `NGramExpert` are toy groups, and language models become
    groups through `smc_jax.sampler.EnsembleSampler`.

    Attributes
    ----------
    num_experts : int
        K.
    alphabet_size : int
        A (EOS is the symbol A).
    """

    num_experts: int
    alphabet_size: int

    def init(self, num_particles: int) -> PyTree:
        """The state of `num_particles` (M) particles at the empty string (particle axis first)."""
        ...

    def logprobs(self, state: PyTree) -> Float[Array, "M K A1"]:
        """log p_k(a | x) for every particle m, expert k and symbol a (EOS last): [M, K, A + 1]."""
        ...

    def advance(self, state: PyTree, symbols: Int[Array, "M"], active: Bool[Array, "M"]) -> PyTree:
        """Appends `symbols` [M] to the particles where `active` [M]; the others are unchanged.

        Parameters
        ----------
        state : pytree
            The particles' state.
        symbols : jax.Array, shape [M]
            One symbol per particle (0..A, EOS = A).
        active : jax.Array, shape [M], bool
            Which particles extend.
        """
        ...

    def reorder(self, state: PyTree, ancestors: Int[Array, "M"]) -> PyTree:
        """The state of particles `ancestors` [M] (resampling)."""
        ...


def take_particles(state: PyTree, ancestors: Int[Array, "M"]) -> PyTree:
    """Gathers every leaf of a particle-major state along its first axis.

    Parameters
    ----------
    state : pytree
        Leaves with the particle axis first, [M, ...].
    ancestors : jax.Array, shape [M]
        The particle each new particle copies.
    """
    return jax.tree.map(lambda leaf: jnp.take(leaf, ancestors, axis=0), state)


def where_active(active: Bool[Array, "M"], new: PyTree, old: PyTree) -> PyTree:
    """Per particle, the new state where active and the old one elsewhere.

    Parameters
    ----------
    active : jax.Array, shape [M], bool
        Which particles take the new state.
    new, old : pytree
        States with the particle axis first.
    """

    def select(n, o):
        mask = active.reshape(active.shape + (1,) * (n.ndim - 1))
        return jnp.where(mask, n, o)

    return jax.tree.map(select, new, old)


@struct.dataclass
class ExpertStack:
    """Several expert groups over one alphabet, seen as one group of sum_g K_g experts.

    The experts' axis is the concatenation of the groups' in order. This is how experts that
    cannot share a batched call (different models, or toy experts of different shapes) are
    combined; experts that can share one (one model under K prompts) form one group.

    Attributes
    ----------
    groups : tuple of ExpertGroup
        At least one group; all share one alphabet.
    """

    groups: tuple

    def __post_init__(self):
        if len(self.groups) == 0:
            raise ValueError("an ensemble needs at least one expert; the expert list is empty")
        sizes = {g.alphabet_size for g in self.groups}
        if len(sizes) != 1:
            raise ValueError(
                f"all experts must share one alphabet, got alphabet sizes {sorted(sizes)}; models "
                "with different tokenizers can only be ensembled at the byte level"
            )

    @property
    def num_experts(self) -> int:
        return sum(g.num_experts for g in self.groups)

    @property
    def alphabet_size(self) -> int:
        return self.groups[0].alphabet_size

    def init(self, num_particles: int) -> tuple:
        return tuple(g.init(num_particles) for g in self.groups)

    def init_deferred(self, num_particles: int) -> tuple:
        """Every group's `expert_init_deferred`.

        Parameters
        ----------
        num_particles : int
            M.
        """
        return tuple(expert_init_deferred(g, num_particles) for g in self.groups)

    def logprobs(self, state: tuple) -> Float[Array, "M K A1"]:
        parts = [g.logprobs(s) for g, s in zip(self.groups, state)]
        # Shapes are static: these checks cost nothing at run time and name the group at fault.
        chex.assert_rank(parts, 3)
        chex.assert_equal_shape_prefix(parts, 1)  # every group has M particles
        chex.assert_equal_shape_suffix(parts, 1)  # and one alphabet (plus EOS)
        return jnp.concatenate(parts, axis=1)

    def advance(self, state: tuple, symbols: Int[Array, "M"], active: Bool[Array, "M"]) -> tuple:
        return tuple(g.advance(s, symbols, active) for g, s in zip(self.groups, state))

    def advance_heal_eos(self, state: tuple, symbols: Int[Array, "M"], active: Bool[Array, "M"], forced: Bool[Array, "M"]) -> tuple:
        """Every group's `expert_advance_heal_eos`.

        Parameters
        ----------
        state : tuple
            The stack's state.
        symbols : jax.Array, shape [M], int
            Each particle's next symbol.
        active : jax.Array, shape [M], bool
            The particles that read it.
        forced : jax.Array, shape [M], bool
            The particles whose symbol after it is EOS.
        """
        return tuple(expert_advance_heal_eos(g, s, symbols, active, forced) for g, s in zip(self.groups, state))

    def reorder(self, state: tuple, ancestors: Int[Array, "M"]) -> tuple:
        return tuple(g.reorder(s, ancestors) for g, s in zip(self.groups, state))

    def heal_eos(self, state: tuple, forced: Bool[Array, "M"]) -> tuple:
        """Every group's `expert_heal_eos`.

        Parameters
        ----------
        state : tuple
            The stack's state.
        forced : jax.Array, shape [M], bool
            The particles whose next symbol is EOS.
        """
        return tuple(expert_heal_eos(g, s, forced) for g, s in zip(self.groups, state))

    def failure(self, state: tuple) -> Exception | None:
        """The first group's failure after a run (an exception to raise) (see `expert_failure`), or None.

        Parameters
        ----------
        state : tuple
            The stack's final state.
        """
        return next(filter(None, (expert_failure(g, s) for g, s in zip(self.groups, state))), None)

    def stats(self, state: tuple) -> dict[str, int]:
        """Summed over groups: model calls of different groups are sequential, so they add up, and
        each group's store capacities and peaks add up to the memory of the whole stack.

        Parameters
        ----------
        state : tuple
            The stack's state (one entry per group).
        """
        total: dict[str, int] = {}
        for g, s in zip(self.groups, state):
            for key, value in expert_stats(g, s).items():
                total[key] = total.get(key, 0) + value
        return total


def expert_stats(group: ExpertGroup, state: PyTree) -> dict[str, int]:
    """Host-side counters of a run (e.g. model calls), for groups that keep them."""
    stats = getattr(group, "stats", None)
    return stats(state) if stats is not None else {}


def expert_failure(group: ExpertGroup, state: PyTree) -> Exception | None:
    """Host-side check after a run: groups that can fail (a full cache, an emptied beam) define
    `failure(state) -> exception or None` (a message string is wrapped in a RuntimeError); the
    others never fail. Callers raise what it returns, so they can catch the failure by type."""
    check = getattr(group, "failure", None)
    problem = check(state) if check is not None else None
    return RuntimeError(problem) if isinstance(problem, str) else problem


def expert_init_deferred(group: ExpertGroup, num_particles: int) -> PyTree:
    """The state of M particles at the empty string for a caller that advances before it reads
    `logprobs` (the SMC engine): groups that can defer their first distributions to that
    advance define `init_deferred(M)` (byte-level experts: no model call at init); for the
    others it is `init(M)`."""
    deferred = getattr(group, "init_deferred", None)
    return deferred(num_particles) if deferred is not None else group.init(num_particles)


def expert_heal_eos(group: ExpertGroup, state: PyTree, forced: Bool[Array, "M"]) -> PyTree:
    """The state before the particles in `forced` read EOS (the sampler's forced EOS at the
    length limit, the end of a scored string): groups that can give EOS a probability where it
    had 0 define `heal_eos(state, forced)` (byte-level experts: EOS healing,
    `smc_jax.bytes.healing`); for the others the state is unchanged."""
    heal = getattr(group, "heal_eos", None)
    return heal(state, forced) if heal is not None else state


def expert_advance_heal_eos(
    group: ExpertGroup, state: PyTree, symbols: Int[Array, "M"], active: Bool[Array, "M"], forced: Bool[Array, "M"]
) -> PyTree:
    """`advance`, then `expert_heal_eos` for the particles in `forced` (those whose next symbol
    will be EOS). Groups that can do both at once define `advance_heal_eos(state, symbols,
    active, forced)` (byte-level experts: one loop of model calls, `ByteExperts._advance`)."""
    both = getattr(group, "advance_heal_eos", None)
    if both is not None:
        return both(state, symbols, active, forced)
    return expert_heal_eos(group, group.advance(state, symbols, active), forced)


def stack_experts(experts: ExpertGroup | Sequence[ExpertGroup]) -> ExpertGroup:
    """One group from a group or a non-empty sequence of groups over the same alphabet.

    Parameters
    ----------
    experts : ExpertGroup or sequence of ExpertGroup
        One group (returned as is) or several (an `ExpertStack` unless there is one).
    """
    if isinstance(experts, ExpertGroup) and not isinstance(experts, (list, tuple)):
        return experts
    experts = tuple(experts)
    if len(experts) == 1:
        return experts[0]
    return ExpertStack(groups=experts)
