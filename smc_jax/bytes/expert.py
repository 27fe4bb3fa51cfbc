"""Byte-level experts: one token LM under K prompts, seen as K distributions over bytes.

The alphabet is the 256 byte values and EOS is symbol 256 (`EOS_BYTE`), so experts with
different tokenizers share it and can be ensembled exactly. Each particle keeps, per expert, a
beam over tokenizations (`beam.py`); a step reads the sampled byte in every beam and then makes
one model call for the token contexts the new beams need, deduplicated across particles and
slots and batched over the K prompts (`experts.contexts`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

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
    initial_beam,
    next_byte_logprobs,
    shift,
    summarize_logits,
)
from smc_jax.bytes.trie import TokenTrie
from smc_jax.bytes.vocab import NUM_BYTES
from smc_jax.experts.base import where_active
from smc_jax.experts.contexts import (
    NO_CONTEXT,
    PROMPT_CONTEXT,
    ContextStore,
    PagedModel,
    bucket_sizes,
    context_stats,
    extend_group,
    init_store,
)

PyTree = Any


class ByteExpertState(NamedTuple):
    beams: BeamState  # leaves [M, K, ...]
    stores: ContextStore  # stacked over the K experts


@struct.dataclass
class ByteExperts:
    """K byte-level experts = one `PagedModel` under K prompts (prefix states stacked on axis 0).

    `allowed[v]` marks the token ids the byte LM may use: byte tokens and the EOS ids; the model's
    distribution is renormalized over them. `max_tokens` bounds the tokens of a continuation
    (at most the number of bytes sampled, the sampler's max_length).
    """

    model: PagedModel
    prefixes: PyTree
    prompt_logits: Float[Array, "K V"]
    trie: TokenTrie
    allowed: Bool[Array, "V"]
    eos_ids: tuple[int, ...] = struct.field(pytree_node=False)
    beam: BeamConfig = struct.field(pytree_node=False)
    max_tokens: int = struct.field(pytree_node=False)
    temperature: float = struct.field(pytree_node=False, default=1.0)
    num_entries: int | None = struct.field(pytree_node=False, default=None)  # None: the worst case
    num_contexts: int | None = struct.field(pytree_node=False, default=None)  # None: the worst case

    @property
    def num_experts(self) -> int:
        return int(self.prompt_logits.shape[0])

    @property
    def alphabet_size(self) -> int:
        return NUM_BYTES

    @property
    def num_slots(self) -> int:
        return self.beam.width * (1 + self.trie.max_duplicates)

    def _summarize(self, logits: Float[Array, "U V"]) -> ByteSummary:
        return summarize_logits(logits, self.trie, self.allowed, self.eos_ids, self.temperature)

    def capacity(self, num_particles: int) -> tuple[int, int]:
        """(pool entries, contexts). The worst case: contexts alive at once are the prompt's,
        every slot's, every materialized extension's and those being created; each path holds
        at most max_tokens entries. Real beams share almost all of their paths, so callers
        usually pass much smaller capacities and grow them on overflow (see `smc_jax.api`)."""
        m, c, d = num_particles, self.num_slots, self.trie.max_duplicates
        worst_contexts = 1 + m * c + 2 * m * c * d
        num_contexts = self.num_contexts or worst_contexts
        return (self.num_entries or num_contexts * self.max_tokens), num_contexts

    def init(self, num_particles: int) -> ByteExpertState:
        m, c, d = num_particles, self.num_slots, self.trie.max_duplicates
        num_entries, num_contexts = self.capacity(num_particles)
        stores = jax.vmap(lambda s: init_store(self.model, s, num_entries, num_contexts, self.max_tokens))(
            self._summarize(self.prompt_logits)
        )
        beam = initial_beam(m, c, d, PROMPT_CONTEXT)
        beams = jax.tree.map(lambda x: jnp.broadcast_to(x[:, None], (m, self.num_experts) + x.shape[1:]), beam)
        return self._refresh(ByteExpertState(beams, stores), jnp.ones((m,), bool))

    def _refresh(self, state: ByteExpertState, active: Bool[Array, "M"]) -> ByteExpertState:
        """Materializes the extensions the new beams need (one model call for all K experts),
        then computes their next-byte distributions."""
        beams, stores = state
        m, k = active.shape[0], self.num_experts
        c, d = self.num_slots, self.trie.max_duplicates
        parent, token, wanted = jax.vmap(
            lambda table, beam: extension_requests(self.trie, table, beam, self.beam), in_axes=(0, 1), out_axes=1
        )(stores.summary, beams)  # [M, K, C, D]
        wanted = wanted & active[:, None, None, None]
        flat = lambda x: jnp.moveaxis(x, 1, 0).reshape(k, m * c * d)
        keep = jnp.moveaxis(beams.context, 1, 0).reshape(k, m * c)
        stores, created = extend_group(
            stores, self.model, self.prefixes, flat(parent), flat(token), flat(wanted), keep, self._summarize,
            bucket_sizes(m * c * d, smallest=8),
        )
        created = jnp.moveaxis(created.reshape(k, m, c, d), 0, 1)
        ext_context = jnp.where(wanted, created, jnp.where(active[:, None, None, None], NO_CONTEXT, beams.ext_context))
        beams = beams._replace(ext_context=ext_context)
        next_logp, log_mass = jax.vmap(
            lambda table, beam: next_byte_logprobs(self.trie, table, beam, self.beam), in_axes=(0, 1), out_axes=1
        )(stores.summary, beams)
        beams = beams._replace(
            next_logp=jnp.where(active[:, None, None], next_logp, beams.next_logp),
            log_mass=jnp.where(active[:, None], log_mass, beams.log_mass),
        )
        return ByteExpertState(beams, stores)

    def logprobs(self, state: ByteExpertState) -> Float[Array, "M K B1"]:
        return state.beams.next_logp

    def advance(self, state: ByteExpertState, symbols: Int[Array, "M"], active: Bool[Array, "M"]) -> ByteExpertState:
        byte = jnp.clip(symbols, 0, NUM_BYTES - 1)
        shifted = jax.vmap(
            lambda table, beam: shift(self.trie, table, beam, byte, self.beam), in_axes=(0, 1), out_axes=1
        )(state.stores.summary, state.beams)
        beams = where_active(active, shifted, state.beams)
        return self._refresh(ByteExpertState(beams, state.stores), active)

    def reorder(self, state: ByteExpertState, ancestors: Int[Array, "M"]) -> ByteExpertState:
        return state._replace(beams=jax.tree.map(lambda x: jnp.take(x, ancestors, axis=0), state.beams))

    def stats(self, state) -> dict[str, int]:
        """Host-side: model calls made, rows computed (padding included) and rows needed."""
        return context_stats(state.stores)

    def failure(self, state: ByteExpertState) -> str | None:
        if bool(np.any(np.asarray(state.stores.overflow))):
            return (
                "the byte-level context store overflowed (a continuation needing more than max_tokens "
                "tokens); raise max_tokens / the sampler's max_length"
            )
        return None


@jax.jit
def _init_one(experts: ByteExperts) -> ByteExpertState:
    return experts.init(1)


@jax.jit
def _read_bytes(
    experts: ByteExperts, state: ByteExpertState, data: Int[Array, "T"], length: Int[Array, ""]
) -> tuple[ByteExpertState, Float[Array, "T"]]:
    """Feeds data[:length] to one particle (data is padded to a bucket length, so strings of
    similar lengths share one compilation): the final state and the per-byte conditionals."""

    def body(state, inputs):
        byte, position = inputs
        active = (position < length)[None]
        logp = experts.logprobs(state)[0, 0, byte]
        return experts.advance(state, byte[None], active), jnp.where(active[0], logp, 0.0)

    return jax.lax.scan(body, state, (data, jnp.arange(data.shape[0])))


def _bucket_length(n: int, smallest: int = 8) -> int:
    size = smallest
    while size < n:
        size *= 2
    return size


class ByteLogprob(NamedTuple):
    """log-probabilities of a byte string under a byte-level expert (natural log).

    `prefix`: log of the beam's total weight after the string (genlm's logZ): the exact prefix
    probability with an unpruned beam, a lower bound otherwise. `complete`: prefix + log P(EOS |
    string). `conditionals[i]`: log P(byte i | bytes < i) (their sum is the chain-rule prefix
    log-probability under the beam's own, normalized, conditionals)."""

    prefix: float
    complete: float
    conditionals: np.ndarray
    next_logprobs: np.ndarray  # [257] after the string


def byte_logprob(experts: ByteExperts, data: bytes) -> ByteLogprob:
    """Scores `data` as a continuation of the expert's prompt (K = 1 expert)."""
    if experts.num_experts != 1:
        raise ValueError("byte_logprob scores under one expert; build it with a single prompt")
    n = len(data)
    padded = np.zeros(_bucket_length(n), np.int32)
    padded[:n] = np.frombuffer(data, np.uint8)
    final, cond = _read_bytes(experts, _init_one(experts), jnp.asarray(padded), jnp.asarray(n, jnp.int32))
    problem = experts.failure(final)
    if problem is not None:
        raise RuntimeError(problem)
    next_logp = np.asarray(final.beams.next_logp[0, 0], np.float64)
    prefix = float(final.beams.log_mass[0, 0])
    return ByteLogprob(
        prefix=prefix,
        complete=prefix + float(next_logp[EOS_BYTE]),
        conditionals=np.asarray(cond, np.float64)[:n],
        next_logprobs=next_logp,
    )
