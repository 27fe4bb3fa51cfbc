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
    """What smc_jax reads of a wrapped model's configuration.

    Attributes
    ----------
    vocab_size : int
        V, the logits the samplers read (the model may return more; they are cut off).
    max_positions : int
        The longest prompt plus continuation the model takes.
    learned_positions : bool
        Always False: positions are the wrapped model's business (see `max_positions`).
    architecture : str
        "flax".
    """

    vocab_size: int
    max_positions: int = 1 << 30
    learned_positions: bool = False  # positions are the model's business; see max_positions
    architecture: str = "flax"


@struct.dataclass
class TokenPrefix:
    """A prompt, right-padded: tokens[:length] are real.

    Attributes
    ----------
    tokens : int array [P]
        The padded prompt.
    length : int array []
        Its real length.
    """

    tokens: Int[Array, " padded"]
    length: Int[Array, ""]


@struct.dataclass
class TokenPool:
    """The continuation token of each pool entry.

    Attributes
    ----------
    tokens : int array [entries]
        One token per pool entry.
    """

    tokens: Int[Array, " entries"]


def _logits(apply_fn: ApplyFn, params: Any, tokens: Array) -> Float[Array, "batch tokens vocab"]:
    out = apply_fn(params, tokens)
    return jnp.asarray(getattr(out, "logits", out)).astype(jnp.float32)


@struct.dataclass
class PagedFlaxLM:
    """The paged-model interface of `smc_jax.models.contexts` over a full-forward function.

    Attributes
    ----------
    params : pytree
        The wrapped model's parameters (or NNX state).
    apply_fn : callable
        (params, tokens [B, L]) -> logits [B, L, V'] (or an object with `.logits`).
    vocab_size : int
        V: the first V logits are returned.
    """

    params: Any
    apply_fn: ApplyFn = struct.field(pytree_node=False)
    vocab_size: int = struct.field(pytree_node=False)

    @property
    def dtype(self) -> Any:
        return jnp.float32

    def init_pool(self, capacity: int) -> TokenPool:
        """An empty pool of `capacity` entries (one token each).

        Parameters
        ----------
        capacity : int
            Entries of the pool.
        """
        return TokenPool(tokens=jnp.zeros((capacity,), jnp.int32))

    def step(
        self,
        prefix: TokenPrefix,
        pool: TokenPool,
        paths: Int[Array, "rows slots"],
        depth: Int[Array, " rows"],
        tokens: Int[Array, " rows"],
        write_at: Int[Array, " rows"],
        tree: bool = False,
        span: Int[Array, ""] | None = None,
    ) -> tuple[Float[Array, "rows vocab"], TokenPool]:
        """Next-token logits of R rows after feeding each its token, and the pool with the tokens
        written (the interface of `PagedTransformer.step`).

        Parameters
        ----------
        prefix : TokenPrefix
            The rows' shared prompt.
        pool : TokenPool
            The continuation tokens stored so far.
        paths : int array [R, S]
            Each row's pool entries, in order (the first `depth[r]` are real).
        depth : int array [R]
            How many continuation tokens each row has before `tokens`.
        tokens : int array [R]
            The token each row reads now.
        write_at : int array [R]
            The pool entry that stores each row's token (out of range: not stored).
        tree : bool
            Whether a path may name an entry this call writes (another row's token): the tokens
            are written before the paths are read, so that needs nothing more here.
        span : int scalar, optional
            A bound on `depth` (see `PagedModel.step`); unused: every row runs its whole padded
            sequence.

        Returns
        -------
        logits : float32 array [R, V]
            The next-token logits after each row's sequence.
        pool : TokenPool
            The updated pool.
        """
        rows, slots = paths.shape
        pool = TokenPool(tokens=pool.tokens.at[write_at].set(tokens, mode="drop"))
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
        return out[:, : self.vocab_size], pool


