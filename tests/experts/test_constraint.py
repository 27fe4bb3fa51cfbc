"""Constraint experts (regex / JSON Schema automata) against enumeration on toy experts.

Semantics under test (reference/constraints.md, option 1): Phi(x) ∝ f_w(p_1(x), ..., p_K(x)) C(x),
shaping psi(x) = f_w(P(x)) C^(x); the locally constrained baseline masks and renormalizes.
"""

import itertools
import json
import math
import re

import jax
import numpy as np
import pytest

from smc_jax.constraints import AutomatonTooLargeError, json_schema, regex, token_transitions
from smc_jax.smc.ensemble import ConstrainedEnsemble, constrained, make_ensemble
from smc_jax.smc.exact import exact_target, proposal_logprob
from smc_jax.experts import ExpertStack, NGramExpert, TableExpert
from smc_jax.smc import SMC, run_batch

from tests.helpers.expert_contract import check_expert_group
from tests.smc.test_exact import posterior_tv, z_hat_samples

ALPHABET = "ab"
#: Strings ending in "a" in which every other "a" is followed by "b": "aa" is a dead end.
PATTERN = "(ab|b)*a"


def text(seq) -> str:
    return "".join(ALPHABET[s] for s in seq)


@pytest.fixture(scope="module")
def automaton():
    return regex(PATTERN)


@pytest.fixture(scope="module")
def ngrams():
    return (
        NGramExpert.random(jax.random.key(11), alphabet_size=2, order=2, eos_logit=-0.5),
        NGramExpert.random(jax.random.key(12), alphabet_size=2, order=2, eos_logit=-0.2),
    )


# ---------------------------------------------------------------------- the automaton


def test_regex_automaton_agrees_with_python_re():
    for pattern in [PATTERN, "a{2,3}b?", "(a|bc)*c", "é+x", "[0-9]{2}-[a-c]*"]:
        auto = regex(pattern)
        compiled = re.compile(pattern)
        chars = sorted(set("abcx0129-é"))
        for n in range(6):
            for chars_ in itertools.product(chars, repeat=n) if n < 4 else []:
                s = "".join(chars_)
                assert auto.matches(s) == bool(compiled.fullmatch(s)), (pattern, s)
        # Viability = some completion matches: checked against completions up to 4 characters.
        for n in range(3):
            for chars_ in itertools.product(chars, repeat=n):
                s = "".join(chars_)
                completable = any(
                    compiled.fullmatch(s + "".join(t)) for m in range(5) for t in itertools.product(chars, repeat=m)
                )
                if completable:
                    assert auto.viable(s), (pattern, s)
        assert not auto.accepting[auto.dead] and np.all(auto.transitions[auto.dead] == auto.dead)


def test_automata_are_minimal():
    # (a|b)*abb: the textbook minimal DFA has 4 states (+ the dead state); regex-automata emits
    # more, and a repeated sub-pattern (W( W)*) would otherwise be copied.
    assert regex("(a|b)*abb").num_states == 5
    word = "(?:select|seek|[a-z]+_id)"
    assert regex(f"{word}(?: {word})*").num_states == regex(f"(?:{word} )*{word}").num_states
    # Minimal: no two states accept the same suffixes (their rows and acceptance differ after
    # merging nothing), checked by brute force on suffixes up to length 3 over the used bytes.
    auto = regex("(ab|b)*a|c[0-9]{2,3}")
    symbols = [ord(c) for c in "abc0"]
    suffixes = [()] + [s for n in range(1, 4) for s in itertools.product(symbols, repeat=n)]

    def signature(state):
        out = []
        for suffix in suffixes:
            s = state
            for b in suffix:
                s = auto.transitions[s, b]
            out.append(bool(auto.accepting[s]))
        return tuple(out)

    signatures = [signature(s) for s in range(auto.num_states)]
    assert len(set(signatures)) == auto.num_states


def test_no_horizon_as_a_value_masks_as_no_horizon():
    """`NO_HORIZON` (what a truncating sampler passes, so that switching modes keeps the
    program) allows exactly what `horizon=None` allows, in every state at every length."""
    from smc_jax.experts.constraint import NO_HORIZON, ConstraintState

    tokens = [b"a", b"b", b"ab", b"ba", b"c"]
    none = regex(PATTERN).token_expert(tokens, horizon=None)
    value = regex(PATTERN).token_expert(tokens, horizon=NO_HORIZON)
    states, lengths = np.meshgrid(np.arange(none.num_states), [0, 1, 7, 1000])
    state = ConstraintState(state=states.ravel().astype(np.int32), length=lengths.ravel().astype(np.int32))
    want, got = np.asarray(none.logprobs(state)), np.asarray(value.logprobs(state))
    np.testing.assert_array_equal(got, want)
    assert np.isfinite(want).any() and not np.isfinite(want).all()  # a mask with both kinds


