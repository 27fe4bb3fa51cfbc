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

import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct
from jax.custom_batching import custom_vmap
from jaxtyping import Array, Bool, Float, Int

from smc_jax.models.cache import PrefixCache
from smc_jax.models.config import ModelConfig
from smc_jax.models.params import Params, activation_dtype
from smc_jax.models.transformer import Keys, PagedKeys, decoder, embed, output_logits
from smc_jax.utils.control import in_place_cond
from smc_jax.utils.problems import in_problems


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
    problem: Int[Array, " rows"] | None = None,
) -> tuple[Float[Array, "rows vocab"], Float[Array, "layers rows kv_heads head_dim"], Array]:
    """One new token per row at position prefix.length + depth[c], attending to the prompt, to
    the pool entries paths[c, :depth[c]] and to itself. With `written` (the entries this call
    writes, out of range for none), a path entry written[j] stands for row j's new token. With
    `span` (unbatched, >= every depth[c]), only the first slots of the paths that hold `span`
    are read (`transformer.PagedKeys`; the same bits at any span, less work for short paths).
    With `problem` ([rows]), prefix and pool stack several problems' ([problems, ...]) and row
    c continues problem problem[c]'s (its entries, its prompt; tree links stay within it).
    Returns logits and the new keys/values."""
    rows, slots = paths.shape
    length = prefix.length if problem is None else prefix.length[problem]
    prompt_pos = jnp.arange(prefix.k.shape[-3], dtype=jnp.int32)
    slot = jnp.arange(slots, dtype=jnp.int32)[None]
    q_pos = (length + depth)[:, None].astype(jnp.int32)
    suffix_pos = jnp.broadcast_to((length[:, None] if problem is not None else length) + slot, (rows, slots))
    suffix_valid = slot < depth[:, None]
    tree = None
    if written is not None:
        names = suffix_valid[:, :, None] & (paths[:, :, None] == written[None, None, :])  # [c, slot, j]
        if problem is not None:
            names = names & (problem[:, None, None] == problem[None, None, :])
        suffix_valid = suffix_valid & ~jnp.any(names, axis=2)
        tree = jnp.any(names, axis=1) | jnp.eye(rows, dtype=bool)

    def context(layer: Array) -> list[Keys | PagedKeys]:
        if problem is None:
            prompt = Keys(prefix.k[layer], prefix.v[layer], prompt_pos, prompt_pos < prefix.length)
        else:  # per row: its problem's prompt
            pos = jnp.broadcast_to(prompt_pos, (rows, prompt_pos.shape[0]))
            prompt = Keys(prefix.k[problem, layer], prefix.v[problem, layer], pos, pos < length[:, None])
        return [prompt, PagedKeys(pool.k, pool.v, layer, paths, suffix_pos, suffix_valid, span, problem)]

    # The pool is read by layer index (`decoder`), gathering only the rows' path entries.
    x = embed(params, config, tokens[:, None], q_pos)
    h, (k, v) = decoder(params, config, x, q_pos, jnp.ones((rows, 1), bool), context, tree)
    return output_logits(params, config, h)[:, 0], k[:, :, 0], v[:, :, 0]


