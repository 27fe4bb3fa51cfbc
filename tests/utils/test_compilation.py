"""Programs kept on disk by `stored_jit`: the same results as the plain jit, read back by a new
process without tracing, and keyed by what they are made from."""

from __future__ import annotations

import dataclasses
import pickle

import jax
import numpy as np
import pytest
from flax import struct

from smc_jax.experts.base import ExpertStack
from smc_jax.smc import engine
from smc_jax.smc.engine import SMC
from smc_jax.smc.ensemble import make_ensemble
from smc_jax.utils import compilation
from smc_jax.utils.compilation import count_compilations, program_store, stored_jit


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A fresh program store (the persistent cache's directory names it)."""
    monkeypatch.setattr(compilation, "program_store", lambda: tmp_path / "exported")
    return tmp_path / "exported"


def _run(smc, experts, ensemble, advance):
    quiet = dataclasses.replace(smc, progress=False, ess_threshold=1.0)
    knobs = engine._Knobs(np.float32(smc.ess_threshold), np.float32(smc.ess_threshold * smc.num_particles))
    state = engine._init_jitted(quiet, jax.random.key(3), experts, ensemble)
    return engine.finish(advance(quiet, knobs, state, experts, ensemble, np.int32(smc.num_steps)))


def _numbers(tree):
    """The leaves as numpy arrays (PRNG keys as their data)."""
    is_key = lambda x: jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
    return jax.tree.map(lambda x: np.asarray(jax.random.key_data(x) if is_key(x) else x), tree)


def test_a_stored_program_gives_the_plain_jits_bits_and_a_new_process_reads_it_without_tracing(
        store, ngram_experts, monkeypatch):
    experts, ens = ExpertStack(groups=ngram_experts), make_ensemble("product", 2)
    smc = SMC(num_particles=16, max_length=9, ess_threshold=0.7)
    plain = _run(smc, experts, ens, engine._advance_jitted.jitted)
    fresh = lambda: stored_jit(engine._advance, static_argnums=(0,), donate_argnums=(2,))
    first = _run(smc, experts, ens, fresh())
    assert len(list(store.glob("advance-*.jaxexport"))) == 1
    # A new process (a new stored_jit) reads the program back: nothing is traced or exported.
    monkeypatch.setattr(jax.export, "export", lambda *a, **k: pytest.fail("traced again"))
    again = fresh()
    second = _run(smc, experts, ens, again)
    for got in (first, second):
        jax.tree.map(np.testing.assert_array_equal, _numbers(got), _numbers(plain))
    # Within a process, a program is made once: later calls (other thresholds too) compile nothing.
    with count_compilations() as compiles:
        _run(dataclasses.replace(smc, ess_threshold=0.3), experts, ens, again)
    assert compiles.count == 0


def test_other_shapes_or_settings_make_other_programs(store, ngram_experts):
    experts, ens = ExpertStack(groups=ngram_experts), make_ensemble("product", 2)
    advance = stored_jit(engine._advance, static_argnums=(0,), donate_argnums=(2,))
    for smc in (SMC(num_particles=8, max_length=5), SMC(num_particles=4, max_length=5),
                SMC(num_particles=8, max_length=5, resampler="systematic")):
        _run(smc, experts, ens, advance)
    assert len(list(store.glob("advance-*.jaxexport"))) == 3


def test_without_a_persistent_cache_nothing_is_stored(tmp_path, ngram_experts, monkeypatch):
    monkeypatch.setattr(compilation, "program_store", lambda: None)
    monkeypatch.setattr(jax.export, "export", lambda *a, **k: pytest.fail("exported"))
    experts, ens = ExpertStack(groups=ngram_experts), make_ensemble("product", 2)
    advance = stored_jit(engine._advance, static_argnums=(0,), donate_argnums=(2,))
    _run(SMC(num_particles=8, max_length=5), experts, ens, advance)


def test_the_store_sits_in_the_persistent_cache_directory(tmp_path):
    before = jax.config.jax_compilation_cache_dir
    try:
        jax.config.update("jax_compilation_cache_dir", str(tmp_path))
        assert program_store() == tmp_path / "exported"
    finally:
        jax.config.update("jax_compilation_cache_dir", before)


def test_bfloat16_leaves_and_an_unreadable_file(store):
    """A bfloat16 argument is stored like any other; a cut-short file is stored again."""
    import jax.numpy as jnp

    def scaled(x, y, n):
        return {"sum": x * n + y.astype(x.dtype), "n": n}

    x, y = jnp.arange(4, dtype=jnp.bfloat16), jnp.ones(4, jnp.float32)
    want = jax.jit(scaled, static_argnums=2)(x, y, 3)
    got = stored_jit(scaled, static_argnums=(2,))(x, y, 3)
    jax.tree.map(np.testing.assert_array_equal, got, want)
    assert got["sum"].dtype == jnp.bfloat16
    (path,) = store.glob("scaled-*.jaxexport")
    path.write_bytes(path.read_bytes()[:100])
    again = stored_jit(scaled, static_argnums=(2,))(x, y, 3)
    jax.tree.map(np.testing.assert_array_equal, again, want)
    assert len(path.read_bytes()) > 100


@struct.dataclass
class _Holder:
    value: jax.Array
    names: tuple = struct.field(pytree_node=False)


def test_equal_trees_share_a_program_whether_or_not_their_parts_are_shared_objects(store, monkeypatch):
    """A model read back from the weights cache shares fewer of its config's strings and tuples
    than one just converted; its programs must still be the stored ones."""
    def scaled(holder):
        return holder.value * len(holder.names)

    name, pair = "default", (0, None, 1)
    shared = _Holder(np.arange(3.0, dtype=np.float32), (name, name, pair, pair))
    separate = _Holder(np.arange(3.0, dtype=np.float32), (name, "".join(["def", "ault"]), pair, tuple(list(pair))))
    assert pickle.dumps(jax.tree.structure(shared)) != pickle.dumps(jax.tree.structure(separate))  # memo references
    want = stored_jit(scaled)(shared)
    monkeypatch.setattr(jax.export, "export", lambda *a, **k: pytest.fail("traced again"))
    np.testing.assert_array_equal(stored_jit(scaled)(separate), want)
    assert len(list(store.glob("scaled-*.jaxexport"))) == 1


def _doubled(x, key):
    return {"y": x * 2, "keys": jax.random.split(key, 3)}


def test_abstract_arguments_give_the_results_shapes_and_a_program_compiled_ahead(store, monkeypatch):
    x, key = np.arange(4, dtype=np.float32), jax.random.key(0)
    specs = (jax.ShapeDtypeStruct((4,), np.float32), jax.ShapeDtypeStruct((), key.dtype))
    want = jax.eval_shape(_doubled, x, key)
    program = stored_jit(_doubled)
    assert program.out_shapes(*specs) == want
    program.precompile(*specs)
    with count_compilations() as compiles:
        out = program(x, key)
    assert compiles.count == 0
    np.testing.assert_array_equal(out["y"], x * 2)
    np.testing.assert_array_equal(jax.random.key_data(out["keys"]), jax.random.key_data(jax.random.split(key, 3)))
    # A new process reads the shapes from the store, tracing nothing.
    monkeypatch.setattr(jax.export, "export", lambda *a, **k: pytest.fail("traced again"))
    again = stored_jit(_doubled)
    again.jitted = None
    assert again.out_shapes(*specs) == want


def test_a_call_inside_another_jit_uses_the_plain_jit(store):
    """The outer program holds the inner one: nothing is stored for traced arguments."""
    inner = stored_jit(_doubled)
    x, key = np.arange(4, dtype=np.float32), jax.random.key(0)
    got = jax.jit(lambda a, k: inner(a, k)["y"] * 3)(x, key)
    np.testing.assert_array_equal(got, x * 6)
    assert not store.exists()


def test_the_librarys_jit_gives_xla_its_options_at_the_top_level_only(monkeypatch):
    """A top-level call on the CPU compiles with COMPILER_OPTIONS (XLA rejects an unknown one, so
    they reach it); inside a user's jit (on its arguments or on constants), vmap or grad, or on
    another backend, the same function runs as the plain jit."""
    f = lambda x: jax.numpy.sum(jax.numpy.exp(x) * x)
    x = np.linspace(-1.0, 1.0, 5, dtype=np.float32)
    assert float(compilation.jit(f)(x)) == pytest.approx(float(f(x)), rel=1e-6)
    monkeypatch.setattr(compilation, "COMPILER_OPTIONS", {"xla_no_such_option": True})
    wrong = compilation.jit(f)
    with pytest.raises(Exception, match="xla_no_such_option"):
        wrong(x)
    np.testing.assert_allclose(jax.jit(lambda a: wrong(a) + 1)(x), f(x) + 1, rtol=1e-6)
    np.testing.assert_allclose(jax.jit(lambda a: wrong(x) + a)(1.0), f(x) + 1, rtol=1e-6)  # a constant inside
    np.testing.assert_allclose(jax.vmap(wrong)(x[:, None]), jax.vmap(f)(x[:, None]), rtol=1e-6)
    np.testing.assert_allclose(jax.grad(wrong)(x), jax.grad(f)(x), rtol=1e-6)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")  # another backend: the plain jit
    assert float(wrong(x)) == pytest.approx(float(f(x)), rel=1e-6)
