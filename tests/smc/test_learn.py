"""Learning weights and tau: gradients against enumeration, fitting synthetic data, errors.

Ground truth: for toy experts every string of length <= L can be listed, so log Z_theta is a
logsumexp over them and the exact gradient is autodiff through that enumeration, itself checked
against central finite differences of a float64 reference (tests/helpers/learn_reference.py).
"""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy.optimize import minimize

from smc_jax.smc.ensemble import GeneralizedMean, make_ensemble
from smc_jax.smc.exact import enumerate_strings, exact_target, string_logprobs
from smc_jax.experts import ExpertStack, NGramExpert, pad_sequences, teacher_force
from smc_jax.smc.learn import (
    EnsembleParams,
    Targets,
    fit,
    global_loss_and_grad,
    global_step,
    init_params,
    local_log_likelihood,
    local_step,
    to_ensemble,
)
from smc_jax.smc import SMC
from tests.helpers import learn_reference as ref

#: Below the tables' longest string (4): EOS is forced at the limit and the mixture's Z is not 1.
MAX_LENGTH = 3
W_INIT = [0.4, 0.6]
TAUS = [0.0, 1.0, -1.0]  # product, mixture, harmonic
RUNS = 1000  # independent SMC runs per estimate, vmapped in one call
NUM_SIGMAS = 4.0
#: The sampler of the plumbing tests (one compilation shared by them).
SMC8 = SMC(8, MAX_LENGTH)


@pytest.fixture(scope="module")
def tables(overlapping_tables) -> ExpertStack:
    return ExpertStack(groups=overlapping_tables)


@pytest.fixture(scope="module")
def enumerated(tables):
    strings = enumerate_strings(tables.alphabet_size, MAX_LENGTH)
    return strings, string_logprobs(tables, strings)


@pytest.fixture(scope="module")
def shared_targets(enumerated):
    """Strings of positive probability under both tables (so log phi > -inf for every tau)."""
    strings, log_p = enumerated
    shared = [s for s, row in zip(strings, log_p) if np.all(np.isfinite(row))]
    assert len(shared) >= 3
    return shared[:3]


def flat(params: EnsembleParams) -> np.ndarray:
    return np.concatenate([np.asarray(params.weight_logits, np.float64), [float(params.tau)]])


def _mean_log_phi(params: EnsembleParams, base: GeneralizedMean, log_p):
    return jnp.mean(to_ensemble(params, base).log_target(log_p))


def _log_z(params: EnsembleParams, base: GeneralizedMean, all_log_p):
    return jax.nn.logsumexp(to_ensemble(params, base).log_target(all_log_p))


#: (value, gradient) of mean_i log phi(x_i) and of log Z = logsumexp over all enumerated strings:
#: the exact gradient is autodiff through the enumeration (library f, float32).
mean_log_phi_and_grad = jax.jit(jax.value_and_grad(_mean_log_phi))
log_z_and_grad = jax.jit(jax.value_and_grad(_log_z))


def exact_loss_and_grad(params: EnsembleParams, base: GeneralizedMean, target_log_p, all_log_p):
    """-mean_i log phi(x_i) + log Z and its gradient (flat: weight logits, tau)."""
    data, grad_mean_log_phi = mean_log_phi_and_grad(params, base, target_log_p)
    log_z, log_z_grad = log_z_and_grad(params, base, all_log_p)
    return float(log_z - data), flat(log_z_grad) - flat(grad_mean_log_phi)


def as_f32(x) -> jnp.ndarray:
    return jnp.asarray(x, jnp.float32)


# ---------------------------------------------------------------- gradients of the global objective


@pytest.mark.parametrize("tau", TAUS + [2.5])
def test_exact_gradient_matches_finite_differences(tables, enumerated, shared_targets, tau):
    _, all_log_p = enumerated
    target_log_p = string_logprobs(tables, shared_targets)
    ens = make_ensemble(tau, 2, W_INIT)
    params = init_params(ens)
    loss, grad = exact_loss_and_grad(params, ens, as_f32(target_log_p), as_f32(all_log_p))
    theta = flat(params)
    neg_ll = lambda th: -ref.global_log_lik(th, target_log_p, all_log_p)
    np.testing.assert_allclose(loss, neg_ll(theta), rtol=1e-5)
    np.testing.assert_allclose(grad, ref.central_diff(neg_ll, theta), rtol=1e-4, atol=2e-5)


