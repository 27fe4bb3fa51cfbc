"""Checks of an embedded GGUF model against transformers' own GGUF loading of the same file.

The test modules `test_gguf_real_<model>.py` import these checks and define the module-scoped
`pair` fixture with `load_pair(name)`: one file per model keeps each file's run short (loading the
transformers reference parses the GGUF file twice: ~40 s for Gemma 3's 262k-token vocabulary).
Our model is loaded through the weights cache, which any change to the converting code
invalidates, so what is tested is the current GGUF conversion.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from smc_jax.models import NoChatTemplateError, load_model
from smc_jax.models import registry
from smc_jax.models.registry import resolve
from smc_jax.models.weights_cache import NO_CACHE_ENV, cache_enabled, entry_path

MARKS = [pytest.mark.real_model, pytest.mark.slow]
PROMPTS = ("The capital of France is", "def fibonacci(n):", "Once upon a time, a small robot")
GREEDY_TOKENS = 32
LOGPROB_ATOL = 1e-4  # next-token log-probabilities of the top tokens, both models
TOP_TOKENS = 20
# Max |logits difference| allowed. Gemma 3 stays within 1e-4 (measured 4.6e-5). SmolLM2 needs
# 2e-4 (measured 1.6e-4): XLA's and PyTorch's f32 GEMMs sum in different orders, and SmolLM2's
# residual stream carries a "massive activation" of 2.2e4 from layer 11 on (f32 ulp 2e-3) whose
# rounding reaches the logits (size ~27). Against transformers run in float64 our f32 logits are
# off by 1.7e-4 and transformers' own f32 logits by 4.4e-5: rounding, not a port error.
LOGITS_ATOL = {"smollm2-135m-instruct": 2e-4, "gemma3-270m": 1e-4}


def _torch_reference(path):
    import torch
    from transformers import AutoModelForCausalLM

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    return model.eval()


def load_pair(name: str):
    """(our model, transformers' float32 model, embedded name)."""
    return load_model(name), _torch_reference(resolve(name)[1]), name


def test_logits_match_transformers(pair):
    import torch

    ours, reference, name = pair
    for prompt in PROMPTS:
        ids = ours.encode_prompt(prompt)
        with torch.no_grad():
            expected = reference(torch.tensor([ids])).logits[0].numpy()
        got = np.asarray(ours.forward(jnp.asarray([ids]))[0])
        np.testing.assert_allclose(got, expected, atol=LOGITS_ATOL[name], rtol=0, err_msg=prompt)
        assert np.array_equal(got.argmax(-1), expected.argmax(-1)), prompt
        top = np.argsort(-expected, axis=-1)[:, :TOP_TOKENS]
        got_lp = np.take_along_axis(np.asarray(jax.nn.log_softmax(got)), top, -1)
        expected_lp = np.take_along_axis(np.asarray(jax.nn.log_softmax(expected)), top, -1)
        np.testing.assert_allclose(got_lp, expected_lp, atol=LOGPROB_ATOL, rtol=0, err_msg=prompt)


def test_greedy_matches_transformers(pair):
    """32 greedy tokens from our prefill + cached decode equal transformers' generate."""
    import torch

    ours, reference, name = pair
    prompt = PROMPTS[0]
    ids = ours.encode_prompt(prompt)
    with torch.no_grad():
        generated = reference.generate(
            torch.tensor([ids]), max_new_tokens=GREEDY_TOKENS, do_sample=False,
            eos_token_id=list(ours.tokenizer.eos_token_ids), pad_token_id=ours.tokenizer.eos_token_ids[0],
        )[0, len(ids):].tolist()
    ours_ids = ours.greedy(prompt, GREEDY_TOKENS)
    assert ours_ids == generated, (ours.tokenizer.decode(ours_ids), ours.tokenizer.decode(generated))
    if name == "smollm2-135m-instruct":
        assert ours.tokenizer.decode(ours_ids).startswith(" Paris.")


def test_tokenizer_facts(pair):
    ours, reference, name = pair
    tok = ours.tokenizer
    assert tok.vocab_size == ours.config.vocab_size == reference.config.vocab_size
    if name == "smollm2-135m-instruct":
        assert 2 in tok.eos_token_ids and tok.bos_token_id == 1  # <|im_end|>, <|im_start|>
        assert tok.encode("Hi") == tok.encode("Hi", add_special_tokens=False)  # no bos added
        ids = ours.encode_prompt([{"role": "user", "content": "Hi"}])
        assert tok.decode(ids).endswith("<|im_start|>assistant\n")
    else:
        assert tok.eos_token_ids == (1,) and tok.bos_token_id == 2
        assert tok.encode("Hi")[0] == 2  # <bos> added by default
        assert ours.config.sliding_layers.count(False) == 3 and ours.config.rope_local.theta == 1e4
        with pytest.raises(NoChatTemplateError, match="no chat template"):
            ours.encode_prompt([{"role": "user", "content": "Hi"}])


TOKENIZER_TEXTS = PROMPTS + (
    "", " leading space", "naïve café 東京\n\n  tabs\tand  spaces", "Ünïcode «ok» — 3.14", "x" * 300,
    "<|im_start|>user\nHi<|im_end|>", "<start_of_turn>user\nhi<end_of_turn>\n", "{\"a\": [1, 2]}\n    return x",
)


@pytest.mark.skipif(not cache_enabled(), reason=f"{NO_CACHE_ENV} is set")
def test_the_cached_tokenizer_reads_as_the_models_own_class(pair):
    """The weights cache reads the saved tokenizer with the generic class; the model's own class
    (transformers' AutoTokenizer on the same files) gives the same ids, tokens and text."""
    from transformers import AutoTokenizer

    _, _, name = pair
    hf = load_model(name).tokenizer.hf  # from the cache (the pair's model may just have been converted)
    own = AutoTokenizer.from_pretrained(entry_path(resolve(name)[1], name) / "tokenizer")
    assert type(hf) is not type(own) or name == "smollm2-135m-instruct"  # SmolLM2's class is the generic one
    assert hf.get_vocab() == own.get_vocab() and hf.all_special_ids == own.all_special_ids
    assert (hf.bos_token_id, hf.eos_token_id, hf.chat_template) == (own.bos_token_id, own.eos_token_id, own.chat_template)
    for text in TOKENIZER_TEXTS:
        for special in (True, False):
            assert hf.encode(text, add_special_tokens=special) == own.encode(text, add_special_tokens=special), text
    ids = np.random.default_rng(0).integers(0, len(own), 2000).tolist()
    assert hf.decode(ids) == own.decode(ids) and hf.convert_ids_to_tokens(ids) == own.convert_ids_to_tokens(ids)


@pytest.mark.skipif(not cache_enabled(), reason=f"{NO_CACHE_ENV} is set")
def test_second_load_comes_from_the_weights_cache(pair, monkeypatch):
    ours, _, name = pair
    assert entry_path(resolve(name)[1], name).is_dir()

    def no_conversion(*args):
        raise AssertionError("the GGUF file was converted again instead of read from the cache")

    monkeypatch.setattr(registry, "_load_gguf", no_conversion)
    again = load_model(name)
    assert again.config == ours.config
    assert again.tokenizer.encode(PROMPTS[0]) == ours.tokenizer.encode(PROMPTS[0])
    for a, b in zip(np.asarray(ours.params["embed"][:100]), np.asarray(again.params["embed"][:100])):
        np.testing.assert_array_equal(a, b)
    assert again.split_layers == ours.split_layers
    for a, b in zip(jax.tree.leaves(ours.params["layers"]), jax.tree.leaves(again.params["layers"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_bfloat16_keeps_the_top_token(pair):
    ours, _, _ = pair
    ids = jnp.asarray([ours.encode_prompt(PROMPTS[0])])
    full = np.asarray(ours.forward(ids))[0, -1]
    half = np.asarray(ours.astype(jnp.bfloat16).forward(ids))[0, -1]
    assert half.dtype == np.float32
    assert half.argmax() == full.argmax()


def test_paged_step_bits_do_not_depend_on_the_span(pair):
    """A row's logits and keys/values do not depend on the span its call's paths were cut to, so
    not on the other rows of the call (real head sizes: 64 for SmolLM2, 256 for Gemma 3)."""
    ours, _, _ = pair
    paged = ours.paged()
    prefix, _ = ours.prefill([ours.tokenizer.bos_token_id])
    entries, rows, slots = 48, 4, 40
    keys = jax.random.split(jax.random.key(5), 2)
    pool = paged.init_pool(entries)
    pool = type(pool)(k=jax.random.normal(keys[0], pool.k.shape, pool.k.dtype),
                      v=jax.random.normal(keys[1], pool.v.shape, pool.v.dtype))
    paths = jnp.asarray(np.random.default_rng(6).integers(0, entries, size=(rows, slots)), jnp.int32)
    depth = jnp.asarray([7, 0, 3, 7], jnp.int32)
    tokens = jnp.asarray([100, 200, 300, 400], jnp.int32)
    write = jnp.asarray([40, 41, 42, entries], jnp.int32)
    # The model is an argument: weights closed over would be constants that XLA folds for minutes.
    step = jax.jit(lambda model, span: model.step(prefix, pool, paths, depth, tokens, write, span=span))
    want_logits, want_pool = step(paged, jnp.int32(7))
    for span in (9, 20, 40):  # one span in each wider branch of the switch (8, 16, 32, 40 slots)
        logits, new_pool = step(paged, jnp.int32(span))
        np.testing.assert_array_equal(np.asarray(logits), np.asarray(want_logits), err_msg=f"span {span}")
        np.testing.assert_array_equal(np.asarray(new_pool.k), np.asarray(want_pool.k), err_msg=f"span {span}")
