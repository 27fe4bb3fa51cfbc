"""Any Flax causal language model as a smc_jax model: `FlaxLM.from_linen` / `FlaxLM.from_nnx`.

The adapter needs only the model's full forward pass, `logits = f(params, tokens[B, L])`
(float logits [B, L, V], or an output object with `.logits`, as transformers' Flax models
return), causal: the logits at position t depend on tokens[:, :t + 1] only. It keeps no
key/value cache. Its paged pool stores each continuation token (one int per entry instead of
keys/values), and a step rebuilds every row's sequence

    prompt[:length] ++ pool[paths[r, :depth[r]]] ++ [token_r]      (right-padded to P + S + 1)

and reads the logits at its last real position. Right padding never changes those (causality),
so any causal LM works unchanged; a step costs a full forward pass over P + S + 1 tokens instead
of one token's, which is the price of needing nothing but `f`.

The result is a `LanguageModel` (`smc_jax.sample`, `smc_jax.logprob`, token and byte level) whose
`config` is a small `FlaxLMConfig` (vocabulary size, maximum positions).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, Float, Int

from smc_jax.models.lm import DEFAULT_PROMPT_CAPACITY, LanguageModel, prompt_bucket
from smc_jax.models.tokenizer import Tokenizer

ApplyFn = Callable[[Any, Array], Any]
"""(params, tokens [B, L] int32) -> logits [B, L, V] (or an object with `.logits`)."""


@dataclasses.dataclass(frozen=True)
class FlaxLMConfig:
    """What smc_jax reads of a wrapped model's configuration."""

    vocab_size: int
    max_positions: int = 1 << 30
    learned_positions: bool = False  # positions are the model's business; see max_positions
    architecture: str = "flax"


@struct.dataclass
class TokenPrefix:
    """A prompt, right-padded: tokens[:length] are real."""

    tokens: Int[Array, " padded"]
    length: Int[Array, ""]


@struct.dataclass
class TokenPool:
    """The continuation token of each pool entry."""

    tokens: Int[Array, " entries"]


def _logits(apply_fn: ApplyFn, params: Any, tokens: Array) -> Float[Array, "batch tokens vocab"]:
    out = apply_fn(params, tokens)
    return jnp.asarray(getattr(out, "logits", out)).astype(jnp.float32)


@struct.dataclass
class PagedFlaxLM:
    """The paged-model interface of `smc_jax.models.contexts` over a full-forward function."""

    params: Any
    apply_fn: ApplyFn = struct.field(pytree_node=False)
    vocab_size: int = struct.field(pytree_node=False)

    @property
    def dtype(self) -> Any:
        return jnp.float32

    def init_pool(self, capacity: int) -> TokenPool:
        return TokenPool(tokens=jnp.zeros((capacity,), jnp.int32))

    def step(
        self,
        prefix: TokenPrefix,
        pool: TokenPool,
        paths: Int[Array, "rows slots"],
        depth: Int[Array, " rows"],
        tokens: Int[Array, " rows"],
        write_at: Int[Array, " rows"],
    ) -> tuple[Float[Array, "rows vocab"], TokenPool]:
        rows, slots = paths.shape
        padded = prefix.tokens.shape[0]
        i = jnp.arange(padded + slots + 1, dtype=jnp.int32)[None]  # [1, L]
        in_prompt = i < prefix.length
        slot = jnp.clip(i - prefix.length, 0, slots - 1)
        history = pool.tokens[jnp.take_along_axis(paths, jnp.broadcast_to(slot, (rows, i.shape[1])), axis=1)]
        prompt = prefix.tokens[jnp.clip(i, 0, padded - 1)]
        last = prefix.length + depth  # [R] position of the new token
        seq = jnp.where(in_prompt, prompt, jnp.where(i < last[:, None], history, 0))
        seq = jnp.where(i == last[:, None], tokens[:, None], seq).astype(jnp.int32)
        logits = _logits(self.apply_fn, self.params, seq)
        out = jnp.take_along_axis(logits, last[:, None, None], axis=1)[:, 0]
        return out[:, : self.vocab_size], TokenPool(tokens=pool.tokens.at[write_at].set(tokens, mode="drop"))


