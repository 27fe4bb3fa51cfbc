"""Token contexts shared by particles and beam slots: a paged KV pool plus a context table.

Model-backed experts never copy key/value caches. Every token that was ever fed to the model
after the prompt owns one *entry* of a pool (its keys/values, kept by the model), and every
entry knows the *path* of entries of its whole continuation (its ancestors, then itself). A
*context* is a token sequence whose next-token distribution an expert still needs: it points at
its last entry (or at the prompt) and stores a *summary* of that distribution (the token-level
log-probabilities, or a byte-level sum tree). Particles and beam slots hold context ids, so
resampling and beam forks copy integers.

Extending contexts by tokens is one batched model call: requests (parent context, token) are
deduplicated across all particles and slots (resampled copies that sample the same token share
one row), compacted into the smallest fixed bucket size that holds them (so shapes stay static
and a step with no request makes no call), and written to free entries and context ids. Entries
and contexts are garbage-collected by reference: a context is alive while a slot or a request
refers to it, an entry while an alive context's path contains it. Capacities are fixed; running
out sets `overflow`, which the sampler reports as an error (never silently wrong results).

Padding meets the pool in the paths: path[e, :depth[e]] are valid entry ids, the rest is 0 and
must be masked by depth (the model's step does so).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, Bool, Float, Int

from smc_jax.utils.buckets import multiple_bucket
from smc_jax.utils.control import in_place_cond, map_axis
from smc_jax.utils.problems import shared_max

PyTree = Any

#: Context id of a slot that holds no hypothesis.
NO_CONTEXT = -1
#: Entry id of the prompt's own context (its keys live in the model's prefix cache).
PROMPT_ENTRY = -1
#: Context id of the prompt context in a fresh store.
PROMPT_CONTEXT = 0


class PagedModel(Protocol):
    """A token LM decoded into a paged pool (a pytree; its config is static)."""

    vocab_size: int

    def init_pool(self, capacity: int) -> PyTree:
        """An empty pool of `capacity` entries."""

    def step(
        self,
        prefix: PyTree,
        pool: PyTree,
        paths: Int[Array, "C S"],
        depth: Int[Array, "C"],
        tokens: Int[Array, "C"],
        write_at: Int[Array, "C"],
        tree: bool = False,
        span: Int[Array, ""] | None = None,
    ) -> tuple[Float[Array, "C V"], PyTree]:
        """Feeds tokens[c] after the prompt and the entries paths[c, :depth[c]]; returns the
        next-token logits and the pool with token c's keys/values stored at entry write_at[c]
        (an out-of-range write_at means: do not store). With `tree` (static), a path may name
        an entry write_at[j] of this call: row c then continues row j's token (tree attention).
        `span` (unbatched) is a bound on every depth[c]: the model may read only paths[:, :span],
        and its results must not depend on it."""


@struct.dataclass
class ContextStore:
    """Contexts of one expert (one prompt). Shapes: N entries, T contexts, S tokens per path."""

    pool: PyTree
    path: Int[Array, "N S"]
    depth: Int[Array, "N"]
    context_entry: Int[Array, "T"]
    summary: PyTree  # leaves [T, ...]
    overflow: Bool[Array, ""]
    calls: Int[Array, ""]  # model calls made (steps whose requests were not all empty)
    rows: Int[Array, ""]  # rows computed by those calls (bucket sizes, padding included)
    requests: Int[Array, ""]  # unique (context, token) rows actually needed
    peak_entries: Int[Array, ""]  # most pool entries in use right after a call (alive + written)
    peak_contexts: Int[Array, ""]  # most contexts in use right after a call

    @property
    def num_entries(self) -> int:
        return self.path.shape[0]

    @property
    def num_contexts(self) -> int:
        return self.context_entry.shape[0]

    @property
    def max_tokens(self) -> int:
        return self.path.shape[1]

    def entry_of(self, contexts: Int[Array, "..."]) -> Int[Array, "..."]:
        """The pool entry each context ends at (PROMPT_ENTRY for the prompt; ids clipped into range)."""
        return self.context_entry[jnp.clip(contexts, 0, self.num_contexts - 1)]


class Recycled(NamedTuple):
    """A spent store's two large buffers, taken over by `init_store` (donated, they are reused in place)."""

    pool: PyTree
    summary: PyTree


