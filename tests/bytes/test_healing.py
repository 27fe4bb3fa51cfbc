"""Token healing (`smc_jax.bytes.healing`) on toy token LMs, against exact sums over tokenizations."""

import collections
import itertools

import numpy as np
import jax
import jax.numpy as jnp
import pytest

from benchmarks.compile_profile import count_parts
from smc_jax.bytes.beam import EOS_BYTE, BeamConfig
from smc_jax import scoring
from smc_jax.experts.byte import byte_logprob
from tests.bytes.test_beam import ExactByteLM, make

# Long tokens that a narrow beam commits to and then cannot continue: "abc" vs a|bd, "cab" vs c|ad.
VOCAB = [b"a", b"b", b"c", b"d", b"abc", b"bd", b"cab", b"ad", None]
EOS_ID = 8
STRINGS = [b"".join(s) for n in range(1, 5) for s in itertools.product([b"a", b"b", b"c", b"d"], repeat=n)]


def _make(width, threshold, heal=True, seed=0):
    lm, experts = make(vocab=VOCAB, width=width, threshold=threshold, seed=seed, order=2, max_tokens=8)
    experts = experts.replace(eos_ids=(EOS_ID,), beam=BeamConfig(width=width, threshold=threshold, heal=heal))
    return lm, experts


class _Exact(ExactByteLM):
    def complete(self, x, ctx=()):  # EOS is id 8 here
        terms = [self.logp(ctx)[EOS_ID]] if not x else []
        for t, b in enumerate(self.vocab):
            if b is not None and x and x.startswith(b):
                terms.append(self.logp(ctx)[t] + self.complete(x[len(b):], ctx + (t,)))
        return float(np.logaddexp.reduce(terms)) if terms else -np.inf


@pytest.mark.parametrize("width, threshold", [(1, 0.0), (2, 0.6)])
def test_healing_gives_every_string_positive_probability_below_the_exact_one(width, threshold):
    """Every string has a tokenization (single bytes), so with healing each gets a finite
    prefix, per-byte log-probability and complete-string probability (EOS healed where the
    beam gave it 0) under any width and threshold, and never more than the exact sum over
    tokenizations."""
    lm, experts = _make(width, threshold, seed=1)
    exact = _Exact(lm, VOCAB, (1,))
    healed = 0
    for x in STRINGS:
        got = byte_logprob(experts, x)
        assert np.isfinite(got.prefix), x
        assert np.all(np.isfinite(got.conditionals)) and np.all(got.conditionals <= 0), (x, got.conditionals)
        assert got.prefix <= exact.prefix(x) + 1e-5, x
        assert np.isfinite(got.complete), x
        assert got.complete <= exact.complete(x) + 1e-5, x
        assert got.next_logprobs[EOS_BYTE] <= 0 and abs(np.logaddexp.reduce(got.next_logprobs)) < 1e-5, x
        assert not np.isnan(got.next_logprobs).any()
        healed += got.healed
    assert healed > 0  # the back-off path ran


def test_without_healing_the_same_beam_loses_strings():
    lm, experts = _make(1, 0.0, heal=False, seed=1)
    lost = sum(not np.isfinite(byte_logprob(experts, x).prefix) for x in STRINGS)
    assert lost > 0


