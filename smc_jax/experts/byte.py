"""Byte-level experts: one token LM under K prompts, seen as K distributions over bytes.

The alphabet is the 256 byte values and EOS is symbol 256 (`EOS_BYTE`), so experts with
different tokenizers share it and can be ensembled exactly. Each particle keeps, per expert, a
beam over tokenizations (`beam.py`). A step reads the sampled byte in every beam, then
materializes the extensions the new next-byte distributions need (and, in the same call, those
the next byte's shift could keep); a shift whose extensions were not fetched that way fetches
them first (and, in the same call, those the new distributions may need). Each is one model call
for the token contexts requested, deduplicated across particles and slots and batched over the
K prompts (`models.contexts`), and none is made when no beam of any particle requests anything.
A byte step thus makes at most one call per model, except when a context created by the shift
needs an extension at once (its parent did not exist before the call). With prefetching
(`ByteExperts.prefetch_depth`, off by default), a call also creates contexts the next bytes may
need (`prefetch_candidates`), and a step finds those in a cache instead of calling.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping, Sequence
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, Bool, Float, Int

from smc_jax.bytes.beam import (
    EOS_BYTE,
    BeamConfig,
    BeamState,
    ByteSummary,
    extension_requests,
    extensions,
    initial_beam,
    lookahead_requests,
    next_byte_logprobs,
    plan_shift,
    prefetch_candidates,
    PrefetchSources,
    prefetch_sources,
    shift,
    shift_requests,
    summarize_logits,
)
from smc_jax.bytes.healing import HealPlan, healed_beam, healed_eos, plan_heal, token_logprob, zero_byte_logprob
from smc_jax.bytes.trie import ROOT, TokenTrie
from smc_jax.bytes.vocab import NUM_BYTES, token_byte_strings
from smc_jax.experts.model_base import ModelExperts
from smc_jax.experts.stored_vocab import stored_vocabulary
from smc_jax.models.contexts import (
    NO_CONTEXT,
    PROMPT_CONTEXT,
    ContextStore,
    Recycled,
    bucket_sizes,
    extend_contexts,
    extend_group,
)
from smc_jax.models.lm import LanguageModel
from smc_jax.utils.buckets import geometric_bucket
from smc_jax.utils.compilation import jit, stored_jit
from smc_jax.utils.control import in_place_cond, in_place_switch, map_axis
from smc_jax.utils.problems import shared_max


class PrefetchCache(NamedTuple):
    """Per expert: the contexts prefetched by the last call (`ByteExperts.prefetch_depth`), each
    keyed by its parent's pool entry and its token (an alive context keeps its parent's entry
    alive, so the key cannot be reused while the context is cached), and counters."""

    context: Int[Array, "K E"]  # NO_CONTEXT where empty
    parent_entry: Int[Array, "K E"]
    token: Int[Array, "K E"]
    hits: Int[Array, "K"]  # extensions found here instead of requested
    created: Int[Array, "K"]  # contexts prefetched


class _Children(NamedTuple):
    """Prefetch children (`ByteExperts._children`), per expert [K, F]."""

    parent: Int[Array, "K F"]  # the source's context where it exists (else its parent's)
    token: Int[Array, "K F"]
    source: Int[Array, "K F"]  # the candidate continued
    exists: Bool[Array, "K F"]  # whether that candidate's context exists before the call
    valid: Bool[Array, "K F"]
    score: Float[Array, "K F"]


class _PrefetchPlan(NamedTuple):
    """The optional rows of a call (`ByteExperts._plan_prefetch`): E candidates, then F children."""

    parent: Int[Array, "K EF"]
    token: Int[Array, "K EF"]
    want: Bool[Array, "K EF"]  # valid and neither cached nor existing
    link: Int[Array, "K EF"]  # the candidate a child of a context created now continues (else -1)
    found: Int[Array, "K EF"]  # the cached or existing context (NO_CONTEXT where none)
    valid: Bool[Array, "K EF"]


class _Healing(NamedTuple):
    """Token healing's progress inside a byte step (`ByteExperts._advance`), [M, K] each."""

    plan: HealPlan
    need: Bool[Array, "M K"]  # beams the byte emptied that heal
    context: Int[Array, "M K"]  # the path's last context created so far
    logp: Float[Array, "M K"]  # log p(the path's tokens so far)
    want: Bool[Array, "M K"]  # beams whose path creates a context in this call


class ByteExpertState(NamedTuple):
    beams: BeamState  # leaves [M, K, ...]
    stores: ContextStore  # stacked over the K experts
    cache: PrefetchCache
    # [M, K]: beams whose next-byte distributions the next advance computes (a deferred start,
    # `ByteExperts.init_deferred`); None: none are.
    stale: Bool[Array, "M K"] | None = None


