"""B independent SMC problems in one program: each with its own experts (prompts), seed and M
particles, advanced together over a leading problem axis.

A step is `SMC.step` vmapped over the problems, so every model call carries the rows of all
B x M particles (one call per step and model, not B), while the ESS test, resampling, weights
and log Z-hat stay per problem. A problem's particles, weights and trace are those of its own
run with the same key, with one difference in the arithmetic: a data-dependent size (a model
call's row bucket, an attention width) is the largest any problem needs
(`smc_jax.utils.problems.shared_max`), so a problem's rows may be computed in a larger call than
alone -- the same rows, padded more. A problem whose particles are all finished stops: its step
counter, key and trace are frozen while the others go on. A problem whose particles all die, or
whose context store overflows, is that problem's error in the results; the others are unaffected.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jaxtyping import Array, Int, PRNGKeyArray

from smc_jax.experts.base import ExpertGroup, stack_experts
from smc_jax.smc import progress as progress_hooks
from smc_jax.smc.engine import SMC, finish
from smc_jax.smc.ensemble import Ensemble
from smc_jax.smc.result import SMCResult
from smc_jax.smc.sharding import PARTICLES, check_particle_split, state_specs
from smc_jax.smc.state import SMCState
from smc_jax.utils.compilation import jit, stored_jit
from smc_jax.utils.problems import PROBLEMS

PyTree = Any

__all__ = ["HOST_LEAF_BYTES", "check_problem_mesh", "gather_problems", "problem_mesh", "problem_results", "run_problems", "sample_problems", "stack_problems"]


def stack_problems(groups: Sequence[ExpertGroup | Sequence[ExpertGroup]]) -> tuple[ExpertGroup, tuple[bool, ...]]:
    """The experts of B problems as one group whose leaves have a leading problem axis, except
    the leaves that are the same object in every problem (such as a model's weights: passed
    once, not B times), and per leaf whether it is shared so.

    Parameters
    ----------
    groups : sequence of ExpertGroup (or of sequences of them)
        One expert group per problem, alike in everything but their array values (same models,
        K, settings and prompt bucket).

    Returns
    -------
    (ExpertGroup, tuple of bool)
        The stacked group and, per leaf, whether it is shared (for `run_problems`).
    """
    groups = [stack_experts(g) for g in groups]
    if not groups:
        raise ValueError("a batch needs at least one problem; the list of expert groups is empty")
    columns, treedef = jax.tree.flatten(groups[0])
    columns = [[leaf] for leaf in columns]
    for b, group in enumerate(groups[1:], start=1):
        leaves, other = jax.tree.flatten(group)
        if other != treedef:
            raise ValueError(
                f"problem {b}'s experts are built differently from problem 0's (other models, K or "
                "settings); a batch shares them -- run such problems in separate batches"
            )
        for i, leaf in enumerate(leaves):
            if jnp.shape(leaf) != jnp.shape(columns[i][0]) or jnp.result_type(leaf) != jnp.result_type(columns[i][0]):
                raise ValueError(
                    f"problem {b}'s experts have an array of shape {jnp.shape(leaf)} where problem 0's has "
                    f"{jnp.shape(columns[i][0])}: their prompts fall in different length buckets; build the "
                    "problems' prompts together (EnsembleSampler.sample_problems pads them to one bucket)"
                )
            columns[i].append(leaf)
    shared = [all(leaf is column[0] for leaf in column) for column in columns]
    stacked = [column[0] if same else jnp.stack(column) for column, same in zip(columns, shared)]
    return jax.tree.unflatten(treedef, stacked), tuple(shared)


def _over_problems(fn: Callable, shared: tuple[bool, ...], experts: ExpertGroup, *args):
    """fn(one problem's experts, *its args), vmapped over the problems (the args and the
    experts' unshared leaves have the problem axis first)."""
    leaves, treedef = jax.tree.flatten(experts)
    batched = [leaf for leaf, same in zip(leaves, shared) if not same]

    def one(own, *a):
        own = iter(own)
        return fn(jax.tree.unflatten(treedef, [leaf if same else next(own) for leaf, same in zip(leaves, shared)]), *a)

    return jax.vmap(one, axis_name=PROBLEMS)(batched, *args)


def _pin(state: SMCState, mesh: Mesh | None) -> SMCState:
    """`state` laid out on a mesh with a "particles" axis: problem b on the devices of row b's
    group, its particle-major leaves split over the row (`state_specs` of one problem, with the
    problem axis in front). Without one (or with one device per row) it is left to XLA."""
    if mesh is None or mesh.shape.get(PARTICLES, 1) == 1:
        return state
    one = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape[1:], leaf.dtype), state)
    specs = jax.tree.map(lambda spec: NamedSharding(mesh, P(PROBLEMS, *spec)), state_specs(one, mesh),
                         is_leaf=lambda x: isinstance(x, P))
    return jax.lax.with_sharding_constraint(state, specs)