def test_eos_healing_changes_only_an_impossible_end():
    """A threshold drops the extensions EOS needs (a token boundary), so a beam that reads a
    string's bytes can still give EOS probability 0. `heal_eos` then gives EOS a finite
    probability, keeps the prefix mass and the bytes' relative probabilities, and the string's
    probability stays at most the exact one; it changes nothing where EOS is possible or where
    EOS is not forced."""
    lm, experts = _make(2, 0.3, seed=1)
    exact = _Exact(lm, VOCAB, (1,))
    start = jax.jit(lambda e: e.init(1))(experts)
    read = jax.jit(lambda e, s, b: e.advance(s, b, jnp.ones((1,), bool)))
    heal = jax.jit(lambda e, s, forced: e.heal_eos(s, forced))
    yes, no = jnp.ones((1,), bool), jnp.zeros((1,), bool)
    healed = possible = 0
    for x in STRINGS:
        state = start
        for b in x:
            state = read(experts, state, jnp.asarray([b], jnp.int32))
        before = jax.tree.map(np.asarray, state.beams)
        if not np.isfinite(before.log_mass[0, 0]):
            continue  # emptied by a byte without a tokenization in reach: byte healing's case
        unforced = jax.tree.map(np.asarray, heal(experts, state, no).beams)
        np.testing.assert_array_equal(unforced.next_logp, before.next_logp)
        after = jax.tree.map(np.asarray, heal(experts, state, yes).beams)
        np.testing.assert_array_equal(after.log_mass, before.log_mass)
        eos_before, eos_after = before.next_logp[0, 0, EOS_BYTE], after.next_logp[0, 0, EOS_BYTE]
        if np.isfinite(eos_before):
            possible += 1
            np.testing.assert_array_equal(after.next_logp, before.next_logp)
            assert after.heals[0, 0] == before.heals[0, 0]
            continue
        healed += 1
        assert np.isfinite(eos_after) and after.heals[0, 0] == before.heals[0, 0] + 1, x
        finite = np.isfinite(before.next_logp[0, 0, :EOS_BYTE])
        np.testing.assert_array_equal(np.isfinite(after.next_logp[0, 0, :EOS_BYTE]), finite)
        shift = after.next_logp[0, 0, :EOS_BYTE][finite] - before.next_logp[0, 0, :EOS_BYTE][finite]
        np.testing.assert_allclose(shift, shift[0], atol=1e-5)  # renormalized only
        assert abs(np.logaddexp.reduce(after.next_logp[0, 0])) < 1e-5
        start_mass = float(np.asarray(start.beams.log_mass)[0, 0])
        complete = float(before.log_mass[0, 0]) - start_mass + float(eos_after)
        assert complete <= exact.complete(x) + 1e-5, x
    assert healed > 0 and possible > 0, (healed, possible)


def test_forced_eos_does_not_kill_particles_with_healing():
    """Byte SMC, product of two prompts, pruned beams, forced EOS at the limit: without
    healing, particles whose beams lost every token boundary get weight 0 at the forced EOS;
    with it, none does (every string here has a tokenization that ends it)."""
    from smc_jax.smc.ensemble import make_ensemble
    from smc_jax.smc import SMC, run_batch

    keys = jax.random.split(jax.random.key(0), 64)
    dead = {}
    for heal in (False, True):
        lm, experts = make(vocab=VOCAB, prompts=((1,), (2, 0)), width=2, threshold=0.3, seed=1, order=2, max_tokens=8)
        experts = experts.replace(eos_ids=(EOS_ID,), beam=BeamConfig(width=2, threshold=0.3, heal=heal))
        states = run_batch(SMC(num_particles=4, max_length=4), keys, experts, make_ensemble("product", 2))
        lw = np.asarray(states.log_weights)
        assert not np.isnan(lw).any() and np.all(np.asarray(states.eos) | (lw == -np.inf))
        dead[heal] = int(np.sum(lw == -np.inf))
    assert dead[False] > 0 and dead[True] == 0, dead


def test_unpruned_beam_never_heals_and_changes_nothing():
    """A beam that never prunes reads every byte that has a tokenization: healing never
    triggers and the values are those without healing (the exact ones)."""
    (lm, on), (_, off) = _make(16, 0.0, heal=True), _make(16, 0.0, heal=False)
    exact = _Exact(lm, VOCAB, (1,))
    for x in STRINGS[:40]:
        a, b = byte_logprob(on, x), byte_logprob(off, x)
        assert a.healed == 0
        np.testing.assert_array_equal(a.conditionals, b.conditionals)
        np.testing.assert_array_equal(a.next_logprobs, b.next_logprobs)
        assert a.prefix == b.prefix
        np.testing.assert_allclose(a.prefix, exact.prefix(x), atol=2e-5)


def _equations(jaxpr) -> int:
    """Equations of a jaxpr and of every program nested in it (a loop body counted once)."""
    counts = collections.Counter()
    count_parts(jaxpr, counts, collections.Counter())
    return sum(counts.values())