def init_store(
    model: PagedModel, prompt_summary: PyTree, num_entries: int, num_contexts: int, max_tokens: int,
    recycle: Recycled | None = None,
) -> ContextStore:
    """A store whose only context is the prompt (id PROMPT_CONTEXT), with the given summary.

    With `recycle` (from a store of these sizes), its pool and summary table are kept as they
    are instead of zeroed, which for a large vocabulary costs more than a short run (hundreds of
    MB, first touched): what they hold is never read, since an entry's keys and a context's
    summary are written when it is created and read only while it is alive, as after any
    context dies within a run.
    """
    table = lambda leaf: jnp.zeros((num_contexts,) + leaf.shape, leaf.dtype)
    if recycle is None:
        summary = jax.tree.map(lambda leaf: table(leaf).at[PROMPT_CONTEXT].set(leaf), prompt_summary)
        pool = model.init_pool(num_entries)
    else:
        shapes = lambda tree: jax.tree.map(lambda x: (tuple(x.shape), jnp.dtype(x.dtype)), tree)
        fresh = Recycled(jax.eval_shape(lambda: model.init_pool(num_entries)),
                         jax.eval_shape(lambda: jax.tree.map(table, prompt_summary)))
        if shapes(recycle) != shapes(fresh):
            raise ValueError("a recycled store must have the new store's sizes; pass recycle=None to start afresh")
        summary = jax.tree.map(lambda old, leaf: old.at[PROMPT_CONTEXT].set(leaf), recycle.summary, prompt_summary)
        pool = recycle.pool
    return ContextStore(
        pool=pool,
        path=jnp.zeros((num_entries, max_tokens), jnp.int32),
        depth=jnp.zeros((num_entries,), jnp.int32),
        context_entry=jnp.full((num_contexts,), PROMPT_ENTRY, jnp.int32),
        summary=summary,
        overflow=jnp.zeros((), bool),
        calls=jnp.zeros((), jnp.int32),
        rows=jnp.zeros((), jnp.int32),
        requests=jnp.zeros((), jnp.int32),
        peak_entries=jnp.zeros((), jnp.int32),
        peak_contexts=jnp.zeros((), jnp.int32),
    )


def context_tokens_path(store: ContextStore, contexts: Int[Array, "C"]) -> tuple[Int[Array, "C S"], Int[Array, "C"]]:
    """The entry path and its length for each context (empty for the prompt context)."""
    entry = store.entry_of(contexts)
    paths = jnp.where((entry == PROMPT_ENTRY)[:, None], 0, store.path[jnp.clip(entry, 0, store.num_entries - 1)])
    return paths, context_depth(store, contexts)


def context_depth(store: ContextStore, contexts: Int[Array, "..."]) -> Int[Array, "..."]:
    """The number of continuation tokens of each context (0 for the prompt context)."""
    entry = store.entry_of(contexts)
    return jnp.where(entry == PROMPT_ENTRY, 0, store.depth[jnp.clip(entry, 0, store.num_entries - 1)])


class Requests(struct.PyTreeNode):
    """Unique (parent context, token) pairs, compacted to the front, and how to find them."""

    parent: Int[Array, "R"]
    token: Int[Array, "R"]
    valid: Bool[Array, "R"]  # the first `count` rows
    inverse: Int[Array, "R"]  # for each original request, its row among the unique ones
    count: Int[Array, ""]


