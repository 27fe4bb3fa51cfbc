"""`transformer._matmul` with bfloat16 weights: the weights-left form (`_weights_left`) gives the
bits of the plain [rows, in] x [out, in] product, at every row count it is used for."""

import math

import jax
import jax.numpy as jnp
import pytest

from smc_jax.models import transformer
from smc_jax.models.transformer import _matmul

SPEC = "rtd,fd->rtf"


def _reference(x, w):
    """The product before the weights-left form: einsum, a lone row multiplied beside a zero row."""
    product = lambda x: jnp.einsum(SPEC, x.astype(w.dtype), w, preferred_element_type=jnp.float32)
    if math.prod(x.shape[:-1]) == 1:
        return jax.vmap(product)(jnp.stack([x, jnp.zeros_like(x)]))[0]
    return product(x)


@pytest.mark.parametrize("shape", [(960, 576), (576, 1536), (8192, 576)])
def test_bfloat16_products_keep_their_bits(shape):
    key = jax.random.PRNGKey(shape[0])
    w = (jax.random.normal(key, shape) / shape[1] ** 0.5).astype(jnp.bfloat16)
    for rows in [1, 2, 3, 4, 5, 7, 10, 16, 20, 33, 40]:
        x = jax.random.normal(jax.random.fold_in(key, rows), (rows, 1, shape[1]))
        got = jax.jit(lambda x: _matmul(SPEC, x, w))(x)
        assert got.dtype == jnp.float32 and got.shape == (rows, 1, shape[0])
        assert bool(jnp.all(got == jax.jit(_reference)(x, w))), rows
    # Mapped over prompts, as the byte and token experts run it.
    xs = jax.random.normal(key, (2, 10, 1, shape[1]))
    got = jax.jit(jax.vmap(lambda x: _matmul(SPEC, x, w)))(xs)
    assert bool(jnp.all(got == jax.jit(jax.vmap(lambda x: _reference(x, w)))(xs)))


def test_weights_left_form_is_used_where_measured():
    w = jnp.zeros((64, 32), jnp.bfloat16)
    jaxpr = str(jax.make_jaxpr(lambda x: _matmul(SPEC, x, w))(jnp.zeros((10, 1, 32))))
    used = transformer.CPU_HAS_AMX_BF16 and jax.default_backend() == "cpu"
    assert ("optimization_barrier" in jaxpr) == used
    small = str(jax.make_jaxpr(lambda x: _matmul(SPEC, x, w))(jnp.zeros((2, 1, 32))))
    assert "optimization_barrier" not in small  # 1-2 rows take another kernel in the plain form
    f32 = str(jax.make_jaxpr(lambda x: _matmul(SPEC, x, w.astype(jnp.float32)))(jnp.zeros((10, 1, 32))))
    assert "optimization_barrier" not in f32
