"""Float64 references for the learning tests, independent of the library's arithmetic.

* `log_f`: the weighted generalized mean (1/tau) log sum_k w_k p_k^tau (tau = 0: sum_k w_k log p_k).
* `global_log_lik`: mean_i log Phi_theta(x_i) over enumerated strings (Z by brute force).
* `local_log_lik`: log q_theta(x) of the token-local ensemble with next-symbol conditionals from
  brute-force prefix sums over the experts' listed support, EOS forced after max_length symbols.
* `central_diff`: central finite differences of a function of a flat parameter vector.
"""

from __future__ import annotations

import numpy as np
from scipy.special import logsumexp

String = tuple[int, ...]


def softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max())
    return z / z.sum()


def log_f(log_p: np.ndarray, weights: np.ndarray, tau: float) -> np.ndarray:
    """log M_tau(p; w) on a trailing expert axis, for finite tau and positive weights."""
    log_p = np.asarray(log_p, np.float64)
    with np.errstate(invalid="ignore"):
        if tau == 0:
            out = np.sum(weights * log_p, axis=-1)
            return np.where(np.any(np.isneginf(log_p), -1), -np.inf, out)
        out = logsumexp(np.log(weights) + tau * log_p, axis=-1) / tau
        if tau < 0:
            out = np.where(np.any(np.isneginf(log_p), -1), -np.inf, out)
        return out


def global_log_lik(theta: np.ndarray, target_log_p: np.ndarray, all_log_p: np.ndarray) -> float:
    """mean_i log phi(x_i) - log sum_x phi(x); theta = (weight logits [K], tau)."""
    w, tau = softmax(theta[:-1]), float(theta[-1])
    return float(np.mean(log_f(target_log_p, w, tau)) - logsumexp(log_f(all_log_p, w, tau)))


def prefix_logprobs(strings: list[String], log_p: np.ndarray) -> dict[String, np.ndarray]:
    """log P_k(y) = log sum of p_k over listed strings extending y, for every prefix y."""
    mass: dict[String, np.ndarray] = {}
    p = np.exp(np.asarray(log_p, np.float64))
    for s, row in zip(strings, p):
        for t in range(len(s) + 1):
            mass[s[:t]] = mass.get(s[:t], 0.0) + row
    with np.errstate(divide="ignore"):
        return {y: np.log(v) for y, v in mass.items()}


def local_log_lik(
    x: String, theta: np.ndarray, strings: list[String], log_p: np.ndarray, alphabet: int, max_length: int
) -> float:
    """log q(x) = sum_t log f(p(x_t | x_<t)) - log sum_a f(p(a | x_<t)); `strings`/`log_p` must
    list the experts' whole support (tables), so that p_k(a | y) = P_k(ya) / P_k(y)."""
    w, tau = softmax(theta[:-1]), float(theta[-1])
    prefix = prefix_logprobs(strings, log_p)
    index = {s: i for i, s in enumerate(strings)}
    k = log_p.shape[1]
    total = 0.0
    for t in range(len(x) + 1):
        if t == max_length:  # EOS forced
            break
        y = x[:t]
        log_py = prefix.get(y, np.full(k, -np.inf))
        cond = np.full((alphabet + 1, k), -np.inf)
        with np.errstate(invalid="ignore"):  # -inf - -inf for an expert that left its support
            for a in range(alphabet):
                if y + (a,) in prefix:
                    cond[a] = prefix[y + (a,)] - log_py
            if y in index:
                cond[alphabet] = log_p[index[y]] - log_py
        cond = np.where(np.isfinite(log_py), cond, -np.inf)
        f = log_f(cond, w, tau)
        if np.all(np.isneginf(f)):  # a dead end: no symbol has positive local mass
            return -np.inf
        chosen = x[t] if t < len(x) else alphabet
        total += f[chosen] - logsumexp(f)
    return float(total)


def central_diff(fn, theta: np.ndarray, step: float = 1e-5) -> np.ndarray:
    grad = np.zeros_like(theta, dtype=np.float64)
    for i in range(theta.size):
        e = np.zeros_like(grad)
        e[i] = step
        grad[i] = (fn(theta + e) - fn(theta - e)) / (2 * step)
    return grad
