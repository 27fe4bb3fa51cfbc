"""Prefetching (`ByteExperts.prefetch_depth`) and guiding (`ByteExperts.guide`): fewer
sequential model calls, the same next-byte distributions, on a toy token LM whose strings cross
several token boundaries."""

import jax
import jax.numpy as jnp
import numpy as np

from smc_jax.bytes.beam import BeamConfig
from smc_jax.bytes.trie import TokenTrie
from smc_jax.experts.byte import ByteExperts, guide_rows, ids_by_bytes
from smc_jax.experts.toy import NGramTokenLM

# Single bytes (any string has a tokenization) and longer tokens the model prefers.
VOCAB = [b"a", b"b", b"c", b"d", b"ab", b"ba", b"cab", b"dab", b"bad", b"cad", b"abc", b"dcba", b"acdc", b"bb", b"ca",
         b"dd", None]
EOS_ID = len(VOCAB) - 1
NUM_STRINGS, NUM_BYTES = 4, 16


def _model() -> NGramTokenLM:
    v = len(VOCAB)
    longer = np.array([0.0 if b is None else 2.5 * (len(b) > 1) for b in VOCAB]) - 3.0 * (np.arange(v) == EOS_ID)
    table = 0.5 * jax.random.normal(jax.random.key(0), (v + 1, v)) + jnp.asarray(longer, jnp.float32)
    return NGramTokenLM(table=table, vocab_size=v, order=2)


def _experts(lm: NGramTokenLM, prefetch_depth: int, children: int = 0, guide_slots: int = 0) -> ByteExperts:
    prefixes, logits = zip(*[lm.prefill(p) for p in ([0], [2])])
    return ByteExperts(
        model=lm, prefixes=jnp.stack(prefixes), prompt_logits=jnp.stack(logits), trie=TokenTrie.build(VOCAB),
        allowed=jnp.ones((len(VOCAB),), bool), eos_ids=(EOS_ID,), beam=BeamConfig(width=3, threshold=0.05),
        max_tokens=NUM_BYTES + 1, prefetch_depth=prefetch_depth, prefetch_slots=24, prefetch_rows=4,
        prefetch_children=children, guide_slots=guide_slots,
    )


def _sample_strings(lm: NGramTokenLM) -> np.ndarray:
    """Strings the model itself writes (ancestral token sampling after prompt [0]), as bytes."""
    rng = np.random.default_rng(0)
    out = np.zeros((NUM_STRINGS, NUM_BYTES), np.int32)
    for i in range(NUM_STRINGS):
        tokens, data = [], b""
        while len(data) < NUM_BYTES:
            logits = lm.logits_of([0], tokens).astype(np.float64)
            logits[EOS_ID] = -np.inf
            p = np.exp(logits - logits.max())
            tokens.append(int(rng.choice(len(p), p=p / p.sum())))
            data += VOCAB[tokens[-1]]
        out[i] = np.frombuffer(data[:NUM_BYTES], np.uint8)
    return out


@jax.jit
def _read(experts: ByteExperts, data: jax.Array):
    """Every string read by its own particle; the next-byte distributions after each byte."""
    state = experts.init(data.shape[0])

    def body(state, column):
        state = experts.advance(state, column, jnp.ones(column.shape, bool))
        return state, state.beams.next_logp

    return jax.lax.scan(body, state, data.T)


def test_prefetch_saves_calls_and_changes_no_distribution():
    lm = _model()
    data = jnp.asarray(_sample_strings(lm))
    runs = {}
    for depth, children in ((0, 0), (4, 0), (4, 8)):
        experts = _experts(lm, depth, children)
        state, logps = _read(experts, data)
        runs[depth, children] = experts.stats(state), np.asarray(logps)
    (off, logp_off), (on, logp_on), (kids, logp_kids) = runs[0, 0], runs[4, 0], runs[4, 8]
    np.testing.assert_array_equal(logp_on, logp_off)  # bit for bit, at every byte and particle
    # Children (tree attention) are created after the candidates, in rows left over: measured
    # 144 -> 148 contexts prefetched, the same calls and distributions.
    np.testing.assert_array_equal(logp_kids, logp_off)
    assert kids["prefetched"] > on["prefetched"] and kids["model_calls"] <= on["model_calls"]
    assert off["prefetched"] == off["prefetch_hits"] == 0
    assert on["prefetch_hits"] > 0
    # Measured: 16 -> 13 calls for 16 bytes (prefetch off calls at every byte), 100 -> 68 rows
    # needed (132 -> 156 computed: prefetched rows fill the batches' padding and 4 more per call,
    # at most up to the next batch size).
    assert on["model_calls"] <= 0.85 * off["model_calls"], (on, off)