batched_global = jax.jit(jax.vmap(global_loss_and_grad, in_axes=(None, None, 0, None, None, None)), static_argnums=5)


def smc_estimates(params, ens, experts, target_log_p, num_particles: int, seed: int):
    smc = SMC(num_particles=num_particles, max_length=MAX_LENGTH)
    keys = jax.random.split(jax.random.key(seed), RUNS)
    loss, log_z, grad = batched_global(params, ens, keys, experts, as_f32(target_log_p), smc)
    return np.asarray(loss, np.float64), np.asarray(log_z, np.float64), flat_batch(grad)


def flat_batch(params: EnsembleParams) -> np.ndarray:
    return np.concatenate([np.asarray(params.weight_logits, np.float64), np.asarray(params.tau, np.float64)[:, None]], 1)


@pytest.mark.parametrize("tau", TAUS)
def test_smc_gradient_matches_exact_gradient(tables, enumerated, shared_targets, tau):
    """d/dtheta [-mean log phi(x_i) + log Z]: exact data term, SMC estimate of E_Phi[d log phi]."""
    _, all_log_p = enumerated
    target_log_p = string_logprobs(tables, shared_targets)
    ens = make_ensemble(tau, 2, W_INIT)
    params = init_params(ens)
    _, exact_grad = exact_loss_and_grad(params, ens, as_f32(target_log_p), as_f32(all_log_p))
    data_value, _ = mean_log_phi_and_grad(params, ens, as_f32(target_log_p))
    log_z, grad_log_z = log_z_and_grad(params, ens, as_f32(all_log_p))
    log_z, grad_log_z, grad_mean_log_phi = float(log_z), flat(grad_log_z), flat(grad_log_z) - exact_grad

    rmse = {}
    for m in (8, 32):
        loss, log_z_hat, grad = smc_estimates(params, ens, tables, target_log_p, m, seed=m)
        # A run whose particles all die (consensus f, few particles) has Z_hat = 0 and no estimate
        # of d log Z (fit raises ZeroWeightError); it still counts as a 0 in the unbiased dZ check.
        alive = np.isfinite(log_z_hat)
        assert alive.mean() > 0.9
        np.testing.assert_allclose(log_z_hat[alive] - loss[alive], float(data_value), rtol=1e-5)  # loss = data + log Z_hat
        rmse[m] = np.sqrt(np.mean((grad[alive] - exact_grad) ** 2, axis=0))
        if m == 8:
            # Unbiased at any M: Z_hat * (estimate of d log Z) is an unbiased estimate of dZ/dtheta.
            dz = np.where(alive[:, None], np.exp(log_z_hat)[:, None] * (grad + grad_mean_log_phi), 0.0)
            se = dz.std(0) / math.sqrt(RUNS)
            assert np.all(np.abs(dz.mean(0) - math.exp(log_z) * grad_log_z) < NUM_SIGMAS * se + 1e-6), (
                dz.mean(0), math.exp(log_z) * grad_log_z, se)
        else:
            # The self-normalized estimate (what fit uses): consistent, bias O(1/M), negligible here.
            g = grad[alive]
            se = g.std(0) / math.sqrt(g.shape[0])
            assert np.all(np.abs(g.mean(0) - exact_grad) < NUM_SIGMAS * se + 1e-6), (g.mean(0), exact_grad, se)
    # Error ~ 1/sqrt(M): 4x the particles should about halve it.
    assert np.all(rmse[32] < 0.65 * rmse[8]), rmse


# ---------------------------------------------------------------- the token-local objective


@pytest.fixture(scope="module")
def full_support(tables):
    """All strings of the tables' support (length <= 4), for brute-force next-symbol conditionals."""
    strings = enumerate_strings(tables.alphabet_size, 4)
    return strings, string_logprobs(tables, strings)


@pytest.mark.parametrize("tau", TAUS + [2.5])
def test_local_log_likelihood_is_exact_and_normalized(tables, full_support, tau):
    strings, log_p = full_support
    candidates = enumerate_strings(tables.alphabet_size, MAX_LENGTH)
    symbols, lengths = pad_sequences(candidates, tables.alphabet_size)
    steps = teacher_force(tables, symbols, lengths).step_logprobs
    ens = make_ensemble(tau, 2, W_INIT)
    got = np.asarray(local_log_likelihood(ens, steps, symbols, lengths, MAX_LENGTH), np.float64)
    theta = flat(init_params(ens))
    want = np.array([ref.local_log_lik(x, theta, strings, log_p, tables.alphabet_size, MAX_LENGTH) for x in candidates])
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))
    assert not np.isnan(got).any()
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-5)
    # A distribution over strings of <= MAX_LENGTH symbols (consensus f may lose mass at dead ends).
    total = np.exp(got[finite]).sum()
    np.testing.assert_allclose(total, np.exp(want[finite]).sum(), rtol=1e-5)
    if tau > 0:
        np.testing.assert_allclose(total, 1.0, rtol=1e-5)
    else:
        assert total <= 1.0 + 1e-6


