"""Parity with transformers (PyTorch) on tiny random checkpoints of every architecture.

Each checkpoint is saved by transformers' `save_pretrained` and loaded by our loader; logits must
match the torch model within 1e-5 in float32, with and without padding, and cached decoding
(prefill + extend/decode steps, rows of different lengths) must equal the full forward pass.
"""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tests.helpers import tiny_checkpoints as tc

from smc_jax.models import KVCache, load_model, lm, transformer
from smc_jax.models.lm import forward as jit_forward
from smc_jax.models.params import to_device
from smc_jax.models.safetensors_loader import load_hf_checkpoint

ATOL = 1e-5
SEQ = 12
ROWS = 3


def _load(directory):
    config, flat = load_hf_checkpoint(directory)
    return config, to_device(flat, jnp.float32)


def _full(tokens: np.ndarray):
    positions = np.broadcast_to(np.arange(tokens.shape[1]), tokens.shape)
    return jnp.asarray(tokens, jnp.int32), jnp.asarray(positions, jnp.int32), jnp.ones(tokens.shape, bool)


@pytest.mark.parametrize("arch", tc.ARCHITECTURES)
def test_forward_matches_transformers(arch, tiny):
    directory, reference = tiny(arch)
    config, params = _load(directory)
    tokens = np.random.default_rng(1).integers(0, tc.VOCAB, size=(ROWS, SEQ))
    expected = tc.torch_logits(reference, tokens)
    got = jit_forward(params, config, *_full(tokens))
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), expected, atol=ATOL, rtol=0)


def test_gemma3_window_is_exercised(tiny):
    """The Gemma 3 tiny config mixes sliding and global layers, and the window is shorter than
    the sequences, so ignoring the window (or applying it everywhere) changes the logits."""
    directory, _ = tiny("gemma3")
    config, params = _load(directory)
    assert config.sliding_layers == (True, False, True, False)
    assert config.sliding_window < SEQ
    tokens = _full(np.random.default_rng(1).integers(0, tc.VOCAB, size=(1, SEQ)))
    base = jit_forward(params, config, *tokens)
    for sliding in ((False,) * 4, (True,) * 4):
        changed = jit_forward(params, dataclasses.replace(config, sliding_layers=sliding), *tokens)
        assert np.abs(np.asarray(changed - base))[0, config.sliding_window :].max() > 1e-3