def compact_sizes(rows: int) -> tuple[int, ...]:
    """Row counts of a call that packs the needed rows of several problems (`shared_decode`):
    an eighth, a quarter, a half and all of their `rows` (each compiles its own forward)."""
    return tuple(sorted({max(1, -(-rows // d)) for d in (8, 4, 2, 1)}))


def shared_decode(
    params: Params,
    config: ModelConfig,
    prefix: PrefixCache,
    pool: KVPool,
    paths: Int[Array, "problems rows slots"],
    depth: Int[Array, "problems rows"],
    tokens: Int[Array, "problems rows"],
    needed: Bool[Array, "problems rows"],
    written: Int[Array, "problems rows"] | None = None,
    span: Int[Array, ""] | None = None,
) -> tuple[Float[Array, "problems rows vocab"], Array, Array]:
    """`paged_decode` for the rows of P problems (prefix, pool and rows stacked on axis 0) in one
    call of only their `needed` rows: those are packed to the front (in problem order) into the
    smallest of `compact_sizes` holding them, and the others get zero logits and keys/values.
    A batch's problems each pad their rows to the largest bucket any of them needs
    (`smc_jax.utils.problems`), so most rows of a vmapped call are padding; this call computes
    the needed ones. Returns logits [P, rows, V] and keys/values [P, layers, rows, ...]."""
    problems, rows = tokens.shape
    flat = lambda x: x.reshape((problems * rows, *x.shape[2:]))
    need = flat(needed)
    order = jnp.argsort(~need, stable=True).astype(jnp.int32)  # needed rows first, in order
    count = jnp.sum(need)
    owner = jnp.repeat(jnp.arange(problems, dtype=jnp.int32), rows)
    sizes = compact_sizes(problems * rows)

    def run(size: int):
        def call(carry):
            at = order[:size]
            out = paged_decode(params, config, prefix, pool, flat(paths)[at], flat(depth)[at], flat(tokens)[at],
                               None if written is None else flat(written)[at], span, owner[at])
            logits, k, v = carry
            return logits.at[at].set(out[0]), k.at[:, at].set(out[1]), v.at[:, at].set(out[2])

        return call

    shapes = jax.eval_shape(lambda: paged_decode(params, config, prefix, pool, flat(paths)[:1], flat(depth)[:1],
                                                 flat(tokens)[:1], None if written is None else flat(written)[:1],
                                                 span, owner[:1]))
    zeros = lambda shape, axis: jnp.zeros(shape.shape[:axis] + (problems * rows,) + shape.shape[axis + 1:], shape.dtype)
    carry = (zeros(shapes[0], 0), zeros(shapes[1], 1), zeros(shapes[2], 1))
    choice = jnp.searchsorted(jnp.asarray(sizes), count, side="left")
    for index, size in enumerate(sizes):
        carry = in_place_cond((choice == index) & (count > 0), run(size), carry)
    logits, k, v = carry
    split = lambda x, axis: jnp.moveaxis(x.reshape(x.shape[:axis] + (problems, rows) + x.shape[axis + 1:]), axis, 0)
    return split(logits, 0), split(k, 1), split(v, 1)


@functools.cache
def _shared_step(config: ModelConfig):
    """`shared_decode` for `config` as a `custom_vmap`: vmapped (over a batch's problems, or a
    problem's experts of one model), it folds the mapped axis into its problem axis and calls
    itself, so the rows of every problem and expert of a model meet in one packed call."""

    @custom_vmap
    def step(params, prefix, pool, paths, depth, tokens, needed, written, span):
        return shared_decode(params, config, prefix, pool, paths, depth, tokens, needed, written, span)

    @step.def_vmap
    def rule(axis_size, in_batched, params, prefix, pool, paths, depth, tokens, needed, written, span):
        if any(jax.tree.leaves(in_batched[0])):  # weights that differ per instance: no packing
            out = jax.vmap(lambda *a: shared_decode(a[0], config, *a[1:]),
                           in_axes=jax.tree.map(lambda b: 0 if b else None, tuple(in_batched)))(
                params, prefix, pool, paths, depth, tokens, needed, written, span)
            return out, (True, True, True)
        if span is not None and in_batched[8]:
            span = jnp.max(span)
        spread = lambda x, b: x if b else jnp.broadcast_to(x, (axis_size, *x.shape))
        fold = lambda x, b: (lambda y: y.reshape((-1, *y.shape[2:])))(spread(x, b))
        args = [jax.tree.map(fold, arg, b) for arg, b in zip((prefix, pool, paths, depth, tokens, needed, written),
                                                             in_batched[1:8])]
        logits, k, v = step(params, *args, span)
        unfold = lambda x: x.reshape((axis_size, -1, *x.shape[1:]))
        return (unfold(logits), unfold(k), unfold(v)), (True, True, True)

    return step


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
    #: In a batch of problems, pack the rows each call needs across its problems (`shared_decode`).
    pack_problems: bool = struct.field(pytree_node=False, default=True)

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
        if in_problems() and self.pack_problems:
            one = lambda x: x[None]
            logits, k, v = _shared_step(self.config)(
                self.params, jax.tree.map(one, prefix), jax.tree.map(one, pool), one(paths), one(depth), one(tokens),
                one(write_at < pool.k.shape[1]), None if written is None else one(written), span)
            logits, k, v = logits[0], k[0], v[0]
        else:
            logits, k, v = _traced_once(self.params, self.config, prefix, pool, paths, depth, tokens, written, span)
        return logits, KVPool(
            k=pool.k.at[:, write_at].set(k.astype(pool.k.dtype), mode="drop"),
            v=pool.v.at[:, write_at].set(v.astype(pool.v.dtype), mode="drop"),
        )
