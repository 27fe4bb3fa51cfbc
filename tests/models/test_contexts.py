"""The context store: deduplication, paging, bucketed calls, garbage collection, overflow."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from smc_jax.models.contexts import (
    Recycled,
    NO_CONTEXT,
    ContextStoreOverflowError,
    PROMPT_CONTEXT,
    bucket_sizes,
    context_tokens_path,
    dedupe,
    extend_group,
    init_store,
    store_failure,
)
from smc_jax.experts.toy import NGramTokenLM
from smc_jax.utils.compilation import count_compilations


FORWARDS_TRACED: list = []  # the row shapes of every traced SpanChecked.step


@struct.dataclass
class SpanChecked:
    """A toy LM whose logits are NaN in a call whose `span` is below a row's depth: extend_group
    must bound every path it sends (the transformer reads only the first `span` slots)."""

    lm: NGramTokenLM

    @property
    def vocab_size(self) -> int:
        return self.lm.vocab_size

    def init_pool(self, capacity: int):
        return self.lm.init_pool(capacity)

    def step(self, prefix, pool, paths, depth, tokens, write_at, tree=False, span=None):
        FORWARDS_TRACED.append(tokens.shape)
        assert span is not None and span.shape == (), "extend_group passes one span for all experts"
        logits, pool = self.lm.step(prefix, pool, paths, depth, tokens, write_at, tree)
        return jnp.where(span >= jnp.max(depth), logits, jnp.nan), pool


def test_dedupe_groups_identical_requests():
    parent = jnp.array([3, 1, 3, 1, 0, 3])
    token = jnp.array([5, 5, 5, 2, 5, 4])
    valid = jnp.array([True, True, True, True, False, True])
    req = dedupe(parent, token, valid)
    assert int(req.count) == 4
    pairs = {(int(p), int(t)) for p, t, v in zip(req.parent, req.token, req.valid) if v}
    assert pairs == {(3, 5), (1, 5), (1, 2), (3, 4)}
    for i in range(6):
        if valid[i]:
            j = int(req.inverse[i])
            assert (int(req.parent[j]), int(req.token[j])) == (int(parent[i]), int(token[i]))
        else:
            assert int(req.inverse[i]) == 6


def test_bucket_sizes():
    assert bucket_sizes(300, typical=10) == (5, 10, 20, 300)
    assert bucket_sizes(10, typical=10) == (5, 10)
    assert bucket_sizes(3, typical=8) == (3,)
    assert bucket_sizes(1, typical=1) == (1,)


def run_random_walk(order: int, steps: int, seed: int, chunk: int = 0):
    """K = 2 prompts, R = 6 walkers extending random tokens, with forks and deaths; every
    walker's summary must equal the directly computed logits of its explicit token list
    (`chunk`: rows per forward, `extend_group`)."""
    v, k, r, s = 5, 2, 6, steps + 1
    lm = NGramTokenLM.random(jax.random.key(seed), vocab_size=v, order=order)
    prompts = [[1, 2, 3], [4]]
    prefixes, logits0 = zip(*[lm.prefill(p) for p in prompts])
    prefixes = jnp.stack(prefixes)
    summarize = lambda logits: logits
    stores = jax.vmap(lambda l: init_store(lm, l, num_entries=r * s, num_contexts=2 * r, max_tokens=s))(jnp.stack(logits0))
    ctx = jnp.full((k, r), PROMPT_CONTEXT, jnp.int32)
    tokens_of = [[[] for _ in range(r)] for _ in range(k)]
    rng = np.random.default_rng(seed)
    step = jax.jit(lambda st, c, t, a: extend_group(st, SpanChecked(lm), prefixes, c, t, a, c, summarize,
                                                    bucket_sizes(r, typical=r), chunk=chunk))
    calls = rows = 0
    with count_compilations() as compiles:
        for _ in range(steps):
            tok = rng.integers(0, v, size=(k, r))
            tok[:, 1] = tok[:, 0]  # walkers 0 and 1 are identical: one row
            active = rng.random((k, r)) < 0.8
            unique = max(len({(int(ctx[e, w]), int(tok[e, w])) for w in range(r) if active[e, w]}) for e in range(k))
            if chunk:  # the chunks the call runs (the same for both experts), the last at half size if it fits
                full, tail = divmod(unique, chunk)
                rows += full * chunk + (0 if not tail else chunk // 2 if 0 < tail <= chunk // 2 else chunk)
            new_stores, new = step(stores, ctx, jnp.asarray(tok, jnp.int32), jnp.asarray(active))
            calls += 1
            new = np.asarray(new)
            assert np.all((new >= 0) == active)
            for e in range(k):
                for w in range(r):
                    if active[e, w]:
                        tokens_of[e][w] = tokens_of[e][w] + [int(tok[e, w])]
            ctx = jnp.where(jnp.asarray(active), jnp.asarray(new), ctx)
            # resampling-like fork: walker 5 copies walker 2
            ctx = ctx.at[:, 5].set(ctx[:, 2])
            for e in range(k):
                tokens_of[e][5] = list(tokens_of[e][2])
            stores = new_stores
            assert not bool(jnp.any(stores.overflow))
            for e in range(k):
                store_e = jax.tree.map(lambda x: x[e], stores)
                for w in range(r):
                    got = np.asarray(store_e.summary[int(ctx[e, w])])
                    want = lm.logits_of(prompts[e], tokens_of[e][w])
                    np.testing.assert_allclose(got, want, rtol=1e-6)
                    _, depth = context_tokens_path(store_e, ctx[e, w][None])
                    assert int(depth[0]) == len(tokens_of[e][w])
    if chunk:  # the rows counted are those computed: the chunks run, not the bucket
        np.testing.assert_array_equal(np.asarray(stores.rows), [rows] * k)
    return compiles.count


@pytest.mark.parametrize("order", [1, 2, 3])
def test_paged_contexts_match_direct_computation(order):
    run_random_walk(order, steps=7, seed=order)


@pytest.mark.parametrize("chunk", [1, 4])
def test_rows_read_a_chunk_at_a_time_match_and_trace_one_forward(chunk):
    """Rows `chunk` at a time (one, or two chunks for the six walkers), a last chunk that fits in
    half a chunk read at half size: the same contexts and summaries, the rows counted are those
    computed, and the program holds one forward (and its half) instead of one per bucket."""
    FORWARDS_TRACED.clear()
    run_random_walk(2, steps=7, seed=5, chunk=chunk)
    assert sorted(FORWARDS_TRACED) == ([(chunk // 2,)] if chunk > 1 else []) + [(chunk,)]
    FORWARDS_TRACED.clear()
    run_random_walk(2, steps=2, seed=5)
    assert len(FORWARDS_TRACED) == len(bucket_sizes(6, typical=6)) > 1


def test_no_call_when_nothing_is_requested_and_no_recompilation():
    v, r, s = 4, 4, 4
    lm = NGramTokenLM.random(jax.random.key(0), vocab_size=v, order=2)
    prefix, logits0 = lm.prefill([1])
    stores = jax.vmap(lambda l: init_store(lm, l, r * s, 2 * r, s))(logits0[None])
    ctx = jnp.zeros((1, r), jnp.int32)
    step = jax.jit(lambda st, c, t, a: extend_group(st, lm, prefix[None], c, t, a, c, lambda x: x, bucket_sizes(r, typical=r)))
    same, new = step(stores, ctx, jnp.zeros((1, r), jnp.int32), jnp.zeros((1, r), bool))
    assert np.all(np.asarray(new) == NO_CONTEXT)
    np.testing.assert_array_equal(np.asarray(same.context_entry), np.asarray(stores.context_entry))
    inputs = [(jnp.ones((1, r), jnp.int32), jnp.arange(r)[None] < n) for n in range(r + 1)]
    with count_compilations() as counter:
        for tokens, active in inputs:  # every bucket, and no call at all
            step(stores, ctx, tokens, active)
    assert counter.count == 0


def live_counts(store, ctx: np.ndarray) -> tuple[int, int]:
    """Brute force: (entries on the paths of the contexts in use, contexts in use), the prompt's
    context included, for one store and the context ids its walkers hold."""
    contexts = {PROMPT_CONTEXT} | {int(c) for c in ctx if c >= 0}
    entries = set()
    for c in contexts:
        path, depth = context_tokens_path(store, jnp.asarray([c], jnp.int32))
        entries |= {int(e) for e in np.asarray(path[0, : int(depth[0])])}
    return len(entries), len(contexts)


def test_freed_entries_are_reused_and_peaks_are_exact():
    """Memory is bounded by what is alive, not by what was ever computed: walkers resampled
    every step write about twice as many tokens as the pool holds, without overflow, and the store's peak counters equal a brute-force count of the entries and contexts
    in use right after each call."""
    v, r, steps = 4, 4, 24
    capacity = 32  # entries: 57 tokens are written (identical copies share one), at most 22 alive at once
    lm = NGramTokenLM.random(jax.random.key(3), vocab_size=v, order=2)
    prefix, logits0 = lm.prefill([2])
    stores = jax.vmap(lambda l: init_store(lm, l, num_entries=capacity, num_contexts=3 * r, max_tokens=steps + 1))(
        logits0[None])
    ctx = np.full((r,), PROMPT_CONTEXT, np.int32)
    step = jax.jit(lambda st, c, t, a: extend_group(st, lm, prefix[None], c, t, a, c, lambda x: x, bucket_sizes(r, r)))
    rng = np.random.default_rng(0)
    want_entries = want_contexts = 0
    for _ in range(steps):
        tok = rng.integers(0, v, size=r)
        active = rng.random(r) < 0.8
        store = jax.tree.map(lambda x: x[0], stores)
        entries, contexts = live_counts(store, ctx)
        new_rows = len({(int(c), int(t)) for c, t, a in zip(ctx, tok, active) if a})
        want_entries, want_contexts = max(want_entries, entries + new_rows), max(want_contexts, contexts + new_rows)
        stores, new = step(stores, jnp.asarray(ctx)[None], jnp.asarray(tok, jnp.int32)[None], jnp.asarray(active)[None])
        ctx = np.where(active, np.asarray(new[0]), ctx)
        ctx = ctx[rng.integers(0, r, size=r)]  # resampling: lineages coalesce, dead paths are freed
    assert not bool(stores.overflow[0])
    written = int(stores.requests[0])
    assert written > 1.5 * capacity
    assert int(stores.peak_entries[0]) == want_entries <= capacity
    assert int(stores.peak_contexts[0]) == want_contexts <= 3 * r


def test_capacity_overflow_is_flagged():
    v, r = 3, 2
    lm = NGramTokenLM.random(jax.random.key(1), vocab_size=v, order=2)
    prefix, logits0 = lm.prefill([0])
    stores = jax.vmap(lambda l: init_store(lm, l, num_entries=8, num_contexts=4, max_tokens=2))(logits0[None])
    ctx = jnp.zeros((1, r), jnp.int32)
    step = jax.jit(lambda st, c, t: extend_group(st, lm, prefix[None], c, t, jnp.ones((1, r), bool), c, lambda x: x, (r,)))
    for _ in range(3):
        stores, new = step(stores, ctx, jnp.array([[0, 1]], jnp.int32))
        ctx = jnp.where(new >= 0, new, ctx)
    assert bool(stores.overflow[0])  # the third token does not fit in max_tokens=2
    # Reported as its own type, so the sampler's retry catches it without reading the message.
    assert isinstance(store_failure(stores), ContextStoreOverflowError)


def copied_shapes_outside_entry(hlo: str) -> list[str]:
    """Result shapes of the `copy` instructions of an optimized HLO module, ENTRY left out."""
    shapes, in_entry = [], False
    for line in hlo.splitlines():
        if line and not line.startswith(" ") and line.rstrip().endswith("{"):
            in_entry = line.startswith("ENTRY")
        elif not in_entry and " copy(" in line:
            shapes.append(line.split("=", 1)[1].split("{", 1)[0].strip())
    return shapes


def test_a_step_loop_updates_the_store_in_place():
    # Under lax.cond/switch XLA gives every branch fresh result buffers: each step would copy
    # every context's summary and the pool even when it calls nothing. The store must not be
    # copied inside the loop, whichever bucket (or none) a step takes.
    v, r, s, contexts = 37, 4, 6, 53
    lm = NGramTokenLM.random(jax.random.key(0), vocab_size=v, order=2)
    prefix, logits0 = lm.prefill([1])
    stores = jax.vmap(lambda l: init_store(lm, l, r * s, contexts, s))(logits0[None])

    def steps(stores):
        def body(i, carry):
            stores, ctx = carry
            active = jnp.arange(r)[None] < i % (r + 1)  # no call, then every bucket
            stores, new = extend_group(stores, lm, prefix[None], ctx, jnp.full((1, r), i % v), active, ctx,
                                       lambda x: x, bucket_sizes(r, typical=2))
            return stores, ctx  # every step extends the prompt: nothing outgrows max_tokens

        return jax.lax.fori_loop(0, 2 * (r + 1), body, (stores, jnp.zeros((1, r), jnp.int32)))

    hlo = jax.jit(steps).lower(stores).compile().as_text()
    table = f"f32[1,{contexts},{v}]"
    assert table in hlo
    assert table not in copied_shapes_outside_entry(hlo)
    final, _ = jax.jit(steps)(stores)
    assert not bool(final.overflow[0]) and int(final.calls[0]) > 0


@pytest.mark.parametrize(
    "required, grow, doublings, rows",
    [
        (3, 0, 1, 4),  # optional rows only fill the padding of the bucket of 4
        (3, 30, 1, 8),  # and may take a larger size (8), never the worst case (40): 33 wished
        (7, 30, 1, 8),  # a call already in the next-to-last size stays there
        (1, 1, 1, 2),  # grow caps the extra rows: 1 + 1 fits the bucket of 2
        (3, 10, 2, 16),  # 13 wished: two sizes up (4 -> 16)
        (3, 30, 2, 16),  # 33 wished: 16, never 40
    ],
)
def test_optional_rows_fill_padding_and_never_take_the_worst_case(required, grow, doublings, rows):
    v, r, e, s = 64, 40, 30, 3
    lm = NGramTokenLM.random(jax.random.key(0), vocab_size=v, order=2)
    prefix, logits0 = lm.prefill([1])
    stores = jax.vmap(lambda l: init_store(lm, l, (r + e) * s, 2 * (r + e), s))(logits0[None])
    parent = jnp.full((1, r), PROMPT_CONTEXT, jnp.int32)
    token = jnp.arange(r, dtype=jnp.int32)[None] % v
    valid = jnp.arange(r)[None] < required  # distinct tokens 0..required-1
    # Optional rows: distinct (parent, token) pairs, fresh (not among the requests).
    o_parent = jnp.full((1, e), PROMPT_CONTEXT, jnp.int32)
    o_token = required + jnp.arange(e, dtype=jnp.int32)[None]
    o_valid = jnp.ones((1, e), bool)
    stores, new, opt = extend_group(stores, lm, prefix[None], parent, token, valid, parent, lambda x: x,
                                    bucket_sizes(r, typical=4, doublings=doublings), optional=(o_parent, o_token, o_valid), grow=grow)
    assert bucket_sizes(r, typical=4, doublings=doublings) == ((2, 4, 8, 40) if doublings == 1 else (2, 4, 8, 16, 40))
    assert int(stores.rows[0]) == rows
    assert np.all(np.asarray(new)[0, :required] != NO_CONTEXT)
    assert int(np.sum(np.asarray(opt) != NO_CONTEXT)) == rows - required


def test_linked_optional_rows_continue_rows_of_the_same_call():
    """Tree attention: each created context of a linked optional row equals the directly
    computed distribution after prompt + its parent row's tokens + its token; a child of a row
    that copies a request continues that request's row; children of equal rows are one row; a
    child of an invalid or later row is dropped; rows are counted once."""
    v, r, s = 9, 16, 4
    lm = NGramTokenLM.random(jax.random.key(3), vocab_size=v, order=3)  # logits see 2 tokens back
    prompt = [1, 2]
    prefix, logits0 = lm.prefill(prompt)
    stores = jax.vmap(lambda l: init_store(lm, l, 32, 32, s))(logits0[None])
    # A stored context [4] to continue.
    stores, first = extend_group(stores, lm, prefix[None], jnp.full((1, 1), PROMPT_CONTEXT), jnp.full((1, 1), 4),
                                 jnp.ones((1, 1), bool), jnp.full((1, 1), NO_CONTEXT), lambda x: x, (1,))
    c4 = int(first[0, 0])
    parent = jnp.asarray([[c4, c4] + [PROMPT_CONTEXT] * (r - 2)], jnp.int32)
    token = jnp.asarray([[5, 6, 7] + [0] * (r - 3)], jnp.int32)
    valid = jnp.arange(r)[None] < 3
    keep = jnp.asarray([[c4]], jnp.int32)
    # (parent, token, link): 0: [4]+8 (fresh); 1: [4]+5 (= request 0); 2: child of 0 (+1);
    # 3: [4]+8 again (= row 0); 4: child of 1 (+2, continues request 0); 5: child of 3 (= row 2);
    # 6: child of 0 (+3); 7: child of 8 (later: dropped); 8: [8] invalid; 9: child of 8 (invalid).
    rows = [(c4, 8, -1), (c4, 5, -1), (0, 1, 0), (c4, 8, -1), (0, 2, 1), (0, 1, 3), (0, 3, 0), (0, 1, 8),
            (PROMPT_CONTEXT, 8, -1), (0, 1, 8)]
    o_parent, o_token, link = (jnp.asarray([[row[i] for row in rows]], jnp.int32) for i in range(3))
    o_valid = jnp.asarray([[i != 8 for i in range(len(rows))]])
    step = jax.jit(lambda st, buckets, grow: extend_group(st, SpanChecked(lm), prefix[None], parent, token, valid, keep, lambda x: x,
                                                          buckets, optional=(o_parent, o_token, o_valid), grow=grow, link=link),
                   static_argnums=(1, 2))
    out, new, opt = step(stores, (4, 8, 16), 8)
    ids = np.asarray(opt)[0].tolist()
    assert ids[1] == int(new[0, 0]) and ids[3] == ids[0] and ids[5] == ids[2]
    assert ids[7] == ids[8] == ids[9] == NO_CONTEXT
    want = {0: [4, 8], 2: [4, 8, 1], 4: [4, 5, 2], 6: [4, 8, 3]}
    for index, seq in want.items():
        assert ids[index] != NO_CONTEXT, index
        np.testing.assert_allclose(np.asarray(out.summary[0, ids[index]]), lm.logits_of(prompt, seq), rtol=1e-6)
    for i, seq in enumerate([[4, 5], [4, 6], [7]]):
        np.testing.assert_allclose(np.asarray(out.summary[0, int(new[0, i])]), lm.logits_of(prompt, seq), rtol=1e-6)
    # 3 requests + 4 fresh optional rows = 7, in the bucket of 8; 3 of them needed.
    assert int(out.rows[0]) - int(stores.rows[0]) == 8 and int(out.requests[0]) - int(stores.requests[0]) == 3
    # In the bucket of 4 (no growth), only row 0 fits: its children are not created.
    out, new, opt = step(stores, (4, 8, 16), 0)
    ids = np.asarray(opt)[0].tolist()
    assert ids[0] != NO_CONTEXT and ids[2] == ids[4] == ids[6] == NO_CONTEXT


def test_a_store_built_on_a_spent_stores_buffers_gives_the_same_results():
    """`init_store(..., recycle=)` keeps a spent store's pool and summaries (dead contexts'
    keys and logits in them) instead of zeros: the same walk then creates the same contexts
    with the same logits; buffers of other sizes are refused."""
    v, r, s, steps = 5, 4, 6, 5
    lm = NGramTokenLM.random(jax.random.key(4), vocab_size=v, order=3)
    prefix, logits0 = lm.prefill([1, 2])
    make = lambda recycle=None: jax.vmap(lambda l, rc: init_store(lm, l, 3 * r * s, 3 * r, s, rc))(logits0[None], recycle)
    step = jax.jit(lambda st, c, t, a: extend_group(st, lm, prefix[None], c, t, a, c, lambda x: x, bucket_sizes(r, r)))

    def walk(stores, seed):
        rng, ctx, made = np.random.default_rng(seed), jnp.full((1, r), PROMPT_CONTEXT, jnp.int32), []
        for _ in range(steps):
            tok, active = rng.integers(0, v, size=(1, r)), rng.random((1, r)) < 0.9
            stores, new = step(stores, ctx, jnp.asarray(tok, jnp.int32), jnp.asarray(active))
            ctx = jnp.where(new >= 0, new, ctx)
            made.append((np.asarray(new), np.asarray(stores.summary[0][jnp.maximum(ctx[0], 0)])))
        return stores, made

    spent, _ = walk(make(), seed=1)
    assert np.any(np.asarray(spent.summary) != 0)
    _, want = walk(make(), seed=2)
    _, got = walk(make(Recycled(spent.pool, spent.summary)), seed=2)
    for (new_a, logits_a), (new_b, logits_b) in zip(got, want):
        np.testing.assert_array_equal(new_a, new_b)
        np.testing.assert_array_equal(logits_a, logits_b)
    with pytest.raises(ValueError, match="sizes"):
        jax.vmap(lambda l, rc: init_store(lm, l, 3 * r * s, 2 * r, s, rc))(logits0[None], Recycled(spent.pool, spent.summary))