def test_candidates_follow_the_heaviest_continuations():
    """Brute force on a small vocabulary: the tokens ending along the `width` heaviest nodes of
    each level below a hypothesis, scored by the mass that reaches their end."""
    from smc_jax.bytes.beam import PrefetchSources, prefetch_candidates, summarize_logits
    from smc_jax.bytes.trie import ROOT

    vocab = [b"a", b"b", b"ab", b"abc", b"abd", b"ba", b"bab", b"c", None]
    p = np.array([0.05, 0.1, 0.05, 0.3, 0.1, 0.15, 0.05, 0.1, 0.1])
    trie = TokenTrie.build(vocab)
    table = summarize_logits(jnp.log(jnp.asarray(p, jnp.float32))[None], trie, jnp.ones(len(vocab), bool), (8,))
    share = -0.5

    def mass(prefix: bytes) -> float:
        return float(np.log(sum(q for b, q in zip(vocab, p) if b is not None and b.startswith(prefix))))

    sources = PrefetchSources(jnp.asarray([0]), jnp.asarray([ROOT]), jnp.asarray([share]))
    cand = prefetch_candidates(trie, table, sources, depth=3, width=1)
    found = {vocab[int(t)]: float(s) for t, s in zip(cand.token, cand.score) if np.isfinite(s)}
    # Heaviest first byte: a (0.5 vs b 0.3, c 0.1); then ab (0.45); then abc (0.3) over abd.
    assert set(found) == {b"a", b"ab", b"abc"}
    for token, score in found.items():
        np.testing.assert_allclose(score, share + mass(token), rtol=1e-5)
    wide = prefetch_candidates(trie, table, sources, depth=3, width=2)
    found = {vocab[int(t)] for t, s in zip(wide.token, wide.score) if np.isfinite(s)}
    # Two nodes per level: {a, b}, then {ab, ba}, then {abc, abd} (bab's 0.05 is lighter).
    assert found == {b"a", b"b", b"ab", b"ba", b"abc", b"abd"}
    # From inside a token (node "ab"): the token ending there, then its heaviest child.
    at_ab = PrefetchSources(jnp.asarray([0]), jnp.asarray([int(_node(trie, b"ab"))]), jnp.asarray([share]))
    cand = prefetch_candidates(trie, table, at_ab, depth=1, width=1)
    assert {vocab[int(t)] for t, s in zip(cand.token, cand.score) if np.isfinite(s)} == {b"ab", b"abc"}


def _node(trie: TokenTrie, path: bytes):
    from smc_jax.bytes.trie import ROOT, child

    node = jnp.asarray(ROOT)
    for byte in path:
        node = child(trie, node, jnp.asarray(byte))
    return node


def _longest_match(data: bytes) -> list[int]:
    """A tokenization of `data`: the longest token at each position."""
    ids, position = [], 0
    while position < len(data):
        i = max((i for i, b in enumerate(VOCAB) if b and data.startswith(b, position)), key=lambda i: len(VOCAB[i]))
        ids.append(i)
        position += len(VOCAB[i])
    return ids


@jax.jit
def _guided_read(experts: ByteExperts, rows: jax.Array, data: jax.Array):
    """One particle reads `data` in both experts, guided by rows [3, K, G] (tokens, spine, count)."""
    state = experts.init(1)
    if experts.guide_slots:
        state = experts.guide(state, rows[0], rows[1], rows[2, :, 0], chunk=8)

    def body(state, byte):
        state = experts.advance(state, byte[None], jnp.ones((1,), bool))
        return state, state.beams.next_logp

    return jax.lax.scan(body, state, data)


def test_guide_along_a_tokenization_saves_calls_and_changes_no_distribution():
    """Guided by a tokenization of the string (the longest-match one, not the model's likeliest)
    and the tokens one off it, the beams find their contexts in the cache: far fewer calls,
    the same distributions bit for bit."""
    lm = _model()
    ids_of = ids_by_bytes(VOCAB)
    g = 32
    for string in _sample_strings(lm):
        data = bytes(string.tolist())
        chain = _longest_match(data)
        tokens, spine = guide_rows(data, chain, VOCAB, ids_of, g)
        assert tokens[: len(chain)] == chain and spine[: len(chain)] == list(range(len(chain)))
        # the rest: tokens spelling a proper prefix of a chain token, after the chain before it
        for token, j in zip(tokens[len(chain):], spine[len(chain):]):
            assert VOCAB[chain[j]].startswith(VOCAB[token]) and VOCAB[token] != VOCAB[chain[j]]
        rows = np.zeros((3, 2, g), np.int32)
        rows[0, :, : len(tokens)], rows[1, :, : len(spine)], rows[2, :, 0] = tokens, spine, len(tokens)
        runs = {}
        for slots in (0, g):
            state, logps = _guided_read(_experts(lm, 0, guide_slots=slots), jnp.asarray(rows), jnp.asarray(string))
            runs[slots] = _experts(lm, 0, guide_slots=slots).stats(state), np.asarray(logps)
        (off, logp_off), (on, logp_on) = runs[0], runs[g]
        np.testing.assert_array_equal(logp_on, logp_off)
        assert on["prefetch_hits"] > 0 and off["prefetch_hits"] == 0
        # the guiding call, plus calls for the tokenizations off the guide the beam keeps
        assert on["model_calls"] <= 0.5 * off["model_calls"], (on, off)
