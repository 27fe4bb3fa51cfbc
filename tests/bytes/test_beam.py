"""The beam over tokenizations on toy token LMs, against exact sums over tokenizations."""

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from smc_jax.bytes.beam import EOS_BYTE, BeamConfig
from smc_jax.experts.byte import ByteExperts, byte_logprob
from smc_jax.bytes.trie import TokenTrie
from smc_jax.experts.toy import NGramTokenLM
from tests.helpers.expert_contract import check_expert_group

# Ambiguous vocabulary: "aba" = a|b|a = ab|a = a|ba = aba. Id 5 is EOS (no bytes).
VOCAB = [b"a", b"b", b"ab", b"ba", b"aba", None]
EOS_ID = 5
DUPLICATED = [b"a", b"b", b"ab", b"a", b"ba", None]  # ids 0 and 3 share the bytes "a"


class ExactByteLM:
    """Exact byte-level probabilities of a toy token LM by recursion over tokenizations."""

    def __init__(self, lm: NGramTokenLM, vocab, prompt, temperature=1.0):
        self.lm, self.vocab, self.prompt, self.t = lm, vocab, tuple(prompt), temperature

    @functools.lru_cache(maxsize=None)  # noqa: B019 (one reference LM per test; freed with it)
    def logp(self, ctx: tuple) -> np.ndarray:
        logits = np.asarray(self.lm.logits_of(self.prompt, list(ctx)), np.float64) / self.t
        return logits - np.logaddexp.reduce(logits)

    def prefix(self, x: bytes, ctx=()) -> float:
        """P(bytes start with x | ctx), as a natural log."""
        if not x:
            return 0.0
        terms = []
        for t, b in enumerate(self.vocab):
            if b is None:
                continue
            if b.startswith(x):
                terms.append(self.logp(ctx)[t])
            elif x.startswith(b):
                terms.append(self.logp(ctx)[t] + self.prefix(x[len(b):], ctx + (t,)))
        return float(np.logaddexp.reduce(terms)) if terms else -math.inf

    def complete(self, x: bytes, ctx=()) -> float:
        terms = [self.logp(ctx)[EOS_ID]] if not x else []
        for t, b in enumerate(self.vocab):
            if b is not None and x and x.startswith(b):
                terms.append(self.logp(ctx)[t] + self.complete(x[len(b):], ctx + (t,)))
        return float(np.logaddexp.reduce(terms)) if terms else -math.inf


def make(vocab=VOCAB, prompts=((1,),), width=16, threshold=0.0, order=3, seed=0, max_tokens=8):
    lm = NGramTokenLM.random(jax.random.key(seed), vocab_size=len(vocab), order=order)
    trie = TokenTrie.build(vocab)
    prefixes, logits = zip(*[lm.prefill(list(p)) for p in prompts])
    experts = ByteExperts(
        model=lm,
        prefixes=jnp.stack(prefixes),
        prompt_logits=jnp.stack(logits),
        trie=trie,
        allowed=jnp.ones((len(vocab),), bool),
        eos_ids=(EOS_ID,),
        beam=BeamConfig(width=width, threshold=threshold),
        max_tokens=max_tokens,
    )
    return lm, experts


STRINGS = [b"".join(s) for n in range(0, 5) for s in itertools.product([b"a", b"b"], repeat=n)]


@pytest.mark.parametrize("vocab", [VOCAB, DUPLICATED], ids=["ambiguous", "duplicates"])
def test_unpruned_beam_is_exact(vocab):
    lm, experts = make(vocab=vocab)
    exact = ExactByteLM(lm, vocab, (1,))
    for x in STRINGS:
        got = byte_logprob(experts, x)
        want_prefix, want_complete = exact.prefix(x), exact.complete(x)
        np.testing.assert_allclose(got.prefix, want_prefix, atol=2e-5, err_msg=repr(x))
        np.testing.assert_allclose(got.complete, want_complete, atol=2e-5, err_msg=repr(x))
        # the chain rule of the beam's conditionals, times P(EOS), is the exact string probability
        np.testing.assert_allclose(got.conditionals.sum(), want_prefix, atol=2e-5)
        np.testing.assert_allclose(got.conditionals.sum() + got.next_logprobs[EOS_BYTE], want_complete, atol=2e-5)
        # a distribution over 256 bytes + EOS; only 'a', 'b' and EOS can have mass
        assert abs(np.logaddexp.reduce(got.next_logprobs)) < 1e-5
        others = np.delete(got.next_logprobs, [ord("a"), ord("b"), EOS_BYTE])
        assert np.all(others == -np.inf) and not np.isnan(got.next_logprobs).any()


