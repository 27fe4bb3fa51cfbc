"""Qwen 3, Mistral, Gemma 2, OLMo 2 and the YaRN / LongRoPE scalings, beyond the parity tests
every architecture runs (test_parity, test_paged, test_gguf_tiny):

* each one's distinguishing option changes the logits on the tiny checkpoints (so parity is not
  reached by ignoring it);
* YaRN and LongRoPE frequencies and attention factors equal transformers' own;
* LongRoPE's switch from short to long factors, decided per call by its largest position, gives
  transformers' cached generation logits, through cached and paged decoding alike;
* a tiny random model of a new architecture with a tiny tokenizer runs the byte-level LM (exact
  against enumeration) and SMC ensembles unchanged;
* hub ids resolve to the new architectures.
"""

from __future__ import annotations

import dataclasses
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tests.helpers import tiny_checkpoints as tc

from smc_jax.models.config_parsing import from_hf_config
import smc_jax
from smc_jax.models import KVCache, ModelConfig, load_model, lm
from smc_jax.models.lm import forward as jit_forward
from smc_jax.models.paged import PagedTransformer

ATOL = 1e-5
SEQ = 12


def _logits(model, config: ModelConfig, tokens: np.ndarray) -> np.ndarray:
    positions = np.broadcast_to(np.arange(tokens.shape[1]), tokens.shape)
    return np.asarray(jit_forward(model.params, config, jnp.asarray(tokens, jnp.int32),
                                  jnp.asarray(positions, jnp.int32), jnp.ones(tokens.shape, bool)))


def _without_long_factors(config: ModelConfig) -> ModelConfig:
    return dataclasses.replace(config, rope=dataclasses.replace(config.rope, long_factor=config.rope.short_factor))


CHANGES = {
    "mistral": {"no window": lambda c: dataclasses.replace(c, sliding_layers=(False,) * c.num_layers)},
    "gemma2": {
        "no window": lambda c: dataclasses.replace(c, sliding_layers=(False,) * c.num_layers),
        "window everywhere": lambda c: dataclasses.replace(c, sliding_layers=(True,) * c.num_layers),
        "no attention soft cap": lambda c: dataclasses.replace(c, attn_softcap=None),
        "no final soft cap": lambda c: dataclasses.replace(c, final_softcap=None),
    },
    "qwen3": {
        "no YaRN": lambda c: dataclasses.replace(c, rope=dataclasses.replace(c.rope, scaling="default")),
        "no YaRN attention factor": lambda c: dataclasses.replace(c, rope=dataclasses.replace(c.rope, attention_factor=1.0)),
    },
    "phi3_longrope": {
        "short factors past the original context": _without_long_factors,
        "no LongRoPE attention factor": lambda c: dataclasses.replace(c, rope=dataclasses.replace(c.rope, attention_factor=1.0)),
    },
}


@pytest.mark.parametrize("arch", list(CHANGES))
def test_distinguishing_options_change_the_logits(arch, tiny):
    directory, _ = tiny(arch)
    model = load_model(directory)
    config = model.config
    tokens = np.random.default_rng(1).integers(0, tc.VOCAB, size=(1, SEQ))
    base = _logits(model, config, tokens)
    for name, change in CHANGES[arch].items():
        assert np.abs(_logits(model, change(config), tokens) - base).max() > 1e-3, name


def test_parsed_options(tiny):
    """What each tiny config turns into: windows, layer kinds, norms and scalings."""
    parse = lambda arch: from_hf_config(tc.hf_config(arch).to_dict())  # noqa: E731
    mistral, gemma2, olmo2, qwen3, phi = (parse(a) for a in ("mistral", "gemma2", "olmo2", "qwen3", "phi3_longrope"))
    assert mistral.sliding_layers == (True, True) and mistral.sliding_window == tc.GEMMA_WINDOW < SEQ
    assert gemma2.sliding_layers == (True, False) and gemma2.attn_softcap == 2.0 and gemma2.final_softcap == 8.0
    assert gemma2.query_scale == pytest.approx(12**-0.5) and gemma2.norm_offset == 1.0 and gemma2.post_norms
    assert not olmo2.pre_norms and olmo2.post_norms and olmo2.qk_norm and not olmo2.qk_norm_per_head
    assert qwen3.qk_norm and qwen3.qk_norm_per_head and qwen3.rope.scaling == "yarn"
    assert qwen3.rope.original_max_positions == tc.YARN_ORIGINAL_CONTEXT < SEQ
    assert phi.rope.scaling == "longrope" and phi.rope.original_max_positions == tc.LONGROPE_ORIGINAL_CONTEXT
    assert phi.rope_switches_to_long and not qwen3.rope_switches_to_long


