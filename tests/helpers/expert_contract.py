"""Reusable checks of the expert interface contract (smc_jax.experts.base), for any group."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from smc_jax.experts.base import ExpertGroup, eos_symbol, expert_failure


def check_expert_group(group: ExpertGroup, num_particles: int = 5, steps: int = 4, seed: int = 0, atol: float = 1e-5):
    """Walks random strings through the group and checks, at every step:
    shapes; each next-symbol row is a distribution (or entirely -inf, for an unreachable
    prefix); `advance` leaves inactive particles unchanged; `reorder` commutes with logprobs."""
    rng = np.random.default_rng(seed)
    m, k, a = num_particles, group.num_experts, group.alphabet_size
    init = jax.jit(lambda g: g.init(m))
    logprobs = jax.jit(lambda g, s: g.logprobs(s))
    advance = jax.jit(lambda g, s, sym, act: g.advance(s, sym, act))
    reorder = jax.jit(lambda g, s, idx: g.reorder(s, idx))
    state = init(group)
    for _ in range(steps):
        logp = np.asarray(logprobs(group, state), np.float64)
        assert logp.shape == (m, k, a + 1), logp.shape
        assert not np.isnan(logp).any(), "NaN in next-symbol log-probabilities"
        if getattr(group, "is_potential", False):
            # A 0/1 potential: every entry is log 1 or log 0 (see smc_jax.experts.base).
            assert np.all((logp == 0.0) | np.isneginf(logp)), "a constraint's entries must be 0 or -inf"
        else:
            lse = np.logaddexp.reduce(logp, axis=-1)
            ok = np.isclose(lse, 0.0, atol=atol) | np.isneginf(lse)
            assert ok.all(), f"rows do not normalize: logsumexp = {lse[~ok]}"
        # Sample a symbol every particle's first expert allows (or any symbol).
        p = np.exp(logp[:, 0, :a])
        syms = np.array([rng.choice(a, p=row / row.sum()) if row.sum() > 0 else rng.integers(a) for row in p])
        active = rng.random(m) < 0.7
        new_state = advance(group, state, jnp.asarray(syms, jnp.int32), jnp.asarray(active))
        new_logp = np.asarray(logprobs(group, new_state), np.float64)
        np.testing.assert_allclose(new_logp[~active], logp[~active], atol=atol)
        perm = jnp.asarray(rng.permutation(m), jnp.int32)
        reordered = np.asarray(logprobs(group, reorder(group, new_state, perm)), np.float64)
        np.testing.assert_allclose(reordered, new_logp[np.asarray(perm)], atol=atol)
        state = new_state
    assert eos_symbol(a) == a
    assert expert_failure(group, state) is None