def dedupe(parent: Int[Array, "R"], token: Int[Array, "R"], valid: Bool[Array, "R"]) -> Requests:
    """Deduplicates valid requests; invalid ones map to row R (out of range)."""
    r = parent.shape[0]
    big = jnp.iinfo(jnp.int32).max
    p = jnp.where(valid, parent, big)
    t = jnp.where(valid, token, big)
    order = jnp.lexsort((t, p))
    sp, st, sv = p[order], t[order], valid[order]
    first = sv & jnp.concatenate([jnp.ones((1,), bool), (sp[1:] != sp[:-1]) | (st[1:] != st[:-1])])
    group = jnp.cumsum(first) - 1
    count = jnp.sum(first).astype(jnp.int32)
    slot = jnp.where(first, group, r)
    u_parent = jnp.zeros((r,), jnp.int32).at[slot].set(sp, mode="drop")
    u_token = jnp.zeros((r,), jnp.int32).at[slot].set(st, mode="drop")
    inverse = jnp.zeros((r,), jnp.int32).at[order].set(jnp.where(sv, group, r).astype(jnp.int32))
    return Requests(
        parent=u_parent, token=u_token, valid=jnp.arange(r) < count, inverse=inverse, count=count
    )


def _first_free(used: Bool[Array, "n"], count: int) -> Int[Array, "count"]:
    """The first `count` indices not in use; n (out of range) where there are fewer."""
    return jnp.nonzero(~used, size=count, fill_value=used.shape[0])[0].astype(jnp.int32)


