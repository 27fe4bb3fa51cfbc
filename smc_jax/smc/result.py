"""Host-side results of a sampling run: weighted particles, log Z-hat, diagnostics.

The weighted particles approximate the global ensemble: Phi_hat(x) = sum_m w_bar_m 1{x_m = x}
with normalized weights w_bar; log Z-hat = log mean_m w_m; expected accuracy under a task's
predicate is sum_m w_bar_m 1{x_m correct} (paper Sec. 6.1).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Hashable
from typing import Any

import jax
import numpy as np


class ZeroWeightError(RuntimeError):
    """Every particle ended with zero weight, so there is no estimate to return."""


def _normalize(log_weights: np.ndarray) -> np.ndarray:
    finite = np.isfinite(log_weights)
    if not finite.any():
        return np.zeros_like(log_weights, dtype=np.float64)
    lw = np.where(finite, log_weights, -np.inf).astype(np.float64)
    w = np.exp(lw - lw[finite].max())
    return w / w.sum()


@dataclasses.dataclass(frozen=True)
class SMCResult:
    """M weighted particles and the run's diagnostics (numpy arrays on the host).

    symbols[m, :lengths[m]] is particle m's string (integer symbols). `finished[m]` is True when
    the particle sampled EOS (a complete string), False when it stopped at the length limit
    without it (truncate mode) or died at zero weight. `expert_logprobs[m, k]` is log p_k(x_m)
    for finished particles (prefix log-probability log P_k(x_m) otherwise). Traces have one row
    per step taken: ESS after the weight update, resampling flags, ancestors, log weights.
    `log_Z` is None for the token-local baseline, whose weights are not importance weights.

    Attributes
    ----------
    symbols : numpy.ndarray, shape [M, L]
        Integer symbols, PAD_SYMBOL past each length.
    lengths : numpy.ndarray, shape [M]
    finished : numpy.ndarray, shape [M], bool
    log_weights : numpy.ndarray, shape [M]
        Unnormalized log weights.
    expert_logprobs : numpy.ndarray, shape [M, K]
        log p_k(x_m) (of the prefix for unfinished particles).
    log_Z : float or None
        log Z-hat (None for the token-local baseline).
    ess, resampled, num_active : numpy.ndarray, shape [T]
        Per-step ESS, resampling flags and active particles.
    ancestors, log_weight_trace : numpy.ndarray, shape [T, M]
        Per-step ancestors and log weights.
    method : str
        "smc" or "local".
    decode : callable, optional
        Symbols -> text (`texts`).
    stats : dict
        Steps, model calls, rows, seconds.
    """

    symbols: np.ndarray
    lengths: np.ndarray
    log_weights: np.ndarray
    finished: np.ndarray
    expert_logprobs: np.ndarray
    log_Z: float | None
    ess: np.ndarray
    resampled: np.ndarray
    ancestors: np.ndarray
    log_weight_trace: np.ndarray
    num_active: np.ndarray
    method: str
    decode: Callable[[np.ndarray], Any] | None = None
    stats: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_state(
        cls, state, method: str, decode: Callable | None = None, stats: dict[str, Any] | None = None
    ) -> "SMCResult":
        """Host-side results of a final `SMCState`.

        Parameters
        ----------
        state : SMCState
            The final state.
        method : str
            "smc" or "local" (the local baseline has no log Z-hat).
        decode : callable, optional
            Symbols -> text.
        stats : dict, optional
            Run counters to keep.
        """
        host = jax.device_get(state)
        steps = int(host.step)
        lw = np.asarray(host.log_weights, np.float64)
        finite = np.isfinite(lw)
        if method == "smc":
            log_z = float(np.logaddexp.reduce(lw[finite]) - math.log(lw.size)) if finite.any() else -math.inf
        else:
            log_z = None
        return cls(
            symbols=np.asarray(host.symbols),
            lengths=np.asarray(host.lengths),
            log_weights=lw,
            finished=np.asarray(host.eos),
            expert_logprobs=np.asarray(host.log_prefix, np.float64),
            log_Z=log_z,
            ess=np.asarray(host.trace.ess[:steps]),
            resampled=np.asarray(host.trace.resampled[:steps]),
            ancestors=np.asarray(host.trace.ancestors[:steps]),
            log_weight_trace=np.asarray(host.trace.log_weights[:steps], np.float64),
            num_active=np.asarray(host.trace.num_active[:steps]),
            method=method,
            decode=decode,
            stats=dict(stats or {}),
        )

    @property
    def num_particles(self) -> int:
        return int(self.log_weights.shape[0])

    @property
    def num_steps(self) -> int:
        return int(self.ess.shape[0])

    @property
    def weights(self) -> np.ndarray:
        """Normalized weights w_bar (sum to 1; all zero only if every weight is zero)."""
        return _normalize(self.log_weights)

    @property
    def sequences(self) -> list[tuple[int, ...]]:
        return [tuple(int(s) for s in row[:n]) for row, n in zip(self.symbols, self.lengths)]

    @property
    def texts(self) -> list[Any]:
        """Each particle's string decoded (raw symbol tuples when no decoder was given)."""
        if self.decode is None:
            return self.sequences
        return [self.decode(row[:n]) for row, n in zip(self.symbols, self.lengths)]

    def posterior(self) -> list[tuple[Hashable, float]]:
        """Phi_hat: (string, total normalized weight), duplicates merged, heaviest first.

        Unfinished particles (stopped at the length limit) are kept distinct from complete
        strings with the same symbols: their key is (string, "...")."""
        mass: dict[Hashable, float] = {}
        for text, w, fin in zip(self.texts, self.weights, self.finished):
            key = text if fin else (text, "...")
            mass[key] = mass.get(key, 0.0) + float(w)
        return sorted(mass.items(), key=lambda kv: -kv[1])

    def expected_accuracy(self, is_correct: Callable[[Any], bool]) -> float:
        """sum_m w_bar_m 1{x_m correct}; unfinished particles count as incorrect.

        Parameters
        ----------
        is_correct : callable
            Maps a particle's text (or symbols when there is no `decode`) to a bool.
        """
        return float(
            sum(w for text, w, fin in zip(self.texts, self.weights, self.finished) if fin and is_correct(text))
        )
