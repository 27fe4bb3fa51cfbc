"""Particles sharded over a device mesh: the sampler's SPMD layout and its jitted run.

A mesh has two axes: "particles" (data parallel) and "model" (tensor parallel, size 1 unless
asked for). `run_sharded` is `SMC.run` jitted with explicit input and output shardings, and the
loop state is pinned to the same layout after every step, so each device keeps M / P particles
for the whole run (one compilation per sampler configuration, mesh and expert structure).

What is sharded:

* particle-major arrays: symbols [M, L], lengths, done, eos, log_weights [M], log_prefix [M, K],
  the trace's [T, M] arrays (on M), and every expert-state leaf outside a context store (toy
  experts' states [M], token context ids [M, K], byte beams [M, K, ...]): split on "particles";
* the PRNG key, the step counter, the trace's [T] arrays and every `ContextStore` (the KV pool and
  context table that all particles share): replicated over "particles". The store's model call
  deduplicates requests across all particles, so every device gathers the [K, M] requests and
  keeps a full copy of the store (see the README, "Several devices");
* expert parameters (model weights, prompt caches, tries, tables): replicated;
* on "model", what a rule table splits (`TENSOR_PARALLEL`): transformer weights by attention
  heads and MLP units, and the KV pool by KV heads.

Resampling gathers ancestors across shards inside the resampling branch of `SMC.step`: XLA's
SPMD partitioner all-gathers each particle-major array there and every device takes its own
ancestors; steps that do not resample move no particle state (tests/sharding_checks.py checks
this on the compiled program and lists its collectives).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jaxtyping import PRNGKeyArray

from smc_jax.smc.ensemble import Ensemble
from smc_jax.experts.base import ExpertGroup, stack_experts
from smc_jax.utils.buckets import multiple_bucket
from smc_jax.experts.byte import PrefetchCache
from smc_jax.models.contexts import ContextStore
from smc_jax.models.paged import KVPool, PagedTransformer
from smc_jax.models.params import SEP, Params
from smc_jax.smc.engine import SMC
from smc_jax.smc.result import SMCResult
from smc_jax.smc.state import SMCState
from smc_jax.utils.compilation import jit

PyTree = Any

#: Mesh axis of the particles (data parallel).
PARTICLES = "particles"
#: Mesh axis of tensor-parallel model weights.
MODEL = "model"

#: (regex on a path such as "layers/q/kernel" or "pool/k", spec of the leaf's *trailing* axes).
#: Paths are those of a transformer's params (`smc_jax.models.params`) and of its KV pool in a
#: context store ("pool/k", "pool/v": [..., kv_heads, head_dim]). Leading axes (stacked layers,
#: experts, pool entries) stay unsplit; the first rule whose regex matches the whole path wins.
ParamRules = tuple[tuple[str, P], ...]

REPLICATED: ParamRules = ((r".*", P()),)
#: A Megatron-style split of the transformer ([out, in] kernels): q/k/v and gate/up by output
#: rows (attention heads, MLP hidden units), o and down by input columns, so each layer needs
#: one all-reduce after attention and one after the MLP; the KV pool by KV heads, so each
#: device stores and reads the keys/values of its own heads. Embeddings and norms replicated.
#: The split layout's fused kernels (qkv, gate_up: `params.FUSED`) are split by rows too, which is
#: correct but not head-aligned (their slices move between devices): shard the stacked layout.
#: Needs a model axis dividing the number of KV heads and the MLP width.
TENSOR_PARALLEL: ParamRules = (
    (r"pool/(k|v)", P(MODEL, None)),
    (r"layers/(\d+/)?(q|k|v|gate|up|qkv|gate_up)/kernel", P(MODEL, None)),
    (r"layers/(\d+/)?(q|k|v|gate|up|qkv|gate_up)/bias", P(MODEL)),
    (r"layers/(\d+/)?(o|down)/kernel", P(None, MODEL)),
    (r"layers/(\d+/)?(o|down)/bias", P()),
    (r"layers/(\d+/)?\w+_norm/(scale|bias)", P()),
    (r"final_norm/(scale|bias)", P()),
    (r"embed|pos_embed|lm_head", P()),
)
PARAM_RULES: dict[str, ParamRules] = {"replicated": REPLICATED, "tensor_parallel": TENSOR_PARALLEL}


def make_mesh(particles: int | None = None, model: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ("particles", "model") mesh over `devices` (default: all of them, every host's).

    particles: devices along the particle axis (default: all devices / model).

    Parameters
    ----------
    particles : int, optional
        Size of the "particles" axis.
    model : int
        Size of the "model" axis (tensor parallel).
    devices : sequence of jax.Device, optional
        The devices (default: `jax.devices()`).
    """
    devices = list(jax.devices() if devices is None else devices)
    if model < 1 or len(devices) % model:
        raise ValueError(f"model={model} must be >= 1 and divide the number of devices ({len(devices)})")
    particles = len(devices) // model if particles is None else particles
    if particles < 1 or particles * model > len(devices):
        raise ValueError(
            f"a mesh of {particles} x {model} (particles x model) devices needs {particles * model} devices, "
            f"but {len(devices)} are available"
        )
    return Mesh(np.asarray(devices[: particles * model]).reshape(particles, model), (PARTICLES, MODEL))


