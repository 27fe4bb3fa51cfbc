"""The problem axis: B independent SMC problems vmapped in one program (`smc_jax.smc.batch`).

A data-dependent branch (a model call's row bucket, its attention width) that differs between
problems would run under vmap as every branch followed by a select over its whole operand (the
KV pool included). Code that picks such a branch takes `shared_max` of its choice first, so all
problems take the largest one: each problem's padding grows, its valid rows are unchanged.
"""

from __future__ import annotations

import jax
from jaxtyping import Array

#: The vmap axis name of the problems of a batched run.
PROBLEMS = "problems"


def shared_max(x: Array) -> Array:
    """max of `x` over the problems when a problem axis is bound (inside a batched run), else x.

    Parameters
    ----------
    x : jax.Array
        A per-problem value (its maximum over the problems is the same for all of them).
    """
    return jax.lax.pmax(x, PROBLEMS) if in_problems() else x


def in_problems() -> bool:
    """Whether a problem axis is bound: the code is traced inside a batched run's vmap."""
    try:
        jax.lax.psum(1, PROBLEMS)
    except NameError:
        return False
    return True
