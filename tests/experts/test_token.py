"""Token-level experts over a paged token LM (the toy n-gram LM stands in for a transformer)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.expert_contract import check_expert_group
from smc_jax.smc.ensemble import make_ensemble
from smc_jax.smc.exact import exact_target
from smc_jax.experts.toy import NGramTokenLM
from smc_jax.experts.token import TokenExperts, token_logprobs
from smc_jax.smc import SMC, run_batch

V, EOS_ID = 4, 3  # token 3 is the model's end-of-sequence token
PROMPTS = [[0, 1], [2]]


def make_experts(order=3, max_tokens=4, seed=0, prompts=PROMPTS):
    lm = NGramTokenLM.random(jax.random.key(seed), vocab_size=V, order=order)
    prefixes, logits = zip(*[lm.prefill(p) for p in prompts])
    return lm, TokenExperts(
        model=lm, prefixes=jnp.stack(prefixes), prompt_logits=jnp.stack(logits), eos_ids=(EOS_ID,), max_tokens=max_tokens
    )


def test_token_logprobs_merge_eos():
    logits = jnp.array([[0.0, 1.0, 2.0, 3.0]])
    lp = np.asarray(token_logprobs(logits, (1, 3)))
    p = np.exp(np.array([0.0, 1.0, 2.0, 3.0]))
    p /= p.sum()
    np.testing.assert_allclose(np.exp(lp[0]), [p[0], 0, p[2], 0, p[1] + p[3]], rtol=1e-6)


def test_contract_and_direct_logprobs():
    lm, experts = make_experts()
    check_expert_group(experts, num_particles=6, steps=3)
    # walk explicit token lists and compare with the LM computed directly
    state = experts.init(3)
    seqs = [[0, 1, 2], [2, 2, 0], [1, 0, 0]]
    for t in range(3):
        lp = np.asarray(experts.logprobs(state))
        for m, seq in enumerate(seqs):
            for k, prompt in enumerate(PROMPTS):
                want = np.asarray(token_logprobs(jnp.asarray(lm.logits_of(prompt, seq[:t])), (EOS_ID,)))
                np.testing.assert_allclose(lp[m, k], want, rtol=1e-5, atol=1e-6)
        state = experts.advance(state, jnp.array([s[t] for s in seqs]), jnp.ones(3, bool))


@pytest.mark.parametrize("f", ["product", "min", "mixture"])
def test_token_smc_is_unbiased(f):
    _, experts = make_experts(order=2, max_tokens=3, seed=1)
    ens = make_ensemble(f, 2)
    exact = exact_target(experts, ens, max_length=3)
    smc = SMC(num_particles=4, max_length=3)
    states = run_batch(smc, jax.random.split(jax.random.key(0), 1500), experts, ens)
    lw = np.asarray(states.log_weights, np.float64)
    z = np.exp(np.logaddexp.reduce(lw, axis=1) - math.log(4))
    se = z.std() / math.sqrt(z.size)
    assert abs(z.mean() - math.exp(exact.log_Z)) < 4.5 * se, (z.mean(), math.exp(exact.log_Z), se)
    assert not np.any(np.asarray(states.expert_state.stores.overflow))


def test_single_prompt_truncated_log_z_is_zero():
    _, experts = make_experts(prompts=[[1]], max_tokens=5)
    res = SMC(num_particles=8, max_length=5, at_max_length="truncate")(jax.random.key(3), experts, make_ensemble("product", 1))
    np.testing.assert_allclose(res.log_Z, 0.0, atol=1e-5)


def test_truncated_run_makes_no_call_after_its_last_symbol():
    """At the length limit in truncate mode nothing reads the experts again, so the last step
    makes no model call: with no EOS mass (compare_genlm's equal-work token target) L tokens
    take L - 1 calls (the first distribution is the prompt's), with the samples and weights of
    a run that calls there (a limit one longer: its first L steps are the same computation)."""
    from benchmarks.compare_genlm import PrefixProduct

    _, experts = make_experts(prompts=[[1]], max_tokens=6)
    target = PrefixProduct(num_experts=1)
    run = lambda length: SMC(num_particles=4, max_length=length, at_max_length="truncate", ess_threshold=0.0)(
        jax.random.key(3), experts, target)
    res, longer = run(5), run(6)
    assert (np.asarray(res.lengths) == 5).all()
    assert res.stats["model_calls"] == 4 and longer.stats["model_calls"] == 5, (res.stats, longer.stats)
    np.testing.assert_array_equal(np.asarray(longer.symbols)[:, :5], np.asarray(res.symbols))
    np.testing.assert_array_equal(np.asarray(longer.log_weight_trace)[4], np.asarray(res.log_weights))