def test_eos_only_at_token_boundaries():
    vocab = [b"ab", b"b", b"aab", None]  # "a" alone is never a whole token
    lm, experts = make(vocab=vocab, prompts=((0,),), order=2)
    EOS = 3
    experts = experts.replace(eos_ids=(EOS,))
    assert byte_logprob(experts, b"a").next_logprobs[EOS_BYTE] == -np.inf
    assert byte_logprob(experts, b"aa").next_logprobs[EOS_BYTE] == -np.inf
    assert np.isfinite(byte_logprob(experts, b"ab").next_logprobs[EOS_BYTE])
    assert byte_logprob(experts, b"c").prefix == -np.inf  # impossible byte: -inf, never NaN


@pytest.mark.parametrize("width, threshold", [(1, 0.0), (2, 0.0), (3, 0.1), (16, 0.3)])
def test_pruned_beam_is_a_lower_bound(width, threshold):
    lm, experts = make(width=width, threshold=threshold, seed=4)
    exact = ExactByteLM(lm, VOCAB, (1,))
    for x in STRINGS:
        got = byte_logprob(experts, x)
        assert got.prefix <= exact.prefix(x) + 1e-5, x
        assert abs(np.logaddexp.reduce(got.next_logprobs)) < 1e-5 or np.all(got.next_logprobs == -np.inf)


def test_byte_experts_satisfy_the_contract():
    _, experts = make(prompts=((1,), (0, 4)), width=3, threshold=0.05)
    check_expert_group(experts, num_particles=4, steps=4)


def test_two_prompts_match_single_prompt_experts():
    """K prompts in one group (one batched call) = the prompts as separate experts."""
    _, both = make(prompts=((1,), (2, 3)), width=4, threshold=0.05)
    _, first = make(prompts=((1,),), width=4, threshold=0.05)
    _, second = make(prompts=((2, 3),), width=4, threshold=0.05)
    data = jnp.array([ord(c) for c in "abab"])
    init = jax.jit(lambda e: e.init(2))
    advance = jax.jit(lambda e, s, sym: e.advance(s, sym, jnp.ones(2, bool)))
    sb, s1, s2 = init(both), init(first), init(second)
    for byte in data:
        sym = jnp.array([byte, byte])
        np.testing.assert_allclose(both.logprobs(sb)[:, 0], first.logprobs(s1)[:, 0], atol=1e-6)
        np.testing.assert_allclose(both.logprobs(sb)[:, 1], second.logprobs(s2)[:, 0], atol=1e-6)
        sb, s1, s2 = advance(both, sb, sym), advance(first, s1, sym), advance(second, s2, sym)


@pytest.mark.parametrize("f", ["product", "mixture"])
def test_byte_smc_is_unbiased_for_the_exact_byte_ensemble(f):
    """Two prompts of a toy token LM as byte-level experts (unpruned beams): Z-hat is unbiased
    for Z = sum over byte strings of length <= L of f(p_1(x), p_2(x)) (the forced EOS at L
    targets phi restricted to those strings), p_k by exact recursion over tokenizations."""
    from smc_jax.smc.ensemble import make_ensemble
    from smc_jax.smc import SMC, run_batch

    prompts = ((1,), (2, 0))
    lm, experts = make(prompts=prompts, width=8, order=2, seed=2, max_tokens=4)
    length = 3
    ens = make_ensemble(f, 2)
    exact = [ExactByteLM(lm, VOCAB, p) for p in prompts]
    strings = [x for x in STRINGS if len(x) <= length]
    log_p = np.array([[e.complete(x) for e in exact] for x in strings])
    log_phi = np.asarray(ens.log_target(jnp.asarray(log_p, jnp.float32)))
    true_z = float(np.exp(np.logaddexp.reduce(log_phi)))
    smc = SMC(num_particles=4, max_length=length)
    states = run_batch(smc, jax.random.split(jax.random.key(0), 400), experts, ens)
    lw = np.asarray(states.log_weights, np.float64)
    z = np.exp(np.logaddexp.reduce(lw, axis=1) - math.log(4))
    se = z.std() / math.sqrt(z.size)
    assert abs(z.mean() - true_z) < 4.5 * se, (z.mean(), true_z, se)
    assert np.all(np.isin(np.asarray(states.symbols), [-1, ord("a"), ord("b")]))
    assert not np.any(np.asarray(states.expert_state.stores.overflow))