def check_mesh(mesh: Mesh, num_particles: int) -> None:
    """The mesh has both axes and its particle axis divides M (else a ValueError saying what to do).

    Parameters
    ----------
    mesh : jax.sharding.Mesh
        The mesh.
    num_particles : int
        M.
    """
    if set(mesh.axis_names) != {PARTICLES, MODEL}:
        raise ValueError(
            f"the mesh needs the axes {(PARTICLES, MODEL)}, got {tuple(mesh.axis_names)}; build it with make_mesh"
        )
    check_particle_split(num_particles, mesh.shape[PARTICLES], "make_mesh")


def check_particle_split(num_particles: int, shards: int, builder: str) -> None:
    """M splits evenly over the mesh's `shards` particle devices (else a ValueError naming the
    mesh `builder` to call with fewer).

    Parameters
    ----------
    num_particles : int
        M.
    shards : int
        Devices on the mesh's particle axis.
    builder : str
        The function that builds such a mesh (named in the error).
    """
    if num_particles % shards:
        raise ValueError(
            f"num_particles={num_particles} is not divisible by the {shards} devices of the mesh's "
            f"{PARTICLES!r} axis: use a multiple of {shards} particles (e.g. "
            f"{multiple_bucket(num_particles, shards)}), or a mesh with fewer particle devices "
            f"({builder}(particles=...))"
        )


def _particle_major(leaf: jax.Array | jax.ShapeDtypeStruct, axis: int = 0) -> P:
    return P(*([None] * axis), PARTICLES, *([None] * (leaf.ndim - axis - 1)))