def extend_contexts(
    store: ContextStore,
    model: PagedModel,
    prefix: PyTree,
    parent: Int[Array, "U"],
    token: Int[Array, "U"],
    valid: Bool[Array, "U"],
    keep: Int[Array, "K"],
    summarize: Callable[[Float[Array, "U V"]], PyTree],
    needed: Bool[Array, "U"] | None = None,
    parent_row: Int[Array, "U"] | None = None,
    span: Int[Array, ""] | None = None,
    chunk: int = 0,
    rows_used: Int[Array, ""] | None = None,
    spine: Int[Array, "U"] | None = None,
) -> tuple[ContextStore, Int[Array, "U"]]:
    """Creates context parent + token for each valid row with one model call of U rows.

    `keep` lists context ids (NO_CONTEXT entries ignored) that must survive besides the parents.
    `needed` (default: `valid`) marks the rows counted as requests (the others are prefetched).
    `parent_row[u] >= 0` makes row u continue the context that row parent_row[u] creates in
    this same call (tree attention; that row must have no such parent itself, and parent[u] is
    ignored); the row is created only where its parent row is. `span` bounds the rows' path
    lengths (see `PagedModel.step`). With `chunk` (static, > 0) the model reads `chunk` rows at a
    time, as many times as the last valid row needs (rows are compacted to the front), or as
    `rows_used` (unbatched) says, a last chunk that fits in half a chunk read at half size: one
    forward in the program whatever U (and its half), and work in proportion to the rows used.
    `spine[u] = s` makes row u continue parent[u] + the tokens of rows 0..s-1 of this call
    (which must form a chain: row j < s has spine j and the same parent), so one call creates
    a chain of tokens and contexts one token off it (tree attention; not with `parent_row`, and
    read in whole chunks only); a row is created only where its whole spine is.
    Returns the store and the new context ids (NO_CONTEXT for invalid rows)."""
    n, t = store.num_entries, store.num_contexts
    u = parent.shape[0]
    in_call = jnp.zeros((u,), bool) if parent_row is None else parent_row >= 0
    parent = jnp.where(in_call, NO_CONTEXT, parent)
    refs = jnp.concatenate([keep, jnp.where(valid, parent, NO_CONTEXT)])
    ctx_alive = jnp.zeros((t,), bool).at[jnp.where(refs >= 0, refs, t)].set(True, mode="drop")
    ctx_alive = ctx_alive.at[PROMPT_CONTEXT].set(True)  # the root of every continuation
    live_paths, live_depth = context_tokens_path(store, jnp.arange(t))
    path_used = ctx_alive[:, None] & (jnp.arange(store.max_tokens)[None] < live_depth[:, None])
    entry_alive = jnp.zeros((n,), bool).at[jnp.where(path_used, live_paths, n)].set(True, mode="drop")

    new_entry = _first_free(entry_alive, u)
    new_ctx = _first_free(ctx_alive, u)
    paths, depth = context_tokens_path(store, parent)
    extended = lambda paths, depth: paths.at[jnp.arange(u), jnp.minimum(depth, store.max_tokens - 1)].set(new_entry)
    full = depth >= store.max_tokens
    overflow = jnp.any(valid & ((new_entry >= n) | (new_ctx >= t) | full))
    ok = valid & ~full
    if parent_row is not None:  # a row in the tree continues its parent row's new path
        row = jnp.clip(parent_row, 0, u - 1)
        paths = jnp.where(in_call[:, None], extended(paths, depth)[row], paths)
        depth = jnp.where(in_call, depth[row] + 1, depth)
        # Rows in the tree are optional: one whose path would be full is dropped, not an overflow
        # (no continuation has more tokens than max_tokens); their room was checked above.
        ok = jnp.where(in_call, ok[row] & valid & (depth < store.max_tokens), ok)
    if spine is not None:  # row u's path: its parent's, then the entries of rows 0..spine[u]-1
        slot = jnp.arange(store.max_tokens, dtype=jnp.int32)[None] - depth[:, None]
        on_spine = (slot >= 0) & (slot < spine[:, None])
        paths = jnp.where(on_spine, new_entry[jnp.clip(slot, 0, u - 1)], paths)
        depth = depth + spine
        # the spine's rows are 0..spine-1, all created (a prefix of the valid rows) or none
        ok = ok & (depth < store.max_tokens) & (jnp.cumsum(~ok)[jnp.clip(spine - 1, 0, u - 1)] * (spine > 0) == 0)
    write_entry = jnp.where(ok, new_entry, n)
    write_ctx = jnp.where(ok, new_ctx, t)

    written = jnp.sum(ok).astype(jnp.int32)

    options = {} if span is None else {"span": span}
    if parent_row is not None or spine is not None:
        options["tree"] = True
    put = lambda summary, at, logits: jax.tree.map(
        lambda table, new: table.at[at].set(new, mode="drop"), summary, summarize(logits))
    if 0 < chunk < u:
        pool, summary, computed = _chunked_step(model, prefix, store.pool, store.summary, paths, depth, token,
                                                write_entry, write_ctx, ok, put, chunk, options, n, t, rows_used,
                                                halves=spine is None)
    else:
        logits, pool = model.step(prefix, store.pool, paths, depth, token, write_entry, **options)
        summary, computed = put(store.summary, write_ctx, logits), u
    new_paths = extended(paths, depth)
    store = ContextStore(
        pool=pool,
        path=store.path.at[write_entry].set(new_paths, mode="drop"),
        depth=store.depth.at[write_entry].set(depth + 1, mode="drop"),
        context_entry=store.context_entry.at[write_ctx].set(new_entry, mode="drop"),
        summary=summary,
        overflow=store.overflow | overflow,
        calls=store.calls + 1,
        rows=store.rows + computed,
        requests=store.requests + jnp.sum(valid if needed is None else needed & valid).astype(jnp.int32),
        peak_entries=jnp.maximum(store.peak_entries, jnp.sum(entry_alive) + written),
        peak_contexts=jnp.maximum(store.peak_contexts, jnp.sum(ctx_alive) + written),
    )
    return store, jnp.where(ok, new_ctx, NO_CONTEXT)


