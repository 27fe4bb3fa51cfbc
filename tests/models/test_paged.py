"""Paged decoding equals the contiguous-cache decode (and hence the full forward pass)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from smc_jax.models import load_model
from smc_jax.models.paged import PagedTransformer

from tests.helpers.tiny_checkpoints import ARCHITECTURES


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_paged_decode_matches_full_forward(tiny, arch):
    """Rows with different histories stored in a shuffled pool: every step's logits equal a full
    forward pass over prompt + history + token."""
    path, _ = tiny(arch)
    model = load_model(path)
    paged = PagedTransformer(params=model.params, config=model.config)
    rng = np.random.default_rng(0)
    prompt = rng.integers(3, model.config.vocab_size, size=5).tolist()
    prefix, _ = model.prefill(prompt)
    rows, steps, slots = 3, 6, 8
    pool = paged.init_pool(32)
    free = list(rng.permutation(32))
    paths = np.zeros((rows, slots), np.int32)
    histories = [[] for _ in range(rows)]
    step = jax.jit(paged.step)
    sequences, got = [], []
    for t in range(steps):
        tokens = rng.integers(3, model.config.vocab_size, size=rows)
        active = np.array([True, t % 2 == 0, t < 3])  # rows of different lengths
        depth = np.array([len(h) for h in histories], np.int32)
        write = np.array([free.pop() if a else 32 for a in active], np.int32)
        logits, pool = step(prefix, pool, jnp.asarray(paths), jnp.asarray(depth), jnp.asarray(tokens, jnp.int32), jnp.asarray(write))
        for r in range(rows):
            sequences.append(prompt + histories[r] + [int(tokens[r])])
            got.append(np.asarray(logits[r]))
            if active[r]:
                paths[r, depth[r]] = write[r]
                histories[r].append(int(tokens[r]))
    # Reference: one full forward pass over every (prompt + history + token), right-padded
    # (padding is masked and leaves the valid logits unchanged: test_parity).
    width = max(len(seq) for seq in sequences)
    padded = np.zeros((len(sequences), width), np.int32)
    for i, seq in enumerate(sequences):
        padded[i, : len(seq)] = seq
    lengths = np.array([len(seq) for seq in sequences])
    full = np.asarray(model.forward(jnp.asarray(padded), mask=jnp.asarray(np.arange(width)[None] < lengths[:, None])))
    for i, n in enumerate(lengths):
        np.testing.assert_allclose(got[i], full[i, n - 1], atol=2e-5, rtol=1e-5)


def test_prompts_vmapped_read_the_pool_and_prompt_caches_in_place(tiny):
    """Several prompts (pools and prompt caches stacked on a leading axis, as the expert groups
    and batches of problems hold them): same logits as each prompt alone, and the step never
    copies a whole pool or all the prompt caches into layers-first order (that copy per call was
    the cost of scanning layers over them)."""
    path, _ = tiny(ARCHITECTURES[0])
    model = load_model(path)
    paged = PagedTransformer(params=model.params, config=model.config)
    prompts = [[5, 6, 7], [8, 9], [10]]  # 3 prompts: not the tiny model's 2 layers
    prefixes = jax.tree.map(lambda *x: jnp.stack(x), *[model.prefill(p)[0] for p in prompts])
    entries, rows, slots = 24, 3, 4
    k = len(prompts)
    keys = jax.random.split(jax.random.key(0), 2)
    pools = paged.init_pool(entries)
    pools = jax.tree.map(lambda x, key: jax.random.normal(key, (k,) + x.shape, x.dtype), pools, type(pools)(k=keys[0], v=keys[1]))
    paths = jnp.asarray(np.random.default_rng(1).integers(0, entries, size=(k, rows, slots)), jnp.int32)
    depth = jnp.asarray([[0, 2, 4], [1, 3, 4], [4, 0, 1]], jnp.int32)
    tokens = jnp.asarray([[3, 4, 5], [6, 7, 8], [9, 10, 11]], jnp.int32)
    write = jnp.asarray([[20, 21, 22], [20, 21, entries], [0, 1, 2]], jnp.int32)
    step = jax.jit(jax.vmap(paged.step))
    logits, new_pools = step(prefixes, pools, paths, depth, tokens, write)
    for i in range(k):
        one = jax.tree.map(lambda x: x[i], (prefixes, pools, paths, depth, tokens, write))
        want_logits, want_pool = jax.jit(paged.step)(*one)
        np.testing.assert_allclose(np.asarray(logits[i]), np.asarray(want_logits), atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(np.asarray(new_pools.k[i]), np.asarray(want_pool.k), atol=1e-6)
    layers, kv_heads, head_dim = model.config.num_layers, model.config.num_kv_heads, model.config.head_dim
    hlo = step.lower(prefixes, pools, paths, depth, tokens, write).compile().as_text()
    assert f"[{k},{layers},{entries},{kv_heads},{head_dim}]" in hlo
    assert f"[{layers},{k},{entries},{kv_heads},{head_dim}]" not in hlo
    width = prefixes.k.shape[2]
    assert f"[{k},{layers},{width},{kv_heads},{head_dim}]" in hlo
    assert f"[{layers},{k},{width},{kv_heads},{head_dim}]" not in hlo


@pytest.mark.parametrize("arch", ["llama", "gemma3", "phi3_longrope"])
def test_tree_rows_continue_rows_of_the_same_call(tiny, arch):
    """Tree attention: rows whose paths name entries written by other rows of the same call
    (a child of a child, two children of one row, next to a plain row) get the logits and
    keys/values of feeding the tokens one call at a time."""
    path, _ = tiny(arch)
    model = load_model(path)
    paged = PagedTransformer(params=model.params, config=model.config)
    prefix, _ = model.prefill([5, 6, 7])
    entries, slots = 16, 6
    step = jax.jit(paged.step, static_argnames="tree")
    pool = paged.init_pool(entries)
    # Stored history: entries 3 -> 9 (tokens 11, 12).
    for depth, entry, token in ((0, 3, 11), (1, 9, 12)):
        paths = jnp.asarray([[3, 0, 0, 0, 0, 0]], jnp.int32)
        _, pool = step(prefix, pool, paths, jnp.asarray([depth], jnp.int32), jnp.asarray([token], jnp.int32), jnp.asarray([entry], jnp.int32))
    base = [3, 9]
    # One call: row 0 = 13 after the history (entry 4), row 1 = 14 after row 0 (entry 5), row 2 =
    # 15 after row 1 (entry 6), row 3 = 16 after row 0 (entry 7), row 4 = 17 after the prompt.
    rows = [(base, 13, 4), (base + [4], 14, 5), (base + [4, 5], 15, 6), (base + [4], 16, 7), ([], 17, 8)]
    paths = np.zeros((len(rows), slots), np.int32)
    for i, (p, _, _) in enumerate(rows):
        paths[i, : len(p)] = p
    args = (jnp.asarray(paths), jnp.asarray([len(p) for p, _, _ in rows], jnp.int32),
            jnp.asarray([t for _, t, _ in rows], jnp.int32), jnp.asarray([w for _, _, w in rows], jnp.int32))
    logits, tree_pool = step(prefix, pool, *args, tree=True)
    # Reference: the same rows fed in dependency order, one call each.
    ref_pool = pool
    want = {}
    for i in (0, 4, 1, 3, 2):
        one = tuple(a[i : i + 1] for a in args)
        out, ref_pool = step(prefix, ref_pool, *one)
        want[i] = np.asarray(out[0])
    for i in range(len(rows)):
        np.testing.assert_allclose(np.asarray(logits[i]), want[i], atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(tree_pool.k), np.asarray(ref_pool.k), atol=2e-5)
    np.testing.assert_allclose(np.asarray(tree_pool.v), np.asarray(ref_pool.v), atol=2e-5)
    # Without tree attention, row 1 would read stale pool data at entry 4: the logits differ.
    stale, _ = step(prefix, pool, *args)
    assert not np.allclose(np.asarray(stale[1]), want[1], atol=1e-3)


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gemma2"])
@pytest.mark.parametrize("tree", [False, True])
def test_paths_cut_to_the_span_give_the_same_bits(tiny, arch, tree):
    """A span (the longest path of the call, or any bound above it) makes the step gather and
    attend over the narrowest `path_widths` that holds it: the logits and new keys/values are
    the same bits at every span, and here those of the whole paths (not guaranteed for every
    model: Gemma 3's differ within 1e-4, `docs/models.md`); the compiled step does read
    narrower paths."""
    from smc_jax.models.transformer import path_widths

    path, _ = tiny(arch)
    model = load_model(path)
    paged = PagedTransformer(params=model.params, config=model.config)
    prefix, _ = model.prefill([5, 6, 7])
    entries, rows, slots = 64, 5, 40
    assert path_widths(slots) == (8, 16, 32, 40)
    rng = np.random.default_rng(2)
    keys = jax.random.split(jax.random.key(3), 2)
    pool = paged.init_pool(entries)
    pool = type(pool)(k=jax.random.normal(keys[0], pool.k.shape, pool.k.dtype),
                      v=jax.random.normal(keys[1], pool.v.shape, pool.v.dtype))
    paths = jnp.asarray(rng.integers(0, entries, size=(rows, slots)), jnp.int32)
    depth = jnp.asarray([11, 0, 7, 11, 3], jnp.int32)
    tokens = jnp.asarray([3, 4, 5, 6, 7], jnp.int32)
    write = jnp.asarray([50, 51, 52, 53, entries], jnp.int32)
    if tree:  # row 3 continues row 0's token of this call
        paths = paths.at[3, 11].set(50)
        depth = depth.at[3].set(12)
    step = jax.jit(paged.step, static_argnames="tree")
    want_logits, want_pool = step(prefix, pool, paths, depth, tokens, write, tree=tree)
    for span in (12, 16, 17, 40, 1000):
        logits, new_pool = step(prefix, pool, paths, depth, tokens, write, tree=tree, span=jnp.int32(span))
        np.testing.assert_array_equal(np.asarray(logits), np.asarray(want_logits), err_msg=f"span {span}")
        np.testing.assert_array_equal(np.asarray(new_pool.k), np.asarray(want_pool.k), err_msg=f"span {span}")
        np.testing.assert_array_equal(np.asarray(new_pool.v), np.asarray(want_pool.v), err_msg=f"span {span}")
    # Without a span the paths are read whole; with one, every width has its own gather.
    kv = f"{model.config.num_kv_heads},{model.config.head_dim}]"
    whole = step.lower(prefix, pool, paths, depth, tokens, write, tree=tree).as_text()
    cut = step.lower(prefix, pool, paths, depth, tokens, write, tree=tree, span=jnp.int32(12)).as_text()
    assert f"{rows}x8x{kv.replace(',', 'x').rstrip(']')}" not in whole.replace(",", "x")
    for width in (8, 16, 32, 40):
        assert f"{rows}x{width}x{kv.replace(',', 'x').rstrip(']')}" in cut.replace(",", "x"), width


def test_token_smc_with_cut_paths_is_the_same_run(tiny):
    """A whole token-SMC run over a tiny transformer (paths of 20 slots: widths 8, 16, 20, all
    used as the particles grow) gives the same samples, weights and log Z-hat, bit for bit, as
    the run that reads every path whole (`PagedTransformer.cut_paths`)."""
    from smc_jax.smc.ensemble import make_ensemble
    from smc_jax.experts.token import TokenExperts
    from smc_jax.smc import SMC

    path, _ = tiny("llama")
    model = load_model(path)
    prefixes, logits = zip(*[model.prefill(p) for p in ([5, 6, 7], [8, 9])])
    smc = SMC(num_particles=6, max_length=20, ess_threshold=0.7, at_max_length="truncate")

    def run(cut_paths):
        paged = PagedTransformer(params=model.params, config=model.config, cut_paths=cut_paths)
        assert paged.cuts_paths == cut_paths
        experts = TokenExperts(model=paged, prefixes=jax.tree.map(lambda *x: jnp.stack(x), *prefixes),
                               prompt_logits=jnp.stack(logits), eos_ids=(model.config.vocab_size - 1,), max_tokens=20)
        result = smc(jax.random.key(4), experts, make_ensemble("product", 2))
        return [list(map(list, result.sequences)), np.asarray(result.log_weights), np.asarray(result.log_Z)]

    cut = run(True)
    assert max(len(s) for s in cut[0]) > 16  # the run reached the last width
    whole = run(False)
    assert cut[0] == whole[0]
    np.testing.assert_array_equal(cut[1], whole[1])
    np.testing.assert_array_equal(cut[2], whole[2])


def test_a_settings_sweep_on_a_tiny_model_compiles_nothing_new(tiny):
    """Token SMC over a tiny transformer: after the first run, new seeds, f (tau), weights, ESS
    thresholds (importance sampling included), temperatures and progress reports reuse the same
    programs; the temperature is applied all the same."""
    from smc_jax.experts.token import TokenExperts, token_logprobs
    from smc_jax.smc import SMC
    from smc_jax.smc.ensemble import make_ensemble
    from smc_jax.utils.compilation import count_compilations

    path, _ = tiny("llama")
    model = load_model(path)
    prefixes, logits = zip(*[model.prefill(p) for p in ([5, 6, 7], [8, 9])])
    experts = TokenExperts(model=model.paged(), prefixes=jax.tree.map(lambda *x: jnp.stack(x), *prefixes),
                           prompt_logits=jnp.stack(logits), eos_ids=(model.config.vocab_size - 1,), max_tokens=8)
    SMC(num_particles=6, max_length=8)(jax.random.key(0), experts, make_ensemble("product", 2))
    sweep = [(1, "min", None, 0.9, False, 1.0, 8), (2, 2.5, [0.2, 0.8], 0.9, False, 1.0, 8),
             (3, "product", None, 0.5, False, 1.0, 8), (4, "mixture", [0.7, 0.3], 0.0, False, 1.0, 8),
             (5, "product", None, 0.9, True, 1.0, 8), (6, "product", None, 0.9, False, 0.6, 8),
             (7, "min", None, 0.5, False, 1.7, 8), (8, "product", None, 0.9, False, 1.0, 5)]
    with count_compilations() as compiled:
        for seed, f, weights, threshold, progress, temperature, max_length in sweep:
            smc = SMC(num_particles=6, max_length=max_length, ess_threshold=threshold, progress=progress)
            result = smc(jax.random.key(seed), experts.replace(temperature=np.float32(temperature)),
                         make_ensemble(f, 2, weights))
            assert result.symbols.shape == (6, max_length) and result.lengths.max() <= max_length
    assert compiled.count == 0  # max_length 5 shares the arrays' width (16) with 8
    cooled = experts.replace(temperature=np.float32(0.6))
    want = token_logprobs(jnp.stack(logits), experts.eos_ids, 0.6)
    np.testing.assert_allclose(cooled.logprobs(cooled.init(3))[0], want, rtol=1e-6, atol=1e-6)
    assert not np.allclose(experts.logprobs(experts.init(3))[0], want)
