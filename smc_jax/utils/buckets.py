"""Padded sizes: lengths rounded up to a few buckets, so that similar sizes share one program."""

from __future__ import annotations


def geometric_bucket(n: int, smallest: int, growth: int = 2) -> int:
    """The least smallest * growth^k >= n (k >= 0).

    Parameters
    ----------
    n : int
        The size (bytes, tokens).
    smallest : int
        The smallest bucket.
    growth : int
        The ratio of one bucket to the next.
    """
    size = smallest
    while size < n:
        size *= growth
    return size


def multiple_bucket(n: int, step: int) -> int:
    """The least multiple of step >= n.

    Parameters
    ----------
    n : int
        The size (bytes, tokens, rows).
    step : int
        The buckets' spacing.
    """
    return -(-n // step) * step
