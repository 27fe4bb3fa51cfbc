"""`map_axis`: vmap's values, without batching where the mapped axis has size 1."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from smc_jax.utils.control import map_axis


def _fn(table, beams, scale):
    """A branch on the data (a cond, a select under vmap) and a loop, as the experts' code has."""
    picked = jax.lax.cond(jnp.sum(table) > 0, lambda: beams * 2.0, lambda: beams - 1.0)
    total = jax.lax.fori_loop(0, 3, lambda i, x: x + table[i], picked)
    return {"total": total * scale, "first": table[:2]}


@pytest.mark.parametrize("k", [1, 3])
def test_map_axis_gives_vmaps_values(k):
    rng = np.random.default_rng(k)
    table = jnp.asarray(rng.normal(size=(k, 4)), jnp.float32)
    beams = jnp.asarray(rng.normal(size=(5, k, 2)), jnp.float32)  # [M, K, ...]: mapped on axis 1
    args = (table, beams, jnp.float32(1.5))
    want = jax.vmap(_fn, in_axes=(0, 1, None), out_axes=1)(*args)
    got = map_axis(_fn, in_axes=(0, 1, None), out_axes=1)(*args)
    for key in want:
        assert got[key].shape == want[key].shape
        np.testing.assert_allclose(got[key], want[key], rtol=1e-6)
    jit_got = jax.jit(map_axis(_fn, in_axes=(0, 1, None), out_axes=1))(*args)
    np.testing.assert_allclose(jit_got["total"], want["total"], rtol=1e-6)


def test_map_axis_of_size_one_does_not_batch():
    seen = []

    def fn(x):
        seen.append(type(x).__name__)
        return jax.lax.cond(x[0] > 0, lambda: x, lambda: -x)

    x = jnp.ones((1, 3))
    jaxpr = jax.make_jaxpr(map_axis(fn))(x)
    assert "cond" in str(jaxpr)  # a batched predicate would have turned the cond into a select
    jax.make_jaxpr(jax.vmap(fn))(jnp.ones((2, 3)))
    assert "BatchTracer" not in seen[0] and "BatchTracer" in seen[1]


def test_map_axis_inside_a_problem_axis_is_vmap():
    # Inside a batched run it batches (slicing the stores' pools there cost 2.3x a run); its
    # values are the same either way.
    from smc_jax.utils.problems import PROBLEMS

    fn = lambda x: x * 2
    x = jnp.arange(6.0).reshape(3, 1, 2)
    np.testing.assert_array_equal(jax.vmap(map_axis(fn), axis_name=PROBLEMS)(x), x * 2)
    np.testing.assert_array_equal(jax.vmap(map_axis(fn))(x), x * 2)
    # no problem axis: the one slice is taken (a squeeze), under an outer vmap too
    jaxprs = [str(jax.make_jaxpr(jax.vmap(map_axis(fn), **kw))(x)) for kw in ({"axis_name": PROBLEMS}, {})]
    assert "squeeze" not in jaxprs[0] and "squeeze" in jaxprs[1]
