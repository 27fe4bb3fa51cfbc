"""Exact answers by enumeration, for experts whose strings can be listed (toy experts).

These are the independent references the tests compare the sampler against:

* `string_logprobs`: log p_k(x) of every string up to a length, through the expert interface;
* `exact_target`: the f-ensemble Phi restricted to those strings and its normalizer Z;
* `proposal_logprob`: the closed form of the locally optimal proposal q(x) built from prefix
  probabilities P_k(x) = sum_{y extends x} p_k(y) summed by brute force over the listed strings
  (exact for experts whose support is listed in full), so that w(x) = phi(x) / q(x) can be
  checked without the sampler's own arithmetic.

Everything here is host-side numpy in float64 with Python loops: never used for sampling.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from smc_jax.smc.ensemble import Ensemble
from smc_jax.experts.base import ExpertGroup, eos_symbol
from smc_jax.utils.compilation import jit

String = tuple[int, ...]


def enumerate_strings(alphabet_size: int, max_length: int) -> list[String]:
    """All strings over 0..A-1 of length 0..max_length, shortest first.

    Parameters
    ----------
    alphabet_size : int
        A.
    max_length : int
        L.
    """
    out: list[String] = []
    for n in range(max_length + 1):
        out.extend(itertools.product(range(alphabet_size), repeat=n))
    return out


def string_logprobs(experts: ExpertGroup, strings: list[String]) -> np.ndarray:
    """log p_k(x) = sum_t log p_k(x_t | x_<t) + log p_k(EOS | x), shape [len(strings), K].

    Parameters
    ----------
    experts : ExpertGroup
        K experts.
    strings : list of tuple of int
        The strings.
    """
    n = len(strings)
    longest = max((len(s) for s in strings), default=0)
    eos = eos_symbol(experts.alphabet_size)
    padded = np.full((n, longest + 1), eos, np.int32)
    for i, s in enumerate(strings):
        padded[i, : len(s)] = s
    lengths = np.array([len(s) for s in strings])
    state = experts.init(n)
    logprobs, advance = jit(type(experts).logprobs), jit(type(experts).advance)
    total = np.zeros((n, experts.num_experts))
    for t in range(longest + 1):
        logp = np.asarray(logprobs(experts, state), np.float64)  # [n, K, A+1]
        sym = padded[:, t]
        here = lengths >= t
        picked = np.take_along_axis(logp, sym[:, None, None], axis=2)[..., 0]
        total = np.where(here[:, None], total + np.where(here[:, None], picked, 0.0), total)
        state = advance(experts, state, jnp.asarray(sym), jnp.asarray(lengths > t))
    return total


@dataclass(frozen=True)
class ExactTarget:
    """Phi over a list of strings.

    Attributes
    ----------
    strings : list of tuple of int
        N strings.
    log_p : numpy.ndarray, shape [N, K]
        log p_k(x).
    log_phi : numpy.ndarray, shape [N]
        log f(p(x)).
    log_Z : float
        log of the sum of phi over the strings.
    """
    strings: list[String]
    log_p: np.ndarray  # [N, K] log p_k(x)
    log_phi: np.ndarray  # [N] log f(p(x))
    log_Z: float

    @property
    def probs(self) -> np.ndarray:
        """Phi(x) for each listed string."""
        return np.exp(self.log_phi - self.log_Z)

    def distribution(self) -> dict[String, float]:
        """Phi as a dict from string to probability (strings of probability 0 left out)."""
        return {s: float(p) for s, p in zip(self.strings, self.probs) if p > 0}


def _log_f(ensemble: Ensemble, log_p: np.ndarray, shaping: bool) -> np.ndarray:
    fn = ensemble.log_shaping if shaping else ensemble.log_target
    return np.asarray(jax.device_get(fn(jnp.asarray(log_p, jnp.float32))), np.float64)


def exact_target(experts: ExpertGroup, ensemble: Ensemble, max_length: int) -> ExactTarget:
    """Phi restricted to strings of length <= max_length, with Z = sum of phi over them.

    Parameters
    ----------
    experts : ExpertGroup
        K experts.
    ensemble : Ensemble
        The f-ensemble.
    max_length : int
        L.
    """
    strings = enumerate_strings(experts.alphabet_size, max_length)
    log_p = string_logprobs(experts, strings)
    log_phi = _log_f(ensemble, log_p, shaping=False)
    finite = np.isfinite(log_phi)
    log_z = float(np.logaddexp.reduce(log_phi[finite])) if finite.any() else -math.inf
    return ExactTarget(strings=strings, log_p=log_p, log_phi=log_phi, log_Z=log_z)


def proposal_logprob(
    target: ExactTarget,
    ensemble: Ensemble,
    max_length: int,
    prefix_potentials: Callable[[String], Sequence[float]] | None = None,
) -> dict[String, float]:
    """log q(x) of the locally optimal proposal for every listed string of length <= max_length
    with q(x) > 0. `target` must list the experts' whole support (prefix sums are over it).

    psi(y) = f(P_1(y), ..., P_K(y)) with P_k(y) = sum of p_k over listed strings extending y;
    q(a | y) = psi(ya) / Z(y) and q(EOS | y) = phi(y) / Z(y), Z(y) = sum_a psi(ya) + phi(y),
    except at length max_length where q(EOS | y) = 1.

    `prefix_potentials(y)`, when given, returns log C^_j(y) of the last J experts, which are
    potentials (constraints) rather than distributions: their prefix value is "y is viable", not
    a sum over the listed strings.

    Parameters
    ----------
    target : ExactTarget
        From `exact_target`, listing the experts' whole support.
    ensemble : Ensemble
        The f-ensemble.
    max_length : int
        L.
    prefix_potentials : callable, optional
        Maps a prefix y to log C^_j(y) of the last J experts when those are constraints.
    """
    alphabet = 1 + max((max(s) for s in target.strings if s), default=0)
    index = {s: i for i, s in enumerate(target.strings)}
    prefix_p: dict[String, np.ndarray] = {}
    p_lin = np.exp(target.log_p)
    for s, i in index.items():
        for t in range(len(s) + 1):
            prefix_p[s[:t]] = prefix_p.get(s[:t], 0.0) + p_lin[i]
    with np.errstate(divide="ignore"):
        log_prefix = {y: np.log(v) for y, v in prefix_p.items()}
    if prefix_potentials is not None:
        for y, value in log_prefix.items():
            pots = np.asarray(prefix_potentials(y), np.float64)
            if pots.size:
                value[-pots.size :] = pots

    def log_psi(y: String) -> float:
        return float(_log_f(ensemble, log_prefix[y][None], shaping=True)[0])

    out: dict[String, float] = {}
    for s, i in index.items():
        if len(s) > max_length:
            continue
        total = 0.0
        for t in range(len(s) + 1):
            y = s[:t]
            if t == len(s) and t == max_length:  # forced EOS
                continue
            options = [log_psi(y + (a,)) for a in range(alphabet) if y + (a,) in prefix_p]
            options.append(float(target.log_phi[index[y]]))
            log_z = np.logaddexp.reduce(options)
            if log_z == -np.inf:  # a dead end: no continuation has positive shaping
                total = -np.inf
                break
            chosen = float(target.log_phi[i]) if t == len(s) else log_psi(s[: t + 1])
            total += chosen - log_z
        if np.isfinite(total):
            out[s] = total
    return out