@pytest.mark.parametrize("tau", TAUS)
def test_local_gradient_matches_finite_differences(tables, full_support, shared_targets, tau):
    strings, log_p = full_support
    symbols, lengths = pad_sequences(shared_targets, tables.alphabet_size)
    steps = teacher_force(tables, symbols, lengths).step_logprobs
    ens = make_ensemble(tau, 2, W_INIT)
    params = init_params(ens)
    loss, grad = local_step(params, ens, steps, symbols, lengths, MAX_LENGTH)

    def neg_ll(th):
        return -np.mean([ref.local_log_lik(x, th, strings, log_p, tables.alphabet_size, MAX_LENGTH) for x in shared_targets])

    theta = flat(params)
    np.testing.assert_allclose(float(loss), neg_ll(theta), rtol=1e-5)
    np.testing.assert_allclose(flat(grad), ref.central_diff(neg_ll, theta), rtol=1e-4, atol=2e-5)


# ---------------------------------------------------------------- fitting synthetic data


def sample_exact(experts, ensemble, max_length: int, n: int, seed: int):
    """n strings drawn i.i.d. from the exact Phi (enumerated), and all strings' log p_k."""
    target = exact_target(experts, ensemble, max_length)
    rng = np.random.default_rng(seed)
    index = rng.choice(len(target.strings), size=n, p=target.probs / target.probs.sum())
    return [target.strings[i] for i in index], target


def fisher_standard_errors(theta_fn, theta: np.ndarray, all_log_p: np.ndarray, n: int) -> np.ndarray:
    """Asymptotic standard errors of the MLE from n samples: sqrt(diag(I^-1) / n), with the Fisher
    information I = Cov_Phi[d log phi / d theta] (the model is phi_theta / Z_theta), in float64."""
    keep = np.isfinite(ref.log_f(all_log_p, *theta_fn(theta)))  # the support of Phi
    log_phi = lambda th: ref.log_f(all_log_p[keep], *theta_fn(th))
    values = log_phi(theta)
    probs = np.exp(values - np.logaddexp.reduce(values))
    step = 1e-5
    jac = np.stack([(log_phi(theta + step * e) - log_phi(theta - step * e)) / (2 * step) for e in np.eye(theta.size)], 1)
    centered = jac - probs @ jac
    info = (probs[:, None] * centered).T @ centered
    return np.sqrt(np.diag(np.linalg.inv(info)) / n)


def exact_mle(target_log_p: np.ndarray, all_log_p: np.ndarray, tau: float | None = None) -> np.ndarray:
    """argmax over (w_1, tau) of mean_i log Phi(x_i) by enumeration (float64, BFGS in the
    unconstrained coordinates (logit w_1, tau)); tau is held at `tau` unless it is None."""

    def unpack(u):
        w1 = 1 / (1 + math.exp(-u[0]))
        return np.array([w1, 1 - w1]), (float(u[1]) if tau is None else tau)

    def neg_ll(u):
        w, t = unpack(u)
        return -(np.mean(ref.log_f(target_log_p, w, t)) - np.logaddexp.reduce(ref.log_f(all_log_p, w, t)))

    res = minimize(neg_ll, np.zeros(1 if tau is not None else 2), method="BFGS", options={"gtol": 1e-8})
    w, t = unpack(res.x)
    return np.array([w[0]]) if tau is not None else np.array([w[0], t])


#: Particles per SMC run in the fits: the gradient noise (sd ~0.02 per logit here) sets how far
#: the last Adam iterate strays from the optimum on these flat likelihoods.
FIT_PARTICLES = 256
#: Allowed |fitted - exact MLE| per parameter (weight, tau): the spread of the final iterate over
#: optimizer seeds is ~0.01 in the weight at this M and schedule; the statistical error of the
#: MLE itself (Fisher SE) is larger (0.024 to 0.041 in the weight).
OPTIMIZATION_TOLERANCE = np.array([0.03, 0.06])