@pytest.mark.parametrize("arch", tc.ARCHITECTURES)
def test_padding_leaves_valid_logits_unchanged(arch, tiny):
    """Left- and right-padded rows (mask False, positions counted from each row's first real
    token) give the logits of the unpadded sequences."""
    directory, reference = tiny(arch)
    config, params = _load(directory)
    rng = np.random.default_rng(2)
    lengths, left_pad = [SEQ, 7, 9], [0, 5, 0]
    tokens = np.zeros((ROWS, SEQ), np.int64)
    positions = np.zeros((ROWS, SEQ), np.int64)
    mask = np.zeros((ROWS, SEQ), bool)
    rows = []
    for r, (n, pad) in enumerate(zip(lengths, left_pad)):
        row = rng.integers(0, tc.VOCAB, size=n)
        rows.append(row)
        tokens[r, pad : pad + n] = row
        positions[r, pad : pad + n] = np.arange(n)
        mask[r, pad : pad + n] = True
    got = np.asarray(jit_forward(params, config, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask)))
    for r, (row, pad) in enumerate(zip(rows, left_pad)):
        expected = tc.torch_logits(reference, row[None])[0]
        np.testing.assert_allclose(got[r, pad : pad + len(row)], expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("arch", tc.ARCHITECTURES)
def test_cached_decoding_equals_full_forward(arch, tiny):
    """Prefill a shared prompt, then rows of different lengths: one 3-token extend, then 1-token
    decode steps; rows that have finished feed padding that the cache append masks out."""
    directory, _ = tiny(arch)
    config, params = _load(directory)
    rng = np.random.default_rng(3)
    prompt_len, padded = 5, 8
    prompt = rng.integers(0, tc.VOCAB, size=prompt_len)
    lengths = np.array([7, 3, 6])
    continuation = rng.integers(0, tc.VOCAB, size=(ROWS, lengths.max()))

    tokens = np.zeros(padded, np.int32)
    tokens[:prompt_len] = prompt
    prefix, last = lm.prefill(params, config, jnp.asarray(tokens), jnp.asarray(prompt_len))
    full_prompt = jit_forward(params, config, *_full(prompt[None]))
    np.testing.assert_allclose(np.asarray(last), np.asarray(full_prompt[0, -1]), atol=ATOL, rtol=0)

    cache = KVCache.init(config, ROWS, capacity=int(lengths.max()))
    got = np.zeros((ROWS, lengths.max(), config.vocab_size), np.float32)
    first = 3
    logits, k, v = lm.extend(
        params, config, prefix, cache.k, cache.v, cache.length, jnp.asarray(continuation[:, :first])
    )
    got[:, :first] = np.asarray(logits)
    cache = cache.append(k, v, jnp.asarray(np.arange(first)[None] < lengths[:, None]))
    for step in range(first, lengths.max()):
        logits, k, v = lm.decode(
            params, config, prefix, cache.k, cache.v, cache.length, jnp.asarray(continuation[:, step])
        )
        got[:, step] = np.asarray(logits)
        cache = cache.append(k[:, :, None], v[:, :, None], jnp.asarray(step < lengths)[:, None])
    np.testing.assert_array_equal(np.asarray(cache.length), lengths)

    # Reference: one full forward pass over prompt + continuation (right padding is masked).
    sequences = np.concatenate([np.broadcast_to(prompt, (ROWS, prompt_len)), continuation], axis=1)
    tokens, positions, mask = _full(sequences)
    mask = jnp.asarray(np.arange(sequences.shape[1])[None] < prompt_len + lengths[:, None])
    expected = np.asarray(jit_forward(params, config, tokens, positions, mask))[:, prompt_len:]
    for r in range(ROWS):
        np.testing.assert_allclose(got[r, : lengths[r]], expected[r, : lengths[r]], atol=ATOL, rtol=0)


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gpt2", "phi3_longrope"])
def test_prefill_of_the_needed_columns_is_the_full_prefill(arch, tiny):
    """`prefill_read` computes only the first `read` columns of the padded prompts and widens the
    cache to the padded size: the same cache (over the prompt) and logits as one pass over the
    whole bucket, for lengths inside and at the end of the read columns and past the sliding
    window (Gemma 3); the slots from `read` on are zero (masked by the length)."""
    directory, _ = tiny(arch)
    config, params = _load(directory)
    padded, read = 16, 12
    tokens = np.random.default_rng(4).integers(0, tc.VOCAB, size=(3, padded)).astype(np.int32)
    lengths = np.array([3, 8, 12], np.int32)
    whole = jax.vmap(lambda t, n: transformer.prefill(params, config, t, n))(jnp.asarray(tokens), jnp.asarray(lengths))
    part = lm.prefill_many(params, config, jnp.asarray(tokens), jnp.asarray(lengths), read)
    np.testing.assert_allclose(np.asarray(part[1]), np.asarray(whole[1]), atol=ATOL, rtol=0)
    np.testing.assert_array_equal(np.asarray(part[0].length), lengths)
    assert part[0].k.shape == whole[0].k.shape and part[0].v.shape == whole[0].v.shape
    for r, n in enumerate(lengths):
        for got, want in ((part[0].k, whole[0].k), (part[0].v, whole[0].v)):
            np.testing.assert_allclose(np.asarray(got[r, :, :n]), np.asarray(want[r, :, :n]), atol=ATOL, rtol=0)
            if not config.rope_switches_to_long:
                assert not np.any(np.asarray(got[r, :, read:]))


def test_prompts_are_prefilled_over_the_multiple_of_the_step_that_holds_the_longest(tiny, monkeypatch):
    """`prefill_prompts` reads `prefill_columns(longest)` columns of the prompts' bucket (the
    whole bucket, one program, where that is not smaller), with the whole bucket's caches and
    logits up to float rounding."""
    directory, _ = tiny("llama")
    model = load_model(directory)
    reads, real = [], lm.prefill_many
    monkeypatch.setattr(lm, "prefill_many", lambda *a: reads.append(a[-1]) or real(*a))
    rng = np.random.default_rng(5)
    for lengths, read in (([70, 129], lm.prefill_columns(129)), ([3, 9], 0), ([100], 0)):
        ids = [rng.integers(0, tc.VOCAB - 1, size=n).tolist() for n in lengths]
        part = lm.prefill_prompts(model, ids, 4, token_ids=True)
        whole = lm.prefill_prompts(model, ids, 4, token_ids=True, columns=lambda n: 10**9)
        assert reads[-2:] == [read, 0]
        np.testing.assert_allclose(np.asarray(part[1]), np.asarray(whole[1]), atol=ATOL, rtol=0)
        for r, n in enumerate(lengths):
            np.testing.assert_allclose(np.asarray(part[0].k[r, :, :n]), np.asarray(whole[0].k[r, :, :n]), atol=ATOL, rtol=0)
    assert lm.prefill_columns(129) == 192 < lm.prompt_bucket(129, model.prompt_capacity) == 256


def test_sharded_checkpoint_loads_the_same(tiny, tmp_path):
    directory, _ = tiny("qwen2")
    sharded = tmp_path / "sharded"
    tc.build("qwen2", sharded, max_shard_size="20KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("*.safetensors"))) > 2
    _, flat = load_hf_checkpoint(directory)
    _, flat_sharded = load_hf_checkpoint(sharded)
    assert flat.keys() == flat_sharded.keys()
    for key in flat:
        np.testing.assert_array_equal(flat[key], flat_sharded[key])


def test_vmap_over_prompts_equals_separate_calls(tiny):
    """Within-model ensembles vmap prefill/extend over an expert axis with params unbatched."""
    directory, _ = tiny("gemma3")
    config, params = _load(directory)
    rng = np.random.default_rng(4)
    prompts = jnp.asarray(rng.integers(0, tc.VOCAB, size=(2, 8)), jnp.int32)
    lengths = jnp.asarray([6, 8], jnp.int32)
    prefixes, lasts = jax.jit(jax.vmap(lambda t, n: lm.prefill(params, config, t, n)))(prompts, lengths)
    cache = KVCache.init(config, ROWS, capacity=4)
    cache = cache.append(*lm.extend(
        params, config, jax.tree.map(lambda x: x[0], prefixes), cache.k, cache.v, cache.length,
        jnp.asarray(rng.integers(0, tc.VOCAB, size=(ROWS, 2)), jnp.int32),
    )[1:])
    tokens = jnp.asarray(rng.integers(0, tc.VOCAB, size=(2, ROWS, 2)), jnp.int32)
    stack = lambda x: jnp.stack([x, x])  # noqa: E731
    batched = jax.jit(jax.vmap(
        lambda prefix, sk, sv, sl, tok: lm.extend(params, config, prefix, sk, sv, sl, tok)
    ))(prefixes, stack(cache.k), stack(cache.v), stack(cache.length), tokens)
    for e in range(2):
        prefix = jax.tree.map(lambda x: x[e], prefixes)
        single_prefix, single_last = lm.prefill(params, config, prompts[e], lengths[e])
        np.testing.assert_allclose(np.asarray(lasts[e]), np.asarray(single_last), atol=ATOL, rtol=0)
        np.testing.assert_allclose(np.asarray(prefix.k), np.asarray(single_prefix.k), atol=ATOL, rtol=0)
        single = lm.extend(params, config, prefix, cache.k, cache.v, cache.length, tokens[e])
        for got, want in zip(batched, single):
            np.testing.assert_allclose(np.asarray(got[e]), np.asarray(want), atol=ATOL, rtol=0)


def test_bfloat16_params_give_float32_logits(tiny):
    directory, _ = tiny("llama")
    model = load_model(directory)
    half = model.astype(jnp.bfloat16)
    assert all(w.dtype == jnp.bfloat16 for w in jax.tree.leaves(half.params["layers"]))
    tokens = np.random.default_rng(5).integers(0, tc.VOCAB, size=(2, SEQ))
    full, reduced = model.forward(tokens), half.forward(tokens)
    assert reduced.dtype == jnp.float32
    assert np.abs(np.asarray(full - reduced)).max() < 0.05 * np.abs(np.asarray(full)).max()
    logprobs = transformer.log_softmax(reduced)
    assert logprobs.dtype == jnp.float32 and np.isfinite(np.asarray(logprobs)).all()
    prefix, last = half.prefill(tokens[0].tolist())
    assert prefix.k.dtype == jnp.bfloat16 and last.dtype == jnp.float32


def test_decode_does_not_recompile(tiny, caplog):
    """Two decode calls with the same shapes compile once; a new prompt length in the same
    bucket reuses the prefill compilation."""
    directory, _ = tiny("llama_bias")
    model = load_model(directory)
    prefix, _ = model.prefill([3, 4, 5])
    cache = model.new_cache(rows=2, capacity=4)
    tokens, other_tokens = jnp.asarray([7, 8], jnp.int32), jnp.asarray([9, 10], jnp.int32)
    other_length = jnp.asarray([1, 2], jnp.int32)
    model.decode(prefix, cache.k, cache.v, cache.length, tokens)  # warm-up compile
    with jax.log_compiles(), caplog.at_level("WARNING"):
        caplog.clear()
        model.decode(prefix, cache.k, cache.v, other_length, other_tokens)
        model.prefill([3, 4, 5, 6, 7])
    compiles = [r for r in caplog.records if "Compiling" in r.getMessage()]
    assert compiles == [], [r.getMessage() for r in compiles]


def kernel_slices(model, tokens) -> int:
    """Ops in the compiled forward that slice a kernel-shaped [out, in] block out of an array: the
    per-layer weight copies of a scan over stacked weights."""
    kernels = {tuple(w.shape[-2:]) for w in jax.tree.leaves(model.params["layers"]) if w.ndim >= 2}
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    text = jit_forward.lower(model.params, model.config, tokens, positions, jnp.ones(tokens.shape, bool)).compile().as_text()
    count = 0
    for line in text.splitlines():
        name, _, rest = line.partition(" = ")
        shape = re.match(r"f32\[(?:1,)?(\d+),(\d+)\]\S* ([\w-]+)\(", rest)
        if shape and "dynamic-slice" in name + shape[3] and (int(shape[1]), int(shape[2])) in kernels:
            count += 1
    return count


@pytest.mark.parametrize("arch", ["gemma3", "gpt2"])
def test_split_layers_match_stacked(arch, tiny):
    """Per-layer weight buffers: the scan switches between them instead of slicing a stack. The
    results equal the stacked model's, and no per-layer weight copy is left in the program."""
    directory, _ = tiny(arch)
    stacked = load_model(directory, split_layers=False)
    split = stacked.with_split_layers()
    assert split.split_layers and not stacked.split_layers
    assert not split.with_split_layers(False).split_layers
    assert load_model(directory).split_layers == (jax.default_backend() == "cpu")
    tokens = np.random.default_rng(7).integers(0, tc.VOCAB, size=(2, SEQ))
    np.testing.assert_allclose(np.asarray(split.forward(tokens)), np.asarray(stacked.forward(tokens)), atol=ATOL, rtol=0)
    assert kernel_slices(stacked, jnp.asarray(tokens)) >= 4  # q, k, v, o, the MLP's: copied per layer
    assert kernel_slices(split, jnp.asarray(tokens)) == 0
    outputs = []
    for model in (stacked, split):
        prefix, last = model.prefill(tokens[0, :6].tolist())
        cache = model.new_cache(rows=2, capacity=3)
        outputs.append((prefix.k, last, *model.decode(prefix, cache.k, cache.v, cache.length, jnp.asarray(tokens[:, 6]))))
    for a, b in zip(*outputs):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=ATOL, rtol=0)


def _dots(text: str) -> list[str]:
    return [line for line in text.splitlines() if re.search(r"= \S+ dot\(", line)]


@pytest.mark.parametrize("arch", ["llama_bias", "qwen2", "gpt2"])
def test_split_layout_fuses_projections(arch, tiny):
    """The split layout holds q/k/v (and gate/up where the MLP is gated) as one kernel each, with
    their biases: stacking again restores the checkpoint's params exactly, the split model's
    logits equal the stacked model's, and its layers make 4 weight matmuls each."""
    directory, _ = tiny(arch)
    stacked = load_model(directory, split_layers=False)
    split = stacked.with_split_layers()
    gated = stacked.config.mlp == "gated"
    for layer in split.params["layers"]:
        assert "qkv" in layer and not {"q", "k", "v"} & set(layer)
        if gated:
            assert "gate_up" in layer and not {"gate", "up"} & set(layer)
        else:  # GPT-2: one up projection, nothing to fuse
            assert "up" in layer and "gate_up" not in layer
    if stacked.config.qkv_bias:
        assert split.params["layers"][0]["qkv"]["bias"].shape == (split.params["layers"][0]["qkv"]["kernel"].shape[0],)
    again = split.with_split_layers(False).params
    assert jax.tree.structure(again) == jax.tree.structure(stacked.params)
    for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(stacked.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    tokens = np.random.default_rng(3).integers(0, tc.VOCAB, size=(2, SEQ))
    np.testing.assert_allclose(np.asarray(split.forward(tokens)), np.asarray(stacked.forward(tokens)), atol=ATOL, rtol=0)
    tokens, positions, mask = _full(tokens)
    program = lambda model: jit_forward.lower(model.params, model.config, tokens, positions, mask).compile().as_text()
    # The weight matmuls are the branches of the layer switches: qkv, o, gate_up (or up), down,
    # where the unfused layout has 7 (or 6).
    weight_dots = [line for line in _dots(program(split)) if "/cond/branch_" in line]
    assert len(weight_dots) == stacked.config.num_layers * 4


def test_one_bf16_row_is_multiplied_as_in_a_batch(tiny):
    """XLA:CPU multiplies a single bfloat16 row far slower than two, so a one-row call multiplies
    it beside a zero row: no bfloat16 matmul of one row is compiled, and the row's logits equal
    those of the same row in a batch of two."""
    directory, _ = tiny("llama")
    model = load_model(directory, matmul_dtype=jnp.bfloat16)
    one, two = np.array([[5]]), np.array([[5], [9]])
    np.testing.assert_array_equal(np.asarray(model.forward(one))[0], np.asarray(model.forward(two))[0])
    text = jit_forward.lower(model.params, model.config, *_full(one)).compile().as_text()
    # The weight matmuls: the layer switches' branches and the head; f32[rows, out] results.
    if jax.default_backend() == "cpu":  # (other backends may rewrite a one-row product as they like)
        weight_dots = [line for line in _dots(text) if "/cond/branch_" in line or "d,vd->" in line]
        assert len(weight_dots) == model.config.num_layers * 4 + 1
        assert not [line for line in weight_dots if re.search(r"= f32\[1,", line)], weight_dots


def bf16_matmul_reference(reference, tokens: np.ndarray) -> np.ndarray:
    """transformers' float32 model with every matmul weight (Linear / Conv1D, the token embedding,
    the head) and every matmul input rounded to bfloat16: products of bfloat16 values are exact in
    float32, so this is a bfloat16 x bfloat16 -> float32 matmul up to the summation order."""
    import copy

    import torch

    model = copy.deepcopy(reference)
    rounded = lambda t: t.to(torch.bfloat16).to(torch.float32)
    matmuls = [m for m in model.modules() if type(m).__name__ in ("Linear", "Conv1D")]
    with torch.no_grad():
        for module in [*matmuls, model.get_input_embeddings(), model.get_output_embeddings()]:
            module.weight.copy_(rounded(module.weight))
    for module in matmuls:
        module.register_forward_pre_hook(lambda _, args: (rounded(args[0]), *args[1:]))
    return tc.torch_logits(model, tokens)


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gpt2"])
def test_bf16_matmuls_match_rounded_reference(arch, tiny):
    """with_matmul_dtype(bfloat16): bfloat16 products with float32 accumulation, activations and
    cache in float32. Equal to transformers with the weights and matmul inputs rounded to bfloat16
    (independent), visibly different from float32, and the compiled forward multiplies bfloat16
    operands: no float32 copy of a weight matrix."""
    directory, reference = tiny(arch)
    model = load_model(directory, matmul_dtype=jnp.bfloat16)
    assert model.matmul_dtype == jnp.bfloat16 and model.dtype == jnp.float32
    assert model.params["final_norm"]["scale"].dtype == jnp.float32
    tokens = np.random.default_rng(11).integers(0, tc.VOCAB, size=(ROWS, SEQ))
    got = np.asarray(model.forward(tokens))
    assert got.dtype == np.float32
    # A different summation order can move an activation across a bfloat16 rounding boundary
    # (one bfloat16 step is 2^-8 relative): rare larger differences, a mean ~100x below float32's.
    to_reference = np.abs(got - bf16_matmul_reference(reference, tokens))
    assert to_reference.mean() < 1e-4 and to_reference.max() < 5e-3, (to_reference.mean(), to_reference.max())
    assert np.abs(got - tc.torch_logits(reference, tokens)).mean() > 1e-3  # bfloat16 shows
    positions = jnp.broadcast_to(jnp.arange(SEQ), tokens.shape)
    text = jit_forward.lower(model.params, model.config, jnp.asarray(tokens), positions,
                             jnp.ones(tokens.shape, bool)).compile().as_text()
    weights = {tuple(w.shape) for w in jax.tree.leaves(model.params) if w.dtype == jnp.bfloat16}
    upcast = [line for line in text.splitlines() if re.search(r"= f32\[(\d+,)*\d+\]\S* convert\(", line)
              and tuple(int(d) for d in re.search(r"f32\[([\d,]+)\]", line)[1].split(",")) in weights]
    assert upcast == []
    prefix, last = model.prefill(tokens[0, :6].tolist())
    assert prefix.k.dtype == jnp.float32 and last.dtype == jnp.float32
    assert model.paged().init_pool(4).k.dtype == jnp.float32


def test_matmul_dtype_is_checked_before_loading(tmp_path):
    with pytest.raises(ValueError, match="matmul_dtype must be jnp.float32 or jnp.bfloat16"):
        load_model(tmp_path / "missing.gguf", matmul_dtype=jnp.int8)
    with pytest.raises(ValueError, match="dtype must be"):
        load_model(tmp_path / "missing.gguf", dtype="float16")


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_bf16_decode_loop_copies_no_weight_table(arch, tiny):
    """A bfloat16 embedding and head under float32 activations, read by decode steps ([rows, 1]
    tokens) in a loop: XLA:CPU must not make a whole-table copy outside the loop on every run
    of the program (a transposed head for the product, the table's bits for the gather)."""
    directory, _ = tiny(arch)
    model = load_model(directory, matmul_dtype=jnp.bfloat16)
    params, config = model.params, model.config
    head = params["embed"] if config.tie_embeddings else params["lm_head"]
    assert head.dtype == jnp.bfloat16

    def steps(params, tokens, n):
        def body(carry):
            i, total = carry
            rows = (tokens + i) % config.vocab_size
            logits = transformer.forward(params, config, rows, jnp.zeros(rows.shape, jnp.int32), jnp.ones(rows.shape, bool))
            return i + 1, total + logits[:, 0, :4].sum()

        return jax.lax.while_loop(lambda carry: carry[0] < n, body, (jnp.int32(0), jnp.float32(0)))[1]

    tokens = jnp.arange(ROWS * 8, dtype=jnp.int32).reshape(-1, 1)
    text = jax.jit(steps).lower(params, tokens, 3).compile().as_text()
    v, d = head.shape
    table = params["embed"].shape
    copies = [line.strip() for line in text.splitlines()
              if re.search(rf"= bf16\[{d},{v}\]\S* (copy|fusion)\(", line)  # the head transposed
              or re.search(rf"= u16\[{table[0]},{table[1]}\]\S* fusion\(", line)]  # the table's bits, materialized
    assert copies == []