@dataclasses.dataclass(frozen=True, eq=False)
class FlaxLM(LanguageModel):
    """A Flax causal LM behind `LanguageModel` (see the module docstring). Build it with
    `from_linen(module, params, vocab_size, tokenizer)`, `from_nnx(module, vocab_size, tokenizer)`
    or `from_apply(apply_fn, params, vocab_size, tokenizer)`.

    Attributes
    ----------
    config : FlaxLMConfig
        Vocabulary size and maximum positions.
    params : pytree
        The wrapped model's parameters (or NNX state).
    tokenizer : Tokenizer or None
        Needed for text prompts and the byte level.
    name, source : str
        The model's name (in messages and results) and where it came from.
    prompt_capacity : int
        The longest prompt, in tokens.
    apply_fn : callable
        (params, tokens [B, L]) -> logits [B, L, V'] (or an object with `.logits`).
    """

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
        """Wrap any causal full-forward function `apply_fn(params, tokens) -> logits`.

        Parameters
        ----------
        apply_fn : callable
            (params, tokens int32 [B, L]) -> logits [B, L, V'] (or an object with `.logits`),
            causal: the logits at position t depend on tokens[:, :t + 1] only.
        params : pytree
            Its first argument.
        vocab_size : int
            V, the number of logits the samplers read (the first V of V').
        tokenizer : Hugging Face tokenizer or smc_jax Tokenizer, optional
            Needed for text prompts and the byte level.
        name : str
            The model's name in messages and results.
        max_positions : int, optional
            The longest prompt plus continuation the model takes (default: unbounded).
        eos_token_ids : sequence of int
            End-of-sequence tokens, when `tokenizer` is a Hugging Face tokenizer that lacks them.
        prompt_capacity : int
            The longest prompt, in tokens (prompts are padded to powers of two up to it).
        """
        if tokenizer is not None and not isinstance(tokenizer, Tokenizer):
            tokenizer = Tokenizer(tokenizer, vocab_size, eos_token_ids)
        config = FlaxLMConfig(vocab_size=vocab_size, max_positions=max_positions or FlaxLMConfig.max_positions)
        return cls(config=config, params=params, tokenizer=tokenizer, name=name, source=name,  # type: ignore[arg-type]
                   prompt_capacity=prompt_capacity, apply_fn=apply_fn)

    @classmethod
    def from_linen(cls, module: Any, params: Any, vocab_size: int, tokenizer: Any = None, **kwargs: Any) -> FlaxLM:
        """A linen module whose `module.apply(params, tokens)` returns the logits.

        Parameters
        ----------
        module : flax.linen.Module
            The causal language model.
        params : pytree
            Its variables (what `module.init` returned).
        vocab_size : int
            V, the number of logits the samplers read.
        tokenizer : Hugging Face tokenizer or smc_jax Tokenizer, optional
            Needed for text prompts and the byte level.
        **kwargs
            `name`, `max_positions`, `eos_token_ids`, `prompt_capacity` (see `from_apply`).
        """
        return cls.from_apply(module.apply, params, vocab_size, tokenizer, **kwargs)

    @classmethod
    def from_nnx(cls, module: Any, vocab_size: int, tokenizer: Any = None, **kwargs: Any) -> FlaxLM:
        """An NNX module whose `module(tokens)` returns the logits (split into graph + state, so
        the state is an ordinary pytree of arrays).

        Parameters
        ----------
        module : flax.nnx.Module
            The causal language model.
        vocab_size : int
            V, the number of logits the samplers read.
        tokenizer : Hugging Face tokenizer or smc_jax Tokenizer, optional
            Needed for text prompts and the byte level.
        **kwargs
            `name`, `max_positions`, `eos_token_ids`, `prompt_capacity` (see `from_apply`).
        """
        from flax import nnx

        graphdef, state = nnx.split(module)

        def apply(state: Any, tokens: Array) -> Any:
            return nnx.merge(graphdef, state)(tokens)

        return cls.from_apply(apply, state, vocab_size, tokenizer, **kwargs)

    # -- what smc_jax calls --------------------------------------------------------------------

    @property
    def dtype(self) -> Any:
        """float32: the logits' type."""
        return jnp.float32

    def paged(self) -> PagedFlaxLM:
        """The paged-model interface the samplers call (a token pool, no key/value cache)."""
        return PagedFlaxLM(params=self.params, apply_fn=self.apply_fn, vocab_size=self.config.vocab_size)

    def prefill_batch(
        self, padded: Int[Array, "prompts tokens"], lengths: Int[Array, " prompts"], read: int = 0
    ) -> tuple[TokenPrefix, Float[Array, "prompts vocab"]]:
        """K right-padded prompts (stacked on axis 0) and their next-token logits.

        Parameters
        ----------
        padded : int array [K, P]
            The prompts, right-padded to one bucket size.
        lengths : int array [K]
            Their real lengths.
        read : int
            Ignored: the Flax model reads the padded prompts whole.
        """
        return _prefill_batch(self.apply_fn, self.config.vocab_size, self.params, padded, lengths)

    def forward(self, tokens: Int[Array, "batch tokens"], positions: Any = None, mask: Any = None) -> Array:
        """Logits [B, T, V] of unpadded (or right-padded) sequences.

        Parameters
        ----------
        tokens : int array [B, T]
            The sequences.
        positions, mask : None
            Not taken (a wrapped model places its tokens itself); given, they raise ValueError.
        """
        if positions is not None:
            raise ValueError("a wrapped Flax model takes no positions: pass right-padded tokens")
        return _logits(self.apply_fn, self.params, jnp.asarray(tokens, jnp.int32))[..., : self.config.vocab_size]

    def prefill(self, ids: Sequence[int]) -> tuple[TokenPrefix, Float[Array, " vocab"]]:
        """One prompt's padded prefix and its next-token logits.

        Parameters
        ----------
        ids : sequence of int
            The prompt's tokens.
        """
        padded = np.zeros(prompt_bucket(len(ids), self.prompt_capacity), np.int32)
        padded[: len(ids)] = ids
        prefix, logits = self.prefill_batch(jnp.asarray(padded[None]), jnp.asarray([len(ids)], jnp.int32))
        return jax.tree.map(lambda x: x[0], prefix), logits[0]

    def _no_cache(self, *args: Any, **kwargs: Any) -> Any:
        """Not available: a wrapped Flax model keeps no key/value cache (raises
        NotImplementedError); `smc_jax.sample` / `logprob` use `paged` and `prefill_batch`.

        Parameters
        ----------
        *args, **kwargs
            Ignored.
        """
        raise NotImplementedError("a wrapped Flax model keeps no key/value cache: use smc_jax.sample / logprob")

    extend = decode = new_cache = greedy = astype = with_split_layers = _no_cache


@partial(jax.jit, static_argnums=(0, 1))
def _prefill_batch(
    apply_fn: ApplyFn, vocab_size: int, params: Any, padded: Array, lengths: Array
) -> tuple[TokenPrefix, Array]:
    logits = _logits(apply_fn, params, padded)
    last = jnp.take_along_axis(logits, (lengths - 1)[:, None, None], axis=1)[:, 0, :vocab_size]
    return TokenPrefix(tokens=padded, length=lengths), last
