"""Plots of a sampling run: particle weights and ESS over steps (resampling marked), ancestry."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from smc_jax.smc.result import SMCResult


def _normalized_trace(result: SMCResult) -> np.ndarray:
    """[T, M] normalized weights after each step's update (before resampling)."""
    lw = result.log_weight_trace
    finite = np.isfinite(lw)
    top = np.where(finite.any(1), np.max(np.where(finite, lw, -np.inf), axis=1), 0.0)
    w = np.where(finite, np.exp(lw - top[:, None]), 0.0)
    total = w.sum(1, keepdims=True)
    return np.divide(w, total, out=np.zeros_like(w), where=total > 0)


def lineages(result: SMCResult) -> np.ndarray:
    """[T + 1, M] index, at each step, of the particle each final particle descends from.

    Parameters
    ----------
    result : SMCResult
        A run's result.
    """
    steps, m = result.ancestors.shape
    line = np.zeros((steps + 1, m), dtype=int)
    line[steps] = np.arange(m)
    for t in range(steps - 1, -1, -1):
        line[t] = result.ancestors[t][line[t + 1]]
    return line


def plot_run(result: SMCResult, path: str | Path, title: str | None = None) -> Path:
    """Saves a three-panel figure: weights per particle, ESS with resampling steps, ancestry.

    Parameters
    ----------
    result : SMCResult
        A run's result.
    path : str or pathlib.Path
        The image file written.
    title : str, optional
        The figure's title.

    Returns
    -------
    pathlib.Path
        `path`.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, m = result.ancestors.shape
    t = np.arange(steps)
    resampled = np.flatnonzero(result.resampled)
    fig, (ax_w, ax_ess, ax_tree) = plt.subplots(3, 1, figsize=(9, 9), sharex=True)

    weights = _normalized_trace(result)
    for j in range(m):
        ax_w.plot(t, weights[:, j], lw=1, alpha=0.8)
    ax_w.set_ylabel("normalized weight")
    ax_w.set_title(title or f"{result.method.upper()} run: M={m}, {steps} steps")

    ax_ess.plot(t, result.ess, color="black", lw=1.5, label="ESS")
    ax_ess.set_ylim(0, m * 1.05)
    ax_ess.set_ylabel("ESS")
    for ax in (ax_w, ax_ess, ax_tree):
        for s in resampled:
            ax.axvline(s, color="tab:red", alpha=0.25, lw=1)
    if resampled.size:
        ax_ess.plot([], [], color="tab:red", alpha=0.5, label="resampled")
    ax_ess.legend(loc="lower left")

    # Ancestry: particle j at step t+1 descends from ancestors[t, j]; surviving lines in color.
    line = lineages(result)
    alive = np.zeros((steps + 1, m), dtype=bool)
    for j in range(m):
        alive[np.arange(steps + 1), line[:, j]] = True
    for s in range(steps):
        for j in range(m):
            a = result.ancestors[s, j]
            on = alive[s + 1, j] and alive[s, a]
            ax_tree.plot([s, s + 1], [a, j], color="tab:blue" if on else "0.8", lw=1.5 if on else 0.6, zorder=2 if on else 1)
    ax_tree.set_ylabel("particle")
    ax_tree.set_xlabel("step")
    ax_tree.set_ylim(-0.5, m - 0.5)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
