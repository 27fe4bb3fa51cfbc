"""`LanguageModel`: config + params + tokenizer, with jitted model calls and conveniences."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from smc_jax.models import transformer
from smc_jax.models.cache import CacheCapacityError, KVCache, PrefixCache
from smc_jax.models.config import ModelConfig
from smc_jax.models.paged import PagedTransformer
from smc_jax.models.params import (
    Params,
    activation_dtype,
    cast,
    cast_matmuls,
    check_float_dtype,
    is_split,
    stack_layers,
    unstack_layers,
)
from smc_jax.models.tokenizer import Tokenizer, check_prompt
from smc_jax.utils.buckets import multiple_bucket
from smc_jax.utils.compilation import jit, stored_jit

MIN_PROMPT_BUCKET = 16
#: A prompt's cache is computed over the least multiple of PREFILL_STEP columns that holds the
#: longest prompt (`prefill_columns`), not its whole bucket: the work grows with the prompt, at
#: the cost of a small program (about 0.5 s to compile on a 2-core CPU) per multiple.
PREFILL_STEP = 64
DEFAULT_PROMPT_CAPACITY = 4096

Prompt = str | Sequence[Mapping[str, str]]

# One compilation per (config, shapes); `config` is hashable and static.
forward = jit(transformer.forward, static_argnames="config")
prefill = jit(transformer.prefill, static_argnames="config")
extend = jit(transformer.extend, static_argnames="config")
decode = jit(transformer.decode, static_argnames="config")


def _prefill_many(params: Params, config: ModelConfig, padded: Int[Array, "K P"], lengths: Int[Array, " K"], read: int):
    """`transformer.prefill` of K prompts padded to one size (caches stacked on axis 0), or
    `transformer.prefill_read` of their first `read` columns where read > 0."""
    if read:
        one = lambda t, n: transformer.prefill_read(params, config, t, n, read)  # noqa: E731
    else:
        one = lambda t, n: transformer.prefill(params, config, t, n)  # noqa: E731
    return jax.vmap(one)(padded, lengths)


# Kept on disk (`stored_jit`): a new process loads the prompts' programs instead of tracing them.
prefill_many = stored_jit(_prefill_many, static_argnums=(1, 4))


@partial(jit, static_argnames="config", donate_argnames="cache")
def decode_step(
    params: Params, config: ModelConfig, prefix: PrefixCache, cache: KVCache, tokens: Int[Array, " rows"]
) -> tuple[Float[Array, "rows vocab"], KVCache]:
    """One token per row: next-token logits and the cache with the token's keys/values appended.

    The input cache is donated (its buffers are reused for the result): do not use it afterwards.
    """
    logits, k, v = transformer.decode(params, config, prefix, cache.k, cache.v, cache.length, tokens)
    return logits, cache.append(k[:, :, None], v[:, :, None])


def prefill_columns(n: int) -> int:
    """Columns the prefill reads for a longest prompt of n tokens: the least multiple of
    PREFILL_STEP >= n (the bucket's size where that is smaller).

    Parameters
    ----------
    n : int
        The longest prompt's length in tokens.
    """
    return multiple_bucket(n, PREFILL_STEP)


def prompt_bucket(length: int, capacity: int) -> int:
    """Padded prompt size: the next power of two >= length (at least MIN_PROMPT_BUCKET), at most
    `capacity`, so prompts of different lengths share a few compilations."""
    if length > capacity:
        raise CacheCapacityError(
            f"the prompt has {length} tokens but the prompt cache capacity is {capacity}; raise it with "
            f"load_model(..., prompt_capacity={1 << (length - 1).bit_length()}) or "
            f"model.with_prompt_capacity(n)"
        )
    if length < 1:
        raise ValueError("the prompt is empty: it needs at least one token (e.g. a bos token)")
    return min(max(MIN_PROMPT_BUCKET, 1 << (length - 1).bit_length()), capacity)


@dataclasses.dataclass(frozen=True, eq=False)
class LanguageModel:
    """A loaded model. `params` may be float32 or bfloat16; logits are always float32.

    Attributes
    ----------
    config : ModelConfig
        The architecture.
    params : pytree
        The weights.
    tokenizer : Tokenizer or None
        Its tokenizer.
    name : str
        A display name.
    source : str
        Where it was loaded from.
    prompt_capacity : int
        The longest prompt, in tokens.
    """

    config: ModelConfig
    params: Params
    tokenizer: Tokenizer | None
    name: str
    source: str
    prompt_capacity: int = DEFAULT_PROMPT_CAPACITY

    @property
    def dtype(self) -> Any:
        """The activations' and the KV cache's dtype (`params.activation_dtype`)."""
        return activation_dtype(self.params)

    @property
    def matmul_dtype(self) -> Any:
        """The matmul weights' dtype: the products' inputs (float32 accumulation)."""
        return self.params["embed"].dtype

    def _tok(self) -> Tokenizer:
        if self.tokenizer is None:
            raise ValueError(f"{self.name} was loaded without a tokenizer (none found in {self.source})")
        return self.tokenizer

    def astype(self, dtype: Any) -> LanguageModel:
        """The same model with params cast to `dtype` (e.g. jnp.bfloat16)."""
        return dataclasses.replace(self, params=cast(self.params, dtype))

    def with_matmul_dtype(self, dtype: Any) -> LanguageModel:
        """The same model with its matmul weights (kernels, embeddings, head) in `dtype` and the
        rest as it is (`params.cast_matmuls`): jnp.bfloat16 under float32 activations reads half
        the bytes per call and multiplies natively on XLA:CPU, at bfloat16's rounding of the
        weights and of each product's inputs (docs/benchmarks.md measures both)."""
        return dataclasses.replace(self, params=cast_matmuls(self.params, check_float_dtype(dtype, "matmul_dtype")))

    def paged(self) -> PagedTransformer:
        """The model behind the paged-model interface the samplers call (`models.contexts`).

        Returns
        -------
        PagedTransformer
            This model's params and config, paged.
        """
        return PagedTransformer(params=self.params, config=self.config)

    def prefill_batch(
        self, padded: Int[Array, "prompts tokens"], lengths: Int[Array, " prompts"], read: int = 0
    ) -> tuple[PrefixCache, Float[Array, "prompts vocab"]]:
        """Prompt caches of K right-padded prompts (stacked on axis 0) and their next-token logits.

        Parameters
        ----------
        padded : int array [K, P]
            The prompts, right-padded to one bucket size.
        lengths : int array [K]
            Their real lengths.
        read : int
            Compute only the first `read` columns (at least the longest length; static), the
            caches still P slots wide (`transformer.prefill_read`); 0: all P.
        """
        return prefill_many(self.params, self.config, padded, lengths, read)

    def with_prompt_capacity(self, capacity: int) -> LanguageModel:
        return dataclasses.replace(self, prompt_capacity=capacity)

    @property
    def split_layers(self) -> bool:
        return is_split(self.params)

    def with_split_layers(self, split: bool = True) -> LanguageModel:
        """The same model with each layer's weights in their own buffers (the layer scan switches
        between them: no per-layer weight copies, a faster forward on CPU) or stacked on a leading
        layer axis (the scan slices them)."""
        params = unstack_layers(self.params) if split else stack_layers(self.params)
        return dataclasses.replace(self, params=params)

    def encode_prompt(self, prompt: Prompt, add_special_tokens: bool = True) -> list[int]:
        """Raw text -> ids (tokenizer's default special tokens); chat messages -> ids of the chat
        template rendering with a generation prompt. Raises `InvalidPromptError` for a prompt
        that is not text (e.g. a lone surrogate)."""
        check_prompt(prompt)
        if isinstance(prompt, str):
            return self._tok().encode(prompt, add_special_tokens=add_special_tokens)
        return self._tok().apply_chat_template(prompt, add_generation_prompt=True)

    def forward(
        self,
        tokens: Int[Array, "batch tokens"],
        positions: Int[Array, "batch tokens"] | None = None,
        mask: Bool[Array, "batch tokens"] | None = None,
    ) -> Float[Array, "batch tokens vocab"]:
        """Full forward pass (see `transformer.forward`); defaults: positions 0.., all valid."""
        tokens = jnp.asarray(tokens, jnp.int32)
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
        if mask is None:
            mask = jnp.ones(tokens.shape, bool)
        return forward(self.params, self.config, tokens, positions, mask)

    def prefill(self, ids: Sequence[int]) -> tuple[PrefixCache, Float[Array, " vocab"]]:
        """Cache of one prompt (padded to a bucket size) and the logits of the first new token."""
        padded = np.zeros(prompt_bucket(len(ids), self.prompt_capacity), np.int32)
        padded[: len(ids)] = ids
        return prefill(self.params, self.config, jnp.asarray(padded), jnp.asarray(len(ids), jnp.int32))

    def extend(
        self,
        prefix: PrefixCache,
        suffix_k: Array,
        suffix_v: Array,
        suffix_len: Int[Array, " rows"],
        tokens: Int[Array, "rows new"],
    ) -> tuple[Float[Array, "rows new vocab"], Array, Array]:
        """See `transformer.extend`."""
        return extend(self.params, self.config, prefix, suffix_k, suffix_v, suffix_len, tokens)

    def decode(
        self,
        prefix: PrefixCache,
        suffix_k: Array,
        suffix_v: Array,
        suffix_len: Int[Array, " rows"],
        tokens: Int[Array, " rows"],
    ) -> tuple[Float[Array, "rows vocab"], Array, Array]:
        """See `transformer.decode`."""
        return decode(self.params, self.config, prefix, suffix_k, suffix_v, suffix_len, tokens)

    def new_cache(self, rows: int, capacity: int) -> KVCache:
        """An empty continuation cache in the params dtype."""
        return KVCache.init(self.config, rows, capacity, self.dtype)

    def greedy(self, prompt: Prompt, max_new_tokens: int, stop_at_eos: bool = True) -> list[int]:
        """Greedy (argmax) continuation ids of `prompt`; stops after an eos token if asked."""
        ids = self.encode_prompt(prompt)
        if self.config.learned_positions and len(ids) + max_new_tokens > self.config.max_positions:
            raise CacheCapacityError(
                f"{len(ids)} prompt + {max_new_tokens} new tokens exceed the {self.config.max_positions} "
                "learned positions of this model"
            )
        prefix, logits = self.prefill(ids)
        cache = self.new_cache(rows=1, capacity=max_new_tokens)
        eos = set(self.tokenizer.eos_token_ids) if (stop_at_eos and self.tokenizer) else set()
        out: list[int] = []
        for _ in range(max_new_tokens):
            token = int(jnp.argmax(logits))
            out.append(token)
            if token in eos or len(out) == max_new_tokens:
                break
            step_logits, cache = decode_step(
                self.params, self.config, prefix, cache, jnp.asarray([token], jnp.int32)
            )
            logits = step_logits[0]
        return out

    def __repr__(self) -> str:
        return (
            f"LanguageModel({self.name!r}, {self.config.architecture}, layers={self.config.num_layers}, "
            f"hidden={self.config.hidden_size}, vocab={self.config.vocab_size}, dtype={self.dtype}, "
            f"source={self.source!r})"
        )


def prefill_prompts(
    model: LanguageModel,
    prompts: Sequence[Prompt] | Sequence[Sequence[int]],
    max_new_tokens: int,
    token_ids: bool = False,
    bucket: Callable[[int], int] | None = None,
    columns: Callable[[int], int] = prefill_columns,
):
    """Prompt caches of K prompts padded to one bucket size, stacked, and their next-token logits
    (prompts are text or chat messages, or token ids when `token_ids`).

    Parameters
    ----------
    model : LanguageModel
        The model the prompts are read by.
    prompts : sequence of prompts, or of token id sequences
        K prompts.
    max_new_tokens : int
        Tokens each prompt's continuation may add (sets the bucket).
    token_ids : bool
        The prompts are token ids already.
    bucket : callable, optional
        Padded size of a prompt of n tokens (default: `prompt_bucket`, within the model's
        prompt capacity).
    columns : callable
        Columns read for a longest prompt of n tokens (at least n): each cache is computed
        over that many columns, at most the bucket's size (the cache keeps the bucket's size),
        one program per distinct value.
    """
    ids = [list(p) for p in prompts] if token_ids else [model.encode_prompt(p) for p in prompts]
    for i, seq in enumerate(ids):
        if len(seq) == 0:
            raise ValueError(f"prompt {i} is empty after tokenization; give it some text")
        if model.config.learned_positions and len(seq) + max_new_tokens > model.config.max_positions:
            raise CacheCapacityError(
                f"prompt {i} ({len(seq)} tokens) plus max_length {max_new_tokens} exceeds the "
                f"{model.config.max_positions} positions of {model.name}; shorten the prompt or max_length"
            )
    size = max(prompt_bucket(len(seq), model.prompt_capacity) for seq in ids)
    if bucket is not None:
        size = min(max(size, max(bucket(len(seq)) for seq in ids)), model.prompt_capacity)
    padded = np.zeros((len(ids), size), np.int32)
    for i, seq in enumerate(ids):
        padded[i, : len(seq)] = seq
    lengths = np.asarray([len(seq) for seq in ids], np.int32)
    arrays = jax.device_put(padded), jax.device_put(lengths)  # transfers: no program per shape
    read = columns(int(lengths.max()))
    read = read if read < size else 0  # 0: the whole bucket
    return model.prefill_batch(*arrays, read=read)