def state_specs(state: SMCState, mesh: Mesh, rules: str | ParamRules = "replicated") -> SMCState:
    """The PartitionSpec of every leaf of a sampler state (concrete or abstract), as an SMCState.

    Expert-state leaves inside a `ContextStore` or a byte expert's `PrefetchCache` are replicated
    over "particles" (a transformer's KV pool is laid out by `rules`); every other expert-state leaf must be particle-major (the
    expert contract), else a ValueError names it.

    Parameters
    ----------
    state : SMCState
        A sampler state (arrays or `jax.ShapeDtypeStruct` leaves).
    mesh : jax.sharding.Mesh
        The mesh.
    rules : str or tuple
        "replicated", "tensor_parallel" or a rule table of (regex, PartitionSpec) pairs.
    """
    m = state.num_particles

    def expert_leaf(path, leaf) -> P:
        if leaf.ndim == 0 or leaf.shape[0] != m:
            raise ValueError(
                f"expert state leaf {jax.tree_util.keystr(path)} of shape {tuple(leaf.shape)} is neither "
                f"particle-major (leading axis M={m}) nor in a ContextStore, so it cannot be sharded"
            )
        return _particle_major(leaf)

    def expert_node(path, node) -> PyTree:
        if isinstance(node, PrefetchCache):  # per expert and shared by its particles, like the store
            return jax.tree.map(lambda _: P(), node)
        if isinstance(node, ContextStore):
            pool = node.pool
            if isinstance(pool, KVPool):
                pool = KVPool(**{f: rule_spec(f"pool/{f}", getattr(pool, f), mesh, rules) for f in ("k", "v")})
            else:
                pool = jax.tree.map(lambda _: P(), pool)
            return jax.tree.map(lambda _: P(), node.replace(pool=None)).replace(pool=pool)
        return expert_leaf(path, node)

    trace = state.trace
    return SMCState(
        key=P(),
        step=P(),
        symbols=_particle_major(state.symbols),
        lengths=_particle_major(state.lengths),
        done=_particle_major(state.done),
        eos=_particle_major(state.eos),
        log_weights=_particle_major(state.log_weights),
        log_prefix=_particle_major(state.log_prefix),
        expert_state=jax.tree_util.tree_map_with_path(
            expert_node, state.expert_state, is_leaf=lambda x: isinstance(x, (ContextStore, PrefetchCache))
        ),
        trace=trace._replace(
            ess=P(),
            resampled=P(),
            ancestors=_particle_major(trace.ancestors, axis=1),
            log_weights=_particle_major(trace.log_weights, axis=1),
            num_active=P(),
        ),
    )


def resolve_rules(rules: str | ParamRules) -> ParamRules:
    """A rule table by name ("replicated", "tensor_parallel") or as given (checked).

    Parameters
    ----------
    rules : str or tuple
        "replicated", "tensor_parallel" or a rule table of (regex, PartitionSpec) pairs.
    """
    if isinstance(rules, str):
        if rules not in PARAM_RULES:
            raise ValueError(
                f"unknown sharding rules {rules!r}; use one of {sorted(PARAM_RULES)} or a tuple of "
                "(regex, PartitionSpec) pairs"
            )
        return PARAM_RULES[rules]
    checked = []
    for rule in rules:
        if not (isinstance(rule, (tuple, list)) and len(rule) == 2 and isinstance(rule[1], P)):
            raise ValueError(f"a sharding rule is a (regex, PartitionSpec) pair, got {rule!r}")
        try:
            re.compile(rule[0])
        except (re.error, TypeError) as err:
            raise ValueError(f"sharding rule {rule!r}: {rule[0]!r} is not a regular expression ({err})") from None
        checked.append((rule[0], rule[1]))
    return tuple(checked)


def rule_spec(name: str, leaf: jax.Array | jax.ShapeDtypeStruct, mesh: Mesh, rules: str | ParamRules) -> P:
    """The spec of one leaf named `name` under `rules` (the first whose regex matches the whole
    name). No matching rule, a spec longer than the leaf's rank, an axis the mesh lacks or a
    dimension the axis does not divide is a ValueError naming the leaf.

    Parameters
    ----------
    name : str
        The leaf's path, e.g. "layers/q/kernel" or "pool/k".
    leaf : jax.Array or jax.ShapeDtypeStruct
        The leaf.
    mesh : jax.sharding.Mesh
        The mesh.
    rules : str or tuple
        "replicated", "tensor_parallel" or a rule table of (regex, PartitionSpec) pairs.
    """
    trailing = next((spec for pattern, spec in resolve_rules(rules) if re.fullmatch(pattern, name)), None)
    if trailing is None:
        raise ValueError(
            f"no sharding rule matches {name!r} {tuple(leaf.shape)}; add a (regex, PartitionSpec) rule for it"
        )
    if len(trailing) > leaf.ndim:
        raise ValueError(f"rule spec {trailing} for {name!r} has more axes than its shape {tuple(leaf.shape)}")
    spec = P(*([None] * (leaf.ndim - len(trailing))), *trailing)
    for size, axis in zip(leaf.shape, spec):
        if axis is None:
            continue
        if axis not in mesh.shape:
            raise ValueError(
                f"rule spec {trailing} for {name!r} names the axis {axis!r}, not in the mesh {tuple(mesh.axis_names)}"
            )
        if size % mesh.shape[axis]:
            raise ValueError(
                f"{name!r} {tuple(leaf.shape)}: a dimension of {size} cannot be split over the "
                f"{mesh.shape[axis]} devices of the {axis!r} axis; choose a {axis!r} axis size that divides it"
            )
    return spec