def test_token_tables_are_built_once_per_automaton_and_vocabulary(monkeypatch):
    from smc_jax.experts import constraint as ce

    builds = []
    real = ce.token_transitions
    monkeypatch.setattr(ce, "token_transitions", lambda *a: builds.append(1) or real(*a))
    monkeypatch.setattr(ce, "_TOKEN_TABLES", ce.OrderedDict())
    tokens = [b"a", b"b", b"ab", b"ba", b"c"]
    first = regex("(ab|b)*a").token_expert(tokens, horizon=4)
    again = regex("(ab|b)*a").token_expert(tokens, horizon=None)  # an equal automaton, another horizon
    assert len(builds) == 1 and again.horizon is None and first.horizon == 4
    np.testing.assert_array_equal(np.asarray(first.transitions), np.asarray(again.transitions))
    regex("(ab|b)*a").token_expert(tokens[:-1])  # another vocabulary: a new table
    assert len(builds) == 2
    ce._TOKEN_TABLES.clear()
    for i in range(4):
        regex(f"a{{{i + 1}}}").token_expert(tokens)
    size = {sum(a.nbytes for a in t) for t in ce._TOKEN_TABLES.values()}
    assert len(size) == 1 and len(builds) == 2 + 4  # the toy tables share one padded size
    ce._TOKEN_TABLES.clear()
    monkeypatch.setattr(ce, "TOKEN_TABLE_CACHE_BYTES", 3 * size.pop())
    for i in range(4):  # bounded by bytes: the oldest are dropped
        regex(f"a{{{i + 1}}}").token_expert(tokens)
    assert len(ce._TOKEN_TABLES) == 3
    regex("a{4}").token_expert(tokens)  # recent: still held
    regex("a{1}").token_expert(tokens)
    assert len(builds) == 2 + 4 + 4 + 1
    monkeypatch.setattr(ce, "TOKEN_TABLE_CACHE_BYTES", 1)  # too small for any: the newest is kept
    regex("a{5}").token_expert(tokens)
    assert len(ce._TOKEN_TABLES) == 1 and len(builds) == 2 + 4 + 4 + 2


def test_equal_automata_built_apart_share_a_digest_a_token_table_and_a_block_of_the_merged_table(monkeypatch):
    from smc_jax.experts import constraint as ce

    builds = []
    real = ce.token_transitions
    monkeypatch.setattr(ce, "token_transitions", lambda *a: builds.append(1) or real(*a))
    monkeypatch.setattr(ce, "_TOKEN_TABLES", ce.OrderedDict())
    a, again, other = regex("(ab|b)*a"), regex("(ab|b)*a"), regex("a(ab|b)*")
    assert a is not again and a.digest == again.digest != other.digest
    copies, others = [regex("(ab|b)*a") for _ in range(10)], [regex(f"(ab|b)*a{{{i}}}") for i in range(1, 11)]
    assert ce.merged_states(copies) == ce.merged_states([a]) < ce.merged_states(others)
    tokens = [b"a", b"b", b"ab", b"ba", b"c"]
    a.token_expert(tokens), again.token_expert(tokens)
    assert len(builds) == 1


def test_multibyte_characters_are_byte_paths():
    auto = regex("é")
    assert auto.matches("é") and not auto.matches(b"\xc3") and auto.viable(b"\xc3") and not auto.viable(b"\xa9")


def test_token_table_reads_each_token_through_the_bytes():
    auto = regex("(ab|b)*a|xé?")
    rng = np.random.default_rng(0)
    pool = [b"a", b"b", b"x", "é".encode(), b"\xc3", b"\xa9"]
    tokens = [b"".join(rng.choice(pool, size=rng.integers(1, 4))) for _ in range(60)] + [None, b"ab", b""]
    table, accepting = token_transitions(auto, tokens)
    assert table.shape == (auto.num_states, len(tokens))
    for s in range(auto.num_states):
        for v, tok in enumerate(tokens):
            want = auto.dead if tok is None else auto.walk(tok, s)
            assert table[s, v] == want, (s, tok)
    with pytest.raises(AutomatonTooLargeError, match="entries"):
        token_transitions(auto, tokens, max_entries=10)