@pytest.mark.parametrize("arch", ["qwen3", "phi3_longrope"])
def test_scaled_rope_matches_transformers(arch):
    """inv_freq (LongRoPE: short and long) and the cos/sin attention factor equal transformers'."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = tc.hf_config(arch)
    config = from_hf_config(hf.to_dict())
    kind = config.rope.scaling
    short, factor = ROPE_INIT_FUNCTIONS[kind](hf)
    np.testing.assert_allclose(config.layer_inv_freq()[0], short.numpy(), rtol=1e-6)
    np.testing.assert_allclose(config.layer_rope_attention_factor(), factor, rtol=1e-6)
    assert factor > 1.1  # the factor matters at this scale
    if kind == "longrope":
        long, _ = ROPE_INIT_FUNCTIONS[kind](hf, seq_len=config.rope.original_max_positions + 1)
        np.testing.assert_allclose(config.layer_inv_freq_long()[0], long.numpy(), rtol=1e-6)
        assert config.layer_long_from()[0] == config.rope.original_max_positions


def test_longrope_switch_matches_transformers_generation(tiny):
    """A prompt shorter than the original context (short factors), then calls that go past it
    (long factors for their tokens; cached keys keep theirs): transformers' cached generation,
    call by call, equals our prefill / extend / decode and our paged decoding."""
    import torch

    directory, reference = tiny("phi3_longrope")
    model = load_model(directory)
    rng = np.random.default_rng(8)
    prompt = rng.integers(3, tc.VOCAB, size=2).tolist()
    chunks = [rng.integers(3, tc.VOCAB, size=n).tolist() for n in (1, 3, 1, 1)]  # positions 2 | 3-5 | 6 | 7

    expected = []
    with torch.no_grad():
        out = reference(torch.tensor([prompt]), use_cache=True)
        expected.append(out.logits[0, -1].numpy())
        cache = out.past_key_values
        for chunk in chunks:
            out = reference(torch.tensor([chunk]), past_key_values=cache, use_cache=True)
            expected.append(out.logits[0].numpy())
            cache = out.past_key_values

    prefix, last = model.prefill(prompt)
    np.testing.assert_allclose(np.asarray(last), expected[0], atol=ATOL, rtol=0)
    kv = KVCache.init(model.config, rows=1, capacity=8)
    for chunk, want in zip(chunks, expected[1:]):
        logits, k, v = lm.extend(model.params, model.config, prefix, kv.k, kv.v, kv.length, jnp.asarray([chunk], jnp.int32))
        np.testing.assert_allclose(np.asarray(logits[0]), want, atol=ATOL, rtol=0)
        kv = kv.append(k, v)

    # Paged decoding feeds one token per call: the same switch, call by call.
    single = [[t] for chunk in chunks for t in chunk]
    with torch.no_grad():
        out = reference(torch.tensor([prompt]), use_cache=True)
        cache, expected = out.past_key_values, []
        for chunk in single:
            out = reference(torch.tensor([chunk]), past_key_values=cache, use_cache=True)
            expected.append(out.logits[0, -1].numpy())
            cache = out.past_key_values
    paged = PagedTransformer(params=model.params, config=model.config)
    pool, step = paged.init_pool(8), jax.jit(paged.step)
    paths = np.zeros((1, 8), np.int32)
    for depth, (chunk, want) in enumerate(zip(single, expected)):
        logits, pool = step(prefix, pool, jnp.asarray(paths), jnp.asarray([depth], jnp.int32),
                            jnp.asarray(chunk, jnp.int32), jnp.asarray([depth], jnp.int32))
        paths[0, depth] = depth
        np.testing.assert_allclose(np.asarray(logits[0]), want, atol=ATOL, rtol=0)


def test_longrope_short_sequences_match_transformers(tiny):
    """Within the original context the short factors are used (the parity tests' sequences go
    past it, so there the long ones)."""
    directory, reference = tiny("phi3_longrope")
    model = load_model(directory)
    tokens = np.random.default_rng(9).integers(0, tc.VOCAB, size=(2, tc.LONGROPE_ORIGINAL_CONTEXT))
    np.testing.assert_allclose(_logits(model, model.config, tokens), tc.torch_logits(reference, tokens), atol=ATOL, rtol=0)


# ---------------------------------------------------------------------------------------------
# The rest of smc_jax on new architectures.


@pytest.fixture(scope="module")
def with_tokenizer(tiny, tmp_path_factory):
    """tiny checkpoints of Qwen 3 and Gemma 2 with the tiny tokenizer, loaded."""
    models = {}
    for arch in ("qwen3", "gemma2"):
        directory = tmp_path_factory.mktemp("tokenized") / arch
        shutil.copytree(tiny(arch)[0], directory)
        tc.save_tokenizer(directory)
        models[arch] = load_model(directory)
    return models


def _exact_tokenizations(text: bytes, ids_of: dict[bytes, list[int]]) -> list[list[int]]:
    if not text:
        return [[]]
    return [[token, *rest] for end in range(1, len(text) + 1) for token in ids_of.get(text[:end], ())
            for rest in _exact_tokenizations(text[end:], ids_of)]


def test_byte_level_lm_on_a_new_architecture(with_tokenizer):
    """log P(text | prompt) of the byte-level LM (wide beam, no pruning) equals the sum over every
    tokenization of text, each scored by a full forward pass (renormalized over the byte tokens
    and EOS, as the byte LM does). The text ends at a token boundary of every tokenization
    counted, so `complete` (then EOS) is the sum of P(u) P(EOS | u)."""
    model = with_tokenizer["qwen3"]
    text, prompt = b" ab", "ab"
    _, allowed = smc_jax.experts.byte.byte_vocabulary(model)
    from smc_jax.bytes.vocab import token_byte_strings

    pieces = token_byte_strings(model.tokenizer.hf, vocab_size=model.config.vocab_size).byte_strings
    ids_of: dict[bytes, list[int]] = {}
    for token, piece in enumerate(pieces):
        if piece:
            ids_of.setdefault(piece, []).append(token)
    prompt_ids = model.encode_prompt(prompt)
    sequences = _exact_tokenizations(text, ids_of)
    assert len(sequences) > 2
    width = len(prompt_ids) + max(map(len, sequences))
    tokens = np.zeros((len(sequences), width), np.int32)
    for i, u in enumerate(sequences):
        tokens[i, : len(prompt_ids) + len(u)] = prompt_ids + u
    logits = np.asarray(model.forward(jnp.asarray(tokens)), np.float64)
    terms = []
    for i, u in enumerate(sequences):
        rows = np.where(allowed, logits[i, len(prompt_ids) - 1 : len(prompt_ids) + len(u)], -np.inf)
        rows -= np.logaddexp.reduce(rows[:, allowed], axis=1, keepdims=True)
        eos = np.logaddexp.reduce(rows[-1, list(model.tokenizer.eos_token_ids)])
        terms.append(sum(rows[t, token] for t, token in enumerate(u)) + eos)
    got = smc_jax.logprob(model, text, prompt, beam_width=8, prune_threshold=0.0)
    np.testing.assert_allclose(got.complete, np.logaddexp.reduce(terms), atol=1e-4)


def test_ensembles_run_on_new_architectures(with_tokenizer):
    """A token-level product ensemble of Qwen 3 and Gemma 2 (one prompt each, the same tokenizer)
    runs SMC unchanged: valid token ids, a finite log Z, the same result for the same seed."""
    qwen3, gemma2 = with_tokenizer["qwen3"], with_tokenizer["gemma2"]
    run = lambda: smc_jax.sample([(qwen3, "ab"), (gemma2, "ba")], "product", level="token",  # noqa: E731
                                 num_particles=4, max_length=3, seed=0)
    result = run()
    assert len(result.sequences) == 4
    assert all(0 <= t < tc.VOCAB for s in result.sequences for t in s)
    assert np.isfinite(result.log_Z) and result.sequences == run().sequences


def test_hub_ids_load_new_architectures(tiny, monkeypatch):
    """A hub id goes through snapshot_download to the same directory loader."""
    import huggingface_hub

    directory, _ = tiny("olmo2")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: str(directory))
    model = load_model("allenai/tiny-olmo2")
    assert model.config.architecture == "olmo2" and model.name == directory.name
