"""Token-level experts: one token LM under K prompts, sharing one vocabulary.

The alphabet is the model's vocabulary (A = V symbols) and EOS is symbol V: the probability of
the model's end-of-sequence token(s) moves there. Each particle holds one context id per expert
in that expert's `ContextStore`; a step feeds every active particle's sampled token to the model
in one deduplicated, bucketed call for all K experts (vmapped over the prompts, parameters
shared), and resampling copies context ids only.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, Bool, Float, Int

from smc_jax.experts.model_base import ModelExperts
from smc_jax.models.contexts import PROMPT_CONTEXT, ContextStore, bucket_sizes, extend_group


class TokenExpertState(NamedTuple):
    context: Int[Array, "M K"]  # each particle's context id in each expert's store
    stores: ContextStore  # stacked over the K experts


def token_logprobs(
    logits: Float[Array, "... V"], eos_ids: tuple[int, ...], temperature: float = 1.0
) -> Float[Array, "... V1"]:
    """log p(a | context) over the vocabulary plus EOS, in float32: the EOS ids' mass moves to
    the last entry (symbol V) and those ids get -inf."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, axis=-1)
    ids = jnp.asarray(eos_ids, jnp.int32)
    eos = jax.nn.logsumexp(logp[..., ids], axis=-1, keepdims=True)
    # One elementwise pass over [..., V + 1] (a scatter, then a concatenation, copied the rows twice).
    vocab = logits.shape[-1]
    symbol = jnp.arange(vocab + 1)
    is_eos_id = np.isin(np.arange(vocab + 1), np.asarray(eos_ids))
    padded = jnp.pad(logp, [(0, 0)] * (logp.ndim - 1) + [(0, 1)])
    return jnp.where(symbol == vocab, eos, jnp.where(is_eos_id, -jnp.inf, padded))


@struct.dataclass(kw_only=True)
class TokenExperts(ModelExperts):
    """K experts = one `PagedModel` under K prompts (fields: see `ModelExperts`)."""

    @property
    def alphabet_size(self) -> int:
        return int(self.prompt_logits.shape[-1])

    def _summarize(self, logits: Float[Array, "U V"]) -> Float[Array, "U V1"]:
        return token_logprobs(logits, self.eos_ids, self.temperature)

    def capacity(self, num_particles: int) -> tuple[int, int]:
        """(pool entries, contexts). Contexts: the prompt's, the M particles' and M created per
        step. Entries: the worst case is M disjoint paths of max_tokens, plus M new ones."""
        num_contexts = 2 * num_particles + 1
        worst = num_particles * (self.max_tokens + 1)
        return (self.num_entries or worst), num_contexts

    def init(self, num_particles: int) -> TokenExpertState:
        stores = self.init_stores(num_particles)
        context = jnp.full((num_particles, self.num_experts), PROMPT_CONTEXT, jnp.int32)
        return TokenExpertState(context=context, stores=stores)

    def logprobs(self, state: TokenExpertState) -> Float[Array, "M K V1"]:
        return jax.vmap(lambda table, ctx: table[ctx], in_axes=(0, 1), out_axes=1)(state.stores.summary, state.context)

    @jax.named_scope("token step")
    def advance(
        self, state: TokenExpertState, symbols: Int[Array, "M"], active: Bool[Array, "M"]
    ) -> TokenExpertState:
        k, m = self.num_experts, symbols.shape[0]
        parent = state.context.T
        tokens = jnp.broadcast_to(jnp.clip(symbols, 0, self.alphabet_size - 1), (k, m))
        valid = jnp.broadcast_to(active, (k, m))
        stores, new = extend_group(
            state.stores, self.model, self.prefixes, parent, tokens, valid, parent, self._summarize, bucket_sizes(m, typical=m)
        )
        context = jnp.where(active[:, None], new.T, state.context)
        return TokenExpertState(context=context, stores=stores)

    def reorder(self, state: TokenExpertState, ancestors: Int[Array, "M"]) -> TokenExpertState:
        return state._replace(context=jnp.take(state.context, ancestors, axis=0))