def _init_problems(smc: SMC, shared: tuple[bool, ...], mesh: Mesh | None, impl: Any, key_data: Array,
                   experts: ExpertGroup, ensemble: Ensemble) -> SMCState:
    # Keys cross as their data: a mesh over processes places plain arrays (typed keys need not).
    keys = jax.random.wrap_key_data(key_data, impl=impl)
    return _pin(_over_problems(lambda group, key: smc.init(key, group, ensemble), shared, experts, keys), mesh)


def _advance_problems(smc: SMC, shared: tuple[bool, ...], mesh: Mesh | None, knobs, state: SMCState,
                      experts: ExpertGroup, ensemble: Ensemble, stop: Int[Array, ""]) -> SMCState:
    """`SMC.advance` of every problem, in one loop that runs while any problem goes on."""
    traced = smc.with_knobs(knobs)
    stop = jnp.minimum(stop, traced.step_limit)
    going = lambda s: (s.step < stop) & jnp.any(~s.done)

    def step(group: ExpertGroup, s: SMCState) -> SMCState:
        # A finished problem's step changes no particle (none is active, nothing resamples); only
        # its counter, key and trace row would move, so they are kept.
        new = traced.step(s, group, ensemble)
        keep = going(s)
        frozen = lambda a, b: jax.lax.select(keep, a, b) if a.ndim == 0 else jnp.where(keep, a, b)
        return new._replace(step=frozen(new.step, s.step), key=jax.lax.select(keep, new.key, s.key),
                            trace=jax.tree.map(frozen, new.trace, s.trace))

    return jax.lax.while_loop(lambda s: jnp.any(jax.vmap(going)(s)),
                              lambda s: _pin(_over_problems(step, shared, experts, s), mesh), state)


_init_problems_jitted = jit(_init_problems, static_argnums=(0, 1, 2, 3))
# Kept on disk (`stored_jit`), as the one-problem loop is: a new process reads the step loop back
# instead of tracing and lowering it (3 s for a token batch on a 2-core CPU).
_advance_problems_jitted = stored_jit(_advance_problems, static_argnums=(0, 1, 2), donate_argnums=(4,))
_finish_problems_jitted = jit(jax.vmap(finish))


