"""Paged decoding equals the contiguous-cache decode (and hence the full forward pass)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from smc_jax.models import load_model
from smc_jax.models.paged import PagedTransformer

from tiny_checkpoints import ARCHITECTURES


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_paged_decode_matches_full_forward(tiny, arch):
    """Rows with different histories stored in a shuffled pool: every step's logits equal a full
    forward pass over prompt + history + token."""
    path, _ = tiny(arch)
    model = load_model(path)
    paged = PagedTransformer(params=model.params, config=model.config)
    rng = np.random.default_rng(0)
    prompt = rng.integers(3, model.config.vocab_size, size=5).tolist()
    prefix, _ = model.prefill(prompt)
    rows, steps, slots = 3, 6, 8
    pool = paged.init_pool(32)
    free = list(rng.permutation(32))
    paths = np.zeros((rows, slots), np.int32)
    histories = [[] for _ in range(rows)]
    step = jax.jit(paged.step)
    for t in range(steps):
        tokens = rng.integers(3, model.config.vocab_size, size=rows)
        active = np.array([True, t % 2 == 0, t < 3])  # rows of different lengths
        depth = np.array([len(h) for h in histories], np.int32)
        write = np.array([free.pop() if a else 32 for a in active], np.int32)
        logits, pool = step(prefix, pool, jnp.asarray(paths), jnp.asarray(depth), jnp.asarray(tokens, jnp.int32), jnp.asarray(write))
        for r in range(rows):
            seq = prompt + histories[r] + [int(tokens[r])]
            full = model.forward(jnp.asarray([seq], jnp.int32))[0, -1]
            np.testing.assert_allclose(np.asarray(logits[r]), np.asarray(full), atol=2e-5, rtol=1e-5)
            if active[r]:
                paths[r, depth[r]] = write[r]
                histories[r].append(int(tokens[r]))
