"""The byte-level LM on the real embedded models, against references built from full forward passes.

For a short string s (model.name keys the text) after a prompt (prompt tokenized canonically), the reference enumerates every
tokenization of s with the token byte strings: the prefix probability sums, over every exact
tokenization u of s[:j] (j < |s|), P(u) times the mass of the tokens whose bytes start with s[j:];
the complete probability sums P(u) P(EOS | u) over the exact tokenizations u of s. Each P comes
from one full forward pass of the model over prompt + u, renormalized over the ids a byte LM may
use (byte tokens and EOS), as the byte LM does. Nothing here goes through the trie or the beam.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from smc_jax.experts.byte import byte_vocabulary
from smc_jax.sampler import logprob
from smc_jax.bytes.vocab import token_byte_strings
from smc_jax.models import load_model

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

PROMPT = "The capital of France is"
# Short enough to enumerate: Gemma 3 spells every byte two ways (a piece and a byte-fallback
# token), so " Paris" has 229 tokenizations there; " Par" has 34.
TEXTS = {"smollm2-135m-instruct": " Paris".encode(), "gemma3-270m": " Par".encode()}
WIDE_BEAM = 64  # more slots than the text's partial and full tokenizations: nothing is pruned
FORWARD_BATCH = 8


@pytest.fixture(scope="module", params=list(TEXTS))
def model(request):
    return load_model(request.param)


def exact_tokenizations(text: bytes, ids_of: dict[bytes, list[int]]) -> list[list[int]]:
    """Every token-id sequence whose byte strings concatenate to `text` (duplicate ids included)."""
    if not text:
        return [[]]
    out = []
    for end in range(1, len(text) + 1):
        for token in ids_of.get(text[:end], ()):
            out.extend([token] + rest for rest in exact_tokenizations(text[end:], ids_of))
    return out


def score_sequences(model, prompt_ids: list[int], sequences: list[list[int]],
                    allowed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each token sequence u after the prompt: log P(u | prompt) by the chain rule and the
    next-token log-probabilities after it, both under the model renormalized over `allowed`
    (one full forward pass per batch of sequences). Returns ([N], [N, V])."""
    width = len(prompt_ids) + max(len(u) for u in sequences)
    totals, last = [], []
    for start in range(0, len(sequences), FORWARD_BATCH):
        chunk = sequences[start : start + FORWARD_BATCH]
        tokens = np.zeros((FORWARD_BATCH, width), np.int32)  # right padding: causal, so harmless
        for i, u in enumerate(chunk):
            tokens[i, : len(prompt_ids) + len(u)] = prompt_ids + u
        logits = np.asarray(model.forward(jnp.asarray(tokens)), np.float64)
        for i, u in enumerate(chunk):
            rows = np.where(allowed, logits[i, len(prompt_ids) - 1 : len(prompt_ids) + len(u)], -np.inf)
            rows = rows - np.logaddexp.reduce(rows[:, allowed], axis=1, keepdims=True)
            totals.append(sum(rows[t, token] for t, token in enumerate(u)))
            last.append(rows[-1])
    return np.asarray(totals), np.stack(last)


@pytest.fixture(scope="module")
def reference(model):
    """Exact prefix and complete log-probabilities of the text by enumeration, and the canonical
    tokenization's log-probability under the raw (not renormalized) model."""
    text = TEXTS[model.name]
    vocab = token_byte_strings(model.tokenizer.hf, vocab_size=model.config.vocab_size)
    _, allowed = byte_vocabulary(model)
    ids_of: dict[bytes, list[int]] = {}
    for token, piece in enumerate(vocab.byte_strings):
        if piece:
            ids_of.setdefault(piece, []).append(token)
    prompt_ids = model.encode_prompt(PROMPT)
    eos = list(model.tokenizer.eos_token_ids)

    heads = [(j, u) for j in range(len(text)) for u in exact_tokenizations(text[:j], ids_of)]
    full = exact_tokenizations(text, ids_of)
    logp, after = score_sequences(model, prompt_ids, [u for _, u in heads] + full, allowed)
    crossing = {j: [t for t, piece in enumerate(vocab.byte_strings) if piece and piece.startswith(text[j:])]
                for j in range(len(text))}
    prefix_terms = [logp[i] + np.logaddexp.reduce(after[i, crossing[j]]) for i, (j, _) in enumerate(heads)]
    complete_terms = logp[len(heads):] + np.logaddexp.reduce(after[len(heads):, eos], axis=1)

    canonical = model.tokenizer.hf.encode(text.decode(), add_special_tokens=False)
    canonical_logp, _ = score_sequences(model, prompt_ids, [canonical], np.ones_like(allowed))
    return {
        "prefix": float(np.logaddexp.reduce(prefix_terms)),
        "complete": float(np.logaddexp.reduce(complete_terms)),
        "canonical": float(canonical_logp[0]),
        "num_tokenizations": len(full),
        "num_slots": len(heads) + len(full),
    }


def scores(model, beam_width: int, prune_threshold: float):
    return logprob(model, TEXTS[model.name], PROMPT, beam_width=beam_width, prune_threshold=prune_threshold)


def test_wide_beam_equals_the_sum_over_all_tokenizations(model, reference):
    assert reference["num_tokenizations"] > 1 and reference["num_slots"] <= WIDE_BEAM  # ambiguous, enumerable
    wide = scores(model, WIDE_BEAM, 0.0)
    np.testing.assert_allclose(wide.prefix, reference["prefix"], atol=2e-3)
    np.testing.assert_allclose(wide.complete, reference["complete"], atol=2e-3)
    np.testing.assert_allclose(np.exp(np.logaddexp.reduce(wide.next_logprobs)), 1.0, atol=1e-4)


def test_byte_probability_bounds(model, reference):
    """log P_bytes(s) >= log P(canonical tokens of s) for the default beam, and a pruned beam is a
    lower bound on the exact value."""
    default = scores(model, 5, 0.05)
    narrow = scores(model, 1, 0.0)
    assert default.prefix >= reference["canonical"] - 1e-3
    assert narrow.prefix <= reference["prefix"] + 1e-3
    assert default.prefix <= reference["prefix"] + 1e-3