@dataclasses.dataclass(frozen=True, eq=False)
class FlaxLM(LanguageModel):
    """A Flax causal LM behind `LanguageModel` (see the module docstring). Build it with
    `from_linen(module, params, tokenizer)`, `from_nnx(module, tokenizer)` or
    `from_apply(apply_fn, params, vocab_size, tokenizer)`."""

    apply_fn: ApplyFn | None = None

    @classmethod
    def from_apply(
        cls,
        apply_fn: ApplyFn,
        params: Any,
        vocab_size: int,
        tokenizer: Any = None,
        *,
        name: str = "flax-lm",
        max_positions: int | None = None,
        eos_token_ids: Sequence[int] = (),
        prompt_capacity: int = DEFAULT_PROMPT_CAPACITY,
    ) -> FlaxLM:
        """`tokenizer`: a Hugging Face tokenizer (or a smc_jax `Tokenizer`), needed for text
        prompts and the byte level; `vocab_size`: the number of logits the model returns."""
        if tokenizer is not None and not isinstance(tokenizer, Tokenizer):
            tokenizer = Tokenizer(tokenizer, vocab_size, eos_token_ids)
        config = FlaxLMConfig(vocab_size=vocab_size, max_positions=max_positions or FlaxLMConfig.max_positions)
        return cls(config=config, params=params, tokenizer=tokenizer, name=name, source=name,  # type: ignore[arg-type]
                   prompt_capacity=prompt_capacity, apply_fn=apply_fn)

    @classmethod
    def from_linen(cls, module: Any, params: Any, vocab_size: int, tokenizer: Any = None, **kwargs: Any) -> FlaxLM:
        """A linen module whose `module.apply(params, tokens)` returns the logits."""
        return cls.from_apply(module.apply, params, vocab_size, tokenizer, **kwargs)

    @classmethod
    def from_nnx(cls, module: Any, vocab_size: int, tokenizer: Any = None, **kwargs: Any) -> FlaxLM:
        """An NNX module whose `module(tokens)` returns the logits (split into graph + state, so
        the state is an ordinary pytree of arrays)."""
        from flax import nnx

        graphdef, state = nnx.split(module)

        def apply(state: Any, tokens: Array) -> Any:
            return nnx.merge(graphdef, state)(tokens)

        return cls.from_apply(apply, state, vocab_size, tokenizer, **kwargs)

    # -- what smc_jax calls --------------------------------------------------------------------

    @property
    def dtype(self) -> Any:
        return jnp.float32

    def paged(self) -> PagedFlaxLM:
        return PagedFlaxLM(params=self.params, apply_fn=self.apply_fn, vocab_size=self.config.vocab_size)

    def prefill_batch(
        self, padded: Int[Array, "prompts tokens"], lengths: Int[Array, " prompts"]
    ) -> tuple[TokenPrefix, Float[Array, "prompts vocab"]]:
        return _prefill_batch(self.apply_fn, self.config.vocab_size, self.params, padded, lengths)

    def forward(self, tokens: Int[Array, "batch tokens"], positions: Any = None, mask: Any = None) -> Array:
        """Logits [B, T, V] of unpadded (or right-padded) sequences."""
        if positions is not None:
            raise ValueError("a wrapped Flax model takes no positions: pass right-padded tokens")
        return _logits(self.apply_fn, self.params, jnp.asarray(tokens, jnp.int32))[..., : self.config.vocab_size]

    def prefill(self, ids: Sequence[int]) -> tuple[TokenPrefix, Float[Array, " vocab"]]:
        padded = np.zeros(prompt_bucket(len(ids), self.prompt_capacity), np.int32)
        padded[: len(ids)] = ids
        prefix, logits = self.prefill_batch(jnp.asarray(padded[None]), jnp.asarray([len(ids)], jnp.int32))
        return jax.tree.map(lambda x: x[0], prefix), logits[0]

    def _no_cache(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("a wrapped Flax model keeps no key/value cache: use smc_jax.sample / logprob")

    extend = decode = new_cache = greedy = astype = with_unrolled_layers = _no_cache


@partial(jax.jit, static_argnums=(0, 1))
def _prefill_batch(
    apply_fn: ApplyFn, vocab_size: int, params: Any, padded: Array, lengths: Array
) -> tuple[TokenPrefix, Array]:
    logits = _logits(apply_fn, params, padded)
    last = jnp.take_along_axis(logits, (lengths - 1)[:, None, None], axis=1)[:, 0, :vocab_size]
    return TokenPrefix(tokens=padded, length=lengths), last