def run_problems(smc: SMC, keys: PRNGKeyArray, experts: ExpertGroup, shared: tuple[bool, ...],
                 ensemble: Ensemble, mesh: Mesh | None = None) -> SMCState:
    """The final states of B problems (leading axis), run together (see the module docstring).

    With a `mesh` (axes "problems" and "particles", over the devices of one or several
    processes: `problem_mesh`), the problems are split over its "problems" axis (data parallel;
    B a multiple of its size), each problem's particles over its "particles" axis (M a multiple
    of that size), and the experts' shared leaves are replicated; the returned arrays are global
    (`gather_problems` brings them to every process).

    Parameters
    ----------
    smc : SMC
        The sampler configuration (shared; its threshold and resampler are run-time values).
    keys : jax.Array, shape [B]
        One PRNG key per problem.
    experts : ExpertGroup
        The problems' experts stacked by `stack_problems`.
    shared : tuple of bool
        Which of their leaves have no problem axis (from `stack_problems`).
    ensemble : Ensemble
        The f-ensemble (shared).
    mesh : jax.sharding.Mesh, optional
        Devices to split the problems over.

    Returns
    -------
    SMCState
        Every leaf with the problem axis first.
    """
    quiet, knobs = smc.split_knobs()
    impl, key_data = jax.random.key_impl(keys), jax.random.key_data(keys)
    if mesh is not None:
        check_problem_mesh(mesh, key_data.shape[0], smc.num_particles)
        leaves, treedef = jax.tree.flatten(experts)
        experts = jax.tree.unflatten(treedef, [_place(leaf, mesh, not same) for leaf, same in zip(leaves, shared)])
        key_data = _place(key_data, mesh, True)
        # Every input of a program over several processes is a global array: the rest replicated.
        ensemble, knobs = jax.tree.map(lambda leaf: _place(leaf, mesh, False), (ensemble, knobs))
    stop = lambda step: np.int32(step) if mesh is None else _place(np.int32(step), mesh, False)  # noqa: E731
    state = _init_problems_jitted(quiet, shared, mesh, impl, key_data, experts, ensemble)
    if not smc.progress:
        return _finish_problems_jitted(_advance_problems_jitted(quiet, shared, mesh, knobs, state, experts, ensemble,
                                                               stop(smc.num_steps)))
    step = 0
    while step < smc.num_steps:
        state = _advance_problems_jitted(quiet, shared, mesh, knobs, state, experts, ensemble, stop(step + 1))
        step, active = int(jnp.max(state.step)), int(jnp.sum(~state.done))
        progress_hooks.report(step - 1, active)
        if active == 0:
            break
    return _finish_problems_jitted(state)


def problem_mesh(devices: Sequence[jax.Device] | None = None, particles: int = 1) -> Mesh:
    """A ("problems", "particles") mesh over `devices` (default: every device of every process,
    in `jax.devices()` order, so a row of `particles` devices lies within one process when
    each process holds a multiple of `particles`).

    Parameters
    ----------
    devices : sequence of jax.Device, optional
        The devices.
    particles : int
        Devices per problem: its particles are split over them.
    """
    devices = list(jax.devices() if devices is None else devices)
    if particles < 1 or len(devices) % particles:
        raise ValueError(f"particles={particles} must be >= 1 and divide the number of devices ({len(devices)})")
    return Mesh(np.asarray(devices).reshape(-1, particles), (PROBLEMS, PARTICLES))


def check_problem_mesh(mesh: Mesh, num_problems: int, num_particles: int) -> None:
    """The mesh has the axes of `problem_mesh`, its "problems" axis divides B and its
    "particles" axis divides M (else a ValueError saying what to do).

    Parameters
    ----------
    mesh : jax.sharding.Mesh
        The mesh.
    num_problems : int
        B.
    num_particles : int
        M.
    """
    if PROBLEMS not in mesh.shape or not set(mesh.axis_names) <= {PROBLEMS, PARTICLES}:
        raise ValueError(f"a batch of problems needs a mesh with the axes {(PROBLEMS, PARTICLES)}, got "
                         f"{tuple(mesh.axis_names)}; build it with problem_mesh")
    rows, columns = mesh.shape[PROBLEMS], mesh.shape.get(PARTICLES, 1)
    if num_problems % rows:
        raise ValueError(f"{num_problems} problems cannot be split evenly over the {rows} rows of the mesh's "
                         f"{PROBLEMS!r} axis; pad the batch to a multiple of {rows}")
    check_particle_split(num_particles, columns, "problem_mesh")


def _place(leaf: Any, mesh: Mesh, split: bool) -> jax.Array:
    """A global array of a host value that every process holds whole: split on its first axis
    over the mesh, or replicated."""
    host = np.asarray(leaf)
    sharding = NamedSharding(mesh, P(PROBLEMS) if split else P())
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


#: Bytes per problem above which a leaf of a run's state is not brought to the host: the
#: context stores' pools and tables (gigabytes for a batch of byte-level problems on a GPU),
#: which results never read (they read particles, weights, the trace, flags and counters).
HOST_LEAF_BYTES = 1 << 22


