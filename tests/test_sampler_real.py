"""The end-to-end API on the real embedded models (SmolLM2-135M-Instruct, Gemma 3 270M)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from smc_jax.experts.byte import byte_vocabulary
from smc_jax.models.lm import prefill_prompts
from smc_jax.sampler import EnsembleSampler, Expert, sample
from smc_jax.models import load_model
from smc_jax.models.cache import CacheCapacityError

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

PHYSICIST = "My favorite physicist is"
AUTHOR = "My favorite author is"
SIGNIFICANCE = 1e-3  # chi-square tests: reject only clear mismatches (fixed seeds: deterministic)
MIN_EXPECTED = 5  # a symbol gets its own chi-square bin when expected at least this often


@pytest.fixture(scope="module")
def smol():
    return load_model("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def gemma():
    return load_model("gemma3-270m")


def first_symbol_counts(sampler: EnsembleSampler, seeds: int) -> np.ndarray:
    firsts = []
    for seed in range(seeds):
        result = sampler(seed)
        assert result.log_Z is not None and abs(result.log_Z) < 1e-4, result.log_Z
        firsts += [seq[0] if seq else -1 for seq in result.sequences]
    return np.asarray(firsts)


def chi_square_pvalue(observed_symbols: np.ndarray, probs: dict[int, float], top: int = 6) -> float:
    """Goodness of fit of the first symbols to exact probabilities: one bin for each of the `top`
    likeliest symbols expected at least MIN_EXPECTED times, one bin for everything else."""
    n = len(observed_symbols)
    ranked = [s for s in sorted(probs, key=probs.get, reverse=True)[:top] if probs[s] * n >= MIN_EXPECTED]
    expected = np.array([probs[s] for s in ranked] + [max(0.0, 1 - sum(probs[s] for s in ranked))]) * n
    observed = np.array([(observed_symbols == s).sum() for s in ranked] + [(~np.isin(observed_symbols, ranked)).sum()])
    assert len(ranked) >= 1 and expected[-1] > 0, "too few samples for a chi-square test"
    return float(stats.chisquare(observed, expected * observed.sum() / expected.sum()).pvalue)


def test_token_level_single_expert_reproduces_the_model(smol):
    sampler = EnsembleSampler(experts=(Expert(smol, PHYSICIST),), level="token", num_particles=64, max_length=3,
                              at_max_length="truncate")
    firsts = first_symbol_counts(sampler, seeds=4)
    _, logits = prefill_prompts(smol, [PHYSICIST], 3)
    p = np.exp(np.asarray(jax.nn.log_softmax(logits[0]), np.float64))
    eos = list(smol.tokenizer.eos_token_ids)
    probs = {t: float(v) for t, v in enumerate(p) if t not in eos}
    probs[-1] = float(p[eos].sum())  # EOS as the first symbol: an empty continuation
    assert chi_square_pvalue(firsts, probs) > SIGNIFICANCE


@pytest.mark.parametrize("which", ["smol", "gemma"])
def test_byte_level_single_expert_reproduces_the_model(which, request):
    model = request.getfixturevalue(which)
    sampler = EnsembleSampler(experts=(Expert(model, PHYSICIST),), level="byte", num_particles=32, max_length=2,
                              at_max_length="truncate")
    firsts = first_symbol_counts(sampler, seeds=6)
    # Exact first-byte distribution from the next-token distribution: P(b) ∝ sum of p(t) over
    # byte tokens whose first byte is b (EOS ids: the end-of-string symbol), renormalized.
    _, logits = prefill_prompts(model, [PHYSICIST], 2)
    p = np.exp(np.asarray(jax.nn.log_softmax(logits[0]), np.float64))
    trie, allowed = byte_vocabulary(model)
    from smc_jax.bytes.vocab import token_byte_strings

    vocab = token_byte_strings(model.tokenizer.hf, vocab_size=model.config.vocab_size).byte_strings
    first = {}
    for t, b in enumerate(vocab):
        if b is not None:
            first[b[0]] = first.get(b[0], 0.0) + p[t]
    first[-1] = sum(p[i] for i in model.tokenizer.eos_token_ids)  # EOS: an empty continuation
    total = sum(first.values())
    probs = {b: v / total for b, v in first.items()}
    assert chi_square_pvalue(firsts, probs) > SIGNIFICANCE


@pytest.mark.parametrize("precision", ["float32", "bf16_matmuls"])
def test_product_weights_and_expert_logprobs_match_direct_forward_passes(smol, precision):
    """Without resampling, every weight is phi(x)/q(x); recompute both from full forward passes
    (of the same model: with bfloat16 matmuls, the cached decode path against the full forward)."""
    # bfloat16 inputs make the two paths round differently (different summation orders cross
    # different rounding boundaries): measured up to 0.035 nats over 4 tokens, so a looser check.
    atol = 2e-3
    if precision == "bf16_matmuls":
        smol, atol = smol.with_matmul_dtype(jnp.bfloat16), 0.1
    result = sample([(smol, PHYSICIST), (smol, AUTHOR)], "product", level="token", num_particles=6,
                    max_length=4, ess_threshold=0.0, at_max_length="truncate", seed=3)
    eos = list(smol.tokenizer.eos_token_ids)
    prompts = [smol.encode_prompt(PHYSICIST), smol.encode_prompt(AUTHOR)]
    for m, (seq, fin) in enumerate(zip(result.sequences, result.finished)):
        step_logp = []  # per expert: [len(seq) + 1, V + 1] conditionals with EOS merged
        for ids in prompts:
            logits = smol.forward(jnp.asarray([ids + list(seq)], jnp.int32))[0, len(ids) - 1 :]
            lp = np.asarray(jax.nn.log_softmax(logits), np.float64)
            eos_lp = np.logaddexp.reduce(lp[:, eos], axis=1)
            lp[:, eos] = -np.inf
            step_logp.append(np.concatenate([lp, eos_lp[:, None]], axis=1))
        step_logp = np.stack(step_logp)  # [K, n + 1, V + 1]
        symbols = list(seq) + ([smol.config.vocab_size] if fin else [])
        per_expert = np.array([sum(step_logp[k, t, s] for t, s in enumerate(symbols)) for k in range(2)])
        np.testing.assert_allclose(result.expert_logprobs[m], per_expert, atol=atol)
        # q(a | x) ∝ prod_k p_k(a | x)^(1/2): the product of the conditionals, renormalized
        log_local = 0.5 * step_logp.sum(0)
        log_q = sum(log_local[t, s] - np.logaddexp.reduce(log_local[t]) for t, s in enumerate(symbols))
        np.testing.assert_allclose(result.log_weights[m], 0.5 * per_expert.sum() - log_q, atol=2.5 * atol)


def test_reproducible_per_seed(smol):
    sampler = EnsembleSampler(experts=(Expert(smol, PHYSICIST), Expert(smol, AUTHOR)), level="token",
                              num_particles=6, max_length=4, at_max_length="truncate")
    a, b, c = sampler(7), sampler(7), sampler(8)
    assert a.texts == b.texts and np.array_equal(a.log_weights, b.log_weights)
    assert a.texts != c.texts or not np.array_equal(a.log_weights, c.log_weights)


def test_prefetch_settings_reach_the_byte_experts(smol):
    common = dict(experts=(Expert(smol, PHYSICIST), Expert(smol, AUTHOR)), level="byte", num_particles=3,
                  max_length=6, at_max_length="truncate", prompt_as_bytes=True, prefetch=4, prefetch_rows=4)
    default = EnsembleSampler(**common).build()
    assert (default.prefetch_slots, default.prefetch_children) == (4 * 3, 1 * 3)
    sampler = EnsembleSampler(**common, prefetch_slots=2, prefetch_children=0)
    group = sampler.build()
    assert (group.prefetch_slots, group.prefetch_children, group.cache_slots) == (6, 0, 6)
    assert group.num_contexts == default.num_contexts - (4 * 3 + 3) + 6  # the cache's contexts stay alive
    result = sampler(0)
    assert 0 < result.stats["prefetched"] and result.stats["model_calls"] > 0
    assert np.isclose(result.weights.sum(), 1)


def test_row_buckets_give_the_same_run_with_a_forward_per_bucket(smol):
    """`row_buckets` changes how a call's rows are read (a forward per bucket, not M rows at a
    time), not which contexts are created: the same strings and calls, weights to float32
    rounding (the same rows, in forwards of other sizes)."""
    common = dict(experts=(Expert(smol, PHYSICIST), Expert(smol, AUTHOR)), level="byte", num_particles=3,
                  max_length=8)
    chunked, bucketed = EnsembleSampler(**common), EnsembleSampler(**common, row_buckets=True)
    assert (chunked.build().row_chunk, bucketed.build().row_chunk) == (3, 0)
    a, b = chunked(1), bucketed(1)
    assert a.texts == b.texts and a.stats["model_calls"] == b.stats["model_calls"]
    np.testing.assert_allclose(a.log_weights, b.log_weights, rtol=0, atol=1e-4)
    with pytest.raises(ValueError, match="row_buckets"):
        EnsembleSampler(**{**common, "level": "token"}, row_buckets=True)


def test_cross_tokenizer_byte_product(smol, gemma):
    result = sample([(smol, PHYSICIST), (gemma, PHYSICIST)], "product", level="byte", num_particles=4,
                    max_length=6, at_max_length="truncate", seed=0)
    assert math.isfinite(result.log_Z)
    assert abs(result.weights.sum() - 1) < 1e-9
    assert np.all(np.isfinite(result.expert_logprobs[result.weights > 0]))
    assert all(isinstance(t, str) for t in result.texts)
    assert result.stats["model_calls"] > 0


def test_bad_input_is_rejected(smol, gemma):
    with pytest.raises(ValueError, match="at least one expert"):
        sample([], "product")
    with pytest.raises(ValueError, match="tokenize differently.*level='byte'"):
        sample([(smol, PHYSICIST), (gemma, PHYSICIST)], "product", level="token")
    with pytest.raises(ValueError, match="unknown ensemble function"):
        sample([(smol, PHYSICIST)], "average", level="token")
    with pytest.raises(CacheCapacityError, match="prompt cache capacity"):
        sample([(smol.with_prompt_capacity(16), "word " * 40)], "product", level="token", max_length=2)
    with pytest.raises(ValueError, match="unknown level"):
        sample([(smol, PHYSICIST)], "product", level="character")


def test_a_batch_of_problems_gives_each_problem_its_own_run(smol, monkeypatch):
    """Three problems (prompts in different length buckets, each with its own JSON schema) in
    batches of two: each result has its unbatched run's strings, and its weights up to float32
    rounding (the batch pads the prompts to one bucket and the model calls to one row count, so
    the same rows are computed in larger calls). The first batch's two schemas are equal but
    compiled apart: its table holds one automaton."""
    from smc_jax import constraints
    from smc_jax import sampler as sampler_module

    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    person, person_again = constraints.json_schema(schema), constraints.json_schema(schema)
    city = constraints.json_schema({"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "integer"}},
                                    "required": ["city", "zip"]})
    prompts = [["Give a person as JSON:"], ["JSON:"], ["Describe a city in JSON with its zip code, as an object with "
                                                       "two keys, the name of the city and its zip code:"]]
    schemas = [person, person_again, city]
    common = dict(level="token", num_particles=8, max_length=16, ess_threshold=0.9)
    sampler = EnsembleSampler([Expert(smol, prompts[0][0])], constraint=person, **common)
    merged, merge = [], sampler_module.merge_constraints
    monkeypatch.setattr(sampler_module, "merge_constraints", lambda experts, n: merged.append(len(experts)) or merge(experts, n))
    batched = sampler.sample_problems(prompts, seeds=[0, 1, 2], constraints=schemas, batch_size=2)
    assert merged == [1, 1]  # one automaton per batch: person (twice, compiled apart), then city
    resampled = 0
    for b, (prompt, schema) in enumerate(zip(prompts, schemas)):
        alone = EnsembleSampler([Expert(smol, prompt[0])], constraint=schema, **common)(b)
        assert batched[b].texts == alone.texts
        np.testing.assert_allclose(batched[b].log_weights, alone.log_weights, rtol=0, atol=1e-3)
        np.testing.assert_allclose(batched[b].log_Z, alone.log_Z, rtol=0, atol=1e-3)
        resampled += int(batched[b].resampled.sum())
    assert resampled > 0


def test_an_overflowing_problem_reruns_padded_to_the_mesh_rows(smol, monkeypatch):
    """A problem whose stores overflow runs again with grown capacities; on a mesh of two rows
    the rerun of that one problem is padded to two, and its result lands at its own index, equal
    to its first run (capacities change no result; its batch-mate differs, so the weights agree
    to float32 rounding of the larger calls, as in the batched runs above)."""
    import types

    from smc_jax import sampler as sampler_module
    from smc_jax.models.contexts import ContextStoreOverflowError
    from smc_jax.smc.sharding import PARTICLES
    from smc_jax.utils.problems import PROBLEMS

    real, sizes, first = sampler_module.sample_problems, [], {}

    def overflow_the_last_once(smc, keys, groups, ensemble, mesh=None, **options):
        sizes.append(len(groups))
        results = real(smc, keys, groups, ensemble, **options)  # one device here: the mesh only sets the padding
        if len(sizes) == 1:
            first.update(enumerate(results))
            results = results[:-1] + [ContextStoreOverflowError("forced by the test")]
        return results

    monkeypatch.setattr(sampler_module, "sample_problems", overflow_the_last_once)
    two_rows = types.SimpleNamespace(shape={PROBLEMS: 2, PARTICLES: 1}, axis_names=(PROBLEMS, PARTICLES))
    sampler = EnsembleSampler([Expert(smol, PHYSICIST)], level="token", num_particles=4, max_length=4)
    got = sampler.sample_problems([[PHYSICIST], ["My favorite author is"]], seeds=[0, 1], batch_size=2, mesh=two_rows)
    assert sizes == [2, 2]  # the rerun of one problem, padded to the mesh's two rows
    for b in (0, 1):
        assert got[b].texts == first[b].texts
        np.testing.assert_allclose(got[b].log_weights, first[b].log_weights, rtol=0, atol=1e-4)


def test_a_byte_level_sweep_of_prune_threshold_max_length_and_mode_compiles_nothing(smol):
    """The prune threshold is a run-time value of the byte experts, max_length one within its
    bucket (the arrays are 16 wide for 6 and 8) and at_max_length a run-time flag: new samplers
    with any of them reuse the programs."""
    from smc_jax.utils.compilation import count_compilations

    common = dict(level="byte", num_particles=4, ess_threshold=0.9)
    EnsembleSampler([Expert(smol, PHYSICIST)], max_length=8, **common)(0)
    with count_compilations() as compiled:
        pruned = EnsembleSampler([Expert(smol, PHYSICIST)], max_length=8, prune_threshold=0.2, **common)(1)
        shorter = EnsembleSampler([Expert(smol, PHYSICIST)], max_length=6, **common)(2)
        cut = EnsembleSampler([Expert(smol, PHYSICIST)], max_length=6, at_max_length="truncate", **common)(2)
    assert compiled.count == 0
    assert pruned.symbols.shape == (4, 8) and shorter.symbols.shape == cut.symbols.shape == (4, 6)
    assert shorter.lengths.max() <= 6 and shorter.finished.any()  # strings end by 6 bytes (forced EOS)
    # Truncated, no particle reads the forced EOS: those at the limit stop unfinished.
    assert not cut.finished[cut.lengths == 6].any() and (cut.lengths == 6).any()
