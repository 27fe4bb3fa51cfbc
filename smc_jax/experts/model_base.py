"""What the model-backed experts share: one `PagedModel` under K prompts, each prompt with a
`ContextStore` of the token contexts its particles reach.

`TokenExperts` (symbols are tokens) and `ByteExperts` (symbols are bytes, through beams over
tokenizations) differ in what a context's logits become (`_summarize`) and in how particles
move; their fields for the model and prompts, the stores' set-up, statistics and failure check
live here once.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from flax import struct
from jaxtyping import Array, Float

from smc_jax.models.contexts import (
    ContextStore,
    ContextStoreOverflowError,
    PagedModel,
    Recycled,
    context_stats,
    init_store,
    store_failure,
)

PyTree = Any


# kw_only: the subclasses add fields without defaults after these (all experts are built with
# keywords), and a dataclass may not put those after the defaults below otherwise.
@struct.dataclass(kw_only=True)
class ModelExperts:
    """K experts = one `PagedModel` under K prompts (prefix states stacked on axis 0).

    Parameters
    ----------
    model : PagedModel
        The model, with its parameters (shared by the K prompts).
    prefixes : pytree
        The K prompts' prefix states (leaves [K, ...]).
    prompt_logits : array [K, V]
        The next-token logits after each prompt.
    eos_ids : tuple of int
        The model's end-of-sequence token ids (their mass is EOS's).
    max_tokens : int
        The most tokens a continuation may hold.
    temperature : float or array []
        Logits are divided by it (a run-time value: a new temperature reuses the program).
    num_entries : int, optional
        Pool entries of each store; None: the worst case (see `capacity`).
    """

    model: PagedModel
    prefixes: PyTree
    prompt_logits: Float[Array, "K V"]
    eos_ids: tuple[int, ...] = struct.field(pytree_node=False)
    max_tokens: int = struct.field(pytree_node=False)
    temperature: Float[Array, ""] = np.float32(1.0)
    num_entries: int | None = struct.field(pytree_node=False, default=None)  # None: the worst case

    @property
    def num_experts(self) -> int:
        return int(self.prompt_logits.shape[0])

    def _summarize(self, logits: Float[Array, "U V"]) -> Any:
        """What a context keeps of its logits (a subclass's next-symbol table)."""
        raise NotImplementedError

    def capacity(self, num_particles: int) -> tuple[int, int]:
        """(pool entries, contexts) of each store for `num_particles` particles."""
        raise NotImplementedError

    def init_stores(self, num_particles: int, recycle: Recycled | None = None) -> ContextStore:
        """The K prompts' stores (stacked on axis 0), each holding its prompt's context; with
        `recycle` (leaves [K, ...]), on the buffers of spent stores of the same sizes (`init_store`)."""
        num_entries, num_contexts = self.capacity(num_particles)
        return jax.vmap(lambda s, r: init_store(self.model, s, num_entries, num_contexts, self.max_tokens, r))(
            self._summarize(self.prompt_logits), recycle
        )

    def stats(self, state) -> dict[str, int]:
        """Host-side: model calls made, rows computed (padding included) and rows needed."""
        return context_stats(state.stores)

    def failure(self, state) -> ContextStoreOverflowError | None:
        """Host-side: the error to raise when a store ran out of room, else None."""
        return store_failure(state.stores)
