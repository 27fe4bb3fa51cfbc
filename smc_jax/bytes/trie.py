"""The token trie as fixed-shape arrays: node masses of next-token distributions.

A byte-level view of a token LM walks a trie of the tokens' byte strings. For a next-token
distribution p over token ids, the mass of a node u (a byte prefix) is

    m(u) = sum_{t : b(t) starts with u} p(t),

over the byte tokens only (CONTROL tokens and padding ids have no bytes and never count). The
next-byte distribution at u is m(child(u, b)) / m(u), and the tokens ending exactly at u
(b(t) = u; several when ids share a byte string) are the ones a hypothesis can commit there:

    m(u) = sum_{t : b(t) = u} p(t) + sum_b m(child(u, b)).

Layout. Byte tokens are sorted by (byte string, id): a depth-first pre-order of the trie, so the
tokens under u are ONE contiguous range [lo(u), hi(u)) of sorted positions, the first of which,
[lo(u), end_hi(u)), end exactly at u. Nodes are numbered breadth-first (by depth, then
lexicographically), so node 0 is the root and the children of u are one contiguous block
[first_child(u), first_child(u) + num_children(u)) in increasing byte order; the edge keys
parent * 256 + byte of nodes 1..N-1 are then sorted, and child(u, b) is one binary search.

Masses come from a log-space sum tree over the sorted log-probabilities (`sumtree.py`): any
range is O(log V) cells, so the 256 child masses of a node cost 256 range queries and never
underflow or cancel. `all_node_logmasses` computes every node at once: a segment logsumexp over
the (node, sorted position) pairs of the nodes with few tokens, and sum-tree range queries for
the few thousand large nodes (a sequential f32 sum over the root's V tokens would be ~4e-4 off).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, ArrayLike, Bool, Float, Int

from smc_jax.bytes.sumtree import (
    SumTree,
    build_sum_tree,
    finite_or_zero,
    leaf_logprobs,
    range_logmass,
)
from smc_jax.bytes.vocab import NUM_BYTES

#: Node id of the root (the empty prefix).
ROOT = 0
#: Returned by `child` when a node has no child for a byte; the root's parent.
NO_NODE = -1
#: Edge label of the root, which has no incoming edge.
NO_BYTE = -1
#: Padding token id in `EndingTokens`.
NO_TOKEN = -1

#: Nodes with at most this many tokens get their whole-distribution mass from a segment sum
#: (a sequential f32 sum of <= 64 terms: relative error <= 64 * 2^-24 ~ 4e-6); larger ones from
#: range queries on the sum tree (pairwise sums: relative error ~ log2(V) * 2^-24).
SEGMENT_MAX_TOKENS = 64

_INT = np.int32
#: Last entry of `edge_keys`, above every real key, so a binary search always lands in range.
EDGE_KEY_END = np.iinfo(_INT).max


@struct.dataclass
class TokenTrie:
    """Trie of a vocabulary's byte strings as arrays (N nodes, Vb byte tokens, V token ids).

    Attributes
    ----------
    sorted_token_ids : jax.Array, shape [Vb]
        The byte tokens sorted by byte string (sorted position -> token id).
    node_depth, node_lo, node_end_hi, node_hi : jax.Array, shape [N]
        Per node u: its depth in bytes; the sorted positions [lo, end_hi) of the tokens spelling
        exactly u and [lo, hi) of those starting with u.
    node_parent, node_byte : jax.Array, shape [N]
        Parent (NO_NODE for the root) and last byte (NO_BYTE for the root).
    node_first_child, node_num_children : jax.Array, shape [N]
        The children are nodes [first_child, first_child + num_children).
    edge_keys : jax.Array, shape [N]
        parent * 256 + byte of nodes 1..N-1 (sorted), for `child` lookups.
    large_nodes : jax.Array, shape [NL]
        Nodes with more than SEGMENT_MAX_TOKENS tokens (their masses come from the sum tree).
    pair_node, pair_position : jax.Array, shape [P]
        (node, sorted position) pairs of the other nodes, by node.
    vocab_size : int
        V.
    num_nodes : int
        N.
    max_depth : int
        The longest byte string.
    max_duplicates : int
        The most tokens sharing one byte string.
    max_inner_children : int
        The most children of a non-root node.
    """

    sorted_token_ids: Int[Array, "Vb"]  # sorted position -> token id
    node_depth: Int[Array, "N"]  # |u| in bytes
    node_lo: Int[Array, "N"]  # first sorted position under u
    node_end_hi: Int[Array, "N"]  # [lo, end_hi): the tokens with b(t) = u
    node_hi: Int[Array, "N"]  # [lo, hi): the tokens with b(t) starting with u
    node_parent: Int[Array, "N"]  # NO_NODE for the root
    node_byte: Int[Array, "N"]  # last byte of u; NO_BYTE for the root
    node_first_child: Int[Array, "N"]  # children: [first_child, first_child + num_children)
    node_num_children: Int[Array, "N"]
    edge_keys: Int[Array, "N"]  # parent * 256 + byte of nodes 1..N-1, then EDGE_KEY_END
    large_nodes: Int[Array, "NL"]  # nodes with > SEGMENT_MAX_TOKENS tokens
    pair_node: Int[Array, "P"]  # (node, sorted position) pairs of the other nodes, by node
    pair_position: Int[Array, "P"]
    vocab_size: int = struct.field(pytree_node=False)  # V, token ids 0..V-1
    num_nodes: int = struct.field(pytree_node=False)  # N
    max_depth: int = struct.field(pytree_node=False)  # longest byte string
    max_duplicates: int = struct.field(pytree_node=False)  # most tokens sharing a byte string
    max_inner_children: int = struct.field(pytree_node=False)  # most children of a non-root node

    @property
    def root(self) -> int:
        return ROOT

    @property
    def num_byte_tokens(self) -> int:
        return self.sorted_token_ids.shape[0]

    @classmethod
    def build(cls, byte_strings: Sequence[bytes | None]) -> TokenTrie:
        """Builds the trie on the host (numpy); None marks a token id without bytes."""
        return cls(**_build_arrays(byte_strings))

    def sort_logprobs(self, logp: Float[ArrayLike, "... V"]) -> Float[Array, "... Vb"]:
        """Next-token log-probabilities of the byte tokens, in sorted (trie) order."""
        return jnp.take(jnp.asarray(logp), self.sorted_token_ids, axis=-1)


class EndingTokens(NamedTuple):
    """The tokens whose byte string is exactly a node's prefix, padded to max_duplicates.

    Attributes
    ----------
    token_ids : jax.Array, shape [...q, D]
        The token ids (D = max_duplicates).
    positions : jax.Array, shape [...q, D]
        Their sorted positions.
    mask : jax.Array, shape [...q, D], bool
        Which entries are real.
    logprobs : jax.Array, shape [...q, D]
        Their log-probabilities (-inf where masked).
    """

    token_ids: Int[Array, "*q D"]  # NO_TOKEN where not mask
    positions: Int[Array, "*q D"]  # sorted positions; meaningless where not mask
    mask: Bool[Array, "*q D"]
    logprobs: Float[Array, "*q D"]  # -inf where not mask


def child(trie: TokenTrie, node: Int[ArrayLike, "*q"], byte: Int[ArrayLike, "*q"]) -> Int[Array, "*q"]:
    """child(u, b), or NO_NODE where u has no child b (or u is NO_NODE). Broadcasts.

    Parameters
    ----------
    trie : TokenTrie
        The trie.
    node, byte : jax.Array, shape [...q]
        Nodes and bytes (broadcast).
    """
    node = jnp.asarray(node, dtype=jnp.int32)
    byte = jnp.asarray(byte, dtype=jnp.int32)
    key = node * NUM_BYTES + byte
    index = jnp.searchsorted(trie.edge_keys, key)  # < N: the last key is EDGE_KEY_END
    found = (trie.edge_keys[index] == key) & (node != NO_NODE) & (byte >= 0) & (byte < NUM_BYTES)
    return jnp.where(found, index + 1, NO_NODE)


def node_logmass(
    trie: TokenTrie, tree: SumTree, node: Int[ArrayLike, "*q"], row: Int[ArrayLike, "*q"] | None = None
) -> Float[Array, "*q"]:
    """log m(u) = log sum_{lo(u) <= i < hi(u)} p(sorted token i); -inf for NO_NODE.
    With `row`, `tree` is a table of trees and query q reads tree row[q].

    Parameters
    ----------
    trie : TokenTrie
        The trie.
    tree : SumTree
        The sum tree (or a table of them).
    node : jax.Array, shape [...q]
        Nodes u.
    row : jax.Array, shape [...q], optional
        With a table of trees, the tree each query reads.
    """
    node = jnp.asarray(node, dtype=jnp.int32)
    valid = node != NO_NODE
    mass = range_logmass(tree, trie.node_lo[node], trie.node_hi[node], row)
    return jnp.where(valid, mass, -jnp.inf)


def next_byte_logmass(
    trie: TokenTrie,
    tree: SumTree,
    node: Int[ArrayLike, ""],
    row: Int[ArrayLike, ""] | None = None,
    max_children: int = NUM_BYTES,
) -> Float[Array, "256"]:
    """log m(child(u, b)) for every byte b; -inf where the child does not exist.

    The children of u form one block of nodes, so this is `max_children` fixed-shape range
    queries scattered to their byte labels (vmap over nodes); `max_children` may be lowered to
    `trie.max_inner_children` for nodes known not to be the root. With the tokens ending at u,
    logaddexp(logsumexp(next_byte_logmass(u)), log sum_{b(t) = u} p(t)) = log m(u).

    Parameters
    ----------
    trie : TokenTrie
        The trie.
    tree : SumTree
        The sum tree (or a table of them).
    node : jax.Array, shape []
        The node u.
    row : jax.Array, shape [], optional
        The tree to read in a table of trees.
    max_children : int
        Static bound on u's children.

    Returns
    -------
    jax.Array, shape [256]
    """
    node = jnp.asarray(node, dtype=jnp.int32)
    slot = jnp.arange(max_children, dtype=jnp.int32)
    exists = (slot < trie.node_num_children[node]) & (node != NO_NODE)
    kid = jnp.where(exists, trie.node_first_child[node] + slot, ROOT)
    masses = range_logmass(tree, trie.node_lo[kid], trie.node_hi[kid], None if row is None else jnp.broadcast_to(row, kid.shape))
    labels = jnp.where(exists, trie.node_byte[kid], NUM_BYTES)  # NUM_BYTES: dropped below
    return jnp.full(NUM_BYTES, -jnp.inf, dtype=masses.dtype).at[labels].set(masses, mode="drop")


def ending_tokens(
    trie: TokenTrie, tree: SumTree, node: Int[ArrayLike, "*q"], row: Int[ArrayLike, "*q"] | None = None
) -> EndingTokens:
    """The tokens t with b(t) = u (duplicates included) and their log-probabilities.

    Parameters
    ----------
    trie : TokenTrie
        The trie.
    tree : SumTree
        The next-token distribution's sum tree over sorted positions (or a table of them).
    node : jax.Array, shape [...q]
        Nodes u.
    row : jax.Array, shape [...q], optional
        With a table of trees, the tree each query reads.
    """
    node = jnp.asarray(node, dtype=jnp.int32)[..., None]
    positions = trie.node_lo[node] + jnp.arange(trie.max_duplicates, dtype=jnp.int32)
    mask = (positions < trie.node_end_hi[node]) & (node != NO_NODE)
    token_ids = jnp.where(mask, trie.sorted_token_ids[positions], NO_TOKEN)
    rows = None if row is None else jnp.broadcast_to(jnp.asarray(row, jnp.int32)[..., None], positions.shape)
    logprobs = jnp.where(mask, leaf_logprobs(tree, positions, rows), -jnp.inf)
    return EndingTokens(token_ids, positions, mask, logprobs)


def all_node_logmasses(trie: TokenTrie, logp: Float[ArrayLike, "V"]) -> Float[Array, "N"]:
    """log m(u) for every node u at once (vmap over distributions).

    Nodes with at most SEGMENT_MAX_TOKENS tokens: a segment logsumexp over their (node, token)
    pairs, log m(u) = M(u) + log sum_{pairs (u, t)} exp(log p(t) - M(u)), M(u) = max over the
    pairs. Larger nodes (a few thousand, but most of the pairs): range queries on a sum tree,
    because a sequential f32 segment sum over the root's V tokens is ~4e-4 off (Gemma 3).

    Parameters
    ----------
    trie : TokenTrie
        The vocabulary's trie.
    logp : array, shape [V]
        A next-token log-distribution.

    Returns
    -------
    jax.Array, shape [N]
    """
    sorted_logp = trie.sort_logprobs(logp)
    pair_logp = sorted_logp[trie.pair_position]
    segments = dict(segment_ids=trie.pair_node, num_segments=trie.num_nodes, indices_are_sorted=True)
    shift = finite_or_zero(jax.ops.segment_max(pair_logp, **segments))
    total = jax.ops.segment_sum(jnp.exp(pair_logp - shift[trie.pair_node]), **segments)
    large = range_logmass(
        build_sum_tree(sorted_logp), trie.node_lo[trie.large_nodes], trie.node_hi[trie.large_nodes]
    )
    return (shift + jnp.log(total)).at[trie.large_nodes].set(large)


def _ranks_in_groups(sizes: np.ndarray) -> np.ndarray:
    """0, 1, ..., sizes[0] - 1, 0, 1, ..., sizes[1] - 1, ... (concatenated aranges)."""
    starts = np.cumsum(sizes) - sizes
    return np.arange(int(np.sum(sizes))) - np.repeat(starts, sizes)


def _build_arrays(byte_strings: Sequence[bytes | None]) -> dict:
    """Host-side construction of every TokenTrie field (vectorized numpy)."""
    token_ids = np.array([t for t, data in enumerate(byte_strings) if data is not None], dtype=_INT)
    if any(len(byte_strings[t]) == 0 for t in token_ids):
        raise ValueError("empty byte string: mark tokens without bytes with None")
    order = sorted(token_ids.tolist(), key=lambda t: (byte_strings[t], t))
    sorted_ids = np.array(order, dtype=_INT)
    num_tokens = len(order)
    lengths = np.array([len(byte_strings[t]) for t in order], dtype=_INT)
    max_depth = int(lengths.max(initial=0))

    # Bytes as a zero-padded matrix with one spare column, so every row has a mismatch column.
    width = max_depth + 1
    matrix = np.zeros((num_tokens, width), dtype=np.uint8)
    rows = np.repeat(np.arange(num_tokens), lengths)
    matrix[rows, _ranks_in_groups(lengths)] = np.frombuffer(b"".join(byte_strings[t] for t in order), dtype=np.uint8)

    # lcp[i]: longest common prefix of sorted tokens i - 1 and i (0 for the first token).
    lcp = np.zeros(num_tokens, dtype=_INT)
    if num_tokens > 1:
        shorter = np.minimum(lengths[1:], lengths[:-1])
        mismatch = (matrix[1:] != matrix[:-1]) | (np.arange(width) >= shorter[:, None])
        lcp[1:] = np.argmax(mismatch, axis=1)

    # Pre-order nodes other than the root: token i opens the prefixes of depths lcp[i]+1..len[i].
    opened = lengths - lcp
    pre_token = np.repeat(np.arange(num_tokens, dtype=_INT), opened)
    pre_depth = (_ranks_in_groups(opened) + lcp[pre_token] + 1).astype(_INT)
    pre_id = np.arange(1, pre_token.size + 1, dtype=_INT)  # root is pre-order node 0

    # Tokens equal to their predecessor share its node; end of each run of equal byte strings.
    duplicate = np.zeros(num_tokens, dtype=bool)
    duplicate[1:] = (lcp[1:] == lengths[1:]) & (lengths[1:] == lengths[:-1])
    run_starts = np.flatnonzero(~duplicate)
    run_end = np.append(run_starts[1:], num_tokens)[np.cumsum(~duplicate) - 1]

    pre_lo = pre_token
    pre_end_hi = np.where(lengths[pre_token] == pre_depth, run_end[pre_token], pre_token)
    pre_hi = np.empty_like(pre_token)
    pre_parent = np.empty_like(pre_token)
    previous_level = np.array([0], dtype=_INT)  # pre-order ids at depth - 1 (the root)
    for depth in range(1, max_depth + 1):
        at_depth = np.flatnonzero(pre_depth == depth)
        # The subtree of a depth-d node opened at token i ends at the next token with lcp < d.
        starts = np.flatnonzero(lcp < depth)
        bounds = np.append(starts, num_tokens)
        pre_hi[at_depth] = bounds[np.searchsorted(starts, pre_token[at_depth], side="right")]
        # Its parent is the last node of depth d - 1 before it in pre-order.
        level_ids = pre_id[at_depth]
        pre_parent[at_depth] = previous_level[np.searchsorted(previous_level, level_ids) - 1]
        previous_level = level_ids

    # Breadth-first numbering: stable sort by depth keeps lexicographic order within a depth.
    depth_all = np.concatenate([[0], pre_depth]).astype(_INT)
    bfs_order = np.argsort(depth_all, kind="stable")
    bfs_of_pre = np.empty_like(bfs_order)
    bfs_of_pre[bfs_order] = np.arange(bfs_order.size)
    lo = np.concatenate([[0], pre_lo])[bfs_order].astype(_INT)
    end_hi = np.concatenate([[0], pre_end_hi])[bfs_order].astype(_INT)
    hi = np.concatenate([[num_tokens], pre_hi])[bfs_order].astype(_INT)
    parent = np.concatenate([[NO_NODE], bfs_of_pre[pre_parent]])[bfs_order].astype(_INT)
    depth = depth_all[bfs_order]
    num_nodes = depth.size
    label = np.full(num_nodes, NO_BYTE, dtype=_INT)
    label[1:] = matrix[lo[1:], depth[1:] - 1]

    if num_nodes * NUM_BYTES > np.iinfo(_INT).max:
        raise ValueError(f"{num_nodes} nodes: edge keys node * {NUM_BYTES} + byte overflow int32")
    edge_keys = np.append(parent[1:] * NUM_BYTES + label[1:], EDGE_KEY_END).astype(_INT)
    assert np.all(np.diff(edge_keys) > 0), "breadth-first edge keys must increase"
    num_children = np.bincount(parent[1:], minlength=num_nodes).astype(_INT)
    first_child = (np.searchsorted(parent[1:], np.arange(num_nodes)) + 1).astype(_INT)

    size = hi - lo
    large = size > SEGMENT_MAX_TOKENS
    pair_size = np.where(large, 0, size)
    pair_node = np.repeat(np.arange(num_nodes, dtype=_INT), pair_size)
    pair_position = (_ranks_in_groups(pair_size) + np.repeat(lo, pair_size)).astype(_INT)

    # device_put, not jnp.asarray: a transfer, not a small program compiled per shape
    return dict(
        sorted_token_ids=jax.device_put(sorted_ids),
        node_depth=jax.device_put(depth),
        node_lo=jax.device_put(lo),
        node_end_hi=jax.device_put(end_hi),
        node_hi=jax.device_put(hi),
        node_parent=jax.device_put(parent),
        node_byte=jax.device_put(label),
        node_first_child=jax.device_put(first_child),
        node_num_children=jax.device_put(num_children),
        edge_keys=jax.device_put(edge_keys),
        large_nodes=jax.device_put(np.flatnonzero(large).astype(_INT)),
        pair_node=jax.device_put(pair_node),
        pair_position=jax.device_put(pair_position),
        vocab_size=len(byte_strings),
        num_nodes=num_nodes,
        max_depth=max_depth,
        max_duplicates=int((end_hi - lo).max(initial=0)),
        max_inner_children=int(num_children[1:].max(initial=0)),
    )
