"""Token trie: structure and node masses against dict-built tries and float64 brute force."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smc_jax.bytes.sumtree import build_sum_tree
from smc_jax.bytes.trie import (
    NO_BYTE,
    NO_NODE,
    NO_TOKEN,
    ROOT,
    TokenTrie,
    all_node_logmasses,
    child,
    ending_tokens,
    next_byte_logmass,
    node_logmass,
)
from smc_jax.bytes.vocab import NUM_BYTES

from .test_sumtree import LOGPROBS, assert_log_close, exact_logsumexp

#: A small alphabet (with the extreme byte values) so that prefixes are shared often.
ALPHABET = b"ab\x00\xff"
#: Bytes queried for children: the alphabet plus one that never occurs.
QUERY_BYTES = np.frombuffer(ALPHABET + b"z", dtype=np.uint8).astype(np.int32)

BYTE_STRINGS = st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=4).map(bytes)


@st.composite
def vocabularies(draw) -> list[bytes | None]:
    """Token byte strings with control tokens (None) and duplicated byte strings, shuffled."""
    base = draw(st.lists(st.one_of(st.none(), BYTE_STRINGS), min_size=1, max_size=12))
    present = [data for data in base if data is not None]
    copies = draw(st.lists(st.sampled_from(present), max_size=4)) if present else []
    vocab = base + copies
    return [vocab[i] for i in draw(st.permutations(range(len(vocab))))]


@st.composite
def vocabularies_and_logprobs(draw) -> tuple[list[bytes | None], np.ndarray]:
    vocab = draw(vocabularies())
    logp = draw(st.lists(LOGPROBS, min_size=len(vocab), max_size=len(vocab)))
    return vocab, np.array(logp, dtype=np.float32)


class DictTrie:
    """The reference: node = prefix (bytes), masses by python loops in float64."""

    def __init__(self, vocab: list[bytes | None], logp: np.ndarray):
        self.vocab, self.logp = vocab, logp
        self.prefixes = {b""} | {data[:k] for data in vocab if data is not None for k in range(1, len(data) + 1)}

    def mass(self, prefix: bytes) -> float:
        return exact_logsumexp([self.logp[t] for t, data in enumerate(self.vocab) if data is not None and data.startswith(prefix)])

    def ending(self, prefix: bytes) -> list[int]:
        return [t for t, data in enumerate(self.vocab) if data == prefix]


def node_prefixes(trie: TokenTrie) -> list[bytes]:
    """Each node's prefix, read back through the parent and byte arrays."""
    parent, label = np.asarray(trie.node_parent), np.asarray(trie.node_byte)
    prefixes = [b""] * trie.num_nodes
    for node in range(1, trie.num_nodes):  # breadth-first: parents come first
        prefixes[node] = prefixes[parent[node]] + bytes([label[node]])
    return prefixes


def trie_queries(trie: TokenTrie, logp):
    """Every query of the API for every node (and every QUERY_BYTES child)."""
    nodes = jnp.arange(trie.num_nodes)
    tree = build_sum_tree(trie.sort_logprobs(logp))
    return dict(
        node=node_logmass(trie, tree, nodes),
        all=all_node_logmasses(trie, logp),
        next_byte=jax.vmap(next_byte_logmass, in_axes=(None, None, 0))(trie, tree, nodes),
        ending=ending_tokens(trie, tree, nodes),
        child=child(trie, nodes[:, None], jnp.asarray(QUERY_BYTES)[None, :]),
    )


jitted_trie_queries = jax.jit(trie_queries)


@settings(max_examples=25, deadline=None)  # each example compiles (new shapes): ~1 s
@given(vocabularies_and_logprobs())
def test_trie_matches_brute_force(example):
    vocab, logp = example
    reference = DictTrie(vocab, logp)
    trie = TokenTrie.build(vocab)
    prefixes = node_prefixes(trie)
    assert sorted(prefixes) == sorted(reference.prefixes) and prefixes[ROOT] == b""
    assert trie.num_nodes == len(reference.prefixes) and trie.vocab_size == len(vocab)
    assert trie.max_depth == max(map(len, reference.prefixes))
    assert trie.max_duplicates == max(len(reference.ending(prefix)) for prefix in reference.prefixes)
    index = {prefix: node for node, prefix in enumerate(prefixes)}
    np.testing.assert_array_equal(trie.node_depth, [len(prefix) for prefix in prefixes])

    # Contiguous ranges of sorted positions: [lo, hi) under the node, [lo, end_hi) ending there.
    sorted_ids = np.asarray(trie.sorted_token_ids)
    for node, prefix in enumerate(prefixes):
        lo, end_hi, hi = (int(a[node]) for a in (trie.node_lo, trie.node_end_hi, trie.node_hi))
        under = [t for t, data in enumerate(vocab) if data is not None and data.startswith(prefix)]
        assert sorted(sorted_ids[lo:hi]) == under
        assert sorted(sorted_ids[lo:end_hi]) == reference.ending(prefix)

    results = jitted_trie_queries(trie, logp)
    expected_mass = [reference.mass(prefix) for prefix in prefixes]
    assert_log_close(results["node"], expected_mass)
    assert_log_close(results["all"], expected_mass)

    for node, prefix in enumerate(prefixes):
        expected_children = [index.get(prefix + bytes([byte]), NO_NODE) for byte in QUERY_BYTES]
        np.testing.assert_array_equal(results["child"][node], expected_children)
        next_byte = results["next_byte"][node]
        expected_next = [reference.mass(prefix + bytes([byte])) if prefix + bytes([byte]) in index else -math.inf for byte in range(NUM_BYTES)]
        assert_log_close(next_byte, expected_next)

        ending = jax.tree.map(lambda a: np.asarray(a[node]), results["ending"])
        token_ids = reference.ending(prefix)
        assert sorted(ending.token_ids[ending.mask]) == token_ids
        assert np.all(ending.token_ids[~ending.mask] == NO_TOKEN)
        np.testing.assert_array_equal(sorted_ids[ending.positions[ending.mask]], ending.token_ids[ending.mask])
        np.testing.assert_array_equal(ending.logprobs[ending.mask], logp[ending.token_ids[ending.mask]])
        assert np.all(np.isneginf(ending.logprobs[~ending.mask]))

        # m(u) = (tokens ending at u) + sum over bytes of m(child(u, b)).
        split = np.logaddexp(exact_logsumexp(next_byte), exact_logsumexp(ending.logprobs))
        assert_log_close(split, expected_mass[node])


