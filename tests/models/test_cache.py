"""KVCache: masked appends at each row's length, row reordering, capacity checks."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from smc_jax.models import KVCache, ModelConfig

CONFIG = ModelConfig(
    architecture="llama", vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=2,
    num_heads=2, num_kv_heads=1, head_dim=4, max_positions=32,
)


def _entries(layers, rows, new, start):
    """Distinct values: entry (l, r, t) is filled with start + 100 l + 10 r + t."""
    values = start + 100 * np.arange(layers)[:, None, None] + 10 * np.arange(rows)[None, :, None] + np.arange(new)
    return jnp.asarray(np.broadcast_to(values[..., None, None], (layers, rows, new, 1, 4)), jnp.float32)


def test_append_writes_masked_entries_at_each_row_length():
    cache = KVCache.init(CONFIG, rows=3, capacity=5)
    first = _entries(2, 3, 2, start=0)
    cache = cache.append(first, -first, jnp.asarray([[True, True], [True, False], [False, False]]))
    np.testing.assert_array_equal(cache.length, [2, 1, 0])
    second = _entries(2, 3, 3, start=1000)
    cache = cache.append(second, -second, jnp.asarray([[True, False, False], [True, True, True], [True, True, False]]))
    np.testing.assert_array_equal(cache.length, [3, 4, 2])
    k = np.asarray(cache.k[..., 0, 0])
    np.testing.assert_array_equal(k[1, 0, :3], [100, 101, 1100])
    np.testing.assert_array_equal(k[1, 1, :4], [110, 1110, 1111, 1112])
    np.testing.assert_array_equal(k[1, 2, :2], [1120, 1121])
    np.testing.assert_array_equal(np.asarray(cache.v), -np.asarray(cache.k))
    assert cache.rows == 3 and cache.capacity == 5


def test_append_past_capacity_drops_entries():
    cache = KVCache.init(CONFIG, rows=1, capacity=2)
    cache = cache.append(*[_entries(2, 1, 3, start=1)] * 2)
    np.testing.assert_array_equal(np.asarray(cache.k[0, 0, :, 0, 0]), [1, 2])


def test_reorder_gathers_rows():
    cache = KVCache.init(CONFIG, rows=3, capacity=2)
    cache = cache.append(*[_entries(2, 3, 1, start=0)] * 2, jnp.asarray([[True], [True], [False]]))
    picked = cache.reorder(jnp.asarray([1, 1, 0, 2]))
    np.testing.assert_array_equal(picked.length, [1, 1, 1, 0])
    np.testing.assert_array_equal(np.asarray(picked.k[0, :, 0, 0, 0]), [10, 10, 0, 0])
