"""`smc_jax.logprob` / `logprob_batch` on SmolLM2: compiled programs reused across pairs,
batched values equal to single ones, healing on real text."""

from __future__ import annotations

import numpy as np
import pytest

from smc_jax import logprob, logprob_batch
from smc_jax.sampler import EnsembleSampler, Expert
from smc_jax.models import load_model
from smc_jax.utils.compilation import count_compilations

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

PAIRS = [("The capital of France is", " Paris, a city"), ("def f(x):", "\n    return x + 1"), ("Hi", " wörld ünïcode")]


@pytest.fixture(scope="module")
def smol():
    return load_model("smollm2-135m-instruct")


def test_logprob_reuses_programs_and_batches_agree(smol):
    single = [logprob(smol, c, prompt=p) for p, c in PAIRS]
    with count_compilations() as compiles:  # other prompts and continuations, same buckets
        again = [logprob(smol, c + "!", prompt=p + " ok") for p, c in PAIRS]
    assert compiles.count == 0
    assert all(np.isfinite(r.prefix) and np.all(np.isfinite(r.conditionals)) for r in single + again)
    batch = logprob_batch(smol, PAIRS, batch_size=4)
    for a, b in zip(single, batch):
        np.testing.assert_allclose(a.conditionals, b.conditionals, atol=1e-4)
        np.testing.assert_allclose(a.prefix, b.prefix, atol=1e-3)
    # the sampler's own teacher forcing (another program, same beam) agrees
    sampler = EnsembleSampler(experts=(Expert(smol, PAIRS[0][0]),), level="byte", num_particles=1, max_length=16)
    np.testing.assert_allclose(sampler.logprob(PAIRS[0][1]).prefix, single[0].prefix, atol=1e-3)