def gather_problems(state: SMCState, max_leaf_bytes: int | None = None) -> SMCState:
    """A run's state as host arrays in every process (an all-gather when it spans processes;
    PRNG keys become their key data), except the leaves of more than `max_leaf_bytes` per
    problem, each replaced by a `jax.ShapeDtypeStruct` (its shape and dtype, no copy).

    Parameters
    ----------
    state : SMCState
        `run_problems`'s state.
    max_leaf_bytes : int, optional
        The largest leaf, in bytes per problem, that is copied (default `HOST_LEAF_BYTES`).
    """
    limit = HOST_LEAF_BYTES if max_leaf_bytes is None else max_leaf_bytes
    state = state._replace(key=jax.random.key_data(state.key))
    leaves, treedef = jax.tree.flatten(state)
    small = [leaf.nbytes <= limit * max(leaf.shape[0], 1) for leaf in leaves]
    kept = [leaf for leaf, ok in zip(leaves, small) if ok]
    if all(leaf.is_fully_addressable for leaf in kept):
        kept = jax.device_get(kept)
    else:
        kept = multihost_utils.process_allgather(kept, tiled=True)
    kept = iter(kept)
    return jax.tree.unflatten(treedef, [next(kept) if ok else jax.ShapeDtypeStruct(leaf.shape, leaf.dtype)
                                        for leaf, ok in zip(leaves, small)])


def problem_results(
    smc: SMC,
    state: SMCState,
    groups: Sequence[ExpertGroup],
    *,
    decode: Callable | None = None,
    allow_zero_weight: bool = False,
) -> list[SMCResult | RuntimeError]:
    """Each problem's `SMC.result`, or the error its run ended in (`ZeroWeightError` when its
    particles all died, `ContextStoreOverflowError` when its store ran out of room): one failed
    problem does not hide the others' results.

    Parameters
    ----------
    smc : SMC
        The sampler configuration the problems ran with.
    state : SMCState
        `run_problems`'s final state.
    groups : sequence of ExpertGroup
        Each problem's own experts (for their counters and failure checks).
    decode : callable, optional
        Maps a particle's symbols to its text.
    allow_zero_weight : bool
        Return a problem's result even when its particles all end at zero weight.
    """
    host = gather_problems(state)
    results: list[SMCResult | RuntimeError] = []
    for b, group in enumerate(groups):
        one = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype) if isinstance(x, jax.ShapeDtypeStruct)
                           else x[b], host)
        try:
            results.append(smc.result(one, stack_experts(group), decode=decode, allow_zero_weight=allow_zero_weight))
        except RuntimeError as error:  # ZeroWeightError, a store's overflow, an expert's failure
            results.append(error)
    return results


def sample_problems(
    smc: SMC,
    keys: PRNGKeyArray,
    groups: Sequence[ExpertGroup | Sequence[ExpertGroup]],
    ensemble: Ensemble,
    *,
    decode: Callable | None = None,
    allow_zero_weight: bool = False,
    mesh: Mesh | None = None,
) -> list[SMCResult | RuntimeError]:
    """B problems (one expert group and one key each) sampled in one program: each problem's
    result, or the error it ended in (in every process, with a `mesh` spanning several).

    Parameters
    ----------
    smc : SMC
        The sampler configuration.
    keys : jax.Array, shape [B]
        One PRNG key per problem.
    groups : sequence
        Each problem's experts (see `stack_problems`).
    ensemble : Ensemble
        The f-ensemble.
    decode : callable, optional
        Maps a particle's symbols to its text.
    allow_zero_weight : bool
        Return a problem's result even when its particles all end at zero weight.
    mesh : jax.sharding.Mesh, optional
        Devices to split the problems over (see `run_problems`).
    """
    groups = [stack_experts(g) for g in groups]
    if keys.shape[0] != len(groups):
        raise ValueError(f"{keys.shape[0]} keys for {len(groups)} problems; give one key per problem")
    if ensemble.num_experts != groups[0].num_experts:
        raise ValueError(f"the ensemble is for {ensemble.num_experts} experts, but {groups[0].num_experts} were given")
    experts, shared = stack_problems(groups)
    state = run_problems(smc, keys, experts, shared, ensemble, mesh)
    return problem_results(smc, state, groups, decode=decode, allow_zero_weight=allow_zero_weight)