def test_padded_states_keep_the_language_and_share_one_shape():
    from smc_jax.experts.constraint import pad_states, state_bucket

    auto = regex("(ab|b)*a|xé?")
    table, accepting = pad_states(auto.transitions, auto.accepting)
    p = state_bucket(auto.num_states)
    assert table.shape == (p, 256) and p >= auto.num_states and p & (p - 1) == 0
    assert not accepting[p - 1] and np.all(table[p - 1] == p - 1)  # the dead state is still last
    assert not np.isin(np.arange(auto.num_states - 1, p - 1), table).any()  # the padding is unreachable

    def walk(data: bytes) -> int:
        s = 0
        for b in data:
            s = int(table[s, b])
        return s

    rng = np.random.default_rng(1)
    pool = [b"a", b"b", b"x", "é".encode(), b"\xc3", b"y"]
    for _ in range(300):
        data = b"".join(rng.choice(pool, size=rng.integers(0, 6)))
        assert bool(accepting[walk(data)]) == auto.matches(data), data
        assert (walk(data) != p - 1) == auto.viable(data), data
    # Automata of different sizes in one bucket give experts of one shape (one compilation).
    a, b = regex("a|b").byte_expert(), regex("ab?c").byte_expert()
    assert a.transitions.shape == b.transitions.shape and a.num_states == state_bucket(regex("ab?c").num_states)


def test_merged_constraints_are_each_automaton_relabelled_and_stack_as_one_shared_table():
    """A batch's problems with different automata share one table (`merge_constraints`): each
    view gives its own automaton's potential at every step of any walk, and stacking the views
    of a batch passes the table once (only the start states get a problem axis)."""
    import jax.numpy as jnp

    from smc_jax.experts.constraint import merge_constraints, merged_states
    from smc_jax.smc.batch import _over_problems, stack_problems

    horizon = 6
    alone = [regex(p).byte_expert(horizon) for p in ("(ab|b)*a", "xé?y", "[0-9]{2,4}", "(ab|b)*a")]
    alone[3] = alone[0]  # a repeated problem (another seed) reuses its automaton
    views = merge_constraints(alone)
    assert views[3] is not alone[0] and views[3].start == views[0].start
    assert views[0].transitions is views[1].transitions is views[2].transitions
    assert views[0].num_states < sum(e.num_states for e in alone[:3])
    rng = np.random.default_rng(0)
    for view, own in zip(views, alone):
        s_view, s_own = view.init(5), own.init(5)
        for _ in range(horizon + 1):
            np.testing.assert_array_equal(view.logprobs(s_view), own.logprobs(s_own))
            # a particle steps only by a symbol its potential allows (else it would be dead)
            ok = np.asarray(own.logprobs(s_own))[:, 0, :256] == 0
            sym = jnp.asarray([rng.choice(np.flatnonzero(row)) if row.any() else 0 for row in ok], jnp.int32)
            active = jnp.asarray(ok.any(axis=1))
            s_view, s_own = view.advance(s_view, sym, active), own.advance(s_own, sym, active)
    stacked, shared = stack_problems([[v] for v in views])
    leaves = jax.tree.leaves(stacked)
    assert [leaf.shape for leaf, same in zip(leaves, shared) if not same] == [(4,), (4,)]  # the starts and horizons
    starts = _over_problems(lambda e: e.init(2).state, shared, stacked)
    np.testing.assert_array_equal(starts[:, 0], [v.start for v in views])
    with pytest.raises(ValueError, match="different alphabets"):
        merge_constraints([alone[0], regex("ab").symbol_expert("ab")])
    # A size fixed for several batches (from the byte automata, before reading any table).
    rows = merged_states([regex(p) for p in ("(ab|b)*a", "xé?y", "[0-9]{2,4}")])
    assert rows >= views[0].num_states and merge_constraints(alone, rows)[0].num_states == rows
    one = merge_constraints([alone[0], alone[0]], rows)  # one automaton, still the batch's shape
    assert one[0].num_states == rows and one[0].start == 0
    own = merge_constraints([alone[0], alone[0]], alone[0].num_states)  # already that size: no copy
    assert own[0].transitions is alone[0].transitions and own[1].start == 0
    assert jax.tree.structure(own[0]) == jax.tree.structure(one[0])  # one program for both
    with pytest.raises(ValueError, match="cannot hold"):
        merge_constraints(alone, 4)


