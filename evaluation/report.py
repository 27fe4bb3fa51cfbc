"""Aggregates records into the paper's tables and figures: Table 5 (expected accuracy, mean and
95% CI over seeds), the particle study (E[log Z-hat] against M, Figs. 6-8), the per-instance
log Z-hat/accuracy Spearman correlations (Table 7), z-scored scatter plots (Fig. 5) and the two
sanity checks of Sec. 6.2: the mixture's expected accuracy converges to the mean of its
experts', and SMC's E[log Z-hat] exceeds importance sampling's at equal M.

Seed-level aggregation everywhere: for each seed, the mean over instances; then the mean and
t-interval of those per-seed values (`stats.t_interval`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from evaluation.methods import STUDY_LEVELS, StudyLevel, get_method, method_label
from evaluation.records import NO_F, Record
from evaluation.runner import select
from evaluation.stats import CorrelationSummary, Interval, pearson, per_instance_spearman, t_interval, zscore

#: Percent in tables of expected accuracy.
PERCENT = 100.0
F_NAMES = {"min": "min", "product": "Product", "mixture": "Mixture", "max": "max", NO_F: ""}

Value = Callable[[Record], float | None]
TOKEN_LEVEL = STUDY_LEVELS["token"]
#: How an SMC variant resamples (the "resampling" column of sanity check (b)).
RESAMPLE_ALL, RESAMPLE_ACTIVE = "all (Alg. 1)", "active only"


def expected_accuracy(record: Record) -> float:
    return record.expected_accuracy


def log_z(record: Record) -> float | None:
    return record.log_Z


def seed_means(records: Sequence[Record], value: Value = expected_accuracy) -> dict[int, float]:
    """Per seed, the mean over instances of `value` (records where it is None are left out)."""
    by_seed: dict[int, list[float]] = defaultdict(list)
    for record in records:
        v = value(record)
        if v is not None:
            by_seed[record.seed].append(float(v))
    return {seed: float(np.mean(vs)) for seed, vs in sorted(by_seed.items())}


def seed_interval(records: Sequence[Record], value: Value = expected_accuracy) -> Interval:
    """Mean and 95% t-interval over seeds of the per-seed instance means."""
    return t_interval(list(seed_means(records, value).values()))


def paired_difference(a: Sequence[Record], b: Sequence[Record], value: Value) -> Interval:
    """t-interval over the seeds present in both of (instance mean of a) - (instance mean of b)."""
    ma, mb = seed_means(a, value), seed_means(b, value)
    return t_interval([ma[s] - mb[s] for s in ma if s in mb])


def run_paired_difference(a: Sequence[Record], b: Sequence[Record], value: Value) -> tuple[Interval, float]:
    """Runs paired by (instance, seed): the t-interval over pairs of value(a) - value(b), and the
    fraction of pairs where a is higher. Uses N x seeds pairs instead of the seed means' few, so
    it resolves smaller differences; same instance and seed, so instance difficulty cancels."""
    va = {(r.instance, r.seed): value(r) for r in a}
    diffs = [float(va[key]) - float(value(r)) for r in b
             if (key := (r.instance, r.seed)) in va and va[key] is not None and value(r) is not None]
    wins = float(np.mean([d > 0 for d in diffs])) if diffs else math.nan
    return t_interval(diffs), wins


def count_instances(records: Sequence[Record]) -> int:
    return len({r.instance for r in records})


# ---------------------------------------------------------------- Table 5


def table5_rows(records: Sequence[Record], tasks: Sequence[str], methods: Sequence[str], fs: Sequence[str],
                particles: Sequence[int]) -> list[dict]:
    """Table 5 layout: one row per method (and f, and M when several), one column per task
    holding "mean ± CI" of expected accuracy in percent; raw numbers under <task>_mean,
    <task>_ci95, <task>_seeds, <task>_instances."""
    base = [m for m in methods if not get_method(m).uses_f]
    ensembles = [m for m in methods if get_method(m).uses_f]
    configs = [(m, NO_F) for m in base] + [(m, f) for f in fs for m in ensembles]
    rows = []
    for name, f in configs:
        for m in particles:
            label = method_label(get_method(name), f, F_NAMES)
            row: dict = {"method": label + (f" (M={m})" if len(particles) > 1 else ""), "M": m}
            for task in tasks:
                chosen = select(records, task=task, method=name, f=f, num_particles=m)
                interval = seed_interval(chosen)
                row[task] = interval.format(PERCENT)
                row[f"{task}_mean"] = interval.mean
                row[f"{task}_ci95"] = interval.half_width
                row[f"{task}_seeds"] = interval.n
                row[f"{task}_instances"] = count_instances(chosen)
            rows.append(row)
    return rows


# ---------------------------------------------------------------- particle study


def logz_by_particles(records: Sequence[Record], method: str, f: str, particles: Sequence[int]) -> list[Interval]:
    """E[log Z-hat] per M: mean (over instances) log Z-hat per seed, then mean and CI over seeds."""
    return [seed_interval(select(records, method=method, f=f, num_particles=m), log_z) for m in particles]


def mixture_check(records: Sequence[Record], particles: Sequence[int], level: StudyLevel = TOKEN_LEVEL) -> list[dict]:
    """Sanity check (a): the mixture's expected accuracy (SMC at `level`) against the mean of its
    experts' (each alone, at the same M), per M, in percent."""
    rows = []
    for m in particles:
        mixture = select(records, method=level.smc, f="mixture", num_particles=m)
        p1 = select(records, method=level.experts[0], num_particles=m)
        p2 = select(records, method=level.experts[1], num_particles=m)
        experts_by_seed = {}
        m1, m2 = seed_means(p1), seed_means(p2)
        for seed in m1:
            if seed in m2:
                experts_by_seed[seed] = (m1[seed] + m2[seed]) / 2
        mix_by_seed = seed_means(mixture)
        diffs = [mix_by_seed[s] - experts_by_seed[s] for s in mix_by_seed if s in experts_by_seed]
        mix, experts, diff = seed_interval(mixture), t_interval(list(experts_by_seed.values())), t_interval(diffs)
        rows.append({
            "M": m,
            "mixture": mix.format(PERCENT), "prompt 1": seed_interval(p1).format(PERCENT),
            "prompt 2": seed_interval(p2).format(PERCENT), "mean(experts)": experts.format(PERCENT),
            "mixture - mean(experts)": diff.format(PERCENT),
            "|mixture - mean(experts)|": abs(diff.mean) * PERCENT if diff.n else math.nan,
            "mixture_mean": mix.mean, "experts_mean": experts.mean, "diff_mean": diff.mean, "diff_ci95": diff.half_width,
        })
    return rows


