"""Flax language models as experts (`smc_jax.models.flax_adapter`): a linen module + params and an
NNX module, each with a tokenizer, run through the samplers at token and byte level; wrapping our
own transformer's forward pass gives the native model's SMC results."""

from __future__ import annotations

import shutil

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tests.helpers import tiny_checkpoints as tc
from flax import nnx

import smc_jax
from smc_jax.models import load_model, transformer
from smc_jax.models.flax_adapter import FlaxLM

WIDTH = 16


class LinenLM(nn.Module):
    """Embedding, one causal self-attention block, a vocabulary head."""

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(tc.VOCAB, WIDTH)(tokens)
        mask = nn.make_causal_mask(tokens)
        x = x + nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=WIDTH)(x, mask=mask)
        return nn.Dense(tc.VOCAB)(nn.LayerNorm()(x))


class NnxLM(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.embed = nnx.Embed(tc.VOCAB, WIDTH, rngs=rngs)
        self.attention = nnx.MultiHeadAttention(num_heads=2, in_features=WIDTH, decode=False, rngs=rngs)
        self.head = nnx.Linear(WIDTH, tc.VOCAB, rngs=rngs)

    def __call__(self, tokens):
        x = self.embed(tokens)
        return self.head(x + self.attention(x, mask=nnx.make_causal_mask(tokens)))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return tc.save_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def linen_lm(tokenizer):
    module = LinenLM()
    params = module.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))
    return FlaxLM.from_linen(module, params, tc.VOCAB, tokenizer, name="linen-tiny")


@pytest.fixture(scope="module")
def nnx_lm(tokenizer):
    return FlaxLM.from_nnx(NnxLM(nnx.Rngs(1)), tc.VOCAB, tokenizer, name="nnx-tiny")


@pytest.mark.parametrize("which", ["linen_lm", "nnx_lm"])
def test_paged_steps_equal_full_forward(which, request):
    """Rows with different histories in a shuffled pool: each step's logits are the full forward
    pass's at the row's last token."""
    model = request.getfixturevalue(which)
    paged = model.paged()
    rng = np.random.default_rng(0)
    prompt = rng.integers(3, tc.VOCAB, size=5).tolist()
    prefix, first = model.prefill(prompt)
    np.testing.assert_allclose(np.asarray(first), np.asarray(model.forward([prompt]))[0, -1], atol=1e-5)
    rows, slots, entries = 3, 4, 16
    pool, step = paged.init_pool(entries), jax.jit(paged.step)
    free = list(rng.permutation(entries))
    paths, histories = np.zeros((rows, slots), np.int32), [[] for _ in range(rows)]
    sequences, got = [], []
    for t in range(slots):
        tokens = rng.integers(3, tc.VOCAB, size=rows)
        active = np.array([True, t % 2 == 0, t < 1])
        depth = np.array([len(h) for h in histories], np.int32)
        write = np.array([free.pop() if a else entries for a in active], np.int32)
        logits, pool = step(prefix, pool, jnp.asarray(paths), jnp.asarray(depth), jnp.asarray(tokens, jnp.int32), jnp.asarray(write))
        for r in range(rows):
            sequences.append(prompt + histories[r] + [int(tokens[r])])
            got.append(np.asarray(logits[r]))
            if active[r]:
                paths[r, depth[r]] = write[r]
                histories[r].append(int(tokens[r]))
    # One forward pass over all the sequences, right-padded (causal: padding changes nothing before it).
    padded = np.zeros((len(sequences), max(map(len, sequences))), np.int32)
    for i, seq in enumerate(sequences):
        padded[i, : len(seq)] = seq
    full = np.asarray(model.forward(padded))
    for i, seq in enumerate(sequences):
        np.testing.assert_allclose(got[i], full[i, len(seq) - 1], atol=1e-5)


def test_wrapped_transformer_gives_the_native_results(tiny, tmp_path):
    """Our own tiny Qwen 3 as an opaque forward function: the same SMC samples and log Z as the
    native model (which uses prompt caches and a key/value pool)."""
    directory = tmp_path / "qwen3"
    shutil.copytree(tiny("qwen3")[0], directory)
    tc.save_tokenizer(directory)
    native = load_model(directory)
    config = native.config

    def apply(params, tokens):
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
        return transformer.forward(params, config, tokens, positions, jnp.ones(tokens.shape, bool))

    wrapped = FlaxLM.from_apply(apply, native.params, config.vocab_size, native.tokenizer.hf, name="wrapped")
    runs = [smc_jax.sample([(m, "ab"), (m, "ba a")], "product", level="token", num_particles=4, max_length=3, seed=2)
            for m in (native, wrapped)]
    assert runs[0].sequences == runs[1].sequences
    np.testing.assert_allclose(runs[0].log_Z, runs[1].log_Z, atol=1e-4)


def test_flax_models_as_experts_at_token_and_byte_level(linen_lm, nnx_lm):
    """The NNX model under two prompts as a byte-level product ensemble: bytes the tokenizer can
    spell; the linen model alone at token level has log Z = 0 (one expert: equal SMC weights)."""
    result = smc_jax.sample([(nnx_lm, "ab"), (nnx_lm, "ba")], "product", level="byte", num_particles=4,
                            max_length=2, seed=0)
    alphabet = set(b"abcdefghijklmnopqrstuvwxyz .")
    assert len(result.sequences) == 4 and all(set(s) <= alphabet for s in result.sequences)
    assert np.isfinite(result.log_Z)
    single = smc_jax.sample([(linen_lm, "ab")], "product", level="token", num_particles=4, max_length=3,
                            at_max_length="truncate", seed=1)
    assert abs(single.log_Z) < 1e-4
