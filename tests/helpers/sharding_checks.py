"""Sharded-run checks on 8 simulated CPU devices, run by tests/smc/test_sharding.py in a subprocess.

XLA_FLAGS=--xla_force_host_platform_device_count=8 must be set before jax is imported, and the
test process has imported jax already, hence `python -m tests.helpers.sharding_checks` (this module sets
the flag itself when run as a script). Each check runs a sampler unsharded and sharded with the
same key and asserts identical symbols, lengths, ancestors and resampling steps and allclose
weights (random bits do not depend on sharding: jax_threefry_partitionable); that the outputs
are split over the 8 devices; and, from the compiled HLO, that no all-gather outside the
resampling branch rebuilds a particle-major state array (see `check_collectives`).
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import re  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from smc_jax.bytes.beam import BeamConfig  # noqa: E402
from smc_jax.experts.byte import ByteExperts  # noqa: E402
from smc_jax.bytes.trie import TokenTrie  # noqa: E402
from smc_jax.smc.ensemble import make_ensemble  # noqa: E402
from smc_jax.experts import NGramExpert  # noqa: E402
from smc_jax.experts.base import stack_experts  # noqa: E402
from smc_jax.experts.token import TokenExperts  # noqa: E402
from smc_jax.models import transformer  # noqa: E402
from smc_jax.models.config import ModelConfig  # noqa: E402
from smc_jax.models.paged import PagedTransformer  # noqa: E402
from smc_jax.models.params import random_params, unstack_layers  # noqa: E402
from smc_jax.smc.sharding import make_mesh, run_sharded, shard_experts, sharded_runner  # noqa: E402
from smc_jax.smc import SMC, SMCState  # noqa: E402
from smc_jax.smc.engine import run_jitted  # noqa: E402

NUM_DEVICES = 8
BYTE_VOCAB = [b"a", b"b", b"ab", b"ba", b"aba", b" ", None]  # ambiguous tokenizations; None: EOS


def tiny_transformer(vocab_size: int, seed: int = 0) -> PagedTransformer:
    """A 2-layer llama-style transformer with random weights (4 heads, 2 KV heads, MLP 32)."""
    config = ModelConfig(
        architecture="llama", vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_layers=2,
        num_heads=4, num_kv_heads=2, head_dim=4, max_positions=64,
    )
    return PagedTransformer(params=random_params(config, jax.random.key(seed)), config=config)


def prefill(model: PagedTransformer, prompts: list[list[int]]):
    """Prompt caches (stacked over prompts, right-padded) and next-token logits."""
    size = max(len(p) for p in prompts)
    padded = jnp.asarray([p + [0] * (size - len(p)) for p in prompts], jnp.int32)
    lengths = jnp.asarray([len(p) for p in prompts], jnp.int32)
    run = jax.jit(jax.vmap(transformer.prefill, in_axes=(None, None, 0, 0)), static_argnums=1)
    return run(model.params, model.config, padded, lengths)


def toy_experts():
    k1, k2 = jax.random.split(jax.random.key(7))
    return stack_experts([
        NGramExpert.random(k1, alphabet_size=3, order=2, eos_logit=-1.0),
        NGramExpert.random(k2, alphabet_size=3, order=3, eos_logit=-1.0),
    ])


def token_experts(max_length: int) -> TokenExperts:
    model = tiny_transformer(vocab_size=12, seed=7)
    prefixes, logits = prefill(model, [[1, 2, 3], [4, 5]])
    return TokenExperts(model=model, prefixes=prefixes, prompt_logits=logits, eos_ids=(11,), max_tokens=max_length)


def byte_experts(max_length: int) -> ByteExperts:
    model = tiny_transformer(vocab_size=len(BYTE_VOCAB), seed=4)
    prefixes, logits = prefill(model, [[0, 1], [2]])
    return ByteExperts(
        model=model, prefixes=prefixes, prompt_logits=logits, trie=TokenTrie.build(BYTE_VOCAB),
        allowed=jnp.ones((len(BYTE_VOCAB),), bool), eos_ids=(len(BYTE_VOCAB) - 1,),
        beam=BeamConfig(width=3, threshold=0.0), max_tokens=max_length,
    )


def assert_same_run(single: SMCState, sharded: SMCState) -> None:
    a, b = jax.device_get(single), jax.device_get(sharded)
    steps = int(a.step)
    assert int(b.step) == steps, (int(b.step), steps)
    for name in ("symbols", "lengths", "eos"):
        np.testing.assert_array_equal(getattr(b, name), getattr(a, name), err_msg=name)
    np.testing.assert_array_equal(b.trace.resampled, a.trace.resampled)
    np.testing.assert_array_equal(b.trace.ancestors, a.trace.ancestors)
    np.testing.assert_allclose(b.log_weights, a.log_weights, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(b.log_prefix, a.log_prefix, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(b.trace.log_weights[:steps], a.trace.log_weights[:steps], rtol=1e-5, atol=1e-5)


def assert_split(state: SMCState, mesh) -> None:
    """Particle-major outputs are split over every particle device (not replicated)."""
    shards = mesh.shape["particles"]
    m = state.num_particles
    for name, leaf in [("symbols", state.symbols), ("log_weights", state.log_weights),
                       ("trace.ancestors", state.trace.ancestors), *[
                           (jax.tree_util.keystr(p), x) for p, x in jax.tree_util.tree_leaves_with_path(state.expert_state)
                           if x.ndim and x.shape[0] == m and "stores" not in jax.tree_util.keystr(p)]]:
        sharding = leaf.sharding
        assert len(sharding.device_set) == mesh.size, (name, sharding)
        assert not sharding.is_fully_replicated, (name, sharding)
        rows = {s.data.shape[0 if name != "trace.ancestors" else 1] for s in leaf.addressable_shards}
        assert rows == {m // shards}, (name, rows)


# ------------------------------------------------------------------ the compiled program

_COLLECTIVE = re.compile(
    r"= (\([^)]*\)|\S+) (all-gather|all-reduce|all-to-all|collective-permute|reduce-scatter)(?:-start)?\("
)
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_ARRAY = re.compile(r"[a-z]+[0-9]*\[[0-9,]*\]")


def collectives(hlo: str) -> list[tuple[str, tuple[str, ...], bool]]:
    """(op, result array shapes, in the resampling branch) for every collective of an optimized
    HLO module (a combined collective has a tuple of results). SPMD collectives carry the metadata
    of the op they partition, and SMC.step names its resampling branch jax.named_scope("resample")."""
    found = []
    for line in hlo.splitlines():
        match = _COLLECTIVE.search(line)
        if match:
            name = _OP_NAME.search(line)
            resampling = bool(name) and "/resample/" in name.group(1)
            found.append((match.group(2), tuple(_ARRAY.findall(match.group(1))), resampling))
    return found


def check_collectives(name: str, smc: SMC, key, experts, ensemble, mesh, state: SMCState) -> None:
    """Compiles the sharded run (a cache hit: it is the program just run), lists its collectives,
    and asserts that no all-gather outside the resampling branch has the shape of a particle-major
    array of rank >= 2 (symbols [M, L], log_prefix [M, K], the trace's [T, M], expert leaves such
    as context ids [M, K] or byte beams [M, K, ...]): a step that does not resample never gathers
    the particle state onto every device.

    What appears instead (jax 0.10.2, XLA:CPU, Shardy): in the resampling branch, one all-gather
    per particle-major array (each device then selects its M / P ancestors locally: `jnp.take`
    with sharded indices from a sharded operand becomes all-gather + local gather); every step,
    an all-gather of the [M] normalized weights for the resampler (every scheme needs all of
    them), all-reduces of scalars (ESS, logsumexp, whether any particle is alive), and for
    model-backed experts the context store's traffic: the [K, M] (bytes: [K, M C D]) requests are
    gathered for the cross-particle deduplication (a sort, with collective-permutes), XLA splits
    the deduplicated model rows over the devices, and all-gathers the new keys/values and
    summaries into the replicated store."""
    jitted, shardings = sharded_runner(smc, key, experts, ensemble, mesh)
    hlo = jitted.lower(*jax.device_put((key, experts, ensemble), shardings)).compile().as_text()
    found = collectives(hlo)
    m = smc.num_particles
    core = state._replace(expert_state=())
    particle_major = {tuple(x.shape) for x in jax.tree.leaves(core) if x.ndim >= 2 and m in x.shape} | {
        tuple(x.shape) for p, x in jax.tree_util.tree_leaves_with_path(state.expert_state)
        if x.ndim >= 2 and x.shape[0] == m and "stores" not in jax.tree_util.keystr(p)
    }

    def dims(shape: str) -> tuple[int, ...]:
        inner = shape[shape.index("[") + 1 : shape.index("]")]
        return tuple(int(d) for d in inner.split(",") if d)

    offending = [(op, shapes) for op, shapes, resampling in found
                 if op == "all-gather" and not resampling and any(dims(s) in particle_major for s in shapes)]
    assert not offending, f"{name}: particle state all-gathered outside the resampling branch: {offending}"
    assert any(resampling for _, _, resampling in found), f"{name}: no collective in the resampling branch?"
    summary = Counter((op, ", ".join(shapes), "resampling branch" if r else "outside it") for op, shapes, r in found)
    print(f"  collectives of the compiled {name} run (count x op, result shape, where):")
    for (op, shape, where), count in sorted(summary.items(), key=lambda kv: (kv[0][2], kv[0][0], kv[0][1])):
        print(f"    {count:3d} x {op:18s} {shape:20s} {where}")


# ------------------------------------------------------------------ the checks

def check(name: str, smc: SMC, experts, ensemble, mesh, seed: int = 0, min_resamples: int = 1) -> None:
    start = time.perf_counter()
    key = jax.random.key(seed)
    single = run_jitted(smc, key, experts, ensemble)
    sharded = run_sharded(smc, key, experts, ensemble, mesh)
    resamples = int(np.sum(jax.device_get(single.trace.resampled)))
    assert resamples >= min_resamples, f"{name}: only {resamples} resampling steps; the check needs some"
    assert_same_run(single, sharded)
    assert_split(sharded, mesh)
    check_collectives(name, smc, key, experts, ensemble, mesh, sharded)
    # A second key, with the experts placed once (as EnsembleSampler does), reuses the program.
    jitted, _ = sharded_runner(smc, key, experts, ensemble, mesh)
    placed = shard_experts(experts, mesh)
    assert all(x.sharding.is_fully_replicated and len(x.sharding.device_set) == NUM_DEVICES
               for x in jax.tree.leaves(placed))
    assert_same_run(run_jitted(smc, jax.random.key(seed + 1), experts, ensemble),
                    run_sharded(smc, jax.random.key(seed + 1), placed, ensemble, mesh))
    assert jitted._cache_size() == 1, "the sharded run compiled more than once"
    lengths = np.asarray(jax.device_get(single.lengths))
    print(f"{name}: M={smc.num_particles}, {int(single.step)} steps, {resamples} resampling steps, "
          f"string lengths {lengths.min()}..{lengths.max()}, "
          f"identical to 1 device ({time.perf_counter() - start:.1f} s)")


def check_tensor_parallel(smc: SMC, experts, ensemble, mesh, seed: int) -> None:
    """A 4 x 2 (particles x model) mesh: attention heads and MLP units split in two."""
    start = time.perf_counter()
    key = jax.random.key(seed)
    single = run_jitted(smc, key, experts, ensemble)
    sharded = run_sharded(smc, key, experts, ensemble, mesh, rules="tensor_parallel")
    assert_same_run(single, sharded)
    assert_split(sharded, mesh)
    _, (_, experts_sharding, _) = sharded_runner(smc, key, experts, ensemble, mesh, rules="tensor_parallel")
    params = experts_sharding.model.params
    assert params["layers"]["q"]["kernel"].spec == P(None, "model", None), params["layers"]["q"]["kernel"]
    assert params["layers"]["down"]["kernel"].spec == P(None, None, "model"), params["layers"]["down"]["kernel"]
    assert params["embed"].is_fully_replicated, params["embed"]
    # The KV pool [K, layers, entries, kv_heads, head_dim] keeps each device's heads.
    assert sharded.expert_state.stores.pool.k.sharding.spec == P(None, None, None, "model", None)
    # Split layers (load_model's CPU default): the layer scan's switches over sharded buffers.
    split = experts.replace(model=experts.model.replace(params=unstack_layers(experts.model.params)))
    assert_same_run(single, run_sharded(smc, key, split, ensemble, mesh, rules="tensor_parallel"))
    _, (_, split_sharding, _) = sharded_runner(smc, key, split, ensemble, mesh, rules="tensor_parallel")
    assert split_sharding.model.params["layers"][0]["qkv"]["kernel"].spec == P("model", None)  # fused
    print(f"tensor parallel (4 x 2 mesh), token experts, stacked and split layers: identical to 1 device "
          f"({time.perf_counter() - start:.1f} s)")


def check_divisibility(mesh) -> None:
    try:
        run_sharded(SMC(num_particles=12, max_length=3), jax.random.key(0), toy_experts(), make_ensemble("product", 2), mesh)
    except ValueError as err:
        assert "multiple of 8" in str(err), err
    else:
        raise AssertionError("M = 12 on 8 devices must be a ValueError")


GROUPS = ("toy", "token", "tensor_parallel", "bytes")


def main(groups: list[str]) -> None:
    unknown = set(groups) - set(GROUPS)
    assert not unknown, f"unknown check groups {sorted(unknown)}; use some of {GROUPS}"
    assert jax.device_count() == NUM_DEVICES, f"expected {NUM_DEVICES} simulated devices, got {jax.devices()}"
    total = time.perf_counter()
    mesh = make_mesh()
    ensemble = make_ensemble("product", 2)
    if "toy" in groups:
        check("toy n-grams, multinomial, ESS 0.9", SMC(num_particles=32, max_length=10, ess_threshold=0.9),
              toy_experts(), ensemble, mesh)
        check("toy n-grams, systematic, ESS 1.0", SMC(num_particles=16, max_length=10, ess_threshold=1.0,
              resampler="systematic"), toy_experts(), ensemble, mesh, seed=1)
        check_divisibility(mesh)
    token = (SMC(num_particles=16, max_length=6, ess_threshold=1.0), token_experts(6), ensemble)
    if "token" in groups:
        check("token experts (tiny transformer)", *token, mesh, seed=2)
    if "tensor_parallel" in groups:
        check_tensor_parallel(*token, make_mesh(particles=4, model=2), seed=2)
    if "bytes" in groups:
        check("byte experts (tiny transformer)", SMC(num_particles=8, max_length=4, ess_threshold=1.0),
              byte_experts(4), ensemble, mesh, seed=3)
    print(f"sharding checks {groups} passed in {time.perf_counter() - total:.1f} s")


if __name__ == "__main__":
    main(sys.argv[1:] or list(GROUPS))