def test_the_heal_plan_program_does_not_grow_with_the_back_off():
    """`plan_heal` walks its J + 1 replay positions in loops: its program has as many
    equations for J = 2 as for J = 16 (an unrolled walk grows with J and is traced, lowered and
    compiled once per byte and per EOS healing site of a step)."""
    from smc_jax.bytes.healing import plan_heal

    _, experts = _make(2, 0.6)
    beams = jax.tree.map(lambda x: x[:, 0], experts.init(1).beams)
    byte = jnp.zeros((1,), jnp.int32)
    sizes = [
        _equations(jax.make_jaxpr(lambda beam, b: plan_heal(experts.trie, beam, b, config))(beams, byte).jaxpr)
        for config in (BeamConfig(width=2, threshold=0.6, heal_max_backoff=j) for j in (2, 16))
    ]
    assert sizes[0] == sizes[1], sizes


def test_advancing_and_healing_eos_in_one_loop_matches_one_after_the_other():
    """`advance_heal_eos` (the step's one loop of model calls, `ByteExperts._advance`) gives
    the beams of `advance` followed by `heal_eos`: the same distributions, masses and heals,
    with EOS healed on strings whose beam gave it 0 and untouched where it is not forced."""
    _, experts = _make(2, 0.3, seed=1)
    start = jax.jit(lambda e: e.init(1))(experts)
    read = jax.jit(lambda e, s, b: e.advance(s, b, jnp.ones((1,), bool)))
    apart = jax.jit(lambda e, s, b, forced: e.heal_eos(e.advance(s, b, jnp.ones((1,), bool)), forced))
    together = jax.jit(lambda e, s, b, forced: e.advance_heal_eos(s, b, jnp.ones((1,), bool), forced))
    healed = 0
    for x in STRINGS:
        state = start
        for b in x[:-1]:
            state = read(experts, state, jnp.asarray([b], jnp.int32))
        last = jnp.asarray([x[-1]], jnp.int32)
        for forced in (jnp.ones((1,), bool), jnp.zeros((1,), bool)):
            want = jax.tree.map(np.asarray, apart(experts, state, last, forced).beams)
            got = jax.tree.map(np.asarray, together(experts, state, last, forced).beams)
            for field in ("next_logp", "log_mass", "logp", "weight"):
                np.testing.assert_allclose(getattr(got, field), getattr(want, field), rtol=1e-6, atol=1e-6, err_msg=(x, field))
            np.testing.assert_array_equal(got.heals, want.heals)
            healed += int(bool(forced[0])) * int(want.heals[0, 0] > np.asarray(read(experts, state, last).beams.heals)[0, 0])
    assert healed > 0, healed


def test_a_byte_step_holds_one_model_call_site():
    """A step's model calls (the shift's, token healing's, the refresh's and EOS healing's) go
    through one call site: tracing `advance_heal_eos` traces the model's step as often as one
    call does (once per batch-size bucket), not once per call site; so do EOS healing on its
    own and scoring's reading program (a byte step per position)."""
    _, experts = _make(2, 0.3, seed=1)
    state = experts.init(2)
    traced = []
    original = type(experts.model).step

    def counting(self, *args, **kwargs):
        traced.append(1)
        return original(self, *args, **kwargs)

    active = jnp.ones((2,), bool)
    one_pair = experts.replace(prefixes=jax.tree.map(lambda x: x[:1], experts.prefixes),
                               prompt_logits=experts.prompt_logits[:1])
    data = jnp.zeros((1, 4), jnp.int32)
    traces = {}
    try:
        type(experts.model).step = counting
        for name, fn, arg in [
            ("one call", lambda s: experts._refresh(s, jnp.ones((2, 1), bool)), state),
            ("step", lambda s: experts.advance_heal_eos(s, jnp.zeros((2,), jnp.int32), active, active), state),
            ("EOS healing alone", lambda s: experts.heal_eos(s, active), state),
            ("one call, one row", lambda s: one_pair._refresh(s, jnp.ones((1, 1), bool)), one_pair.init(1)),
            ("scoring's read", lambda s: scoring._read(one_pair, s, data, data, jnp.int32(0), jnp.ones((1,), jnp.int32)),
             one_pair.init(1)),
        ]:
            traced.clear()
            jax.make_jaxpr(fn)(arg)
            traces[name] = len(traced)
    finally:
        type(experts.model).step = original
    one_call = traces["one call"]
    assert one_call > 0 and traces["step"] == traces["EOS healing alone"] == one_call, traces
    assert traces["scoring's read"] == traces["one call, one row"] > 0, traces  # fewer row buckets