@struct.dataclass(kw_only=True)
class ByteExperts(ModelExperts):
    """K byte-level experts = one `PagedModel` under K prompts (shared fields: `ModelExperts`).

    `allowed[v]` marks the token ids the byte LM may use: byte tokens and the EOS ids; the model's
    distribution is renormalized over them. `max_tokens` bounds the tokens of a continuation
    (at most the number of bytes sampled, the sampler's max_length).
    """

    trie: TokenTrie
    allowed: Bool[Array, "V"]
    beam: BeamConfig  # its width and healing are static; its prune threshold a run-time value
    num_contexts: int | None = struct.field(pytree_node=False, default=None)  # None: the worst case
    # A shift that calls the model also fetches what the next refresh may need (more rows, fewer
    # sequential calls); False fetches only what each of the two needs (same distributions).
    lookahead: bool = struct.field(pytree_node=False, default=True)
    # Prefetching (0 = off): a call made anyway also creates, in the rows its batch pads plus at
    # most `prefetch_rows` more, the contexts the next `prefetch_depth` bytes may need: the
    # tokens along the likeliest continuations of the `prefetch_sources` heaviest distinct
    # hypotheses per expert (`smc_jax.bytes.beam.prefetch_candidates`, `prefetch_width` nodes per
    # byte), those reached by at least `prefetch_threshold` of a beam's weight, heaviest first, up
    # to `prefetch_slots` per expert. A later step finds them (keyed by parent and token) instead
    # of calling: fewer sequential calls, the same distributions (up to float rounding: a
    # prefetched context is computed in a batch of another size; docs/bytes.md).
    prefetch_depth: int = struct.field(pytree_node=False, default=0)
    prefetch_width: int = struct.field(pytree_node=False, default=3)
    prefetch_sources: int = struct.field(pytree_node=False, default=32)
    prefetch_slots: int = struct.field(pytree_node=False, default=32)
    prefetch_rows: int = struct.field(pytree_node=False, default=0)
    prefetch_threshold: float = struct.field(pytree_node=False, default=0.01)
    # Children: up to `prefetch_children` contexts one token below the best candidates
    # (`_children`), created in the same call (tree attention) when their parent is created too.
    prefetch_children: int = struct.field(pytree_node=False, default=0)
    prefetch_child_depth: int = struct.field(pytree_node=False, default=2)
    # Guiding (0 = off; scoring a known string, without prefetching): `guide` creates up to
    # `guide_slots` contexts along the string's own tokenization in one call, and they stay in
    # the cache, where a step finds them instead of calling.
    guide_slots: int = struct.field(pytree_node=False, default=0)
    # Rows per model forward (0: each call site compiles one forward per batch-size bucket, and a
    # call runs the smallest that holds its rows). With n > 0 a call site holds one forward that
    # reads n rows at a time, as often as the call's rows need, the last at n // 2 if they fit:
    # a smaller program.
    row_chunk: int = struct.field(pytree_node=False, default=0)
    # GenLM's prompt convention: the prefix holds only BOS, and these raw prompt bytes (padded,
    # with their lengths) are read through the beam at init, summing over their tokenizations.
    prompt_bytes: Int[Array, "K P"] | None = None
    prompt_lengths: Int[Array, "K"] | None = None
    # The state of M particles after the prompt, computed once by `with_start_state` (its model
    # calls are the prompt's, like a prefill): runs then start from it without calling the model.
    start: ByteExpertState | None = None

    @property
    def alphabet_size(self) -> int:
        return NUM_BYTES

    @property
    def num_slots(self) -> int:
        return self.beam.width * (1 + self.trie.max_duplicates)

    def _summarize(self, logits: Float[Array, "U V"]) -> ByteSummary:
        return summarize_logits(logits, self.trie, self.allowed, self.eos_ids, self.temperature)

    @property
    def cache_slots(self) -> int:
        """E, the cache's size per expert (0 with prefetching and guiding off)."""
        if self.guide_slots and self.prefetch_depth:
            raise ValueError("guiding (guide_slots) and prefetching (prefetch_depth) share the cache; use one")
        return self.guide_slots or (self.prefetch_slots + self.prefetch_children if self.prefetch_depth else 0)

    def capacity(self, num_particles: int) -> tuple[int, int]:
        """(pool entries, contexts). The worst case: contexts alive at once are the prompt's,
        every slot's, every materialized extension's and those being created; each path holds
        at most max_tokens entries. Real beams share almost all of their paths, so callers
        usually pass much smaller capacities and grow them on overflow (see `smc_jax.sampler`)."""
        m, c, d = num_particles, self.num_slots, self.trie.max_duplicates
        worst_contexts = 1 + m * c + 2 * m * c * d + self.cache_slots
        num_contexts = self.num_contexts or worst_contexts
        return (self.num_entries or num_contexts * self.max_tokens), num_contexts

    def with_start_state(self, num_particles: int) -> ByteExperts:
        """These experts with the start state of `num_particles` particles precomputed (the
        prompt read through the beams, the first extensions and next-byte distributions), its
        call counters reset so that a run's statistics count the run's own calls."""
        start = _initial_state(self.replace(start=None), num_particles)
        zero = jnp.zeros_like(start.stores.calls)
        stores = start.stores.replace(calls=zero, rows=zero, requests=zero)
        cache = start.cache._replace(hits=jnp.zeros_like(start.cache.hits), created=jnp.zeros_like(start.cache.created))
        return self.replace(start=start._replace(stores=stores, cache=cache))

    def _start_for(self, num_particles: int) -> ByteExpertState:
        if self.start.beams.log_mass.shape[0] != num_particles:
            raise ValueError(
                f"the start state is for {self.start.beams.log_mass.shape[0]} particles, not {num_particles}; "
                "call with_start_state(num_particles) again"
            )
        return self.start

    def _empty_cache(self) -> PrefetchCache:
        k, e = self.num_experts, self.cache_slots
        none = jnp.full((k, e), NO_CONTEXT, jnp.int32)
        return PrefetchCache(none, none, none, jnp.zeros((k,), jnp.int32), jnp.zeros((k,), jnp.int32))

    def init(self, num_particles: int, refresh: bool = True, recycle: Recycled | None = None) -> ByteExpertState:
        """The state after the prompt; without `refresh` (static, raw prompt bytes not allowed)
        its next-byte distributions are left for a `_refresh`, so it needs no model call. With
        `recycle`, the stores are built on a spent state's buffers (`ModelExperts.init_stores`)."""
        if not refresh and (self.start is not None or self.prompt_bytes is not None):
            raise ValueError("init(refresh=False) is for a token prompt without a start state")
        if self.start is not None:
            return self._start_for(num_particles)
        m, c, d = num_particles, self.num_slots, self.trie.max_duplicates
        stores = self.init_stores(num_particles, recycle)
        k = self.num_experts
        if self.prompt_bytes is None:
            beam = initial_beam(m, c, d, PROMPT_CONTEXT)
            beams = jax.tree.map(lambda x: jnp.broadcast_to(x[:, None], (m, k) + x.shape[1:]), beam)
            state = ByteExpertState(beams, stores, self._empty_cache())
            return self._refresh(state, jnp.ones((m, k), bool)) if refresh else state
        # Read the prompt bytes once (one particle), then give every particle that beam.
        beam = initial_beam(1, c, d, PROMPT_CONTEXT)
        one = self._refresh(
            ByteExpertState(
                jax.tree.map(lambda x: jnp.broadcast_to(x[:, None], (1, k) + x.shape[1:]), beam), stores, self._empty_cache()
            ),
            jnp.ones((1, k), bool),
        )

        def read(state, position):
            byte = self.prompt_bytes[:, position][None]  # [1, K]
            return self._advance(state, byte, (position < self.prompt_lengths)[None]), None

        one, _ = jax.lax.scan(read, one, jnp.arange(self.prompt_bytes.shape[1]))
        beams = jax.tree.map(lambda x: jnp.broadcast_to(x, (m,) + x.shape[1:]), one.beams)
        return ByteExpertState(beams, one.stores, one.cache)

    def init_deferred(self, num_particles: int) -> ByteExpertState:
        """The state after the prompt with its next-byte distributions left to the next
        `advance` (`smc_jax.experts.base.expert_init_deferred`): nothing here holds the model's
        forward, so the sampler compiles no start program (after a token prompt the first
        distributions make no call: the prompt's logits hold them). A start state or raw
        prompt bytes are read as `init` reads them.

        Parameters
        ----------
        num_particles : int
            M.
        """
        if self.start is not None:
            return self._start_for(num_particles)
        if self.prompt_bytes is not None:
            return self.init(num_particles)
        state = self.init(num_particles, refresh=False)
        return state._replace(stale=jnp.ones(state.beams.log_mass.shape, bool))

    def _create(
        self,
        state: ByteExpertState,
        parent: Int[Array, "M K R"],
        token: Int[Array, "M K R"],
        wanted: Bool[Array, "M K R"],
        prefetch: bool | Bool[Array, ""] = False,
        also_keep: Int[Array, "M K X"] | None = None,
    ) -> tuple[ContextStore, PrefetchCache, Int[Array, "M K R"]]:
        """Creates the wanted contexts parent + token with one model call for all particles,
        requests and K experts (none if nothing is wanted); returns them (NO_CONTEXT elsewhere).
        The beams' contexts, the cache's and `also_keep` survive the call. With `prefetch` (a
        bool, or a traced flag) and prefetching on, the call also creates the prefetch
        candidates and they become the cache; without a call the cache stays."""
        beams, stores, cache = state.beams, state.stores, state.cache
        m, k, r = wanted.shape
        flat = lambda x: jnp.moveaxis(x, 1, 0).reshape(k, -1)
        kept = [flat(beams.context), flat(beams.ext_context), cache.context]
        keep = jnp.concatenate(kept + ([] if also_keep is None else [flat(also_keep)]), axis=1)
        args = (stores, self.model, self.prefixes, flat(parent), flat(token), flat(wanted), keep, self._summarize,
                # ~one fresh context per particle and step; prefetch rows may fill up to 4 times that
                bucket_sizes(m * r, typical=m, doublings=2 if self.cache_slots and self.prefetch_rows else 1))
        if prefetch is False or not self.prefetch_depth:
            stores, created = extend_group(*args, chunk=self.row_chunk)
            return stores, cache, jnp.moveaxis(created.reshape(k, m, r), 0, 1)
        called = jnp.any(wanted) & prefetch
        # The searches matter only to a step that calls the model anyway: skipped otherwise (a
        # plain cond: its outputs are small [K, E + F] arrays, so no pool is copied).
        plan = lambda: self._plan_prefetch(stores, cache, beams)
        blank = lambda: jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), jax.eval_shape(plan))
        p = jax.lax.cond(called, plan, blank)
        stores, created, fetched = extend_group(*args, optional=(p.parent, p.token, p.want), grow=self.prefetch_rows,
                                                link=p.link if self.prefetch_children else None, chunk=self.row_chunk)
        context = jnp.where(p.found != NO_CONTEXT, p.found, fetched)
        # A child of a context created now continues it: its parent is that context.
        parent = jnp.where(p.link >= 0, jnp.take_along_axis(context, jnp.maximum(p.link, 0), axis=1), p.parent)
        new = PrefetchCache(
            context=jnp.where(p.valid, context, NO_CONTEXT),
            parent_entry=jax.vmap(ContextStore.entry_of)(stores, parent),
            token=p.token,
            hits=cache.hits,
            created=cache.created + jnp.sum(p.want & (fetched != NO_CONTEXT), axis=1).astype(jnp.int32),
        )
        cache = jax.tree.map(lambda x, y: jnp.where(called, x, y), new, cache)
        return stores, cache, jnp.moveaxis(created.reshape(k, m, r), 0, 1)

    @jax.named_scope("guide")
    def guide(
        self, state: ByteExpertState, tokens: Int[Array, "K G"], spine: Int[Array, "K G"], count: Int[Array, "K"],
        chunk: int,
    ) -> ByteExpertState:
        """Creates, with one call of `chunk` rows at a time, the contexts prompt + tokens[k, :spine[k, g]]
        + tokens[k, g] for g < count[k] (rows 0..s-1 of expert k a chain with spine[k, j] = j,
        the others one token off it), and makes them the cache, keyed by parent and token: the
        beams of a state just after the prompt find them instead of calling the model
        (`_resolve`). The same distributions, up to float rounding (computed `chunk` rows at a time).

        Parameters
        ----------
        state : ByteExpertState
            The state after the prompt (`init` or `init_deferred`).
        tokens, spine : jax.Array, shape [K, G], int32
            Each row's token and the number of chain rows before it.
        count : jax.Array, shape [K], int32
            The rows used per expert (a prefix of each row list).
        chunk : int
            Rows per forward (static).
        """
        if tokens.shape[1] != self.cache_slots or not self.guide_slots:
            raise ValueError(f"guide takes guide_slots = {self.guide_slots} rows per expert, got {tokens.shape[1]}")
        k, g = tokens.shape
        flat = lambda x: jnp.moveaxis(x, 1, 0).reshape(k, -1)
        keep = jnp.concatenate([flat(state.beams.context), flat(state.beams.ext_context)], axis=1)
        valid = jnp.arange(g)[None] < count[:, None]
        root = jnp.full((g,), PROMPT_CONTEXT, jnp.int32)
        # unbatched bounds: one loop of forwards and one path width for all experts and problems
        rows_used, span = shared_max(jnp.max(count)), shared_max(jnp.max(jnp.where(valid, spine, 0)))
        create = lambda store, prefix, token, ok, kept, spine: extend_contexts(
            store, self.model, prefix, root, token, ok, kept, self._summarize, span=span, chunk=chunk,
            rows_used=rows_used, spine=spine)
        stores, context = map_axis(create)(state.stores, self.prefixes, tokens, valid, keep, spine)
        # a row's parent is the chain row before its spine's end (the prompt for spine 0)
        parent = jnp.where(spine > 0, jnp.take_along_axis(context, jnp.maximum(spine - 1, 0), axis=1), PROMPT_CONTEXT)
        cache = PrefetchCache(
            context=context,
            parent_entry=jax.vmap(ContextStore.entry_of)(stores, parent),
            token=tokens,
            hits=state.cache.hits,
            created=state.cache.created + jnp.sum(context != NO_CONTEXT, axis=1).astype(jnp.int32),
        )
        return state._replace(stores=stores, cache=cache)

    @jax.named_scope("prefetch")
    def _plan_prefetch(self, stores: ContextStore, cache: PrefetchCache, beams: BeamState) -> _PrefetchPlan:
        """The optional rows of a call: the `prefetch_slots` best candidates (heaviest first),
        then the children (`_children`), each with its cached or existing context if any."""
        k = stores.context_entry.shape[0]
        flat = lambda x: jnp.moveaxis(x, 1, 0).reshape(k, -1)
        sources = jax.vmap(lambda table, beam: prefetch_sources(self.trie, table, beam), in_axes=(0, 1), out_axes=1)(
            stores.summary, beams)
        # Particles that share a history share hypotheses: look ahead from the U heaviest distinct ones.
        share = jax.vmap(_best_of_each)(flat(sources.context), flat(sources.node), flat(sources.share))
        share, pick = jax.lax.top_k(share, min(self.prefetch_sources, share.shape[1]))
        sources = PrefetchSources(jnp.take_along_axis(flat(sources.context), pick, axis=1),
                                  jnp.take_along_axis(flat(sources.node), pick, axis=1), share)
        cand = jax.vmap(lambda table, src: prefetch_candidates(self.trie, table, src, self.prefetch_depth, self.prefetch_width))(
            stores.summary, sources)  # [K, Q]
        e = self.prefetch_slots
        pad = max(0, e - cand.score.shape[1])  # fewer candidates than cache slots
        cand = jax.tree.map(lambda x, fill: jnp.pad(x, ((0, 0), (0, pad)), constant_values=fill), cand,
                            type(cand)(0, 0, -jnp.inf, 0))
        score, best = jax.lax.top_k(jax.vmap(_best_of_each)(cand.parent, cand.token, cand.score), e)  # [K, E]
        c_parent = jnp.take_along_axis(cand.parent, best, axis=1)
        c_token = jnp.take_along_axis(cand.token, best, axis=1)
        c_valid = score > math.log(self.prefetch_threshold)
        found = self._lookup(stores, cache, c_parent, c_token, c_valid)
        missing = c_valid & (found == NO_CONTEXT)
        kids = self._children(stores, c_parent, c_token, score, c_valid, found)
        # Children of existing contexts are plain optional rows; those of contexts created now
        # continue their rows in the same call (tree attention). They come after the candidates:
        # their scores are guesses, and ranked among the candidates they displaced better ones
        # (measured: more calls).
        k_found = self._lookup(stores, cache, kids.parent, kids.token, kids.valid & kids.exists)
        k_want = kids.valid & jnp.where(kids.exists, k_found == NO_CONTEXT, jnp.take_along_axis(missing, kids.source, axis=1))
        return _PrefetchPlan(
            parent=jnp.concatenate([c_parent, kids.parent], 1),
            token=jnp.concatenate([c_token, kids.token], 1),
            want=jnp.concatenate([missing, k_want], 1),
            link=jnp.concatenate([jnp.full_like(c_token, -1), jnp.where(kids.exists, -1, kids.source)], 1),
            found=jnp.concatenate([found, k_found], 1),
            valid=jnp.concatenate([c_valid, kids.valid], 1),
        )

    def _children(
        self, stores: ContextStore, parent: Int[Array, "K E"], token: Int[Array, "K E"], score: Float[Array, "K E"],
        valid: Bool[Array, "K E"], found: Int[Array, "K E"],
    ) -> "_Children":
        """The `prefetch_children` likeliest tokens after the best candidates c + t: a search
        `prefetch_child_depth` bytes down the trie from the root of c + t, with c + t's own
        distribution where it exists, else with c's (a guess: c + t's is not computed yet)."""
        if not self.prefetch_children:
            none = jnp.zeros((parent.shape[0], 0), jnp.int32)
            return _Children(none, none, none, none.astype(bool), none.astype(bool), none.astype(jnp.float32))
        n = min(self.prefetch_children, parent.shape[1])
        exists = found[:, :n] != NO_CONTEXT
        table_of = jnp.where(exists, found[:, :n], parent[:, :n])
        sources = PrefetchSources(table_of, jnp.full(table_of.shape, ROOT, jnp.int32), jnp.where(valid[:, :n], score[:, :n], -jnp.inf))
        cand = jax.vmap(lambda table, src: prefetch_candidates(self.trie, table, src, self.prefetch_child_depth, self.prefetch_width))(
            stores.summary, sources)
        best_score, best = jax.lax.top_k(jax.vmap(_best_of_each)(cand.source, cand.token, cand.score), self.prefetch_children)
        source = jnp.take_along_axis(cand.source, best, axis=1)
        return _Children(
            parent=jnp.take_along_axis(table_of, source, axis=1),
            token=jnp.take_along_axis(cand.token, best, axis=1),
            source=source,
            exists=jnp.take_along_axis(exists, source, axis=1),
            valid=best_score > math.log(self.prefetch_threshold),
            score=best_score,
        )

    def _lookup(
        self, stores: ContextStore, cache: PrefetchCache, parent: Int[Array, "K R"], token: Int[Array, "K R"], mask: Bool[Array, "K R"]
    ) -> Int[Array, "K R"]:
        """The cached context parent + token of each masked request (NO_CONTEXT where none)."""

        def one(entry, c_context, c_parent, c_token, p, t, w):
            match = (c_context != NO_CONTEXT)[None] & (c_parent[None] == entry[:, None]) & (c_token[None] == t[:, None])
            match = match & (w & (p != NO_CONTEXT))[:, None]
            return jnp.where(jnp.any(match, axis=1), c_context[jnp.argmax(match, axis=1)], NO_CONTEXT)

        entry = jax.vmap(ContextStore.entry_of)(stores, parent)
        return jax.vmap(one)(entry, cache.context, cache.parent_entry, cache.token, parent, token, mask)

    @jax.named_scope("prefetch")
    def _resolve(self, state: ByteExpertState, active: Bool[Array, "M K"]) -> ByteExpertState:
        """Records in ext_context the extensions of the active beams found in the prefetch cache."""
        if not self.cache_slots:
            return state
        beams, stores, cache = state.beams, state.stores, state.cache
        ext = jax.vmap(lambda table, beam: extensions(self.trie, table, beam), in_axes=(0, 1), out_axes=1)(stores.summary, beams)
        missing = (beams.ext_context == NO_CONTEXT) & jnp.isfinite(ext.weight) & active[:, :, None, None]
        parent = jnp.broadcast_to(beams.context[..., None], ext.token.shape)
        m, k = active.shape
        flat = lambda x: jnp.moveaxis(x, 1, 0).reshape(k, -1)
        found = self._lookup(stores, cache, flat(parent), flat(ext.token), flat(missing))
        hit = found != NO_CONTEXT
        found = jnp.moveaxis(found.reshape((k, m) + ext.token.shape[2:]), 0, 1)
        beams = beams._replace(ext_context=jnp.where(found != NO_CONTEXT, found, beams.ext_context))
        cache = cache._replace(hits=cache.hits + jnp.sum(hit, axis=1).astype(jnp.int32))
        return ByteExpertState(beams, stores, cache)

    @jax.named_scope("byte refresh")
    def _refresh_requests(
        self, state: ByteExpertState, active: Bool[Array, "M K"]
    ) -> tuple[ByteExpertState, tuple[Int[Array, "M K C D"], Int[Array, "M K C D"], Bool[Array, "M K C D"]]]:
        """The extensions the active beams' next-byte distributions need, after those found in
        the prefetch cache (`_resolve`); if any beam needs one, also those the next shift could
        keep. Returns the state and the requests (parent, token, wanted)."""
        state = self._resolve(state, active)
        reqs = jax.vmap(
            lambda table, beam: extension_requests(self.trie, table, beam, self.beam), in_axes=(0, 1), out_axes=1
        )(state.stores.summary, state.beams)  # [M, K, C, D]
        needed = reqs.next_byte & active[:, :, None, None]
        wanted = needed | (reqs.shift & active[:, :, None, None] & jnp.any(needed))
        return state, (reqs.parent, reqs.token, wanted)

    @jax.named_scope("byte refresh")
    def _refreshed(
        self, stores: ContextStore, beams: BeamState, wanted: Bool[Array, "M K C D"], created: Int[Array, "M K CD"],
        active: Bool[Array, "M K"],
    ) -> BeamState:
        """The beams with the created extensions recorded and the active ones' next-byte distributions."""
        beams = beams._replace(ext_context=jnp.where(wanted, created.reshape(wanted.shape), beams.ext_context))
        next_logp, log_mass = jax.vmap(
            lambda table, beam: next_byte_logprobs(self.trie, table, beam, self.beam), in_axes=(0, 1), out_axes=1
        )(stores.summary, beams)
        return beams._replace(
            next_logp=jnp.where(active[:, :, None], next_logp, beams.next_logp),
            log_mass=jnp.where(active, log_mass, beams.log_mass),
        )

    def _refresh(self, state: ByteExpertState, active: Bool[Array, "M K"]) -> ByteExpertState:
        """Materializes the extensions the beams' next-byte distributions need (one call, see
        `_refresh_requests` and `_create`), then computes the distributions."""
        state, (parent, token, wanted) = self._refresh_requests(state, active)
        flat = lambda x: x.reshape(x.shape[:2] + (-1,))
        stores, cache, created = self._create(state, flat(parent), flat(token), flat(wanted), prefetch=True)
        return ByteExpertState(self._refreshed(stores, state.beams, wanted, created, active), stores, cache)

    def logprobs(self, state: ByteExpertState) -> Float[Array, "M K B1"]:
        return state.beams.next_logp

    def advance(self, state: ByteExpertState, symbols: Int[Array, "M"], active: Bool[Array, "M"]) -> ByteExpertState:
        return self._read(state, symbols, active)

    def _read(
        self, state: ByteExpertState, symbols: Int[Array, "M"], active: Bool[Array, "M"], forced: Bool[Array, "M"] | None = None
    ) -> ByteExpertState:
        """`_advance` of one symbol per particle: the distributions are recomputed where a byte
        is read and where they are stale (a deferred start), EOS healed where `forced`."""
        active = self._per_expert(active)
        refresh_active = active if state.stale is None else active | state.stale
        new = self._advance(state, self._per_expert(jnp.clip(symbols, 0, NUM_BYTES - 1)), active,
                            eos=None if forced is None else self._per_expert(forced), refresh_active=refresh_active)
        return new._replace(stale=None if state.stale is None else jnp.zeros_like(state.stale))

    def _per_expert(self, x: Array) -> Array:
        """[M] -> [M, K]: the same value for every expert."""
        return jnp.broadcast_to(x[:, None], (x.shape[0], self.num_experts))

    def advance_heal_eos(
        self, state: ByteExpertState, symbols: Int[Array, "M"], active: Bool[Array, "M"], forced: Bool[Array, "M"]
    ) -> ByteExpertState:
        """`advance`, then `heal_eos(forced)` for the particles whose next symbol is EOS, in the
        same loop of model calls (`_advance`): the step program holds one forward per model."""
        return self._read(state, symbols, active, forced if self.beam.heal else None)

    def _advance(
        self, state: ByteExpertState, byte: Int[Array, "M K"], active: Bool[Array, "M K"], refresh: bool = True,
        eos: Bool[Array, "M K"] | None = None, refresh_active: Bool[Array, "M K"] | None = None,
    ) -> ByteExpertState:
        """Reads byte[m, k] into expert k's beam of particle m where active[m, k]; without
        `refresh` (static) the next-byte distributions are left for a `_refresh` to compute,
        with it they are computed where `refresh_active` (default: `active`). With `eos`
        (healing on, with `refresh`), the beams where it is set are then EOS-healed
        (`heal_eos`).

        The step's model calls are made in order by one loop around one call site (`_create`),
        so the program holds one forward per model whatever the features. Iteration

            i = 0:           the shift (its kept extensions, and those the refresh may need);
            1 <= i <= n:     token healing's token i (`smc_jax.bytes.healing`; n = the longest
                             path, 0 unless a byte emptied a beam);
            i = n + 1:       the refresh (with `refresh`);
            n + 1 < i:       EOS healing's tokens (with `eos`; `heal_eos`).

        Each iteration builds its requests (padded to the shift's width), makes the call (none
        where nothing is wanted) and applies what it created."""
        if eos is not None and not (self.beam.heal and refresh):
            raise ValueError("EOS healing in a step needs healing on and the refresh")
        m, k = active.shape
        refresh_active = active if refresh_active is None else refresh_active
        per_expert = lambda fn, table, beams, *args: jax.vmap(fn, in_axes=(0, 1) + (1,) * len(args), out_axes=1)(
            table, beams, *args)
        flat = lambda x: x.reshape(x.shape[:2] + (-1,))
        with jax.named_scope("byte shift"):
            state = self._resolve(state, active)
            before = state.beams
            plan = per_expert(lambda table, beam, b: plan_shift(self.trie, table, beam, b, self.beam),
                              state.stores.summary, before, byte)
            parent, token, wanted = jax.vmap(shift_requests, in_axes=1, out_axes=1)(before, plan)
            wanted = wanted & active[:, :, None, None]
            # A shift that calls the model also fetches the extensions the new beam's next-byte
            # distribution may need (those whose parents exist now), so the refresh after it
            # rarely calls again: one call per byte step instead of two.
            ahead_parent, ahead_token, ahead = jax.vmap(lookahead_requests, in_axes=1, out_axes=1)(plan)
            ahead = ahead & active[:, :, None, None] & jnp.any(wanted) & self.lookahead
        both = lambda x, y: jnp.concatenate([flat(x), flat(y)], axis=2)
        shift_rows = (both(parent, ahead_parent), both(token, ahead_token), both(wanted, ahead))
        width, split = shift_rows[0].shape[2], wanted.shape[2] * wanted.shape[3]
        pad = lambda x, fill: jnp.pad(x, ((0, 0), (0, 0), (0, width - x.shape[2])), constant_values=fill)
        no_keep = jnp.full((m, k, 1), NO_CONTEXT, jnp.int32)
        yes, no = jnp.ones((), bool), jnp.zeros((), bool)
        heal = self.beam.heal  # static: with heal off the program is the one without healing
        if heal:
            healing = _Healing(self._plan_heal(before, byte), jnp.zeros((m, k), bool),
                               jnp.full((m, k), NO_CONTEXT, jnp.int32), jnp.zeros((m, k), jnp.float32), jnp.zeros((m, k), bool))
        else:
            healing = None

        # Each kind of iteration's requests, from and to (stores, beams, cache, healing, rows, keep,
        # prefetch); then what it does with the contexts created, from and to (stores, beams,
        # healing, n, n_eos). Branches are in-place loops (`in_place_switch`): the stores pass through.
        def shift_requests_(i, n, carry):
            stores, beams, cache, healing, _, _, _ = carry
            return stores, beams, cache, healing, shift_rows, no_keep, yes

        @jax.named_scope("healing")
        def heal_requests(i, n, carry):
            stores, beams, cache, healing, _, _, _ = carry
            j = jnp.where(i <= n, i - 1, i - n - 2)  # the token of the byte's path, or of EOS's
            want = healing.need & (j < healing.plan.count)
            position = jnp.take(healing.plan.positions, j, axis=2)
            step_logp = per_expert(token_logprob, stores.summary, healing.context, position)
            logp = jnp.where(want, healing.logp + step_logp, healing.logp)
            rows = (pad(healing.context[..., None], NO_CONTEXT), pad(jnp.take(healing.plan.tokens, j, axis=2)[..., None], 0),
                    pad(want[..., None], False))
            # The path's current context must survive the call (no beam holds it).
            keep = jnp.where(healing.need, healing.context, NO_CONTEXT)[..., None]
            return stores, beams, cache, healing._replace(logp=logp, want=want), rows, keep, no

        def refresh_requests(i, n, carry):
            stores, beams, cache, healing, _, _, _ = carry
            state, rows = self._refresh_requests(ByteExpertState(beams, stores, cache), refresh_active)
            rows = tuple(pad(flat(x), fill) for x, fill in zip(rows, (NO_CONTEXT, 0, False)))
            return stores, state.beams, state.cache, healing, rows, no_keep, yes

        @jax.named_scope("byte shift")
        def shifted(i, rows_wanted, created, carry):
            stores, _, healing, n, n_eos = carry
            shift_ctx, ahead_ctx = jnp.split(created, [split], axis=2)
            materialized = before._replace(ext_context=jnp.where(wanted, shift_ctx.reshape(wanted.shape), before.ext_context))
            ahead_ctx = jnp.where(ahead, ahead_ctx.reshape(ahead.shape), NO_CONTEXT)
            # Materializing adds contexts but changes none the plan read: the plan still holds.
            new = per_expert(lambda table, beam, b, p, a: shift(self.trie, table, beam, b, p, a),
                             stores.summary, materialized, byte, plan, ahead_ctx)
            beams = jax.tree.map(lambda x, y: jnp.where(active.reshape((m, k) + (1,) * (x.ndim - 2)), x, y), new, materialized)
            if not heal:
                return stores, beams, healing, n, n_eos
            with jax.named_scope("healing"):
                empty = active & ~jnp.isfinite(beams.log_mass)
                heal_plan = self._plan_heal(before, byte, empty)
                need = empty & heal_plan.found
                # In a batch of problems all loop alike (no select of stores).
                n = shared_max(jnp.max(jnp.where(need, heal_plan.count, 0)))
            return stores, beams, _Healing(heal_plan, need, heal_plan.source, heal_plan.source_logp, healing.want), n, n_eos

        @jax.named_scope("healing")
        def healed(i, rows_wanted, created, carry):
            stores, beams, healing, n, n_eos = carry
            return stores, beams, healing._replace(context=jnp.where(healing.want, created[..., 0], healing.context)), n, n_eos

        def refreshed(i, rows_wanted, created, carry):
            stores, beams, healing, n, n_eos = carry
            beams = self._refreshed(stores, beams, rows_wanted[..., :split].reshape(wanted.shape), created[..., :split],
                                    refresh_active)
            if eos is None:
                return stores, beams, healing, n, n_eos
            with jax.named_scope("eos healing"):
                plan_eos, need = self._plan_heal_eos(beams, eos)
                n_eos = shared_max(jnp.max(jnp.where(need, plan_eos.count, 0)))
            return stores, beams, _Healing(plan_eos, need, plan_eos.source, plan_eos.source_logp, healing.want), n, n_eos

        kinds = [(shift_requests_, shifted)] + ([(heal_requests, healed)] if heal else []) + (
            [(refresh_requests, refreshed)] if refresh else [])
        last = len(kinds) - 1
        blank_rows = (jnp.full(shift_rows[0].shape, NO_CONTEXT, jnp.int32), jnp.zeros(shift_rows[1].shape, jnp.int32),
                      jnp.zeros(shift_rows[2].shape, bool))

        def body(carry):
            i, n, n_eos, beams, stores, cache, healing = carry
            if heal:  # shift, the byte's healing, refresh, EOS healing
                kind = jnp.where(i == 0, 0, jnp.where(i <= n, 1, jnp.where(i == n + 1, last, 1)))
            else:
                kind = jnp.minimum(i, last)
            stores, beams, cache, healing, rows, keep, prefetch = in_place_switch(
                kind, [partial(fn, i, n) for fn, _ in kinds], (stores, beams, cache, healing, blank_rows, no_keep, no))
            with jax.named_scope("byte step"):
                stores, cache, created = self._create(ByteExpertState(beams, stores, cache), *rows, prefetch=prefetch,
                                                      also_keep=keep)
            stores, beams, healing, n, n_eos = in_place_switch(
                kind, [partial(fn, i, rows[2], created) for _, fn in kinds], (stores, beams, healing, n, n_eos))
            if heal:  # the beams the byte emptied take their healed paths after the last token
                stores, beams = in_place_cond(
                    i == n, lambda c: (c[0], self._healed(c[0], c[1], before, byte, active, healing)), (stores, beams))
            if eos is not None:  # and after EOS healing's last token, EOS its path's probability
                stores, beams = in_place_cond(i == n + 1 + n_eos, lambda c: (c[0], self._healed_eos(
                    c[0], c[1], healing.need, healing.context, healing.logp)), (stores, beams))
            return i + 1, n, n_eos, beams, stores, cache, healing

        calls = lambda carry: carry[0] < carry[1] + 1 + (1 if refresh else 0) + carry[2]
        _, _, _, beams, stores, cache, _ = jax.lax.while_loop(
            calls, body, (jnp.int32(0), jnp.int32(0), jnp.int32(0), state.beams, state.stores, state.cache, healing))
        return ByteExpertState(beams, stores, cache)

    @jax.named_scope("healing")
    def _healed(
        self, stores: ContextStore, shifted: BeamState, before: BeamState, byte: Int[Array, "M K"], active: Bool[Array, "M K"],
        healing: _Healing,
    ) -> BeamState:
        """The beams after the byte: those it emptied on their healed paths (`healed_beam`), a
        byte of probability 0 read recorded (`zero_byte_logprob`)."""
        beams = jax.vmap(
            lambda table, shifted, old, heal, ctx, lp, node: healed_beam(self.trie, table, shifted, old, heal, ctx, lp, node),
            in_axes=(0, 1, 1, 1, 1, 1, 1), out_axes=1,
        )(stores.summary, shifted, before, healing.need, healing.context, healing.logp, healing.plan.node)
        beams = jax.vmap(zero_byte_logprob, in_axes=1, out_axes=1)(before, beams, byte)
        return beams._replace(healed=beams.healed & active, healed_logp=jnp.where(active, beams.healed_logp, 0.0))

    @jax.named_scope("eos healing")
    def heal_eos(self, state: ByteExpertState, forced: Bool[Array, "M"]) -> ByteExpertState:
        """EOS healing (`smc_jax.bytes.healing.healed_eos`) for the particles that must read EOS
        next (`forced`): where a beam gives EOS probability 0, one tokenization of its string
        that ends at a token boundary is followed (its contexts created by the step's loop of
        model calls, `_advance`, with no byte read) and EOS gets that path's probability. A no-op
        with healing off and where EOS is possible.

        Parameters
        ----------
        state : ByteExpertState
            The experts' state.
        forced : jax.Array, shape [M] or [M, K], bool
            The particles (or particles and experts) whose next symbol is EOS.
        """
        if not self.beam.heal:
            return state
        shape = state.beams.log_mass.shape  # [M, K]
        forced = jnp.broadcast_to(forced if forced.ndim == 2 else forced[:, None], shape)
        nothing = jnp.zeros(shape, bool)  # no byte read, no distribution recomputed: only EOS healing's calls
        new = self._advance(state, jnp.zeros(shape, jnp.int32), nothing, eos=forced, refresh_active=nothing)
        # The last byte's record stays: no byte was read here.
        beams = new.beams._replace(healed=state.beams.healed, healed_logp=state.beams.healed_logp)
        return new._replace(beams=beams)

    def _plan_heal_eos(self, beams: BeamState, forced: Bool[Array, "M K"]) -> tuple[HealPlan, Bool[Array, "M K"]]:
        """EOS healing's plan, and the forced beams that heal: those giving EOS 0 with a path found."""
        zero = forced & ~jnp.isfinite(beams.next_logp[..., EOS_BYTE]) & jnp.isfinite(beams.log_mass)
        plan = self._plan_heal(beams, jnp.full(zero.shape, EOS_BYTE, jnp.int32), zero)
        return plan, zero & plan.found

    def _healed_eos(
        self, stores: ContextStore, beams: BeamState, need: Bool[Array, "M K"], context: Int[Array, "M K"], logp: Float[Array, "M K"]
    ) -> BeamState:
        return jax.vmap(healed_eos, in_axes=(0, 1, 1, 1, 1), out_axes=1)(stores.summary, beams, need, context, logp)

    def _plan_heal(self, beams: BeamState, byte: Int[Array, "M K"], wanted: Bool[Array, "M K"] | None = None) -> HealPlan:
        """`plan_heal` of every beam, computed only when some beam is `wanted` (else, and with
        `wanted` None, all not found)."""
        plan_fn = jax.vmap(lambda beam, b: plan_heal(self.trie, beam, b, self.beam), in_axes=(1, 1), out_axes=1)
        blank = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), jax.eval_shape(plan_fn, beams, byte))
        return blank if wanted is None else jax.lax.cond(jnp.any(wanted), lambda: plan_fn(beams, byte), lambda: blank)

    def reorder(self, state: ByteExpertState, ancestors: Int[Array, "M"]) -> ByteExpertState:
        take = lambda x: jnp.take(x, ancestors, axis=0)
        return state._replace(beams=jax.tree.map(take, state.beams), stale=None if state.stale is None else take(state.stale))

    def stats(self, state) -> dict[str, int]:
        """Host-side: model calls made, rows computed (padding included) and rows needed, and
        the bytes healed (`smc_jax.bytes.healing`) along the particles' histories (summed).

        Parameters
        ----------
        state : ByteExpertState
            The experts' state after a run.
        """
        cache = state.cache
        return dict(
            super().stats(state),
            heals=int(np.asarray(state.beams.heals).sum()),
            prefetched=int(np.asarray(cache.created).sum()),
            prefetch_hits=int(np.asarray(cache.hits).sum()),
        )


