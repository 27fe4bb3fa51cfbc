"""Teacher forcing: the experts' log-probabilities of given strings, through the expert interface.

For a batch of N strings x (padded to T symbols) one `lax.scan` over positions t = 0..T feeds
x_t (EOS at t = |x|) to `advance` and records `logprobs`, giving

    step_logprobs[n, t, k, a] = log p_k(a | x_<t)        for t <= |x_n| (frozen state after it)
    string_logprobs[n, k]     = sum_{t < |x|} log p_k(x_t | x_<t) + log p_k(EOS | x) = log p_k(x)

The strings' symbols are inputs, so nothing here depends on an ensemble: these are the constants
that learning (smc_jax.smc.learn) and scoring reuse. Everything is pure and jittable.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from smc_jax.experts.base import PAD_SYMBOL, ExpertGroup, eos_symbol, expert_heal_eos


class Scores(NamedTuple):
    """Teacher-forced log-probabilities of N strings of at most T symbols under K experts.

    Attributes
    ----------
    step_logprobs : jax.Array, shape [N, T + 1, K, A + 1], or None
        log p_k(a | x_<t) at every step (None when not kept).
    string_logprobs : jax.Array, shape [N, K]
        log p_k(x), EOS included.
    """

    step_logprobs: Float[Array, "N T1 K A1"] | None  # log p_k(a | x_<t), t = 0..T; None if not kept
    string_logprobs: Float[Array, "N K"]  # log p_k(x), EOS included


def pad_sequences(
    sequences: Sequence[Sequence[int]], alphabet_size: int, width: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Host side: integer strings -> (symbols [N, T] padded with PAD_SYMBOL, lengths [N]).

    T is the longest length (or `width`). Symbols must lie in 0..A-1 (EOS is implicit).

    Parameters
    ----------
    sequences : sequence of sequences of int
        N strings.
    alphabet_size : int
        A.
    width : int, optional
        T (at least the longest length).
    """
    seqs = [np.asarray(s, np.int64).reshape(-1) for s in sequences]
    lengths = np.array([s.size for s in seqs], np.int32)
    longest = int(lengths.max(initial=0))
    width = longest if width is None else width
    if width < longest:
        raise ValueError(f"width {width} is shorter than the longest sequence ({longest} symbols)")
    for i, s in enumerate(seqs):
        if s.size and (s.min() < 0 or s.max() >= alphabet_size):
            raise ValueError(f"sequence {i} ({s.tolist()}) has symbols outside 0..{alphabet_size - 1}")
    padded = np.full((len(seqs), width), PAD_SYMBOL, np.int32)
    for i, s in enumerate(seqs):
        padded[i, : s.size] = s
    return padded, lengths


def target_symbols(
    sequences: Int[Array, "N T"], lengths: Int[Array, "N"], alphabet_size: int
) -> Int[Array, "N T1"]:
    """The symbol emitted at each step t = 0..T: x_t for ``t < |x|``, EOS from ``t = |x|`` on.

    Parameters
    ----------
    sequences : jax.Array, shape [N, T]
        Padded strings.
    lengths : jax.Array, shape [N]
        Their lengths.
    alphabet_size : int
        A (EOS is A).

    Returns
    -------
    jax.Array, shape [N, T + 1]
    """
    n, width = sequences.shape
    padded = jnp.concatenate([sequences, jnp.zeros((n, 1), sequences.dtype)], axis=1)
    here = jnp.arange(width + 1)[None, :] < lengths[:, None]
    return jnp.where(here, padded, eos_symbol(alphabet_size)).astype(jnp.int32)


@partial(jax.jit, static_argnames="keep_steps")
def teacher_force(
    experts: ExpertGroup, sequences: Int[Array, "N T"], lengths: Int[Array, "N"], keep_steps: bool = True
) -> Scores:
    """Walks N padded strings through `init` / `logprobs` / `advance` in one `lax.scan`.

    Returns the per-step next-symbol log-probabilities (if `keep_steps`) and log p_k(x).
    """
    n = sequences.shape[0]
    symbols = target_symbols(sequences, lengths, experts.alphabet_size)  # [N, T+1]

    def body(state, inputs):
        t, sym = inputs
        state = expert_heal_eos(experts, state, t == lengths)  # each string's EOS must be read
        logp = experts.logprobs(state).astype(jnp.float32)  # [N, K, A+1]
        picked = jnp.take_along_axis(logp, sym[:, None, None], axis=2)[..., 0]  # [N, K]
        picked = jnp.where((t <= lengths)[:, None], picked, 0.0)
        state = experts.advance(state, sym, t < lengths)
        return state, (logp if keep_steps else None, picked)

    steps = jnp.arange(symbols.shape[1])
    _, (logps, picked) = jax.lax.scan(body, experts.init(n), (steps, symbols.T))
    step_logprobs = jnp.moveaxis(logps, 0, 1) if keep_steps else None
    return Scores(step_logprobs=step_logprobs, string_logprobs=jnp.sum(picked, axis=0))


def sequence_logprobs(
    experts: ExpertGroup, sequences: Int[Array, "N T"], lengths: Int[Array, "N"]
) -> Float[Array, "N K"]:
    """log p_k(x) of each padded string under each expert (EOS included), jitted.

    Parameters
    ----------
    experts : ExpertGroup
        K experts.
    sequences : jax.Array, shape [N, T]
        Strings padded with PAD_SYMBOL.
    lengths : jax.Array, shape [N]
        Their lengths.

    Returns
    -------
    jax.Array, shape [N, K]
    """
    return teacher_force(experts, sequences, lengths, keep_steps=False).string_logprobs