def test_constraint_expert_contract(automaton):
    check_expert_group(automaton.symbol_expert(ALPHABET), num_particles=6, steps=5)
    check_expert_group(automaton.byte_expert(), num_particles=4, steps=3)


def test_bad_patterns_and_schemas_fail_clearly():
    with pytest.raises(ValueError, match="cannot compile the regex"):
        regex("(a")
    with pytest.raises(ValueError, match="matches no string"):
        regex("[a&&b]")
    with pytest.raises(AutomatonTooLargeError, match=r"has \d+ states, more than max_states=5"):
        regex("[ab]{20}", max_states=5)
    with pytest.raises(ValueError, match="'uniqueItems'.*#/properties/tags"):
        json_schema({"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}})
    with pytest.raises(ValueError, match="'not'"):
        json_schema({"not": {"type": "string"}})
    with pytest.raises(FileNotFoundError):
        json_schema("no/such/schema.json")


def test_json_schema_automaton_accepts_valid_json_only():
    jsonschema = pytest.importorskip("jsonschema")
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 3}, "age": {"type": "integer"}, "ok": {"type": "boolean"}},
        "required": ["name", "age"],
    }
    auto = json_schema(schema)
    assert auto.matches('{"name": "Al", "age": 42}') and auto.matches('{"name":"","age":-1,"ok":true}')
    for bad in ['{"age": 42, "name": "Al"}x', '{"name": "Alice", "age": 1}', '{"name": "A"}', '{"name": "A", "age": 1.5}']:
        assert not auto.matches(bad), bad
    # Random walks through the automaton: every accepted string validates.
    rng = np.random.default_rng(1)
    seen = 0
    for _ in range(200):
        s, out = auto.start, bytearray()
        for _ in range(60):
            if auto.accepting[s] and rng.random() < 0.3:
                break
            ok = np.flatnonzero(auto.transitions[s] != auto.dead)
            if ok.size == 0:  # only possible in an accepting state (every other one is viable)
                assert auto.accepting[s]
                break
            ok = ok[(ok >= 32) & (ok < 127)] if np.any((ok >= 32) & (ok < 127)) else ok
            b = int(rng.choice(ok))
            out.append(b)
            s = int(auto.transitions[s, b])
        if auto.accepting[s]:
            jsonschema.validate(__import__("json").loads(out.decode()), schema)
            seen += 1
    assert seen > 20


# ---------------------------------------------------------------------- the target Phi


@pytest.mark.parametrize("f", ["product", "min", "mixture"])
def test_phi_is_the_ensemble_restricted_to_the_language(ngrams, automaton, f):
    """Enumeration through the expert interface equals f_w(p_1, p_2) * 1{x in L}, renormalized
    (models' weights untouched by the constraint, for every f)."""
    c = automaton.symbol_expert(ALPHABET)
    experts = ExpertStack(groups=(*ngrams, c))
    base = make_ensemble(f, 2, [0.3, 0.7])
    ens = constrained(base, 1)
    assert isinstance(ens, ConstrainedEnsemble) and ens.num_experts == 3
    exact = exact_target(experts, ens, max_length=5)
    free = exact_target(ExpertStack(groups=ngrams), base, max_length=5)
    in_language = np.array([bool(re.fullmatch(PATTERN, text(s))) for s in free.strings])
    assert in_language.any() and not in_language.all()
    want = np.where(in_language, np.exp(free.log_phi), 0.0)
    np.testing.assert_allclose(exact.probs, want / want.sum(), atol=1e-6)
    assert exact.log_Z == pytest.approx(math.log(want.sum()), abs=1e-5)


# ---------------------------------------------------------------------- the sampler