def smc_vs_is(records: Sequence[Record], fs: Sequence[str], particles: Sequence[int],
              level: StudyLevel = TOKEN_LEVEL) -> list[dict]:
    """Sanity check (b): E[log Z-hat] of SMC and of importance sampling (ess_threshold = 0) at
    equal M, per SMC variant present (Alg. 1, which resamples all particles, and resampling of
    active particles only) and f, with the seed-level CI of their difference and the run-level
    one (runs paired by instance and seed; `run_paired_difference`), plus the share of pairs
    where SMC is higher."""
    rows = []
    for smc, resampling in ((level.smc, RESAMPLE_ALL), (level.smc_active, RESAMPLE_ACTIVE)):
        for f in fs:
            for m in particles:
                a = select(records, method=smc, f=f, num_particles=m)
                b = select(records, method=level.importance, f=f, num_particles=m)
                if not a or not b:
                    continue
                ia, ib, diff = seed_interval(a, log_z), seed_interval(b, log_z), paired_difference(a, b, log_z)
                runs, wins = run_paired_difference(a, b, log_z)
                rows.append({
                    "resampling": resampling, "f": f, "M": m, "E[log Z] SMC": ia.format(digits=2),
                    "E[log Z] IS": ib.format(digits=2), "SMC - IS": diff.format(digits=2),
                    "SMC higher": bool(diff.mean > 0), "SMC - IS (paired runs)": runs.format(digits=2),
                    "pairs": runs.n, "SMC higher in": f"{wins:.0%}" if runs.n else "n/a",
                    "smc_mean": ia.mean, "is_mean": ib.mean, "smc_ci95": ia.half_width, "is_ci95": ib.half_width,
                    "diff_mean": diff.mean, "diff_ci95": diff.half_width,
                    "run_diff_mean": runs.mean, "run_diff_ci95": runs.half_width, "smc_higher_share": wins,
                })
    return rows