def guide_rows(
    data: bytes, chain: Sequence[int], token_bytes: Sequence[bytes | None], ids_of: Mapping[bytes, Sequence[int]],
    limit: int,
) -> tuple[list[int], list[int]]:
    """The rows of `ByteExperts.guide` for one string: the tokens of `chain` (a tokenization of
    `data`, as far as their bytes spell it), then, per chain token, every other token whose bytes
    are a proper prefix of that token's (`ids_of`: the ids of each byte string), where the beams
    pass on the way; at most `limit` rows, the chain first. Returns (tokens, spine).

    Parameters
    ----------
    data : bytes
        The string the beams will read.
    chain : sequence of int
        Token ids, in order (the string's own tokenization).
    token_bytes : sequence of bytes or None
        Each id's bytes.
    ids_of : mapping of bytes to ids
        The ids of each byte string.
    limit : int
        The most rows.
    """
    followed, starts, position = [], [], 0
    for i in list(chain)[:limit]:
        piece = token_bytes[i]
        if not piece or data[position : position + len(piece)] != piece:
            break
        followed.append(i)
        starts.append(position)
        position += len(piece)
    tokens, spine = list(followed), list(range(len(followed)))
    for j, (i, start) in enumerate(zip(followed, starts)):
        for size in range(1, len(token_bytes[i])):
            for other in ids_of.get(data[start : start + size], ()):
                tokens.append(other)
                spine.append(j)
    return tokens[:limit], spine[:limit]