def _chunked_step(model, prefix, pool, summary, paths, depth, token, write_entry, write_ctx, ok, put, chunk, options,
                  no_entry, no_context, rows_used, halves=True):
    """`model.step` on rows [i * chunk, (i + 1) * chunk) for i = 0, 1, ... while some row at or
    after i * chunk is written (`extend_contexts` with `chunk`); out-of-range writes pad the last.
    With `rows_used` (unbatched), a last chunk whose rows fit in half a chunk is read as a half
    chunk: a second, smaller forward in the program, since a forward's cost is mostly its rows
    and a call's rows per expert often fit in M / 2. Returns the pool, the summaries and the
    rows computed (padding included)."""
    u = token.shape[0]
    padded = multiple_bucket(u, chunk)
    pad = lambda x, fill: jnp.pad(x, [(0, padded - u)] + [(0, 0)] * (x.ndim - 1), constant_values=fill)
    rows = (pad(paths, 0), pad(depth, 0), pad(token, 0), pad(write_entry, no_entry), pad(write_ctx, no_context))
    # Rows up to the last written one; given from outside a vmap, the loop is not batched (a
    # batched loop would select whole pools at every iteration).
    needed = jnp.max(jnp.where(ok, jnp.arange(u) + 1, 0)) if rows_used is None else rows_used
    half = chunk // 2 if rows_used is not None and halves else 0

    def read(start, size):
        def run(carry):
            pool, summary = carry
            take = lambda x: jax.lax.dynamic_slice_in_dim(x, start, size)
            c_paths, c_depth, c_token, c_entry, c_ctx = map(take, rows)
            logits, pool = model.step(prefix, pool, c_paths, c_depth, c_token, c_entry, **options)
            return pool, put(summary, c_ctx, logits)

        return run

    def body(carry):
        i, computed, pool, summary = carry
        start = i * chunk
        if not half:
            return i + 1, computed + chunk, *read(start, chunk)((pool, summary))
        # The predicate is unbatched (rows_used), so each branch runs or is skipped in place.
        small = needed - start <= half
        pool, summary = in_place_cond(small, read(start, half), (pool, summary))
        pool, summary = in_place_cond(~small, read(start, chunk), (pool, summary))
        return i + 1, computed + jnp.where(small, half, chunk), pool, summary

    _, computed, pool, summary = jax.lax.while_loop(lambda carry: carry[0] * chunk < needed, body,
                                                    (jnp.int32(0), jnp.int32(0), pool, summary))
    return pool, summary, computed