def test_jit_and_eager_agree():
    rng = np.random.default_rng(0)
    vocab = [None, b"a", b"ab", b"ab", b"b\xff", None, b"\x00", b"abab", b"b", b"a"]
    logp = np.concatenate([rng.normal(-5, 3, size=7), [-200.0, -math.inf, -120.0]]).astype(np.float32)
    trie = TokenTrie.build(vocab)
    eager = trie_queries(trie, logp)
    jitted = jitted_trie_queries(trie, logp)
    for actual, expected in zip(jax.tree.leaves(jitted), jax.tree.leaves(eager)):
        np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=0)


def test_missing_nodes_and_bytes():
    trie = TokenTrie.build([b"ab", None, b"ab", b"b"])
    tree = build_sum_tree(trie.sort_logprobs(jnp.log(jnp.array([0.25, 0.5, 0.125, 0.125]))))
    a = child(trie, ROOT, ord("a"))
    assert child(trie, a, ord("b")) != NO_NODE
    np.testing.assert_array_equal(child(trie, [NO_NODE, a, ROOT, ROOT], [ord("a"), ord("a"), -1, NUM_BYTES]), NO_NODE)
    assert np.isneginf(node_logmass(trie, tree, NO_NODE))
    assert np.all(np.isneginf(next_byte_logmass(trie, tree, NO_NODE)))
    assert not np.any(ending_tokens(trie, tree, NO_NODE).mask)
    assert int(trie.node_parent[ROOT]) == NO_NODE and int(trie.node_byte[ROOT]) == NO_BYTE
    np.testing.assert_allclose(np.exp(node_logmass(trie, tree, a)), 0.375, rtol=1e-6)


def test_vocabulary_without_byte_tokens():
    trie = TokenTrie.build([None, None])
    tree = build_sum_tree(trie.sort_logprobs(jnp.zeros(2)))
    assert trie.num_nodes == 1 and trie.max_depth == 0 and trie.max_duplicates == 0
    assert np.isneginf(node_logmass(trie, tree, ROOT))
    assert np.isneginf(all_node_logmasses(trie, jnp.zeros(2))[ROOT])
    assert child(trie, ROOT, 0) == NO_NODE


def test_empty_byte_string_is_rejected():
    with pytest.raises(ValueError, match="empty byte string"):
        TokenTrie.build([b"a", b""])


def exact_node_logmasses(trie: TokenTrie, logp: np.ndarray) -> np.ndarray:
    """log m(u) for every node in float64: one logsumexp per node range of sorted positions."""
    lo, hi = np.asarray(trie.node_lo), np.asarray(trie.node_hi)
    values = logp.astype(np.float64)[np.asarray(trie.sorted_token_ids)]
    starts = np.cumsum(hi - lo) - (hi - lo)
    positions = np.arange(np.sum(hi - lo)) - np.repeat(starts, hi - lo) + np.repeat(lo, hi - lo)
    segments = np.repeat(np.arange(trie.num_nodes), hi - lo)
    peak = np.maximum.reduceat(values[positions], starts)
    return peak + np.log(np.add.reduceat(np.exp(values[positions] - peak[segments]), starts))


@pytest.mark.real_model
@pytest.mark.parametrize("vocab_fixture", ["smollm2_vocab", "gemma_vocab"])
def test_real_vocabulary_masses(vocab_fixture, request):
    vocab = request.getfixturevalue(vocab_fixture)
    trie = TokenTrie.build(vocab.byte_strings)
    assert trie.num_byte_tokens == sum(data is not None for data in vocab.byte_strings)
    assert trie.max_duplicates == (2 if vocab_fixture == "gemma_vocab" else 1)
    # Logits spread 40 nats wide: most tokens sit below log(smallest f32), where exp gives 0.
    logits = 40.0 * jax.random.normal(jax.random.key(0), (trie.vocab_size,))
    logp = np.asarray(jax.nn.log_softmax(logits))
    assert np.mean(np.exp(logp) == 0) > 0.5

    nodes = jnp.arange(trie.num_nodes)

    @jax.jit
    def masses(trie, logp):
        tree = build_sum_tree(trie.sort_logprobs(logp))
        return node_logmass(trie, tree, nodes), all_node_logmasses(trie, logp)

    from_tree, from_segments = (np.asarray(m, np.float64) for m in masses(trie, logp))
    exact = exact_node_logmasses(trie, logp)
    assert np.all(np.isfinite(exact)) and np.all(np.isfinite(from_tree)) and np.all(np.isfinite(from_segments))
    relative = np.abs(np.expm1(from_tree - from_segments))
    print(f"{vocab_fixture}: max relative difference sum tree vs segment pass {relative.max():.2e}")
    assert_log_close(from_tree, exact)
    assert_log_close(from_segments, exact)