def _best_of_each(key1: Int[Array, "Q"], key2: Int[Array, "Q"], score: Float[Array, "Q"]) -> Float[Array, "Q"]:
    """The scores with every repeated (key1, key2) pair but its best-scored copy set to -inf."""
    order = jnp.lexsort((-score, key2, key1))
    k1, k2 = key1[order], key2[order]
    first = jnp.concatenate([jnp.ones((1,), bool), (k1[1:] != k1[:-1]) | (k2[1:] != k2[:-1])])
    return jnp.full_like(score, -jnp.inf).at[order].set(jnp.where(first, score[order], -jnp.inf))


def _initial_state(experts: ByteExperts, num_particles: int) -> ByteExpertState:
    return experts.init(num_particles)


# Kept on disk: reading the prompt through the beams is a program of its own, traced per model.
_initial_state = stored_jit(_initial_state, static_argnums=(1,))


@jit
def _read_bytes(
    experts: ByteExperts, state: ByteExpertState, data: Int[Array, "T"], length: Int[Array, ""]
) -> tuple[ByteExpertState, Float[Array, "T"]]:
    """Feeds data[:length] to one particle (data is padded to a bucket length, so strings of
    similar lengths share one compilation): the final state and the per-byte conditionals. The
    string ends after its last byte, so EOS must be read: the step that reads it (the first,
    reading nothing, for the empty string) also heals EOS (`ByteExperts.advance_heal_eos`, one
    loop of model calls)."""

    def body(state, inputs):
        byte, position = inputs
        active = (position < length)[None]
        logp = experts.logprobs(state)[0, 0, byte]
        state = experts.advance_heal_eos(state, byte[None], active, (position == jnp.maximum(length - 1, 0))[None])
        # A healed byte had probability 0 before it was read; it gets the healed path's.
        logp = jnp.where(state.beams.healed[0, 0], state.beams.healed_logp[0, 0], logp)
        return state, jnp.where(active[0], logp, 0.0)

    return jax.lax.scan(body, state, (data, jnp.arange(data.shape[0])))