@pytest.mark.parametrize(
    "f,threshold,resample_finished",
    [("product", 0.0, True), ("min", 0.9, True), ("mixture", 1.0, True), ("product", 1.0, False)],
)
def test_z_hat_is_unbiased_with_a_constraint(ngrams, automaton, f, threshold, resample_finished):
    """Infinite-support experts, forced EOS at L = 4: particles in a non-accepting state at the
    limit die, and Z-hat is still unbiased for Z = sum_{|x| <= 4} f_w(p(x)) C(x)."""
    experts = ExpertStack(groups=(*ngrams, automaton.symbol_expert(ALPHABET)))
    ens = constrained(make_ensemble(f, 2, [0.4, 0.6]), 1)
    exact = exact_target(experts, ens, max_length=4)
    smc = SMC(num_particles=4, max_length=4, ess_threshold=threshold, resample_finished=resample_finished)
    z = z_hat_samples(smc, experts, ens, runs=1500, seed=7)
    se = z.std() / math.sqrt(z.size)
    assert abs(z.mean() - math.exp(exact.log_Z)) < 4.5 * se, (z.mean(), math.exp(exact.log_Z), se)


def test_weights_equal_phi_over_q_with_the_viability_shaping(automaton):
    """Without resampling each finished particle's weight is f(p(x)) C(x) / q(x), q built by
    hand from prefix sums P_k(y) and the automaton's viability C^(y) (not the sampler's code)."""
    t1 = {"a": 0.2, "ba": 0.1, "aa": 0.15, "bab": 0.1, "b": 0.05, "aba": 0.25, "bba": 0.15}
    t2 = {"a": 0.3, "ba": 0.2, "aa": 0.1, "abba": 0.2, "bba": 0.1, "": 0.1}
    tables = (TableExpert.from_table(t1, alphabet=ALPHABET), TableExpert.from_table(t2, alphabet=ALPHABET))
    experts = ExpertStack(groups=(*tables, automaton.symbol_expert(ALPHABET)))
    ens = constrained(make_ensemble("product", 2, [0.3, 0.7]), 1)
    full = exact_target(experts, ens, max_length=4)
    viable = lambda y: [0.0 if automaton.viable(text(y)) else -np.inf]
    log_q = proposal_logprob(full, ens, 4, prefix_potentials=viable)
    log_phi = dict(zip(full.strings, full.log_phi))
    res = SMC(num_particles=64, max_length=4, ess_threshold=0.0)(jax.random.key(2), experts, ens, allow_zero_weight=True)
    checked = 0
    for seq, lw, fin in zip(res.sequences, res.log_weights, res.finished):
        if np.isfinite(lw):
            assert fin and re.fullmatch(PATTERN, text(seq))
            np.testing.assert_allclose(lw, log_phi[seq] - log_q[seq], rtol=1e-4, atol=1e-4)
            checked += 1
    assert checked >= 20


@pytest.mark.parametrize("method", ["smc", "local"])
@pytest.mark.parametrize("max_length", [2, 5])
def test_no_particle_ends_outside_the_language(ngrams, automaton, method, max_length):
    """Every particle that ends with EOS is in L; at the forced-EOS limit a non-accepting
    particle gets weight 0 and is not marked finished; every positive weight is a string of L."""
    experts = ExpertStack(groups=(*ngrams, automaton.symbol_expert(ALPHABET)))
    ens = constrained(make_ensemble("product", 2), 1)
    smc = SMC(num_particles=8, max_length=max_length, method=method)
    states = run_batch(smc, jax.random.split(jax.random.key(3), 120), experts, ens)
    sym, lengths = np.asarray(states.symbols), np.asarray(states.lengths)
    eos, lw = np.asarray(states.eos), np.asarray(states.log_weights)
    strings = [[text(s[:n]) for s, n in zip(row, ln)] for row, ln in zip(sym, lengths)]
    inside = np.array([[bool(re.fullmatch(PATTERN, s)) for s in row] for row in strings])
    assert np.all(inside[eos]), "a particle ended with EOS outside the language"
    assert np.all(eos[np.isfinite(lw)]) and np.all(inside[np.isfinite(lw)])
    if max_length == 2:  # "ab"+"b" prefixes cannot finish in 2 symbols: some particles die
        assert (~eos).any() and np.all(np.isneginf(lw[~eos]))


@pytest.mark.parametrize("method", ["smc", "local"])
def test_horizon_steers_every_particle_to_finish_within_the_limit(ngrams, automaton, method):
    """A length-aware constraint (horizon = max_length): with n-grams that give every symbol
    positive probability, no particle dies at the forced EOS, and every one is in L."""
    length = 2
    experts = ExpertStack(groups=(*ngrams, automaton.symbol_expert(ALPHABET, horizon=length)))
    ens = constrained(make_ensemble("product", 2), 1)
    states = run_batch(SMC(num_particles=8, max_length=length, method=method), jax.random.split(jax.random.key(3), 60), experts, ens)
    assert np.all(np.asarray(states.eos)) and np.all(np.isfinite(np.asarray(states.log_weights)))
    for row, ln in zip(np.asarray(states.symbols), np.asarray(states.lengths)):
        assert all(re.fullmatch(PATTERN, text(s[:n])) for s, n in zip(row, ln))


