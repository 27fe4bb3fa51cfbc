"""Particles sharded over a device mesh (smc_jax.smc.sharding).

In this process (1 CPU device unless XLA_FLAGS says otherwise): the helpers, rule tables and
a 1-device mesh run. On 8 simulated devices: tests/helpers/sharding_checks.py in a subprocess, since
--xla_force_host_platform_device_count must be set before jax is imported.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, PartitionSpec as P

from smc_jax.smc.ensemble import make_ensemble
from smc_jax.experts.base import stack_experts
from smc_jax.experts.toy import NGramTokenLM
from smc_jax.experts.token import TokenExperts
from smc_jax.models.config import ModelConfig
from smc_jax.models.params import param_shapes, random_params, unflatten, unstack_layers
from smc_jax.smc.sharding import (
    check_mesh,
    make_mesh,
    param_specs,
    resolve_rules,
    run_sharded,
    sample_sharded,
    sharded_runner,
    state_specs,
)
from smc_jax.smc import SMC
from smc_jax.smc.engine import run_jitted

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ModelConfig(
    architecture="llama", vocab_size=8, hidden_size=8, intermediate_size=12, num_layers=2,
    num_heads=4, num_kv_heads=2, head_dim=2, max_positions=32,
)


@pytest.fixture(scope="module")
def toy(ngram_experts):
    return stack_experts(ngram_experts), make_ensemble("product", 2)


def abstract_params(config: ModelConfig = CONFIG):
    return unflatten({path: jax.ShapeDtypeStruct(shape, jnp.float32) for path, shape in param_shapes(config).items()})


def test_one_device_mesh_run_equals_the_unsharded_run(toy):
    experts, ensemble = toy
    smc = SMC(num_particles=6, max_length=6, ess_threshold=1.0)
    mesh = make_mesh()
    assert dict(mesh.shape) == {"particles": jax.device_count(), "model": 1}
    single = run_jitted(smc, jax.random.key(0), experts, ensemble)
    sharded = run_sharded(smc, jax.random.key(0), experts, ensemble, mesh)
    assert int(np.sum(sharded.trace.resampled)) > 0
    np.testing.assert_array_equal(sharded.symbols, single.symbols)
    np.testing.assert_array_equal(sharded.trace.ancestors, single.trace.ancestors)
    np.testing.assert_allclose(sharded.log_weights, single.log_weights, rtol=1e-6)
    assert sharded.symbols.sharding.spec == P("particles", None)
    assert sharded.trace.ancestors.sharding.spec == P(None, "particles")
    # Compiled once per configuration: another key reuses the program.
    run_sharded(smc, jax.random.key(1), experts, ensemble, mesh)
    jitted, _ = sharded_runner(smc, jax.random.key(1), experts, ensemble, mesh)
    assert jitted._cache_size() == 1


def test_sample_sharded_gives_the_same_result(toy):
    experts, ensemble = toy
    smc = SMC(num_particles=4, max_length=5)
    want = smc(jax.random.key(3), experts, ensemble)
    got = sample_sharded(smc, jax.random.key(3), experts, ensemble, make_mesh())
    np.testing.assert_array_equal(got.symbols, want.symbols)
    np.testing.assert_allclose(got.log_weights, want.log_weights, rtol=1e-6)
    assert got.log_Z == pytest.approx(want.log_Z, rel=1e-6)


def test_state_specs_split_particle_major_leaves_and_replicate_the_store():
    lm = NGramTokenLM.random(jax.random.key(0), vocab_size=4, order=2)
    prefixes, logits = zip(*[lm.prefill(p) for p in ([0, 1], [2])])
    experts = TokenExperts(model=lm, prefixes=jnp.stack(prefixes), prompt_logits=jnp.stack(logits), eos_ids=(3,),
                           max_tokens=4)
    smc = SMC(num_particles=6, max_length=4)
    state = jax.eval_shape(smc.run, jax.random.key(0), experts, make_ensemble("product", 2))
    specs = state_specs(state, make_mesh())
    assert specs.symbols == P("particles", None) and specs.log_prefix == P("particles", None)
    assert specs.expert_state.context == P("particles", None)
    assert all(spec == P() for spec in jax.tree.leaves(specs.expert_state.stores, is_leaf=lambda x: isinstance(x, P)))
    assert specs.key == P() and specs.trace.ess == P() and specs.trace.log_weights == P(None, "particles")


def test_state_specs_reject_a_leaf_that_is_not_particle_major(toy):
    experts, ensemble = toy
    state = jax.eval_shape(SMC(num_particles=4, max_length=3).run, jax.random.key(0), experts, ensemble)
    state = state._replace(expert_state=(state.expert_state[0], jax.ShapeDtypeStruct((3,), jnp.int32)))
    with pytest.raises(ValueError, match=r"\[1\] of shape \(3,\) is neither particle-major"):
        state_specs(state, make_mesh())


def test_particles_not_divisible_by_the_devices_say_what_to_do():
    mesh = AbstractMesh((8, 1), ("particles", "model"))
    with pytest.raises(ValueError, match=r"num_particles=12 is not divisible by the 8 devices.*multiple of 8 particles \(e\.g\. 16\)"):
        check_mesh(mesh, 12)
    check_mesh(mesh, 16)
    with pytest.raises(ValueError, match="needs the axes"):
        check_mesh(AbstractMesh((8,), ("data",)), 16)
    with pytest.raises(ValueError, match=r"needs \d+ devices, but \d+ are available"):
        make_mesh(particles=jax.device_count() + 1)


def test_tensor_parallel_rules_split_heads_and_mlp_units():
    mesh = AbstractMesh((1, 2), ("particles", "model"))
    specs = param_specs(abstract_params(), mesh, "tensor_parallel")
    layers = specs["layers"]
    assert layers["q"]["kernel"] == P(None, "model", None)  # [layers, H hd, D]: heads
    assert layers["k"]["kernel"] == P(None, "model", None)
    assert layers["o"]["kernel"] == P(None, None, "model")  # [layers, D, H hd]
    assert layers["gate"]["kernel"] == layers["up"]["kernel"] == P(None, "model", None)
    assert layers["down"]["kernel"] == P(None, None, "model")
    assert layers["attn_norm"]["scale"] == P(None, None)
    assert specs["embed"] == P(None, None)
    # Split layers (load_model's CPU default): one dict per layer, the same rules on the trailing
    # axes, q/k/v and gate/up fused and split by rows like their parts.
    split = param_specs(unstack_layers(random_params(CONFIG, jax.random.key(0))), mesh, "tensor_parallel")
    assert len(split["layers"]) == CONFIG.num_layers
    for layer in split["layers"]:
        assert layer["qkv"]["kernel"] == layer["gate_up"]["kernel"] == P("model", None)
        assert layer["o"]["kernel"] == layer["down"]["kernel"] == P(None, "model")
        assert layer["attn_norm"]["scale"] == P(None)
    replicated = param_specs(abstract_params(), mesh)
    assert all(spec == P(*[None] * len(spec)) for spec in jax.tree.leaves(replicated, is_leaf=lambda x: isinstance(x, P)))


def test_rule_errors_name_the_problem():
    mesh = AbstractMesh((1, 2), ("particles", "model"))
    with pytest.raises(ValueError, match="unknown sharding rules 'megatron'"):
        resolve_rules("megatron")
    with pytest.raises(ValueError, match="not a regular expression"):
        resolve_rules((("layers/(q", P()),))
    with pytest.raises(ValueError, match=r"no sharding rule matches 'layers/attn_norm/scale' \(2, 8\)"):
        param_specs(abstract_params(), mesh, ((r"embed|final_norm/scale", P()),))
    with pytest.raises(ValueError, match="names the axis 'heads'"):
        param_specs(abstract_params(), mesh, ((r".*kernel", P(None, "heads")), (r".*", P())))
    odd = AbstractMesh((1, 3), ("particles", "model"))
    with pytest.raises(ValueError, match=r"'layers/k/kernel' \(2, 4, 8\): a dimension of 4 cannot be split over the 3"):
        param_specs(abstract_params(), odd, "tensor_parallel")


def run_checks(*groups: str) -> str:
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-m", "tests.helpers.sharding_checks", *groups], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout


def test_eight_devices_toy_and_token_experts_match_one_device():
    """Toy experts (multinomial at ESS 0.9 and systematic at 1.0), token experts over a tiny
    random transformer, the same on a 4 x 2 tensor-parallel mesh; outputs split over 8 devices
    and no particle-state all-gather outside the resampling branch (see sharding_checks)."""
    out = run_checks("toy", "token", "tensor_parallel")
    assert "passed" in out


@pytest.mark.slow
def test_eight_devices_byte_experts_match_one_device():
    """Byte experts over a tiny random transformer (about a minute: two byte-level programs)."""
    assert "passed" in run_checks("bytes")


@pytest.mark.real_model
@pytest.mark.slow
def test_ensemble_sampler_with_a_mesh_gives_the_same_result():
    from smc_jax.sampler import EnsembleSampler, Expert
    from smc_jax.models import load_model

    smol = load_model("smollm2-135m-instruct")
    common = dict(experts=(Expert(smol, "My favorite physicist is"), Expert(smol, "My favorite author is")),
                  level="token", num_particles=4, max_length=4, ess_threshold=1.0)
    want = EnsembleSampler(**common)(0)
    got = EnsembleSampler(**common, mesh=make_mesh())(0)
    assert got.texts == want.texts
    np.testing.assert_allclose(got.log_weights, want.log_weights, rtol=1e-5)
    np.testing.assert_allclose(got.expert_logprobs, want.expert_logprobs, rtol=1e-5)
