"""A log-space sum tree: range log-masses of a vector of log-probabilities in O(log n).

For log-probabilities x_0..x_{n-1}, padded with -inf to P = 2^L leaves, the tree is the pairwise
logaddexp pyramid in heap layout (cell 1 is the root, cell c has children 2c and 2c + 1, leaf i
is cell P + i):

    cell[c] = logaddexp(cell[2c], cell[2c + 1]),   cell[P + i] = x_i.

A range [lo, hi) is the disjoint union of at most 2L + 2 cells (the bottom-up segment-tree
walk, at most one cell at each end of each level), so log sum_{lo <= i < hi} exp(x_i) is one max-shifted logsumexp of those cells. Every
operation stays in log space: no mass underflows while its logarithm is a finite f32 (a token of
log-probability -150 keeps its mass, where exp(-150) is 0 in f32), and nothing is a difference
of large sums (no cancellation). Building costs one logaddexp per cell above a value (cells over
padding only are -inf, not computed: n - 1 + L at most); each query O(log P) gathers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct
from jaxtyping import Array, ArrayLike, Float, Int

#: Index of the root cell in the heap layout (cell 0 is unused and holds -inf).
ROOT_CELL = 1


def finite_or_zero(peak: Array) -> Array:
    """A safe shift: the peak where finite, else 0 (so -inf - shift stays -inf, never NaN)."""
    return jnp.where(jnp.isfinite(peak), peak, 0.0)


def _logaddexp(a: Array, b: Array) -> Array:
    """log(e^a + e^b) = m + log(1 + e^(n - m)), m = max(a, b), n = min(a, b); m where m is not finite.

    Cheaper to compile and run than jnp.logaddexp on CPU, and one exp per pair: e^(m - m) = 1
    exactly, so this is bit for bit the symmetric m + log(e^(a - m) + e^(b - m)). The sum lies in
    [1, 2], so its log has absolute error <= one f32 ulp, i.e. the mass has relative error <= 2^-23.
    """
    top = jnp.maximum(a, b)
    # The shift is 0 where top is not finite, so that no NaN is made even where it is not kept.
    return jnp.where(jnp.isfinite(top), top + jnp.log(1.0 + jnp.exp(jnp.minimum(a, b) - finite_or_zero(top))), top)


def _logsumexp(x: Array, axis: int) -> Array:
    """log sum exp(x) along `axis`, shifted by the maximum; -inf for an all -inf slice."""
    shift = finite_or_zero(jnp.max(x, axis=axis, keepdims=True))
    return jnp.squeeze(shift, axis) + jnp.log(jnp.sum(jnp.exp(x - shift), axis=axis))


@struct.dataclass
class SumTree:
    """Heap-ordered logaddexp pyramid over P = num_leaves leaves (leaf i is cell P + i).

    Attributes
    ----------
    cells : jax.Array, shape [..., 2P]
        The pyramid: cell 1 is the root, cells P..2P-1 the leaves (cell 0 unused).
    num_leaves : int
        P, a power of two.
    """

    cells: Float[Array, "... cells"]  # cells = 2 * num_leaves
    num_leaves: int = struct.field(pytree_node=False)  # P, a power of two

    @property
    def num_levels(self) -> int:
        """The number of halvings from the leaves to the root, L = log2(P)."""
        return self.num_leaves.bit_length() - 1


def build_sum_tree(logp: Float[ArrayLike, "... n"]) -> SumTree:
    """The pyramid of `logp` along its last axis (leading axes are independent trees).

    Parameters
    ----------
    logp : array, shape [..., n]
        Log-values; padded with -inf to P leaves.
    """
    logp = jnp.asarray(logp, dtype=jnp.float32)
    num_values = logp.shape[-1]
    num_leaves = 1 << max(num_values - 1, 0).bit_length()
    padding = [(0, 0)] * (logp.ndim - 1) + [(0, num_leaves - num_values)]
    # Materialized once: fused into both of its readers (the first level and the table), the
    # leaves' producers (a gather into trie order, a log-softmax) ran twice, 1.9x the time.
    level = jax.lax.optimization_barrier(jnp.pad(logp, padding, constant_values=-jnp.inf))
    levels, valid = [level], num_values
    while level.shape[-1] > 1:
        # Cells past the values' ceil(valid / 2) parents cover padding only: -inf, not computed.
        half, valid = level.shape[-1] // 2, (valid + 1) // 2
        pairs = level[..., : 2 * valid].reshape(*level.shape[:-1], valid, 2)
        level = jax.lax.optimization_barrier(_logaddexp(pairs[..., 0], pairs[..., 1]))
        if valid < half:
            level = jnp.concatenate([level, jnp.full((*level.shape[:-1], half - valid), -jnp.inf, level.dtype)], -1)
        levels.append(level)
    unused = jnp.full((*logp.shape[:-1], 1), -jnp.inf, dtype=jnp.float32)
    return SumTree(jnp.concatenate([unused, *reversed(levels)], axis=-1), num_leaves)


def _cells_at(tree: SumTree, cells: Int[Array, "*q c"], row: Int[ArrayLike, "*r"] | None) -> Float[Array, "*q c"]:
    """tree.cells[cells] for a single tree, or tree.cells[row, cells] for a table of trees
    (reading only the needed cells of each row, never copying a whole tree)."""
    if row is None:
        if tree.cells.ndim != 1:
            raise ValueError("a table of trees (cells [T, 2P]) needs the `row` of each query")
        return tree.cells[cells]
    if tree.cells.ndim != 2:
        raise ValueError("`row` indexes a table of trees: cells must be [T, 2P]")
    row = jnp.asarray(row, dtype=jnp.int32)
    return tree.cells[row.reshape(row.shape + (1,) * (cells.ndim - row.ndim)), cells]


def range_logmass(
    tree: SumTree, lo: Int[ArrayLike, "*q"], hi: Int[ArrayLike, "*q"], row: Int[ArrayLike, "*q"] | None = None
) -> Float[Array, "*q"]:
    """log sum_{lo <= i < hi} exp(x_i) for every pair (lo, hi); -inf for an empty range.

    `lo` and `hi` broadcast against each other. The tree is a single one, or a table of trees
    (cells [T, 2P]) of which query q reads row[q]. The bottom-up segment-tree walk in closed form: at level k (leaves k = 0)
    the range is the cells [l_k, r_k) with l_k = ceil((P + lo) / 2^k), r_k = floor((P + hi) / 2^k);
    the walk takes cell l_k when l_k is odd and cell r_k - 1 when r_k is odd (if l_k < r_k).

    Parameters
    ----------
    tree : SumTree
        One tree, or a table of trees [T, 2P].
    lo, hi : jax.Array, shape [...q]
        Ranges [lo, hi) of leaves.
    row : jax.Array, shape [...q], optional
        With a table of trees, the tree each query reads.
    """
    lo = jnp.asarray(lo, dtype=jnp.int32)[..., None] + tree.num_leaves
    hi = jnp.asarray(hi, dtype=jnp.int32)[..., None] + tree.num_leaves
    level = jnp.arange(tree.num_levels + 1, dtype=jnp.int32)
    left = (lo + (1 << level) - 1) >> level
    right = hi >> level
    nonempty = left < right
    take_left = nonempty & ((left & 1) == 1)
    take_right = nonempty & ((right & 1) == 1)
    cells = jnp.concatenate(jnp.broadcast_arrays(left, right - 1), axis=-1)
    taken = jnp.concatenate(jnp.broadcast_arrays(take_left, take_right), axis=-1)
    return _logsumexp(jnp.where(taken, _cells_at(tree, cells, row), -jnp.inf), axis=-1)


def leaf_logprobs(
    tree: SumTree, positions: Int[ArrayLike, "*q"], row: Int[ArrayLike, "*q"] | None = None
) -> Float[Array, "*q"]:
    """x_i for every position i (leaves of a single tree, or of row[q] of a table of trees).

    Parameters
    ----------
    tree : SumTree
        One tree, or a table of trees [T, 2P].
    positions : jax.Array, shape [...q]
        Leaf indices.
    row : jax.Array, shape [...q], optional
        With a table of trees, the tree each query reads.
    """
    cells = jnp.asarray(positions, dtype=jnp.int32)[..., None] + tree.num_leaves
    return _cells_at(tree, cells, row)[..., 0]