def param_specs(params: Params, mesh: Mesh, rules: str | ParamRules = "replicated") -> Params:
    """The PartitionSpec of every model weight under `rules` (see `rule_spec`).

    Parameters
    ----------
    params : pytree
        A transformer's parameters.
    mesh : jax.sharding.Mesh
        The mesh.
    rules : str or tuple
        "replicated", "tensor_parallel" or a rule table of (regex, PartitionSpec) pairs.
    """

    def spec_of(path, leaf) -> P:
        return rule_spec(SEP.join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path), leaf, mesh, rules)

    return jax.tree_util.tree_map_with_path(spec_of, params)


def experts_specs(experts: ExpertGroup, mesh: Mesh, rules: str | ParamRules = "replicated") -> PyTree:
    """PartitionSpecs of an expert group: transformer weights by `rules`, all else replicated.

    Parameters
    ----------
    experts : ExpertGroup
        The expert group.
    mesh : jax.sharding.Mesh
        The mesh.
    rules : str or tuple
        "replicated", "tensor_parallel" or a rule table of (regex, PartitionSpec) pairs.
    """

    def node_spec(node) -> PyTree:
        if isinstance(node, PagedTransformer):
            return node.replace(params=param_specs(node.params, mesh, rules))
        return P()

    return jax.tree.map(node_spec, experts, is_leaf=lambda x: isinstance(x, PagedTransformer))


def shard_experts(experts: ExpertGroup, mesh: Mesh, rules: str | ParamRules = "replicated") -> ExpertGroup:
    """The expert group placed on the mesh (`experts_specs`). Runs use a placed group as is and
    copy an unplaced one to the devices every time: place a group you reuse once, with this.

    Parameters
    ----------
    experts : ExpertGroup
        The expert group.
    mesh : jax.sharding.Mesh
        The mesh.
    rules : str or tuple
        "replicated", "tensor_parallel" or a rule table of (regex, PartitionSpec) pairs.
    """
    return jax.device_put(experts, _named(mesh, experts_specs(experts, mesh, rules)))


def _named(mesh: Mesh, specs: PyTree) -> PyTree:
    return jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs, is_leaf=lambda x: isinstance(x, P))


def _abstract(tree: PyTree) -> tuple:
    """A hashable description of a pytree: its structure and its leaves' shapes and dtypes."""
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves)


@functools.lru_cache(maxsize=16)
def _sharded_runner(smc: SMC, mesh: Mesh, rules: ParamRules, key: tuple, experts: tuple, ensemble: tuple):
    """The jitted sharded run and its input shardings, built once per configuration."""
    abstract = [jax.tree.unflatten(treedef, leaves) for treedef, leaves in (key, experts, ensemble)]
    replicated = NamedSharding(mesh, P())
    experts_sharding = _named(mesh, experts_specs(abstract[1], mesh, rules))
    state_sharding = _named(mesh, state_specs(jax.eval_shape(smc.run, *abstract), mesh, rules))

    def run(key: PRNGKeyArray, experts: ExpertGroup, ensemble: Ensemble) -> SMCState:
        pin = lambda s: jax.lax.with_sharding_constraint(s, state_sharding)
        return smc.run(key, experts, ensemble, constrain=pin)

    jitted = jit(run, in_shardings=(replicated, experts_sharding, replicated), out_shardings=state_sharding)
    return jitted, (replicated, experts_sharding, replicated)


