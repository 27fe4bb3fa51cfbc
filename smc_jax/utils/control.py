"""Branches that update large operands in place.

Why not `lax.cond` / `lax.switch`: XLA gives a conditional's result buffers of its own, so every
branch, the pass-through one included, copies what it returns (a KV pool and every context's
sum tree: hundreds of MB per call on CPU, even where nothing changes). Even branches that only
read the stores cost copies inside a loop that then updates them: as a `lax.switch`, the byte
step's branches made scoring 1.7x slower. A while loop updates its carry in place, so a branch
written as a loop that runs at most once costs nothing when skipped.
The index or predicate must be the same for every problem of a batch (`shared_max`): a batched
one would make the loop select its whole carry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

PyTree = Any


def in_place_cond(pred: Bool[Array, ""], fn: Callable[[PyTree], PyTree], operand: PyTree) -> PyTree:
    """fn(operand) if pred else operand, as a while loop that runs its body at most once.

    Parameters
    ----------
    pred : jax.Array, shape [], bool
        Whether to apply `fn`.
    fn : callable
        operand -> a pytree of the same structure, shapes and dtypes.
    operand : pytree
        The carry (large buffers included: they are updated in place).
    """

    def body(carry: tuple[Bool[Array, ""], PyTree]) -> tuple[Bool[Array, ""], PyTree]:
        return jnp.zeros((), bool), fn(carry[1])

    return jax.lax.while_loop(lambda carry: carry[0], body, (pred, operand))[1]


def in_place_switch(index: Int[Array, ""], branches: Sequence[Callable[[PyTree], PyTree]], operand: PyTree) -> PyTree:
    """branches[index](operand) (operand unchanged for an index out of range), one
    `in_place_cond` per branch: only the chosen one runs."""
    for j, fn in enumerate(branches):
        operand = in_place_cond(index == j, fn, operand)
    return operand