def adam(num_steps: int, peak: float = 0.1) -> optax.GradientTransformation:
    """Adam with a cosine decay to peak / 100: fast progress, then a small final step size."""
    return optax.adam(optax.cosine_decay_schedule(peak, num_steps, alpha=0.01))


@pytest.mark.parametrize("tau", [0.0, 1.0])
def test_fit_recovers_weights(tables, tau):
    """Data from Phi with weights (0.8, 0.2); fit the weights from uniform (tau fixed)."""
    truth = make_ensemble(tau, 2, [0.8, 0.2])
    n, length = 400, 4
    data, target = sample_exact(tables, truth, length, n, seed=int(10 * tau))
    targets = Targets.from_sequences(tables, data)
    steps = 300
    result = fit(targets, make_ensemble(tau, 2), adam(steps), steps, jax.random.key(0), SMC(FIT_PARTICLES, length), learn_tau=False)
    w_fit = float(result.ensemble.weights[0])
    assert float(result.ensemble.tau) == tau

    theta_fn = lambda th: (np.array([th[0], 1 - th[0]]), tau)
    target_log_p = string_logprobs(tables, data)
    w_mle = float(exact_mle(target_log_p, target.log_p, tau=tau)[0])
    se = float(fisher_standard_errors(theta_fn, np.array([0.8]), target.log_p, n)[0])
    nll = lambda w: -ref.global_log_lik(np.array([math.log(w), math.log(1 - w), tau]), target_log_p, target.log_p)
    print(f"tau={tau}: truth 0.8, MLE {w_mle:.4f} (SE {se:.4f}), fitted {w_fit:.4f}; exact NLL "
          f"{nll(0.5):.4f} -> {nll(w_fit):.4f} (MLE {nll(w_mle):.4f}); reported {result.losses[:20].mean():.4f} "
          f"-> {result.losses[-50:].mean():.4f}")
    assert abs(w_mle - 0.8) < NUM_SIGMAS * se
    assert abs(w_fit - w_mle) < OPTIMIZATION_TOLERANCE[0]
    check_learning_curve(result.losses, nll(0.5), nll(w_fit))
    assert result.log_Z.shape == (steps, 1) and np.all(np.isfinite(result.log_Z))


def check_learning_curve(losses: np.ndarray, initial_nll: float, final_nll: float, tail: int = 50) -> None:
    """The exact loss decreased, and the reported one (with log Z_hat) ends at the exact value.

    Over the last `tail` steps the parameters barely move, so the reported losses are the exact
    loss plus the error of log Z_hat, whose bias is about -Var(log Z_hat) / 2 (delta method;
    E log Z_hat <= log Z): corrected by the losses' own variance, their mean must be within 4
    standard errors of the exact value, plus 0.005 for the drift of the last steps.
    """
    assert final_nll < initial_nll - 0.01
    end = losses[-tail:]
    corrected = end.mean() + end.var() / 2
    assert abs(corrected - final_nll) < NUM_SIGMAS * end.std() / math.sqrt(tail) + 0.005, (corrected, final_nll)


@pytest.fixture(scope="module")
def sharp_ngrams() -> ExpertStack:
    """Two bigram experts over 3 symbols with peaked rows: tau is identifiable from ~1e3 strings."""
    k1, k2 = jax.random.split(jax.random.key(0))
    return ExpertStack(groups=(
        NGramExpert.random(k1, alphabet_size=3, order=2, eos_logit=0.5, concentration=0.5),
        NGramExpert.random(k2, alphabet_size=3, order=2, eos_logit=0.5, concentration=0.5),
    ))


