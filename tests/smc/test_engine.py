"""Engine behaviour: determinism, jit vs eager, no recompilation, results, clear errors."""

import itertools
import math

import chex
import jax
import numpy as np
import pytest

from tests.helpers.expert_contract import check_expert_group
from smc_jax.smc.ensemble import make_ensemble
from smc_jax.experts import ExpertStack, NGramExpert, TableExpert
from smc_jax.smc import SMC, ZeroWeightError, importance_sampling, local_ensemble
from smc_jax.utils.compilation import count_compilations


def decode(symbols):
    return "".join("abc"[int(s)] for s in symbols)


def test_toy_experts_satisfy_the_contract(overlapping_tables, ngram_experts):
    for group in [*overlapping_tables, *ngram_experts, ExpertStack(groups=overlapping_tables)]:
        check_expert_group(group)


def test_same_key_same_result_and_keys_matter(overlapping_tables):
    ens = make_ensemble("product", 2)
    smc = SMC(num_particles=16, max_length=4)
    a = smc(jax.random.key(3), overlapping_tables, ens)
    b = smc(jax.random.key(3), overlapping_tables, ens)
    c = smc(jax.random.key(4), overlapping_tables, ens)
    np.testing.assert_array_equal(a.symbols, b.symbols)
    np.testing.assert_array_equal(a.log_weights, b.log_weights)
    assert a.log_Z == b.log_Z
    assert not (np.array_equal(a.symbols, c.symbols) and np.array_equal(a.log_weights, c.log_weights))


@pytest.mark.parametrize("method", ["smc", "local"])
def test_jit_and_eager_agree(overlapping_tables, method):
    ens = make_ensemble("mixture", 2)
    smc = SMC(num_particles=6, max_length=4, method=method)
    jitted = smc(jax.random.key(0), overlapping_tables, ens, jit=True)
    with jax.disable_jit():
        eager = smc(jax.random.key(0), overlapping_tables, ens, jit=False)
    np.testing.assert_array_equal(jitted.symbols, eager.symbols)
    np.testing.assert_allclose(jitted.log_weights, eager.log_weights, rtol=1e-5)
    np.testing.assert_array_equal(jitted.resampled, eager.resampled)