def bucket_sizes(max_requests: int, typical: int, doublings: int = 1) -> tuple[int, ...]:
    """Batch sizes of the model call: half and once the `typical` number of unique requests per
    step, that doubled `doublings` times, and the worst case `max_requests`. Each size compiles
    its own copy of the model step, so there are few; a step uses the smallest that holds its
    requests."""
    sizes = {max(1, typical // 2)} | {typical * 2**i for i in range(doublings + 1)}
    return tuple(sorted({min(size, max_requests) for size in sizes} | {max_requests}))


@jax.named_scope("context store")
def extend_group(
    stores: ContextStore,
    model: PagedModel,
    prefixes: PyTree,
    parent: Int[Array, "K R"],
    token: Int[Array, "K R"],
    valid: Bool[Array, "K R"],
    keep: Int[Array, "K J"],
    summarize: Callable[[Float[Array, "U V"]], PyTree],
    buckets: Sequence[int],
    optional: tuple[Int[Array, "K E"], Int[Array, "K E"], Bool[Array, "K E"]] | None = None,
    grow: int = 0,
    link: Int[Array, "K E"] | None = None,
    chunk: int = 0,
) -> tuple[ContextStore, Int[Array, "K R"]] | tuple[ContextStore, Int[Array, "K R"], Int[Array, "K E"]]:
    """`extend_contexts` for K experts of one model (stores and prefixes stacked on axis 0).

    Requests are deduplicated per expert; the bucket is the smallest size holding every expert's
    unique count, chosen outside the vmap over experts (so only that size runs; `in_place_cond`),
    and a step without requests calls nothing. Returns the new context of every request.

    `optional` (parent, token, valid) lists requests in priority order that ride along when a
    call is made anyway: they fill the rows the bucket pads (free: padding is computed too), and
    may take up to `grow` more rows (the bucket is then the smallest holding them, never the
    last, worst-case size).
    Duplicates of a request or of an earlier optional row share its context. Where `link[k, i]
    >= 0`, optional row i continues the context that the earlier optional row link[k, i] creates
    in the same call (tree attention; parent[k, i] is ignored, and the row is dropped where that
    one is not created). With `optional`, also returns each optional row's context (NO_CONTEXT
    where it did not fit). With `chunk` (static, > 0) there is one size, the last bucket, and the
    model reads its rows `chunk` at a time (`extend_contexts`): one forward in the program, and
    its half for a last chunk that fits in it.
    """
    if chunk:
        buckets = tuple(buckets)[-1:]
    reqs = map_axis(dedupe)(parent, token, valid)
    k, r = parent.shape
    has_optional = optional is not None
    if optional is None:
        optional = (jnp.zeros((k, 0), jnp.int32), jnp.zeros((k, 0), jnp.int32), jnp.zeros((k, 0), bool))
    opt_parent, opt_token, opt_valid = optional
    e = opt_parent.shape[1]
    position = jnp.arange(e, dtype=jnp.int32)[None]
    linked = jnp.zeros((k, e), bool) if link is None else link >= 0
    safe_link = jnp.clip(jnp.zeros((k, e), jnp.int32) if link is None else link, 0, max(e - 1, 0))
    # A linked row needs a valid, earlier, unlinked parent row.
    at_link = lambda x: jnp.take_along_axis(x, safe_link, axis=1)
    opt_valid = opt_valid & (~linked | ((safe_link < position) & at_link(opt_valid) & ~at_link(linked)))
    # Each optional row's source: a unique request (index < r), the first equal optional row, or
    # itself (fresh: ranked in priority order after the requests). A linked row's key is its
    # parent row's source (negative: no context id), so children of equal rows are equal.
    same_req = (opt_parent[:, :, None] == reqs.parent[:, None, :]) & (opt_token[:, :, None] == reqs.token[:, None, :])
    same_req = same_req & reqs.valid[:, None, :] & opt_valid[:, :, None] & ~linked[:, :, None]
    plain_same = _same_earlier(opt_parent, opt_token, opt_valid & ~linked)
    plain_source = jnp.where(jnp.any(same_req, axis=-1), _first(same_req),
                             r + jnp.where(jnp.any(plain_same, axis=-1), _first(plain_same), position))
    key = jnp.where(linked, -2 - at_link(plain_source), opt_parent)
    same_opt = _same_earlier(key, opt_token, opt_valid)
    fresh = opt_valid & ~jnp.any(same_req, axis=-1) & ~jnp.any(same_opt, axis=-1)
    own_row = reqs.count[:, None] + jnp.cumsum(fresh, axis=1) - 1
    row = jnp.where(jnp.any(same_req, axis=-1), _first(same_req),
                    jnp.where(jnp.any(same_opt, axis=-1), jnp.take_along_axis(own_row, _first(same_opt), axis=1), own_row))
    row = jnp.where(opt_valid, row, _NO_ROW)
    parent_row = jnp.where(linked & opt_valid, at_link(row), -1)

    # The longest path a row of the call continues, +1 for rows continuing a row of the call:
    # found outside the vmap over experts, so the model cuts its paths to one width for all.
    depth_of = lambda parents, ok: jnp.where(ok, map_axis(context_depth)(stores, parents), 0)
    span = jnp.maximum(jnp.max(depth_of(parent, valid), initial=0), jnp.max(depth_of(opt_parent, opt_valid), initial=0))
    span = shared_max(span + (0 if link is None else 1))

    sizes = jnp.asarray(buckets)
    bucket = lambda n: jnp.minimum(jnp.searchsorted(sizes, n, side="left"), len(buckets) - 1)
    # Optional rows never take the last size (the worst case, far larger than the others).
    required = bucket(jnp.max(reqs.count))
    wished = bucket(jnp.max(reqs.count + jnp.minimum(jnp.sum(fresh, axis=1), grow)))
    grown = jnp.minimum(wished, jnp.maximum(required, len(buckets) - 2))
    branch = shared_max(jnp.where(jnp.max(reqs.count) == 0, 0, 1 + grown))  # one size for all problems

    # Rows the call uses (the same for all experts and problems: the chunk loop is not batched).
    rows_used = shared_max(jnp.max(reqs.count + jnp.sum(fresh, axis=1))) if chunk else None

    def make_branch(size: int):
        def run(carry: tuple[ContextStore, Array]) -> tuple[ContextStore, Int[Array, "K RE"]]:
            def one(store, prefix, req: Requests, keep_k, fresh_k, own_k, o_parent, o_token, p_row):
                at = jnp.where(fresh_k & (own_k < size), own_k, size)  # a child's parent is earlier: it fits
                fill = lambda base, opt: base[:size].at[at].set(opt, mode="drop")
                rows_link = None if link is None else fill(jnp.full((r,), -1, jnp.int32), p_row)
                store, created = extend_contexts(
                    store, model, prefix, fill(req.parent, o_parent), fill(req.token, o_token),
                    fill(req.valid, jnp.ones_like(fresh_k)), keep_k, summarize, req.valid[:size], rows_link, span,
                    chunk, rows_used,
                )
                return store, jnp.full((r + e,), NO_CONTEXT, jnp.int32).at[:size].set(created)

            return map_axis(one)(carry[0], prefixes, reqs, keep, fresh, own_row, opt_parent, opt_token, parent_row)

        return run

    carry = (stores, jnp.full((k, r + e), NO_CONTEXT, jnp.int32))
    for index, size in enumerate(buckets, start=1):
        carry = in_place_cond(branch == index, make_branch(size), carry)
    stores, created = carry
    at_row = lambda rows: jnp.take_along_axis(created, jnp.clip(rows, 0, r + e - 1), axis=1)
    new_ctx = jnp.where(valid & (reqs.inverse < r), at_row(reqs.inverse), NO_CONTEXT)
    if not has_optional:
        return stores, new_ctx
    return stores, new_ctx, jnp.where(opt_valid, at_row(row), NO_CONTEXT)


#: Row index of an optional row or child that has none.
_NO_ROW = jnp.iinfo(jnp.int32).max


def _first(mask: Bool[Array, "K E N"]) -> Int[Array, "K E"]:
    """The index of the first True along the last axis (0 where none, or where N = 0)."""
    return jnp.argmax(mask, axis=-1) if mask.shape[-1] else jnp.zeros(mask.shape[:-1], jnp.int32)


def _same_earlier(key1: Int[Array, "K E"], key2: Int[Array, "K E"], valid: Bool[Array, "K E"]) -> Bool[Array, "K E E"]:
    """same[k, i, j]: valid rows j < i with the keys of row i."""
    e = key1.shape[1]
    earlier = jnp.arange(e)[None, :] < jnp.arange(e)[:, None]
    same = (key1[:, :, None] == key1[:, None, :]) & (key2[:, :, None] == key2[:, None, :])
    return same & earlier[None] & valid[:, None, :] & valid[:, :, None]


def context_stats(stores: ContextStore) -> dict[str, int]:
    """Host-side counters of a (stack of) store(s): every expert of a group shares each call.
    Peaks and capacities are per store (the largest over the stack): memory is fixed by the
    capacities, and the peaks show how much of them a run used."""
    calls = np.asarray(stores.calls).reshape(-1)
    return {
        "model_calls": int(calls.max()) if calls.size else 0,
        "rows_computed": int(np.asarray(stores.rows).sum()),
        "rows_needed": int(np.asarray(stores.requests).sum()),
        "peak_live_entries": int(np.asarray(stores.peak_entries).max()),
        "peak_live_contexts": int(np.asarray(stores.peak_contexts).max()),
        "entry_capacity": int(stores.path.shape[-2]),
        "context_capacity": int(stores.context_entry.shape[-1]),
    }


class ContextStoreOverflowError(RuntimeError):
    """A context store ran out of room: a run needs larger capacities (no result is wrong; the
    sampler in `smc_jax.sampler` catches this type and reruns with grown capacities)."""


def store_failure(stores: ContextStore) -> ContextStoreOverflowError | None:
    """Host-side: the error to raise when a (stack of) store(s) ran out of room, else None."""
    if bool(np.any(np.asarray(stores.overflow))):
        return ContextStoreOverflowError(
            "the context store overflowed: a continuation needed more than max_tokens tokens, or more "
            "contexts or pool entries were alive than its capacity; raise max_length or the store's "
            "capacities (smc_jax.sampler grows them automatically)"
        )
    return None