def test_fit_recovers_tau_and_weights(sharp_ngrams):
    """Data from the product (tau = 0) with weights (0.8, 0.2); fit both from the uniform mixture."""
    truth = make_ensemble("product", 2, [0.8, 0.2])
    n, length = 2000, 3
    data, target = sample_exact(sharp_ngrams, truth, length, n, seed=1)
    targets = Targets.from_sequences(sharp_ngrams, data)
    steps = 400
    result = fit(targets, make_ensemble("mixture", 2), adam(steps), steps, jax.random.key(1), SMC(FIT_PARTICLES, length))
    fitted = np.array([float(result.ensemble.weights[0]), float(result.ensemble.tau)])

    theta_fn = lambda th: (np.array([th[0], 1 - th[0]]), float(th[1]))
    target_log_p = string_logprobs(sharp_ngrams, data)
    mle = exact_mle(target_log_p, target.log_p)
    se = fisher_standard_errors(theta_fn, np.array([0.8, 0.0]), target.log_p, n)
    nll = lambda w, tau: -ref.global_log_lik(np.array([math.log(w), math.log(1 - w), tau]), target_log_p, target.log_p)
    print(f"truth (0.8, 0.0), MLE {mle} (SE {se}), fitted {fitted}; exact NLL {nll(0.5, 1.0):.4f} -> "
          f"{nll(*fitted):.4f} (MLE {nll(*mle):.4f}); reported {result.losses[:20].mean():.4f} -> "
          f"{result.losses[-50:].mean():.4f}")
    assert np.all(np.abs(mle - [0.8, 0.0]) < NUM_SIGMAS * se)
    assert np.all(np.abs(fitted - mle) < OPTIMIZATION_TOLERANCE)
    check_learning_curve(result.losses, nll(0.5, 1.0), nll(*fitted))


def test_local_fit_reaches_a_stationary_point_of_the_exact_local_likelihood(tables, full_support):
    strings, log_p = full_support
    data, _ = sample_exact(tables, make_ensemble("mixture", 2, [0.8, 0.2]), MAX_LENGTH, 300, seed=3)
    steps = 300
    result = fit(
        Targets.from_sequences(tables, data), make_ensemble("mixture", 2), adam(steps), steps,
        jax.random.key(0), SMC8, objective="local", learn_tau=False,
    )
    assert result.log_Z is None
    theta = np.concatenate([np.asarray(result.params.weight_logits, np.float64), [1.0]])  # tau fixed at 1
    counts: dict = {}
    for x in data:
        counts[x] = counts.get(x, 0) + 1
    cached = {x: None for x in counts}

    def neg_ll(th):
        for x in cached:
            cached[x] = ref.local_log_lik(x, th, strings, log_p, tables.alphabet_size, MAX_LENGTH)
        return -sum(c * cached[x] for x, c in counts.items()) / len(data)

    grad = ref.central_diff(neg_ll, theta)[:2]
    print(f"local fit: weights {np.asarray(result.ensemble.weights)}, exact gradient {grad}")
    assert np.all(np.abs(grad) < 2e-3)
    assert result.losses[-1] < result.losses[0] - 0.01
    assert np.all(np.diff(result.losses[::50]) < 1e-5)  # exact loss: non-increasing at this scale
    np.testing.assert_allclose(result.losses[-1], neg_ll(theta), atol=1e-3)


# ---------------------------------------------------------------- plumbing: groups, jit, keys


def test_groups_split_the_mean(tables, shared_targets):
    """Several target groups: the loss is the mean over all targets (exact with the local objective)."""
    data = shared_targets * 2
    opt, steps = optax.adam(0.05), 20
    ens = make_ensemble(0.5, 2)
    one = fit(Targets.from_sequences(tables, data), ens, opt, steps, jax.random.key(0), SMC8, objective="local")
    two = fit(
        [Targets.from_sequences(tables, data[:3]), Targets.from_sequences(tables, data[3:])],
        ens, opt, steps, jax.random.key(0), SMC8, objective="local",
    )
    np.testing.assert_allclose(two.losses, one.losses, rtol=1e-5)
    np.testing.assert_allclose(flat(two.params), flat(one.params), rtol=1e-4, atol=1e-6)
    # Global: each group has its own SMC run (own key) and log Z_hat.
    both = fit([Targets.from_sequences(tables, shared_targets)] * 2, ens, opt, 5, jax.random.key(0), SMC8)
    assert both.log_Z.shape == (5, 2) and np.all(np.isfinite(both.log_Z))
    assert not np.array_equal(both.log_Z[:, 0], both.log_Z[:, 1])