def test_prompt_read_as_bytes_sums_over_its_tokenizations():
    """GenLM's convention: start at BOS and read the prompt's bytes through the beam. With an
    unpruned beam, P(x | prompt bytes y) = P(y x) / P(y) exactly."""
    lm = NGramTokenLM.random(jax.random.key(5), vocab_size=len(VOCAB), order=3)
    bos_history, bos_logits = lm.prefill([])
    prompts = [b"ab", b"aba"]
    width = max(len(p) for p in prompts)
    padded = np.zeros((2, width), np.int32)
    for i, p in enumerate(prompts):
        padded[i, : len(p)] = list(p)
    both = ByteExperts(
        model=lm, prefixes=jnp.stack([bos_history] * 2), prompt_logits=jnp.stack([bos_logits] * 2),
        trie=TokenTrie.build(VOCAB), allowed=jnp.ones((len(VOCAB),), bool), eos_ids=(EOS_ID,),
        beam=BeamConfig(width=16), max_tokens=8, prompt_bytes=jnp.asarray(padded),
        prompt_lengths=jnp.asarray([len(p) for p in prompts], jnp.int32),
    )
    exact = ExactByteLM(lm, VOCAB, ())
    for i, y in enumerate(prompts):
        one = both.replace(
            prefixes=both.prefixes[i : i + 1], prompt_logits=both.prompt_logits[i : i + 1],
            prompt_bytes=both.prompt_bytes[i : i + 1], prompt_lengths=both.prompt_lengths[i : i + 1],
        )
        for x in [b"", b"a", b"ba", b"abb"]:
            got = byte_logprob(one, x)
            np.testing.assert_allclose(got.prefix, exact.prefix(y + x) - exact.prefix(y), atol=2e-5)
            np.testing.assert_allclose(got.complete, exact.complete(y + x) - exact.prefix(y), atol=2e-5)


def test_precomputed_start_state_changes_nothing_but_the_calls():
    """`with_start_state`: a run from the precomputed prompt state is the run that reads the
    prompt itself (same key, same particles and weights), and counts only its own model calls."""
    from smc_jax.smc.ensemble import make_ensemble
    from smc_jax.models.contexts import context_stats
    from smc_jax.smc import SMC
    from smc_jax.smc.engine import run_jitted

    lm, experts = make(prompts=((1,), (2, 0)), width=4, threshold=0.05, seed=3)
    bos_history, bos_logits = lm.prefill([])
    experts = experts.replace(  # prompts read as bytes: the start state costs model calls
        prefixes=jnp.stack([bos_history] * 2), prompt_logits=jnp.stack([bos_logits] * 2),
        prompt_bytes=jnp.asarray([[ord("a"), ord("b"), ord("a")], [ord("b"), ord("a"), 0]], jnp.int32),
        prompt_lengths=jnp.asarray([3, 2], jnp.int32),
    )
    smc, ens = SMC(num_particles=4, max_length=4), make_ensemble("product", 2)
    cached = experts.with_start_state(4)
    assert context_stats(cached.start.stores)["model_calls"] == 0
    key = jax.random.key(7)
    plain, fast = run_jitted(smc, key, experts, ens), run_jitted(smc, key, cached, ens)
    np.testing.assert_array_equal(plain.symbols, fast.symbols)
    np.testing.assert_allclose(plain.log_weights, fast.log_weights, rtol=1e-6)
    calls = lambda stores: context_stats(stores)["model_calls"]
    prompt_calls = calls(jax.jit(lambda e: e.init(4))(experts).stores)
    assert prompt_calls > 0 and calls(fast.expert_state.stores) == calls(plain.expert_state.stores) - prompt_calls
    with pytest.raises(ValueError, match="with_start_state"):
        cached.init(3)