def test_z_hat_is_unbiased_with_a_horizon(ngrams, automaton):
    """The horizon changes the shaping, not the target: Z-hat estimates the same Z."""
    length = 3
    plain = ExpertStack(groups=(*ngrams, automaton.symbol_expert(ALPHABET)))
    experts = ExpertStack(groups=(*ngrams, automaton.symbol_expert(ALPHABET, horizon=length)))
    ens = constrained(make_ensemble("product", 2, [0.4, 0.6]), 1)
    exact = exact_target(plain, ens, max_length=length)
    assert exact_target(experts, ens, max_length=length).log_Z == pytest.approx(exact.log_Z, abs=1e-6)
    z = z_hat_samples(SMC(num_particles=4, max_length=length, ess_threshold=0.9), experts, ens, runs=1500, seed=9)
    se = z.std() / math.sqrt(z.size)
    assert abs(z.mean() - math.exp(exact.log_Z)) < 4.5 * se, (z.mean(), math.exp(exact.log_Z), se)


def test_local_constrained_decoding_differs_from_phi_as_enumeration_predicts():
    """constraints.md's two-step toy: p(a) = 0.9, p(b) = 0.1; after "a" the valid continuation
    has probability 0.01, after "b" 0.9. Local decoding returns "aa" w.p. 0.9; Phi gives it
    0.009 / (0.009 + 0.09) = 1/11."""
    table = {"aa": 0.9 * 0.01, "ab": 0.9 * 0.99, "ba": 0.1 * 0.9, "bb": 0.1 * 0.1}
    lm = TableExpert.from_table(table, alphabet=ALPHABET)
    experts = ExpertStack(groups=(lm, regex("aa|ba").symbol_expert(ALPHABET)))
    ens = constrained(make_ensemble("product", 1), 1)
    exact = exact_target(experts, ens, max_length=2)
    phi_aa = exact.distribution()[(0, 0)]
    assert phi_aa == pytest.approx(1 / 11, abs=1e-6)

    local = SMC(num_particles=4000, max_length=2, method="local")(jax.random.key(0), experts, ens)
    share_local = np.mean([s == (0, 0) for s in local.sequences])
    assert abs(share_local - 0.9) < 0.02, share_local  # the local baseline: q(aa) = 0.9
    res = SMC(num_particles=4000, max_length=2)(jax.random.key(0), experts, ens)
    share_smc = sum(w for s, w in zip(res.sequences, res.weights) if s == (0, 0))
    assert abs(share_smc - phi_aa) < 0.02, share_smc
    assert res.log_Z == pytest.approx(math.log(0.009 + 0.09), abs=0.15)  # ~4% sd at M = 4000


def test_local_baseline_matches_its_enumerated_distribution(ngrams, automaton):
    """On infinite-support n-grams: the local sampler's string frequencies equal
    q(x) = prod_t f(p(.|y)) C^(ya) / sum_a' (...), enumerated, and q differs from Phi. (With
    the horizon no particle dies at the limit, so q sums to 1 over the strings of L.)"""
    length = 3
    experts = ExpertStack(groups=(*ngrams, automaton.symbol_expert(ALPHABET, horizon=length)))
    ens = constrained(make_ensemble("product", 2), 1)
    exact = exact_target(experts, ens, max_length=length)
    logprobs = jax.jit(type(experts).logprobs)
    advance = jax.jit(type(experts).advance)
    # q by enumeration: walk each string through the experts, normalizing f over viable symbols.
    q = {}
    for s in exact.strings:
        state, lq = experts.init(1), 0.0
        for t in range(len(s) + 1):
            logp = np.asarray(logprobs(experts, state))[0]  # [K, A+1]
            row = np.asarray(ens.log_target(logp.T), np.float64)
            if t == length:
                row[:-1] = -np.inf
            total = np.logaddexp.reduce(row)
            sym = s[t] if t < len(s) else 2
            if not np.isfinite(total) or np.isneginf(row[sym]):  # a dead end or a masked symbol
                lq = -np.inf
                break
            lq += row[sym] - total
            if t < len(s):
                state = advance(experts, state, np.array([sym], np.int32), np.array([True]))
        q[s] = math.exp(lq)
    assert sum(q.values()) == pytest.approx(1.0, abs=1e-5)
    phi = exact.distribution()
    tv_q_phi = 0.5 * sum(abs(q.get(s, 0.0) - phi.get(s, 0.0)) for s in set(q) | set(phi))
    assert tv_q_phi > 0.05
    res = SMC(num_particles=20000, max_length=length, method="local")(jax.random.key(4), experts, ens)
    counts, sequences = {}, res.sequences  # (a property computed on each access)
    for s in sequences:
        counts[s] = counts.get(s, 0) + 1 / len(sequences)
    tv = 0.5 * sum(abs(counts.get(s, 0.0) - q.get(s, 0.0)) for s in set(q) | set(counts))
    assert tv < 0.03, tv
    assert 0.5 * sum(abs(counts.get(s, 0.0) - phi.get(s, 0.0)) for s in set(phi) | set(counts)) > tv_q_phi - 0.03