def correlations(records: Sequence[Record], fs: Sequence[str], method: str = "token") -> dict[str, CorrelationSummary]:
    """Table 7: per f, the mean over instances of Spearman(log Z-hat, expected accuracy) across
    that instance's (M, seed) runs."""
    out = {}
    for f in fs:
        points = [(r.instance, r.log_Z, r.expected_accuracy) for r in select(records, method=method, f=f)
                  if r.log_Z is not None]
        out[f] = per_instance_spearman(points)
    return out


def zscored_points(records: Sequence[Record], f: str, method: str = "token") -> list[tuple[str, int, float, float]]:
    """Fig. 5: per (instance, M), log Z-hat and expected accuracy averaged over seeds, then
    z-scored within each instance; (instance, M, z log Z, z accuracy)."""
    cells: dict[tuple[str, int], list[Record]] = defaultdict(list)
    for r in select(records, method=method, f=f):
        if r.log_Z is not None:
            cells[(r.instance, r.num_particles)].append(r)
    by_instance: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
    for (instance, m), rs in sorted(cells.items()):
        by_instance[instance].append((m, float(np.mean([r.log_Z for r in rs])),
                                      float(np.mean([r.expected_accuracy for r in rs]))))
    points = []
    for instance, values in by_instance.items():
        zl, za = zscore([v[1] for v in values]), zscore([v[2] for v in values])
        points += [(instance, m, float(a), float(b)) for (m, _, _), a, b in zip(values, zl, za)]
    return points


# ---------------------------------------------------------------- plots


def plot_logz_vs_particles(records: Sequence[Record], fs: Sequence[str], particles: Sequence[int], path: Path,
                           title: str = "", level: StudyLevel = TOKEN_LEVEL) -> Path:
    """E[log Z-hat] against M per f (95% CI over seeds): the SMC variants solid, importance
    sampling dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(fs), figsize=(3.4 * len(fs), 3.2), squeeze=False)
    for ax, f in zip(axes[0], fs):
        for method, style, label in ((level.smc, "-o", "SMC (Alg. 1)"), (level.smc_active, "-^", "SMC, active only"),
                                     (level.importance, "--s", "IS (no resampling)")):
            intervals = logz_by_particles(records, method, f, particles)
            if not any(i.n for i in intervals):
                continue
            mean = np.array([i.mean for i in intervals])
            half = np.nan_to_num(np.array([i.half_width for i in intervals]))
            ax.plot(particles, mean, style, label=label)
            ax.fill_between(particles, mean - half, mean + half, alpha=0.2)
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(particles), [str(m) for m in particles])
        ax.set_title(F_NAMES.get(f, f))
        ax.set_xlabel("particles M")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(r"E[log $\hat Z$]")
    axes[0][0].legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_zscores(records: Sequence[Record], fs: Sequence[str], path: Path, title: str = "", method: str = "token") -> Path:
    """z-scored log Z-hat against z-scored expected accuracy per f (points: instance x M, seed
    means, colored by M), with a least-squares line and Pearson's r."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(fs), figsize=(3.4 * len(fs), 3.2), squeeze=False, sharey=True)
    scatter = None
    for ax, f in zip(axes[0], fs):
        points = zscored_points(records, f, method)
        if not points:
            continue
        ms = np.array([p[1] for p in points])
        x, y = np.array([p[2] for p in points]), np.array([p[3] for p in points])
        scatter = ax.scatter(x, y, c=np.log2(ms), cmap="viridis", s=22, alpha=0.8)
        r, p = pearson(x, y)
        if not math.isnan(r):
            slope, intercept = np.polyfit(x, y, 1)
            grid = np.linspace(x.min(), x.max(), 20)
            ax.plot(grid, slope * grid + intercept, color="grey")
        stars = "".join("*" for level in (0.05, 0.01, 0.001) if not math.isnan(p) and p < level)
        ax.text(0.03, 0.95, f"ρ = {r:.2f}{stars}" if not math.isnan(r) else "ρ undefined",
                transform=ax.transAxes, va="top", fontsize=9)
        ax.set_title(F_NAMES.get(f, f))
        ax.set_xlabel(r"z-scored log $\hat Z$")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("z-scored expected accuracy")
    if scatter is not None:
        bar = fig.colorbar(scatter, ax=axes[0].tolist(), shrink=0.8)
        bar.set_label("log2 M")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
