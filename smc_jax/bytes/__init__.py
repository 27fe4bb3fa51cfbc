"""Byte-level view of token LMs: token byte strings, the token trie and its node masses."""

from smc_jax.bytes.sumtree import SumTree, build_sum_tree, leaf_logprobs, range_logmass
from smc_jax.bytes.trie import (
    NO_BYTE,
    NO_NODE,
    NO_TOKEN,
    ROOT,
    EndingTokens,
    TokenTrie,
    all_node_logmasses,
    child,
    ending_tokens,
    next_byte_logmass,
    node_logmass,
)
from smc_jax.bytes.vocab import (
    NUM_BYTES,
    ByteVocab,
    TokenizerScheme,
    TokenKind,
    detect_scheme,
    token_byte_strings,
)

__all__ = [
    "SumTree", "build_sum_tree", "leaf_logprobs", "range_logmass", "NO_BYTE", "NO_NODE",
    "NO_TOKEN", "ROOT", "EndingTokens", "TokenTrie", "all_node_logmasses", "child",
    "ending_tokens", "next_byte_logmass", "node_logmass", "NUM_BYTES", "ByteVocab",
    "TokenizerScheme", "TokenKind", "detect_scheme", "token_byte_strings",
]