def test_jit_and_eager_agree(tables, shared_targets):
    ens = make_ensemble(-1.0, 2, W_INIT)
    params = init_params(ens)
    target_log_p = as_f32(string_logprobs(tables, shared_targets))
    jitted = global_step(params, ens, jax.random.key(2), tables, target_log_p, SMC8)
    with jax.disable_jit():
        eager = global_loss_and_grad(params, ens, jax.random.key(2), tables, target_log_p, SMC8)
    # Fused (jit) and op-by-op f32 arithmetic round differently, by a few ulps that the SMC
    # steps and the gradient sums compound; tolerances leave room for that across CPUs.
    for a, b in zip(jax.tree.leaves(jitted), jax.tree.leaves(eager)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


def test_same_key_same_result(tables, shared_targets):
    targets = Targets.from_sequences(tables, shared_targets)
    run = lambda seed: fit(targets, make_ensemble(1.0, 2), optax.adam(0.05), 5, jax.random.key(seed), SMC8)
    a, b, c = run(0), run(0), run(1)
    np.testing.assert_array_equal(a.losses, b.losses)
    np.testing.assert_array_equal(a.log_Z, b.log_Z)
    np.testing.assert_array_equal(flat(a.params), flat(b.params))
    assert not np.array_equal(a.log_Z, c.log_Z)


def test_fixed_parts_stay_fixed(tables, shared_targets):
    targets = Targets.from_sequences(tables, shared_targets)
    opt = optax.adam(0.1)
    only_tau = fit(targets, make_ensemble(0.5, 2, W_INIT), opt, 3, jax.random.key(0), SMC8, learn_weights=False)
    assert only_tau.params.weight_logits is None
    np.testing.assert_array_equal(np.asarray(only_tau.ensemble.weights), np.asarray(W_INIT, np.float32))
    assert float(only_tau.ensemble.tau) != 0.5
    only_weights = fit(targets, make_ensemble(0.5, 2, W_INIT), opt, 3, jax.random.key(0), SMC8, learn_tau=False)
    assert only_weights.params.tau is None and float(only_weights.ensemble.tau) == 0.5
    assert not np.allclose(np.asarray(only_weights.ensemble.weights), W_INIT)
    # tau fixed at +inf (max): finite losses; max ignores the weights, so their gradient is 0.
    with_max = fit(targets, make_ensemble("max", 2, W_INIT), opt, 3, jax.random.key(0), SMC8, learn_tau=False)
    assert float(with_max.ensemble.tau) == math.inf and np.all(np.isfinite(with_max.losses))
    np.testing.assert_allclose(np.asarray(with_max.ensemble.weights), W_INIT, rtol=1e-6)


# ---------------------------------------------------------------- errors


def test_bad_inputs_are_rejected(tables, enumerated):
    strings, log_p = enumerated
    ens, opt, smc, key = make_ensemble("product", 2), optax.adam(0.1), SMC8, jax.random.key(0)
    with pytest.raises(ValueError, match="data set is empty"):
        fit(Targets.from_sequences(tables, []), ens, opt, 1, key, smc)
    with pytest.raises(ValueError, match="data set is empty"):
        fit([], ens, opt, 1, key, smc)
    with pytest.raises(ValueError, match=r"target 1 of group 0 \(\[0, 0, 0, 0\]\) has 4 symbols, more than max_length = 3"):
        fit(Targets.from_sequences(tables, [[0], [0, 0, 0, 0]]), ens, opt, 1, key, smc)
    only_first = next(s for s, row in zip(strings, log_p) if np.isfinite(row[0]) and np.isneginf(row[1]))
    for objective, what in [("global", "ensemble"), ("local", "token-local ensemble")]:
        message = re.escape(f"target 0 of group 0 ({list(only_first)}) has probability 0 under the initial {what} (")
        with pytest.raises(ValueError, match=message):
            fit(Targets.from_sequences(tables, [only_first]), ens, opt, 1, key, smc, objective=objective)
    ok = Targets.from_sequences(tables, [strings[0]])
    with pytest.raises(ValueError, match="method='smc'"):
        fit(ok, ens, opt, 1, key, SMC(8, MAX_LENGTH, method="local"))
    with pytest.raises(ValueError, match="unknown objective"):
        fit(ok, ens, opt, 1, key, smc, objective="exact")
    with pytest.raises(ValueError, match="initial weight > 0"):
        fit(ok, make_ensemble("mixture", 2, [1.0, 0.0]), opt, 1, key, smc)
    with pytest.raises(ValueError, match="finite tau"):
        fit(ok, make_ensemble("min", 2), opt, 1, key, smc)
    with pytest.raises(ValueError, match="nothing to learn"):
        fit(ok, ens, opt, 1, key, smc, learn_weights=False, learn_tau=False)
    with pytest.raises(ValueError, match="num_steps"):
        fit(ok, ens, opt, 0, key, smc)
    with pytest.raises(ValueError, match="the ensemble is for 3"):
        fit(ok, make_ensemble("product", 3), opt, 1, key, smc)