def sharded_runner(
    smc: SMC,
    key: PRNGKeyArray,
    experts: ExpertGroup,
    ensemble: Ensemble,
    mesh: Mesh,
    rules: str | ParamRules = "replicated",
) -> tuple[Callable[[PRNGKeyArray, ExpertGroup, Ensemble], SMCState], tuple]:
    """(jitted run, input shardings) for these arguments: the compiled program can be inspected
    with `jitted.lower(*args).compile().as_text()`.

    Parameters
    ----------
    smc : SMC
        The sampler.
    key : jax.Array
        PRNG key.
    experts : ExpertGroup
        The expert group.
    ensemble : Ensemble
        The f-ensemble.
    mesh : jax.sharding.Mesh
        The mesh.
    rules : str or tuple
        "replicated", "tensor_parallel" or a rule table of (regex, PartitionSpec) pairs.
    """
    check_mesh(mesh, smc.num_particles)
    return _sharded_runner(smc, mesh, resolve_rules(rules), _abstract(key), _abstract(experts), _abstract(ensemble))


def run_sharded(
    smc: SMC,
    key: PRNGKeyArray,
    experts: ExpertGroup | Sequence[ExpertGroup],
    ensemble: Ensemble,
    mesh: Mesh,
    rules: str | ParamRules = "replicated",
) -> SMCState:
    """`SMC.run` with the particles split over the mesh's "particles" axis (M must be a multiple
    of its size) and model weights laid out by `rules` (a group placed by `shard_experts` is
    not copied again). Returns the final state as sharded device arrays; for the same key it
    equals the unsharded run (up to the summation order of cross-device sums).

    Parameters
    ----------
    smc : SMC
        The sampler.
    key : jax.Array
        PRNG key.
    experts : ExpertGroup or sequence of ExpertGroup
        The K experts.
    ensemble : Ensemble
        The f-ensemble.
    mesh : jax.sharding.Mesh
        A mesh with "particles" and "model" axes (`make_mesh`).
    rules : str or tuple
        "replicated", "tensor_parallel" or a rule table of (regex, PartitionSpec) pairs.
    """
    experts = stack_experts(experts)
    jitted, shardings = sharded_runner(smc, key, experts, ensemble, mesh, rules)
    return jitted(*jax.device_put((key, experts, ensemble), shardings))


def sample_sharded(
    smc: SMC,
    key: PRNGKeyArray,
    experts: ExpertGroup | Sequence[ExpertGroup],
    ensemble: Ensemble,
    mesh: Mesh,
    rules: str | ParamRules = "replicated",
    *,
    decode: Callable | None = None,
    allow_zero_weight: bool = False,
) -> SMCResult:
    """`run_sharded`, then host-side results like `SMC.__call__`. Reads every array on this host,
    so the mesh must belong to one process (over several hosts, call `run_sharded` and gather
    what you need with `jax.experimental.multihost_utils.process_allgather`).

    Parameters
    ----------
    smc : SMC
        The sampler.
    key : jax.Array
        PRNG key.
    experts : ExpertGroup or sequence of ExpertGroup
        The K experts.
    ensemble : Ensemble
        The f-ensemble.
    mesh : jax.sharding.Mesh
        A mesh of this process's devices.
    rules : str or tuple
        "replicated", "tensor_parallel" or a rule table of (regex, PartitionSpec) pairs.
    decode : callable, optional
        Symbols -> text.
    allow_zero_weight : bool
        Return the result even when every particle ends at zero weight.
    """
    if mesh.is_multi_process:
        raise ValueError(
            "sample_sharded reads results on this host, but the mesh spans several processes: call "
            "run_sharded and gather what you need with multihost_utils.process_allgather(..., tiled=True)"
        )
    experts = stack_experts(experts)
    if ensemble.num_experts != experts.num_experts:
        raise ValueError(f"the ensemble is for {ensemble.num_experts} experts, but {experts.num_experts} were given")
    state = run_sharded(smc, key, experts, ensemble, mesh, rules)
    return smc.result(state, experts, decode=decode, allow_zero_weight=allow_zero_weight)