class ByteLogprob(NamedTuple):
    """log-probabilities of a byte string under a byte-level expert (natural log).

    `prefix`: log of the beam's total weight after the string minus that after the prompt
    (genlm's logZ - base): the exact prefix probability with an unpruned beam, a lower bound
    otherwise (for a prompt read as bytes, the ratio of two such bounds). `complete`: prefix + log P(EOS |
    string), with EOS healed where the beam gave it 0 (`ByteExperts.heal_eos`), so a string
    with a tokenization never gets -inf. `conditionals[i]`: log P(byte i | bytes < i) (their sum
    is the chain-rule prefix log-probability under the beam's own, normalized, conditionals).
    `next_logprobs`: the distribution after the string (EOS healed too). `model_calls` and
    `rows`: the model forwards made while reading the string and the rows they computed (padding
    included; pairs scored together share calls, so each pair counts every call of its run)."""

    prefix: float
    complete: float
    conditionals: np.ndarray
    next_logprobs: np.ndarray  # [257] after the string
    healed: int = 0  # bytes (and the end, EOS) that needed token healing (`smc_jax.bytes.healing`)
    model_calls: int = 0
    rows: int = 0


def byte_logprob(experts: ByteExperts, data: bytes) -> ByteLogprob:
    """Scores `data` as a continuation of the expert's prompt (K = 1 expert)."""
    if experts.num_experts != 1:
        raise ValueError("byte_logprob scores under one expert; build it with a single prompt")
    n = len(data)
    padded = np.zeros(geometric_bucket(n, 8), np.int32)  # lengths 8, 16, 32, ...: few programs
    padded[:n] = np.frombuffer(data, np.uint8)
    if experts.start is not None and experts.start.beams.log_mass.shape[0] == 1:
        start = experts.start
    else:
        experts = experts.replace(start=None)
        start = _initial_state(experts, 1)
    final, cond = _read_bytes(experts, start, jnp.asarray(padded), jnp.asarray(n, jnp.int32))
    problem = experts.failure(final)
    if problem is not None:
        raise problem
    next_logp = np.asarray(final.beams.next_logp[0, 0], np.float64)
    prefix = float(final.beams.log_mass[0, 0] - start.beams.log_mass[0, 0])
    return ByteLogprob(
        prefix=prefix,
        complete=prefix + float(next_logp[EOS_BYTE]),
        conditionals=np.asarray(cond, np.float64)[:n],
        next_logprobs=next_logp,
        healed=int(final.beams.heals[0, 0] - start.beams.heals[0, 0]),
        model_calls=int(final.stores.calls[0] - start.stores.calls[0]),
        rows=int(final.stores.rows[0] - start.stores.rows[0]),
    )


