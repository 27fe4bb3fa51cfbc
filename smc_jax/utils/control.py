"""Branches that update large operands in place, and a vmap that skips batching an axis of one.

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

from smc_jax.utils.problems import in_problems

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


def map_axis(fn: Callable[..., PyTree], in_axes: int | tuple[int | None, ...] = 0, out_axes: int = 0) -> Callable[..., PyTree]:
    """`jax.vmap(fn, in_axes, out_axes)`, except that a mapped axis of size 1 calls fn on its
    one slice: batching a model's forward inside loops costs seconds of tracing and a larger
    program, and one expert per model is the common case. The values are the same. Inside a
    batched run's problem axis it is `jax.vmap`: there the slices of the context stores' pools
    made a batch of two byte-level problems 2.3x slower (23 s against 10 s a run).

    Parameters
    ----------
    fn : callable
        Arrays without the mapped axis -> a pytree of arrays.
    in_axes : int or tuple of (int or None)
        The mapped axis of every argument, or of each (None: not mapped).
    out_axes : int
        Where the mapped axis goes in every output.
    """

    def mapped(*args: PyTree) -> PyTree:
        axes = in_axes if isinstance(in_axes, tuple) else (in_axes,) * len(args)
        sizes = {x.shape[a] for arg, a in zip(args, axes) if a is not None for x in jax.tree.leaves(arg)}
        if sizes != {1} or in_problems():
            return jax.vmap(fn, in_axes=in_axes, out_axes=out_axes)(*args)
        one = [arg if a is None else jax.tree.map(lambda x, a=a: jax.lax.index_in_dim(x, 0, a, keepdims=False), arg)
               for arg, a in zip(args, axes)]
        return jax.tree.map(lambda x: jnp.expand_dims(x, out_axes), fn(*one))

    return mapped
