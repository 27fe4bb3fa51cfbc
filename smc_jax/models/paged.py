"""Paged decoding: rows continue one prompt with their continuation keys/values in a pool.

The pool holds the keys/values of every continuation token ever fed, one *entry* each
([layers, entries, kv_heads, head_dim]); row c's continuation is the entries paths[c, :depth[c]]
in order (see `smc_jax.models.contexts`, which allocates and frees them). A decode step
gathers those entries layer by layer inside the layer loop (never the whole cache at once), so
rows that share a history share its entries and resampling copies integers, not caches.

Padding meets the pool in the paths: path slots >= depth[c] point at entry 0 (or any entry) and
are masked, exactly like the stale tail of a contiguous continuation cache; their positions are
computed as if they followed the valid part, so masking is all that is needed.

A path may also name entries that the same call writes (`written`): row c then attends to row
j's new key/value, computed in this call, wherever paths[c] names written[j] (tree attention:
one call feeds a token and some of its continuations). Such slots are masked in the pool block
(the pool holds stale data there) and read from the rows' own block instead.

Paths are as wide as the longest continuation (max_tokens slots), but a call's rows are mostly
far shorter. Given `span`, a bound on every row's depth, the step gathers and attends over only
the narrowest of `transformer.path_widths` that holds it. Every span gives the same bits, so a
row's logits never depend on the other rows of its call (masked slots are dropped from the end
of the attention, whose sums do not depend on the width). The attention compiled inside that
switch may round differently from the one compiled without it: SmolLM2's runs are the same bits
either way, Gemma 3's logits move by up to 1e-4.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct
from jaxtyping import Array, Float, Int

from smc_jax.models.cache import PrefixCache
from smc_jax.models.config import ModelConfig
from smc_jax.models.params import Params, activation_dtype
from smc_jax.models.transformer import Keys, PagedKeys, decoder, embed, output_logits


@struct.dataclass
class KVPool:
    k: Float[Array, "layers entries kv_heads head_dim"]
    v: Float[Array, "layers entries kv_heads head_dim"]




def paged_decode(
    params: Params,
    config: ModelConfig,
    prefix: PrefixCache,
    pool: KVPool,
    paths: Int[Array, "rows slots"],
    depth: Int[Array, " rows"],
    tokens: Int[Array, " rows"],
    written: Int[Array, " rows"] | None = None,
    span: Int[Array, ""] | None = None,
) -> tuple[Float[Array, "rows vocab"], Float[Array, "layers rows kv_heads head_dim"], Array]:
    """One new token per row at position prefix.length + depth[c], attending to the prompt, to
    the pool entries paths[c, :depth[c]] and to itself. With `written` (the entries this call
    writes, out of range for none), a path entry written[j] stands for row j's new token. With
    `span` (unbatched, >= every depth[c]), only the first slots of the paths that hold `span`
    are read (`transformer.PagedKeys`; the same bits at any span, less work for short paths).
    Returns logits and the new keys/values."""
    rows, slots = paths.shape
    q_pos = (prefix.length + depth)[:, None].astype(jnp.int32)
    prompt_pos = jnp.arange(prefix.k.shape[1], dtype=jnp.int32)
    slot = jnp.arange(slots, dtype=jnp.int32)[None]
    suffix_pos = jnp.broadcast_to(prefix.length + slot, (rows, slots))
    suffix_valid = slot < depth[:, None]
    tree = None
    if written is not None:
        names = suffix_valid[:, :, None] & (paths[:, :, None] == written[None, None, :])  # [c, slot, j]
        suffix_valid = suffix_valid & ~jnp.any(names, axis=2)
        tree = jnp.any(names, axis=1) | jnp.eye(rows, dtype=bool)

    def context(layer: Array) -> list[Keys | PagedKeys]:
        return [
            Keys(prefix.k[layer], prefix.v[layer], prompt_pos, prompt_pos < prefix.length),
            PagedKeys(pool.k, pool.v, layer, paths, suffix_pos, suffix_valid, span),
        ]

    # The pool is read by layer index (`decoder`), gathering only the rows' path entries.
    x = embed(params, config, tokens[:, None], q_pos)
    h, (k, v) = decoder(params, config, x, q_pos, jnp.ones((rows, 1), bool), context, tree)
    return output_logits(params, config, h)[:, 0], k[:, :, 0], v[:, :, 0]


#: `paged_decode` as its own jit: a byte-SMC program calls it at ~20 places (bucket sizes, the
#: tracing passes of loops and branches), and jit traces it once per distinct shape, not per call.
_traced_once = jax.jit(paged_decode, static_argnums=1)


@struct.dataclass
class PagedTransformer:
    """A transformer behind the paged-model interface of `smc_jax.models.contexts`."""

    params: Params
    config: ModelConfig = struct.field(pytree_node=False)
    #: Read only the first slots of the paths that hold a call's span (the same bits, less work).
    #: None: on CPU only, where it was measured (a call 16-25% faster with SmolLM2 at paths of up
    #: to 16 slots); on a GPU rows are nearly free and a switch per layer is unmeasured.
    cut_paths: bool | None = struct.field(pytree_node=False, default=None)

    @property
    def cuts_paths(self) -> bool:
        return jax.default_backend() == "cpu" if self.cut_paths is None else self.cut_paths

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def dtype(self) -> Any:
        """The activations' and the KV pool's dtype."""
        return activation_dtype(self.params)

    def init_pool(self, capacity: int) -> KVPool:
        shape = (self.config.num_layers, capacity, self.config.num_kv_heads, self.config.head_dim)
        return KVPool(k=jnp.zeros(shape, self.dtype), v=jnp.zeros(shape, self.dtype))

    def step(
        self,
        prefix: PrefixCache,
        pool: KVPool,
        paths: Int[Array, "rows slots"],
        depth: Int[Array, " rows"],
        tokens: Int[Array, " rows"],
        write_at: Int[Array, " rows"],
        tree: bool = False,
        span: Int[Array, ""] | None = None,
    ) -> tuple[Float[Array, "rows vocab"], KVPool]:
        written = write_at if tree else None
        span = span if self.cuts_paths else None
        logits, k, v = _traced_once(self.params, self.config, prefix, pool, paths, depth, tokens, written, span)
        return logits, KVPool(
            k=pool.k.at[:, write_at].set(k.astype(pool.k.dtype), mode="drop"),
            v=pool.v.at[:, write_at].set(v.astype(pool.v.dtype), mode="drop"),
        )