_BYTE_VOCABS: "weakref.WeakKeyDictionary[LanguageModel, tuple[TokenTrie, np.ndarray, tuple]]" = weakref.WeakKeyDictionary()


def _vocabulary(model: LanguageModel) -> tuple[TokenTrie, np.ndarray, tuple[bytes | None, ...]]:
    if model not in _BYTE_VOCABS:
        if model.tokenizer is None:
            raise ValueError(f"{model.name} has no tokenizer, so its tokens' bytes are unknown")
        def build() -> tuple[TokenTrie, tuple[bytes | None, ...]]:
            byte_strings = token_byte_strings(model.tokenizer.hf, vocab_size=model.config.vocab_size).byte_strings
            return TokenTrie.build(byte_strings), byte_strings

        trie, byte_strings = stored_vocabulary(model.tokenizer.hf, model.config.vocab_size, build)
        allowed = np.array([b is not None for b in byte_strings])
        allowed[list(model.tokenizer.eos_token_ids)] = True
        _BYTE_VOCABS[model] = (trie, allowed, byte_strings)
    return _BYTE_VOCABS[model]


def byte_vocabulary(model: LanguageModel) -> tuple[TokenTrie, np.ndarray]:
    """The model's token trie and the mask of ids a byte-level LM may use (byte tokens + EOS).

    Parameters
    ----------
    model : LanguageModel
        A model with its tokenizer.
    """
    return _vocabulary(model)[:2]


