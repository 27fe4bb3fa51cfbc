"""Key/value caches: one shared prompt cache (`PrefixCache`) and a contiguous per-row cache.

The model functions never write a cache: `transformer.extend` returns the new keys and values and
the caller stores them. `KVCache` is the simple store (one contiguous buffer per row) used by
tests and by `LanguageModel.greedy`; a paged pool can replace it without touching the model.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from smc_jax.models.config import ModelConfig


@flax.struct.dataclass
class PrefixCache:
    """Keys/values of one prompt, right-padded: entries [0, length) are valid, the rest is padding.

    k, v: [layers, T_pad, kv_heads, head_dim]; positions are 0..T_pad-1. Several prompts are the
    same pytree with a leading prompt axis (from `jax.vmap(prefill)`).

    Attributes
    ----------
    k, v : jax.Array, shape [layers, T_pad, kv_heads, head_dim]
        Keys and values of the prompt.
    length : jax.Array, shape []
        The prompt's length in tokens.
    """

    k: Float[Array, "layers tokens kv_heads head_dim"]
    v: Float[Array, "layers tokens kv_heads head_dim"]
    length: Int[Array, ""]

    @property
    def capacity(self) -> int:
        return self.k.shape[-3]


class CacheCapacityError(ValueError):
    """More tokens than a cache was sized for."""


@flax.struct.dataclass
class KVCache:
    """Continuation keys/values for R rows: row r's entries [0, length[r]) are valid.

    k, v: [layers, rows, capacity, kv_heads, head_dim]. Row r's entry s sits at absolute position
    prefix.length + s (the prompt cache holds positions below that).

    Attributes
    ----------
    k, v : jax.Array, shape [layers, rows, capacity, kv_heads, head_dim]
        Keys and values.
    length : jax.Array, shape [rows]
        Valid entries per row.
    """

    k: Float[Array, "layers rows capacity kv_heads head_dim"]
    v: Float[Array, "layers rows capacity kv_heads head_dim"]
    length: Int[Array, " rows"]

    @classmethod
    def init(cls, config: ModelConfig, rows: int, capacity: int, dtype: Any = jnp.float32) -> KVCache:
        shape = (config.num_layers, rows, capacity, config.num_kv_heads, config.head_dim)
        return cls(
            k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype), length=jnp.zeros((rows,), jnp.int32)
        )

    @property
    def rows(self) -> int:
        return self.k.shape[1]

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def check_room(self, new_tokens: int) -> None:
        """Host-side check (not under jit) that every row can take `new_tokens` more entries."""
        longest = int(jnp.max(self.length))
        if longest + new_tokens > self.capacity:
            raise CacheCapacityError(
                f"a row holds {longest} tokens and needs {new_tokens} more, but the cache capacity is "
                f"{self.capacity}; create it with KVCache.init(config, rows, capacity=...) at least "
                f"{longest + new_tokens}"
            )

    @jax.jit
    def append(
        self,
        new_k: Float[Array, "layers rows new kv_heads head_dim"],
        new_v: Float[Array, "layers rows new kv_heads head_dim"],
        mask: Bool[Array, "rows new"] | None = None,
    ) -> KVCache:
        """Write row r's masked-in new entries at slots length[r], length[r] + 1, ...

        mask[r, t] False skips entry t of row r (rows may advance by different amounts); valid
        entries must come first in each row. Entries past the capacity are dropped (jit cannot
        raise): callers check with `check_room` first.
        """
        rows, new = new_k.shape[1], new_k.shape[2]
        if mask is None:
            mask = jnp.ones((rows, new), bool)
        slots = self.length[:, None] + jnp.cumsum(mask, axis=1) - 1
        slots = jnp.where(mask, slots, self.capacity)  # out of range -> dropped
        row_index = jnp.arange(rows)[:, None]
        k = self.k.at[:, row_index, slots].set(new_k.astype(self.k.dtype), mode="drop")
        v = self.v.at[:, row_index, slots].set(new_v.astype(self.v.dtype), mode="drop")
        return KVCache(k=k, v=v, length=self.length + mask.sum(axis=1, dtype=jnp.int32))

    @jax.jit
    def reorder(self, indices: Int[Array, " new_rows"]) -> KVCache:
        """Row i of the result is row indices[i] of this cache (resampling, beam pruning)."""
        return KVCache(k=self.k[:, indices], v=self.v[:, indices], length=self.length[indices])