def test_deferred_start_is_the_start_state_computed_by_the_first_step():
    """`init_deferred` leaves the prompt's next-byte distributions to the next advance (even one
    reading nothing): they are then `init`'s. A run from it (the engine's default) is the run
    from the precomputed start state, with the start's model calls (none after a token
    prompt) added."""
    from smc_jax.models.contexts import context_stats
    from smc_jax.smc import SMC
    from smc_jax.smc.engine import run_jitted
    from smc_jax.smc.ensemble import make_ensemble

    _, experts = make(prompts=((1,), (2, 0)), width=4, threshold=0.05, seed=3)
    deferred = jax.jit(lambda e: e.init_deferred(4))(experts)
    assert np.all(np.asarray(deferred.stale)) and context_stats(deferred.stores)["model_calls"] == 0
    nothing = jax.jit(lambda e, s: e.advance(s, jnp.zeros(4, jnp.int32), jnp.zeros(4, bool)))(experts, deferred)
    np.testing.assert_allclose(experts.logprobs(nothing), experts.logprobs(jax.jit(lambda e: e.init(4))(experts)), atol=1e-6)
    assert not np.any(np.asarray(nothing.stale))

    smc, ens = SMC(num_particles=4, max_length=5), make_ensemble("product", 2)
    key = jax.random.key(11)
    plain, fast = run_jitted(smc, key, experts, ens), run_jitted(smc, key, experts.with_start_state(4), ens)
    assert plain.expert_state.stale is not None and fast.expert_state.stale is None  # each ran as built
    np.testing.assert_array_equal(plain.symbols, fast.symbols)
    np.testing.assert_allclose(plain.log_weights, fast.log_weights, rtol=1e-6)
    calls = lambda state: context_stats(state.expert_state.stores)["model_calls"]
    start_calls = context_stats(jax.jit(lambda e: e.init(4))(experts).stores)["model_calls"]
    assert calls(plain) == calls(fast) + start_calls


@pytest.mark.parametrize("vocab", [VOCAB, DUPLICATED], ids=["ambiguous", "duplicates"])
def test_lookahead_saves_calls_and_changes_no_distribution(vocab):
    """A shift that calls the model also fetches what the next-byte distribution after it may
    need (`ByteExperts.lookahead`): the distributions are those of fetching only what each needs,
    bit for bit, and the byte steps that call the model twice become single calls."""
    width, threshold = 3, 0.2  # narrow, pruned beams: steps that need two calls are common
    data = np.random.default_rng(0).choice([ord("a"), ord("b")], size=(12, 10))
    runs = {}
    for lookahead in (False, True):
        _, experts = make(vocab=vocab, width=width, threshold=threshold, seed=1, max_tokens=12)
        experts = experts.replace(lookahead=lookahead)
        init, advance = jax.jit(lambda e: e.init(1)), jax.jit(lambda e, s, b: e.advance(s, b, jnp.ones(1, bool)))
        calls, logps = [], []
        for text in data:  # one particle at a time (many particles' calls would hide the pattern)
            state = init(experts)
            for byte in text:
                before = int(state.stores.calls.max())
                state = advance(experts, state, jnp.asarray([byte]))
                calls.append(int(state.stores.calls.max()) - before)
                logps.append(np.asarray(state.beams.next_logp))
        runs[lookahead] = np.array(calls), np.stack(logps)
    (calls_off, logp_off), (calls_on, logp_on) = runs[False], runs[True]
    np.testing.assert_array_equal(logp_on, logp_off)
    assert np.all(calls_on <= calls_off) and calls_on.sum() < calls_off.sum(), (calls_on, calls_off)