def token_bytes(model: LanguageModel) -> tuple[bytes | None, ...]:
    """Each token id's bytes (None for the ids a byte-level LM may not use but EOS).

    Parameters
    ----------
    model : LanguageModel
        A model with its tokenizer.
    """
    return _vocabulary(model)[2]


_IDS_OF: "weakref.WeakKeyDictionary[LanguageModel, dict[bytes, list[int]]]" = weakref.WeakKeyDictionary()


def ids_by_bytes(byte_strings: Sequence[bytes | None]) -> dict[bytes, list[int]]:
    """The ids of each (non-empty) byte string, in id order.

    Parameters
    ----------
    byte_strings : sequence of bytes or None
        Each id's bytes.
    """
    ids: dict[bytes, list[int]] = {}
    for i, b in enumerate(byte_strings):
        if b:
            ids.setdefault(b, []).append(i)
    return ids


def token_ids_of(model: LanguageModel) -> dict[bytes, list[int]]:
    """`ids_by_bytes` of the model's tokens, built once per model (`guide_rows` reads it).

    Parameters
    ----------
    model : LanguageModel
        A model with its tokenizer.
    """
    if model not in _IDS_OF:
        _IDS_OF[model] = ids_by_bytes(token_bytes(model))
    return _IDS_OF[model]