def test_weighted_particles_approach_the_constrained_phi(ngrams, automaton):
    """With the horizon no run ends with every particle at zero weight, so each run's weighted
    particles are a distribution to compare with Phi (total variation falls with M)."""
    experts = ExpertStack(groups=(*ngrams, automaton.symbol_expert(ALPHABET, horizon=4)))
    ens = constrained(make_ensemble("min", 2), 1)
    exact = exact_target(experts, ens, max_length=4)
    tv = []
    for m in [4, 32]:
        states = run_batch(SMC(num_particles=m, max_length=4), jax.random.split(jax.random.key(m), 100), experts, ens)
        tv.append(posterior_tv(states, exact, experts.alphabet_size).mean())
    assert tv[1] < tv[0] and tv[1] < 0.2, tv


# ---------------------------------------------------------------------- API and CLI checks


def test_cli_lists_and_validates_constraints_before_loading_models(capsys, tmp_path, monkeypatch):
    from smc_jax import cli

    with pytest.raises(SystemExit):
        cli.main(["sample", "--help"])
    out = capsys.readouterr().out
    assert "--regex" in out and "--json-schema" in out

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded before the constraint was checked")

    monkeypatch.setattr(cli, "_load_models", no_loading)
    assert cli.main(["sample", "--regex", "(a"]) == 2
    assert "cannot compile the regex" in capsys.readouterr().err
    bad = tmp_path / "schema.json"
    bad.write_text(json.dumps({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}))
    assert cli.main(["sample", "--json-schema", str(bad)]) == 2
    assert "uniqueItems" in capsys.readouterr().err
    assert cli.main(["sample", "--json-schema", str(tmp_path / "missing.json")]) == 2


def test_sampler_rejects_what_is_not_a_compiled_constraint():
    from smc_jax.sampler import as_constraints

    with pytest.raises(TypeError, match="smc_jax.constraints.regex"):
        as_constraints(["[ab]+"])
    auto = regex("a")
    assert as_constraints(auto) == (auto,) and as_constraints(None) == ()


def test_evaluation_constraints_of_the_json_and_word_sorting_instances():
    from evaluation.methods import get_method, instance_constraint
    from evaluation.tasks.base import Demonstration
    from evaluation.tasks.json_schema import JsonSchemaInstance
    from evaluation.tasks.word_sorting import WordSortingInstance, WordSortingTask

    words = WordSortingInstance(id="example-0", input="pear apple fig", target="apple fig pear",
                                demonstration=Demonstration(input="b a", output="a b"))
    auto = instance_constraint("word_sorting", words)
    assert auto.matches(" apple, fig, pear") and auto.matches("apple,fig,pear")
    assert WordSortingTask().is_correct(words, " apple, fig, pear")
    assert not auto.matches("apple, fig") and not auto.matches("apple, fig, kiwi") and not auto.matches("apple, fig, pear.")
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "n": {"type": "integer"}}, "required": ["city"]}
    for task in ("json", "json_schema"):  # the registry's name, and the schema's
        auto = instance_constraint(task, JsonSchemaInstance(id="x", schema=schema))
        assert auto.matches('{"city":"Oslo","n":3}') and not auto.matches('{"n":3}')
    assert get_method("token_constrained").constrained and get_method("local_constrained").level == "local"
    with pytest.raises(ValueError, match="no constraint"):
        instance_constraint("text_to_sql", None)