def test_step_parts_compose_to_the_jitted_run(overlapping_tables):
    """A Python loop over `step` (itself propose / reweight / resample / record) reaches the
    jitted while-loop's final state: the whole state tree, expert states and trace included."""
    experts = ExpertStack(groups=overlapping_tables)
    ens = make_ensemble("product", 2, [0.4, 0.6])
    smc = SMC(num_particles=8, max_length=4, resample_finished=False)
    key = jax.random.key(5)
    want = jax.jit(smc.run)(key, experts, ens)
    step = jax.jit(smc.step)
    state = smc.init(key, experts, ens)
    while int(state.step) < smc.num_steps and bool((~state.done).any()):
        state = step(state, experts, ens)
    got = state._replace(done=np.ones_like(state.done))
    chex.assert_trees_all_equal_structs(got, want)
    chex.assert_trees_all_close(got._replace(key=None), want._replace(key=None), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("at_max_length", ["eos", "truncate"])
def test_progress_reports_every_step_with_the_same_result_and_no_host_call(ngram_experts, at_max_length):
    """progress=True runs one step per dispatch and reports each: the same particles, weights
    and log Z-hat as the single-dispatch run, bit for bit, and no host callback in any program
    (a program with one is never kept in the persistent compilation cache)."""
    from smc_jax.smc import engine
    from smc_jax.smc.progress import report_progress

    ens = make_ensemble("product", 2, [0.3, 0.7])
    quiet = SMC(num_particles=12, max_length=6, ess_threshold=0.8, at_max_length=at_max_length)
    loud = SMC(num_particles=12, max_length=6, ess_threshold=0.8, at_max_length=at_max_length, progress=True)
    want = quiet(jax.random.key(7), ngram_experts, ens)
    seen = []
    with report_progress(lambda step, active: seen.append((step, active))):
        got = loud(jax.random.key(7), ngram_experts, ens)
    np.testing.assert_array_equal(got.symbols, want.symbols)
    np.testing.assert_array_equal(got.log_weights, want.log_weights)
    np.testing.assert_array_equal(got.resampled, want.resampled)
    assert got.log_Z == want.log_Z
    assert [step for step, _ in seen] == list(range(got.stats["steps"]))
    assert [active for _, active in seen] == list(np.asarray(got.num_active[1:len(seen)])) + [seen[-1][1]]
    experts = ExpertStack(groups=ngram_experts)
    state = engine._init_jitted(quiet, jax.random.key(7), experts, ens)
    knobs = engine._Knobs(np.float32(0.8), np.float32(0.8 * 12))
    for program, args in [(engine._advance_jitted, (quiet, knobs, state, experts, ens, np.int32(1))),
                          (engine.run_jitted, (loud, jax.random.key(7), experts, ens))]:
        assert "callback" not in program.lower(*args).as_text()


def test_a_group_breaking_the_shape_contract_fails_at_the_boundary(overlapping_tables):
    class WrongAlphabet:  # reports 4 symbols but returns 3 + EOS columns
        def __getattr__(self, name):
            return getattr(overlapping_tables[0], name)

        alphabet_size = 4

    with pytest.raises(AssertionError, match="assert_shape"):
        SMC(num_particles=2, max_length=2)(jax.random.key(0), WrongAlphabet(), make_ensemble("product", 1), jit=False)


def test_no_recompilation_across_keys_ensembles_thresholds_resamplers_progress_lengths_and_modes(overlapping_tables):
    SMC(num_particles=8, max_length=4)(jax.random.key(0), overlapping_tables, make_ensemble("product", 2))
    sweep = [("min", 0.5, "systematic"), ("mixture", 0.0, "multinomial"), (-1.0, 1.0, "residual"), (2.0, 0.9, "stratified"),
             ("max", 0.3, "multinomial")]
    with count_compilations() as counter:
        for i, (f, threshold, resampler) in enumerate(sweep):
            at = ("eos", "truncate")[i // 2 % 2]
            smc = SMC(num_particles=8, max_length=4 - i % 2, ess_threshold=threshold, resampler=resampler,
                      progress=i % 2 == 1, at_max_length=at)  # max_length 3 and 4 share one bucket
            result = smc(jax.random.key(i), overlapping_tables, make_ensemble(f, 2, [0.3, 0.7]))
            assert result.symbols.shape == (8, 4 - i % 2)
            # A forced EOS finishes every live particle; truncation stops those at the limit unfinished.
            if at == "eos":
                assert result.finished[result.weights > 0].all()
            else:
                assert not result.finished[result.lengths == smc.max_length].any()
            assert result.num_steps <= smc.num_steps
    assert counter.count == 0


def test_a_run_time_threshold_resamples_as_a_static_one(overlapping_tables):
    """The dispatched run (threshold, resampler, length limit and forced EOS as arguments; arrays
    of the limit's bucket width) and the whole-loop program (all compiled in) take the same steps,
    importance sampling (0), active-only pools, every resampler and both length modes included."""
    from smc_jax.smc.engine import run_jitted

    ens = make_ensemble("product", 2, [0.4, 0.6])
    experts = ExpertStack(groups=overlapping_tables)
    cases = [(0.0, True, "multinomial"), (0.7, True, "multinomial"), (0.7, False, "multinomial"), (1.0, False, "systematic"),
             (0.9, True, "residual"), (1.0, True, "stratified"), (0.9, False, "residual")]
    for (threshold, finished, resampler), at in itertools.product(cases, ("eos", "truncate")):
        smc = SMC(num_particles=6, max_length=4, ess_threshold=threshold, resample_finished=finished, resampler=resampler,
                  at_max_length=at)
        got, want = smc(jax.random.key(2), experts, ens), run_jitted(smc, jax.random.key(2), experts, ens)
        np.testing.assert_array_equal(got.resampled, np.asarray(want.trace.resampled[: len(got.resampled)]))
        np.testing.assert_array_equal(got.log_weights, np.asarray(want.log_weights))
        np.testing.assert_array_equal(got.symbols, np.asarray(want.symbols))
        np.testing.assert_array_equal(got.lengths, np.asarray(want.lengths))
        np.testing.assert_array_equal(got.finished, np.asarray(want.eos))
        assert got.num_steps == int(want.step)


def test_result_fields_and_posterior(overlapping_tables):
    res = SMC(num_particles=32, max_length=4)(jax.random.key(1), overlapping_tables, make_ensemble("mixture", 2), decode=decode)
    m = res.num_particles
    assert res.weights.shape == (m,) and abs(res.weights.sum() - 1) < 1e-9
    assert res.finished.all()  # forced EOS: every particle ends with a complete string
    assert res.expert_logprobs.shape == (m, 2)
    assert res.ess.shape == res.resampled.shape == (res.num_steps,)
    assert res.ancestors.shape == res.log_weight_trace.shape == (res.num_steps, m)
    assert np.all(res.num_active[:-1] >= res.num_active[1:])
    assert math.isfinite(res.log_Z)
    post = res.posterior()
    assert abs(sum(p for _, p in post) - 1) < 1e-9
    assert len({s for s, _ in post}) == len(post) == len(set(res.texts))
    assert res.expected_accuracy(lambda s: True) == pytest.approx(1.0)
    assert res.expected_accuracy(lambda s: s.startswith("a")) == pytest.approx(
        sum(p for s, p in post if s.startswith("a"))
    )
    # phi(x) recomputed from the reported per-expert log-probabilities
    ens = make_ensemble("mixture", 2)
    log_phi = np.asarray(ens.log_target(res.expert_logprobs.astype(np.float32)))
    assert np.all(np.isfinite(log_phi))


def test_finished_particles_are_frozen(ngram_experts):
    smc = importance_sampling(num_particles=12, max_length=6)
    res = smc(jax.random.key(2), ngram_experts, make_ensemble("product", 2))
    # without resampling, a particle's log weight changes only while it is active
    trace = res.log_weight_trace
    for m in range(res.num_particles):
        t_end = res.lengths[m]  # the step at which it sampled EOS
        assert np.allclose(trace[t_end:, m], trace[t_end, m])


def test_active_only_resampling_leaves_finished_particles_alone(ngram_experts):
    """resample_finished=False: a finished particle is never replaced nor copied, its weight
    never changes, and a resampling step keeps the total weight (so log Z-hat) unchanged."""
    smc = SMC(num_particles=12, max_length=8, ess_threshold=1.0, resample_finished=False)
    res = smc(jax.random.key(5), ngram_experts, make_ensemble("product", 2))
    steps = np.flatnonzero(res.resampled)
    # A particle of length l sampled EOS at step l; finished slots are never refilled, so the
    # final lengths say which slots were finished at each resampling.
    assert any(0 < (res.lengths <= t).sum() < res.num_particles for t in steps)
    for t in steps:
        finished = res.lengths <= t
        np.testing.assert_array_equal(res.ancestors[t][finished], np.flatnonzero(finished))
        assert not finished[res.ancestors[t][~finished]].any()
    for m in range(res.num_particles):
        t_end = res.lengths[m]
        np.testing.assert_allclose(res.log_weight_trace[t_end:, m], res.log_weight_trace[t_end, m])
    again = smc(jax.random.key(5), ngram_experts, make_ensemble("product", 2))
    np.testing.assert_array_equal(again.symbols, res.symbols)


def test_local_baseline_ignores_weights(overlapping_tables):
    res = local_ensemble(num_particles=10, max_length=4)(jax.random.key(0), overlapping_tables, make_ensemble("max", 2))
    assert res.log_Z is None
    np.testing.assert_allclose(res.weights, 0.1)
    assert not res.resampled.any()


def test_bad_configuration_is_rejected():
    with pytest.raises(ValueError, match="num_particles"):
        SMC(num_particles=0, max_length=4)
    with pytest.raises(ValueError, match="max_length"):
        SMC(num_particles=4, max_length=0)
    with pytest.raises(ValueError, match="ess_threshold"):
        SMC(num_particles=4, max_length=4, ess_threshold=1.5)
    with pytest.raises(ValueError, match="unknown resampler"):
        SMC(num_particles=4, max_length=4, resampler="magic")
    with pytest.raises(ValueError, match="unknown method"):
        SMC(num_particles=4, max_length=4, method="global")


def test_bad_experts_are_rejected(overlapping_tables):
    smc = SMC(num_particles=4, max_length=4)
    with pytest.raises(ValueError, match="at least one expert"):
        smc(jax.random.key(0), [], make_ensemble("product", 1))
    with pytest.raises(ValueError, match="for 3 experts, but 2"):
        smc(jax.random.key(0), overlapping_tables, make_ensemble("product", 3))
    other = NGramExpert.random(jax.random.key(0), alphabet_size=2)
    with pytest.raises(ValueError, match="alphabet sizes.*byte level"):
        smc(jax.random.key(0), [overlapping_tables[0], other], make_ensemble("product", 2))


def test_every_particle_at_zero_weight_is_an_error():
    e1 = TableExpert.from_table({"a": 0.5, "aa": 0.5}, alphabet="ab")
    e2 = TableExpert.from_table({"b": 0.5, "bb": 0.5}, alphabet="ab")
    smc = SMC(num_particles=8, max_length=3)
    with pytest.raises(ZeroWeightError, match="zero weight"):
        smc(jax.random.key(0), [e1, e2], make_ensemble("product", 2))
    res = smc(jax.random.key(0), [e1, e2], make_ensemble("product", 2), allow_zero_weight=True)
    assert res.log_Z == -math.inf and not np.isnan(res.log_weights).any()
    # a coverage-seeking f has mass on both supports
    assert math.isfinite(smc(jax.random.key(0), [e1, e2], make_ensemble("mixture", 2)).log_Z)


def test_table_expert_validation():
    with pytest.raises(ValueError, match="sum to 1"):
        TableExpert.from_table({"a": 0.5}, alphabet="ab")
    with pytest.raises(ValueError, match="not in the alphabet"):
        TableExpert.from_table({"z": 1.0}, alphabet="ab")
    with pytest.raises(ValueError, match=">= 0"):
        TableExpert.from_table({"a": 1.5, "b": -0.5}, alphabet="ab")
