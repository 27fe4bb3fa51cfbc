"""The statistics of the paper's tables: means with 95% t-intervals over seeds, z-scores, and
per-instance Spearman correlations averaged over instances (Table 7).

Confidence interval (Table 5): for n per-seed values v_1..v_n (each the mean over instances of
one seed's expected accuracies), mean +- t_{(1+c)/2, n-1} * s / sqrt(n), where s is the sample
standard deviation (ddof = 1) and t_{q, n-1} the q-quantile of Student's t with n - 1 degrees
of freedom (c = 0.95: t_{0.975, 2} = 4.303 for 3 seeds, 2.776 for 5). Undefined (NaN) for n < 2.

Correlation (Table 7): per instance, Spearman's rho between log Z-hat and expected accuracy
over that instance's runs (all M and seeds) -- Pearson's r of their average ranks, undefined
when either side is constant (such instances are left out and counted). The table reports the
mean of the defined per-instance rhos +- their standard error s / sqrt(n), and a one-sample
t-test of the mean against zero.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Hashable, Iterable, Sequence

import numpy as np
from scipy import stats as scipy_stats

CONFIDENCE = 0.95


@dataclasses.dataclass(frozen=True)
class Interval:
    """A mean with the half-width of its confidence interval over n values (NaN if n < 2).

    Attributes
    ----------
    mean, half_width : float
        The interval is mean +- half_width.
    n : int
        The number of values.
    """

    mean: float
    half_width: float
    n: int

    def format(self, scale: float = 1.0, digits: int = 1) -> str:
        if self.n == 0:
            return "n/a"
        if math.isnan(self.half_width):
            return f"{self.mean * scale:.{digits}f}"
        return f"{self.mean * scale:.{digits}f} ± {self.half_width * scale:.{digits}f}"


def t_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """mean +- t_{(1+c)/2, n-1} * s / sqrt(n) with s the sample standard deviation (ddof=1).

    Parameters
    ----------
    values : sequence of float
        The values (one per seed).
    confidence : float
        c.
    """
    v = np.asarray(values, np.float64)
    n = int(v.size)
    if n == 0:
        return Interval(math.nan, math.nan, 0)
    if n == 1:
        return Interval(float(v[0]), math.nan, 1)
    quantile = float(scipy_stats.t.ppf((1.0 + confidence) / 2.0, n - 1))
    return Interval(float(v.mean()), quantile * float(v.std(ddof=1)) / math.sqrt(n), n)


def zscore(values: Sequence[float]) -> np.ndarray:
    """(v - mean) / std with the population std (ddof=0); all zeros when the values are constant.

    Parameters
    ----------
    values : sequence of float
        The values.
    """
    v = np.asarray(values, np.float64)
    std = v.std()
    if v.size == 0 or not std > 0:
        return np.zeros_like(v)
    return (v - v.mean()) / std


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rho: Pearson's r of average ranks; NaN when either side is constant or n < 2.

    Parameters
    ----------
    x, y : sequence of float
        Paired values.
    """
    if len(x) != len(y):
        raise ValueError(f"x and y differ in length: {len(x)} != {len(y)}")
    if len(x) < 2:
        return math.nan
    rx, ry = scipy_stats.rankdata(x), scipy_stats.rankdata(y)
    if rx.std() == 0 or ry.std() == 0:
        return math.nan
    return float(np.corrcoef(rx, ry)[0, 1])


@dataclasses.dataclass(frozen=True)
class CorrelationSummary:
    """Mean of per-instance correlations +- standard error, a t-test against 0, and counts.

    Attributes
    ----------
    mean, standard_error, p_value : float
        Mean rho over the instances, its standard error, the t-test's p-value.
    n_instances, n_undefined : int
        Instances with a defined rho, and those left out (a constant side).
    per_instance : dict
        rho per instance.
    """

    mean: float
    standard_error: float
    p_value: float
    n_instances: int
    n_undefined: int
    per_instance: dict[Hashable, float]

    def format(self, digits: int = 2) -> str:
        if self.n_instances == 0:
            return "n/a"
        stars = "".join("*" for level in (0.05, 0.01, 0.001) if self.p_value < level)
        se = "" if math.isnan(self.standard_error) else f" ± {self.standard_error:.{digits}f}"
        return f"{self.mean:.{digits}f}{se}{stars}"


def per_instance_spearman(points: Iterable[tuple[Hashable, float, float]]) -> CorrelationSummary:
    """points: (instance, x, y) triples. Spearman's rho per instance, then their mean +- SE over
    the instances where it is defined, and a one-sample t-test of that mean against 0.

    Parameters
    ----------
    points : iterable of (instance, float, float)
        (instance, x, y) triples.
    """
    groups: dict[Hashable, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    for instance, x, y in points:
        groups[instance][0].append(float(x))
        groups[instance][1].append(float(y))
    rhos = {instance: spearman(xs, ys) for instance, (xs, ys) in groups.items()}
    defined = np.asarray([r for r in rhos.values() if not math.isnan(r)], np.float64)
    n = int(defined.size)
    if n == 0:
        return CorrelationSummary(math.nan, math.nan, math.nan, 0, len(rhos), rhos)
    se = float(defined.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
    if n > 1 and defined.std() > 0:
        p = float(scipy_stats.ttest_1samp(defined, 0.0).pvalue)
    else:
        p = math.nan
    return CorrelationSummary(float(defined.mean()), se, p, n, len(rhos) - n, rhos)


def pearson(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Pearson's r and its two-sided p-value (NaN, NaN when undefined)."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if x.size < 3 or x.std() == 0 or y.std() == 0:
        return math.nan, math.nan
    result = scipy_stats.pearsonr(x, y)
    return float(result.statistic), float(result.pvalue)
