"""The decoder-only transformer as pure functions over a params pytree (see `params.py`).

One layer, for every family (`config` switches the optional parts):

    h = x + PostNorm_a(Attn(Norm_a(x)))          PostNorm only when config.post_norms (Gemma,
    y = h + PostNorm_m(MLP(Norm_m(h)))           OLMo 2); Norm only when config.pre_norms (not OLMo 2)

Attention for query i at absolute position p_i over keys j at positions p_j:

    softmax_j( cap(scale * q_i . k_j) + mask_ij ) v_j,   visible iff valid_j and p_j <= p_i and
                                                      (layer is global or p_i - p_j < window)

with cap(s) = c tanh(s / c) when config.attn_softcap = c (Gemma 2), else cap(s) = s. q and k are
optionally RMS-normed first (config.qk_norm: per head, or over the whole projection for OLMo 2),
then rotated (RoPE; cos and sin times the scaling's attention factor, see `config.RopeConfig`).

The layers are stacked and run with `jax.lax.scan`; per-layer RoPE frequencies, query scales and
sliding/global flags are arrays scanned alongside the weights, so one layer body is compiled.
Params whose "layers" entry is a tuple of per-layer dicts (`params.unstack_layers`) run the same
scan over the layer index, each matmul switching to its layer's own buffer: no per-layer weight
copies, faster steps on CPU (see `decoder`); there q/k/v and gate/up are one kernel each
(`params.FUSED`), whose output slices are the parts' outputs.

Three entry points share that body; they differ only in where the keys come from:
  * `forward`: a batch of sequences attends to itself (no cache).
  * `prefill`: one prompt; returns its keys/values as a `PrefixCache`.
  * `extend` (and `decode` = extend with one token): R rows continue ONE shared prompt; row r
    attends to the prompt cache, to its own continuation cache, and causally to its new tokens.

Logits are float32 whatever the params dtype (the head matmul accumulates in float32), and the
attention softmax runs in float32. Every matmul runs in its weights' dtype with float32
accumulation; activations keep the norms' dtype (`params.activation_dtype`), so bfloat16 matmul
weights under float32 activations (`params.cast_matmuls`) halve the bytes a call reads.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from smc_jax.models.cache import PrefixCache
from smc_jax.models.config import ModelConfig
from smc_jax.models.params import Params, activation_dtype, is_split

F32 = jnp.float32
# Score of a masked key. Finite, so a query with no visible key (a padding query) gets a uniform,
# harmless distribution instead of NaN; `where` (not addition) keeps it from overflowing.
MASK_VALUE = float(jnp.finfo(F32).min)


class Keys(NamedTuple):
    """One block of keys/values a query may attend to.

    Either shared by all rows (k: [S, kv_heads, hd], pos: [S], valid: [S], or [R, S] when rows
    see different keys of it: a tree of rows) or per row (k: [R, S, kv_heads, hd], pos/valid:
    [R, S]).
    """

    k: Float[Array, "*rows keys kv_heads head_dim"]
    v: Float[Array, "*rows keys kv_heads head_dim"]
    pos: Int[Array, "*rows keys"]
    valid: Bool[Array, "*rows keys"]

    @property
    def shared(self) -> bool:
        return self.k.ndim == 3


class PagedKeys(NamedTuple):
    """Per-row keys read from a paged pool: row r's slot s is entry paths[r, s] of the pool's
    layer `layer` (k, v: [layers, entries, kv_heads, head_dim]), at pos[r, s], visible where
    valid[r, s].

    `span` (an unbatched scalar, or None) bounds every row's valid slots: slots >= span are
    invalid. The attention then gathers and multiplies only the narrowest of `path_widths`
    holding `span` slots (a switch), not all of them: paths are sized for the longest
    continuation, and most rows of a call are far shorter.
    """

    k: Float[Array, "layers entries kv_heads head_dim"]
    v: Float[Array, "layers entries kv_heads head_dim"]
    layer: Int[Array, ""]
    paths: Int[Array, "rows slots"]
    pos: Int[Array, "rows slots"]
    valid: Bool[Array, "rows slots"]
    span: Int[Array, ""] | None = None

    @property
    def size(self) -> int:
        return self.paths.shape[1]

    def first(self, width: int) -> Keys:
        """The block's first `width` slots, gathered from the pool."""
        paths = self.paths[:, :width]
        return Keys(self.k[self.layer, paths], self.v[self.layer, paths], self.pos[:, :width], self.valid[:, :width])


#: The narrowest path width a paged attention block is cut to (see `path_widths`).
MIN_PATH_WIDTH = 8


def path_widths(slots: int) -> tuple[int, ...]:
    """The widths a paged block of `slots` slots may be cut to: MIN_PATH_WIDTH doubled while
    below `slots`, then `slots` (each width compiles its own attention, so there are few)."""
    widths, width = [], MIN_PATH_WIDTH
    while width < slots:
        widths.append(width)
        width *= 2
    return (*widths, slots)


def _norm(x: Float[Array, "... d"], p: dict[str, Array], config: ModelConfig) -> Float[Array, "... d"]:
    """RMSNorm: x / rms(x) * (offset + w); LayerNorm: (x - mean) / std * w + b. In float32."""
    xf = x.astype(F32)
    if config.norm == "rms":
        y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + config.norm_eps)
        y = y * (config.norm_offset + p["scale"].astype(F32))
    else:
        centered = xf - jnp.mean(xf, axis=-1, keepdims=True)
        var = jnp.mean(centered * centered, axis=-1, keepdims=True)
        y = centered * jax.lax.rsqrt(var + config.norm_eps) * p["scale"].astype(F32)
        y = y + p["bias"].astype(F32)
    return y.astype(x.dtype)


_ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    "silu": jax.nn.silu,
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
}


class _PerLayer(NamedTuple):
    """One weight matrix of every layer, as separate buffers, and the running layer's index."""

    kernels: tuple[Array, ...]
    index: Int[Array, ""]


def _matmul(spec: str, x: Array, w: Array, out: Any = None) -> Array:
    """einsum(spec, x, w) in w's dtype with float32 accumulation, returned in `out` (None: x's
    dtype). With bfloat16 weights under float32 activations (`params.cast_matmuls`) the inputs are
    rounded to bfloat16 for the product only: XLA:CPU multiplies two bfloat16 operands natively,
    where a float32 x bfloat16 product first converts the whole weight matrix."""
    product = lambda x: jnp.einsum(spec, x.astype(w.dtype), w, preferred_element_type=F32)
    rows = math.prod(x.shape[:-1])
    a, b = spec.split("->")[0].split(",")
    cpu_bf16 = w.dtype == jnp.bfloat16 and jax.default_backend() == "cpu"
    if cpu_bf16 and CPU_HAS_AMX_BF16 and rows >= WEIGHTS_LEFT_MIN_ROWS and b[1] == a[-1] and spec.endswith(a[:-1] + b[0]):
        y = _weights_left(x, w)
    elif cpu_bf16 and rows == 1:
        # XLA:CPU turns a one-row bfloat16 matmul into a multiply-and-sum, several times slower
        # than a two-row matmul (a plain SmolLM2 sample: 2.1 s against 1.1 s): multiply the row
        # beside a zero row, as it would be multiplied in any batch of two.
        y = jax.vmap(product)(jnp.stack([x, jnp.zeros_like(x)]))[0]
    else:
        y = product(x)
    return y.astype(x.dtype if out is None else out)


def _cpu_has_amx_bf16() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return "amx_bf16" in f.read().split()
    except OSError:
        return False


#: `_weights_left` is used where it was measured to give the same bits, faster: bfloat16 weights
#: on an XLA:CPU with AMX (YNNPACK's AMX kernel either way) and at least 3 rows (1-2 rows take
#: another kernel in the [rows, in] x [out, in] form; `tests/models/test_matmul.py`).
CPU_HAS_AMX_BF16 = _cpu_has_amx_bf16()
WEIGHTS_LEFT_MIN_ROWS = 3


def _weights_left(x: Array, w: Array) -> Array:
    """x [..., in] @ w [out, in]^T computed as w @ x^T (bfloat16 on XLA:CPU).

    XLA:CPU's YNNPACK copies a dot's right operand into its kernel's tile layout on every call.
    With the weights on the right that copy is most of a small-batch matmul's time
    (measured on SmolLM2's layers at 1-40 rows); with them on the left only the rows are copied. The
    barrier keeps XLA from folding the transpose back into the dot (which swaps the operands
    again)."""
    lead = x.shape[:-1]
    rows = x.reshape(-1, x.shape[-1]).astype(w.dtype)
    transposed = jnp.einsum("oi,ni->on", w, rows, preferred_element_type=F32)
    return jax.lax.optimization_barrier(transposed).T.reshape(*lead, w.shape[0])


def _dense(x: Array, p: dict[str, Array], spec: str) -> Array:
    kernel = p["kernel"]
    if isinstance(kernel, _PerLayer):
        # A switch over the layers: each branch multiplies by its layer's own buffer, which XLA
        # reads in place; a dynamic slice of a stacked array is first copied (on CPU).
        branches = [lambda x, w=w: _matmul(spec, x, w) for w in kernel.kernels]
        y = jax.lax.switch(kernel.index, branches, x)
    else:
        y = _matmul(spec, x, kernel)
    return y + p["bias"] if "bias" in p else y


def _rope(
    x: Float[Array, "rows tokens heads head_dim"],
    positions: Int[Array, "rows tokens"],
    inv_freq: Float[Array, "*rows half_rotary"],
    attention_factor: Float[Array, ""] | float = 1.0,
) -> Float[Array, "rows tokens heads head_dim"]:
    """Rotate pairs (i, i + r/2) of the first r dims by angle position * inv_freq[i]; cos and sin
    are multiplied by `attention_factor` (YaRN / LongRoPE), so the rotated dims scale by it.
    `inv_freq` is shared, or per row ([R, r/2], LongRoPE)."""
    rotary = 2 * inv_freq.shape[-1]
    freqs = inv_freq[:, None, :] if inv_freq.ndim == 2 else inv_freq
    angles = positions[..., None].astype(F32) * freqs  # [R, T, r/2]
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
    cos, sin = jnp.cos(angles) * attention_factor, jnp.sin(angles) * attention_factor
    xr, rest = x[..., :rotary].astype(F32), x[..., rotary:]
    half = rotary // 2
    rotated = jnp.concatenate([-xr[..., half:], xr[..., :half]], axis=-1)
    out = (xr * cos + rotated * sin).astype(x.dtype)
    return jnp.concatenate([out, rest], axis=-1) if rest.shape[-1] else out


def _attend(
    q: Float[Array, "rows tokens heads head_dim"],
    q_pos: Int[Array, "rows tokens"],
    blocks: Sequence[Keys | PagedKeys],
    scale: Float[Array, ""],
    sliding: Bool[Array, ""],
    config: ModelConfig,
) -> Float[Array, "rows tokens heads head_dim"]:
    """Softmax attention of every query over the concatenation of the key blocks.

    Grouped-query: head h uses kv head h // (heads / kv_heads). A shared block is read once for
    all rows (an einsum without a row axis on the keys), never copied per row. A paged block
    (at most one) goes last and is read at the width its span needs (a switch over
    `path_widths`): cutting it then only drops trailing keys, all masked, so the softmax sums
    the same keys in the same order and every width gives the same bits
    (`tests/models/test_paged.py`).
    """
    paged = [block for block in blocks if isinstance(block, PagedKeys)]
    if not paged:
        return _attend_keys(q, q_pos, blocks, scale, sliding, config)
    (block,) = paged
    others = [b for b in blocks if not isinstance(b, PagedKeys)]
    at = lambda w: _attend_keys(q, q_pos, [*others, block.first(w)], scale, sliding, config)
    widths = path_widths(block.size)
    if block.span is None or len(widths) == 1:
        return at(block.size)
    index = jnp.minimum(jnp.searchsorted(jnp.asarray(widths), block.span, side="left"), len(widths) - 1)
    return jax.lax.switch(index, [lambda w=w: at(w) for w in widths])


def _attend_keys(
    q: Float[Array, "rows tokens heads head_dim"],
    q_pos: Int[Array, "rows tokens"],
    blocks: Sequence[Keys],
    scale: Float[Array, ""],
    sliding: Bool[Array, ""],
    config: ModelConfig,
) -> Float[Array, "rows tokens heads head_dim"]:
    """`_attend` over key blocks in memory."""
    rows, tokens, heads, hd = q.shape
    kv_heads = config.num_kv_heads
    qg = q.reshape(rows, tokens, kv_heads, heads // kv_heads, hd)
    qp = q_pos[:, :, None]
    scores, visible = [], []
    for block in blocks:
        spec = "rtkgd,skd->rtkgs" if block.shared else "rtkgd,rskd->rtkgs"
        scores.append(jnp.einsum(spec, qg, block.k, preferred_element_type=F32))
        kp = block.pos[None, None, :] if block.shared else block.pos[:, None, :]
        ok = block.valid[None, None, :] if block.valid.ndim == 1 else block.valid[:, None, :]
        ok = ok & (kp <= qp)
        if config.uses_sliding_window:
            ok = ok & (~sliding | (qp - kp < config.sliding_window))
        visible.append(jnp.broadcast_to(ok, (rows, tokens, block.k.shape[-3])))
    for i, (s, ok) in enumerate(zip(scores, visible)):
        s = s * scale
        if config.attn_softcap is not None:
            s = jnp.tanh(s / config.attn_softcap) * config.attn_softcap
        scores[i] = jnp.where(ok[:, :, None, None, :], s, MASK_VALUE)
    # Softmax over all blocks, each block's terms summed by `_pairwise_sum`: keys appended
    # after a block's last visible one (zero terms) then leave every sum's bits unchanged.
    top = functools.reduce(jnp.maximum, [jnp.max(s, axis=-1, keepdims=True) for s in scores])
    terms = [jnp.exp(s - top) for s in scores]
    total = functools.reduce(jnp.add, [_pairwise_sum(t) for t in terms])
    out = jnp.zeros(qg.shape, F32)
    for block, t in zip(blocks, terms):
        p = (t / total).astype(block.v.dtype)
        spec = "rtkgs,skd->rtkgd" if block.shared else "rtkgs,rskd->rtkgd"
        out = out + jnp.einsum(spec, p, block.v, preferred_element_type=F32)
    return out.reshape(rows, tokens, heads, hd).astype(q.dtype)


def _pairwise_sum(x: Float[Array, "... n"]) -> Float[Array, "... 1"]:
    """Sum over the last axis by a fixed pairwise tree over its length padded to a power of
    two: x[:h] + x[h:] until one term is left. Unlike XLA's reduce, whose order depends on the
    length, the sum of x and of x followed by zeros are the same bits."""
    n = x.shape[-1]
    width = 1 << max(n - 1, 0).bit_length()
    x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, width - n)])
    while width > 1:
        width //= 2
        x = x[..., :width] + x[..., width:]
    return x


def _mlp(x: Float[Array, "rows tokens d"], lp: Params, config: ModelConfig) -> Float[Array, "rows tokens d"]:
    act = _ACTIVATIONS[config.activation]
    if "gate_up" in lp:  # fused (`params.FUSED`)
        gate, up = jnp.split(_dense(x, lp["gate_up"], "rtd,fd->rtf"), 2, axis=-1)
        hidden = act(gate) * up
    else:
        up = _dense(x, lp["up"], "rtd,fd->rtf")
        hidden = act(_dense(x, lp["gate"], "rtd,fd->rtf")) * up if config.mlp == "gated" else act(up)
    return _dense(hidden, lp["down"], "rtf,df->rtd")


class _LayerMeta(NamedTuple):
    """Per-layer constants scanned alongside the weights."""

    inv_freq: Float[Array, "layers half_rotary"]
    inv_freq_long: Float[Array, "layers half_rotary"]
    long_from: Int[Array, " layers"]
    rope_factor: Float[Array, " layers"]
    scale: Float[Array, " layers"]
    sliding: Bool[Array, " layers"]


def _layer_meta(config: ModelConfig) -> _LayerMeta:
    return _LayerMeta(
        inv_freq=jnp.asarray(config.layer_inv_freq()),
        inv_freq_long=jnp.asarray(config.layer_inv_freq_long()),
        long_from=jnp.asarray(config.layer_long_from()),
        rope_factor=jnp.asarray(config.layer_rope_attention_factor()),
        scale=jnp.asarray(config.layer_query_scale()),
        sliding=jnp.asarray(config.sliding_layers, bool),
    )


def _qk_norm(x: Array, p: dict[str, Array], config: ModelConfig) -> Array:
    """RMSNorm of each head's vector (Qwen 3, Gemma 3) or of all heads' at once (OLMo 2)."""
    if config.qk_norm_per_head:
        return _norm(x, p, config)
    return _norm(x.reshape(*x.shape[:2], -1), p, config).reshape(x.shape)


ContextFn = Callable[[Array], list[Keys | PagedKeys]]
"""Builds a layer's cached key blocks from the layer's index."""


def decoder(
    params: Params,
    config: ModelConfig,
    x: Float[Array, "rows tokens d"],
    q_pos: Int[Array, "rows tokens"],
    q_valid: Bool[Array, "rows tokens"],
    context: ContextFn = lambda _: [],
    tree: Bool[Array, "rows rows"] | None = None,
) -> tuple[Float[Array, "rows tokens d"], tuple[Array, Array]]:
    """Run all layers; returns the final hidden states and every layer's new k, v.

    `context` turns a layer's index into the key blocks that precede the new tokens (read from
    the caches by index, never scanned over: a cache with a leading prompt or problem axis, as
    `jax.vmap` makes it, would first be transposed to layers-first, a copy of all of it per
    call; for 21 prompts of 512 columns SmolLM2's paged forward of 168 rows took 0.55-0.61 s
    against 0.38-0.47 s). With `tree` (one new token per row), row r attends to the new token of
    every row j with tree[r, j] (its ancestors in this call, and itself) instead of only its
    own: tree attention.
    """

    if config.rope_switches_to_long:
        # LongRoPE as transformers runs it: a call whose largest position reaches the original
        # context uses the long factors for all its tokens, else the short ones; cached keys keep
        # the factors of the call that computed them. Decided per row (transformers: per batch,
        # the same for one sequence), so a row's logits never depend on the other rows.
        call_len = jnp.max(jnp.where(q_valid, q_pos, -1), axis=1) + 1  # [R]

    def layer(x: Array, xs: tuple[Params, _LayerMeta, Array]) -> tuple[Array, tuple[Array, Array]]:
        lp, meta, index = xs
        h = _norm(x, lp["attn_norm"], config) if config.pre_norms else x
        heads = (*x.shape[:2], -1, config.head_dim)
        if "qkv" in lp:  # fused (`params.FUSED`): one matmul, sliced
            q_rows, kv_rows = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
            qkv = _dense(h, lp["qkv"], "rtd,nd->rtn")
            q, k, v = (y.reshape(heads) for y in jnp.split(qkv, [q_rows, q_rows + kv_rows], axis=-1))
        else:
            q = _dense(h, lp["q"], "rtd,nd->rtn").reshape(heads)
            k = _dense(h, lp["k"], "rtd,nd->rtn").reshape(heads)
            v = _dense(h, lp["v"], "rtd,nd->rtn").reshape(heads)
        if config.qk_norm:
            q, k = _qk_norm(q, lp["q_norm"], config), _qk_norm(k, lp["k_norm"], config)
        if config.rope is not None:
            inv_freq = meta.inv_freq
            if config.rope_switches_to_long:
                inv_freq = jnp.where((call_len > meta.long_from)[:, None], meta.inv_freq_long, inv_freq)
            q = _rope(q, q_pos, inv_freq, meta.rope_factor)
            k = _rope(k, q_pos, inv_freq, meta.rope_factor)
        new = Keys(k, v, q_pos, q_valid) if tree is None else Keys(k[:, 0], v[:, 0], q_pos[:, 0], tree & q_valid[:, 0][None])
        blocks = [*context(index), new]
        attn = _attend(q, q_pos, blocks, meta.scale, meta.sliding, config)
        out = _dense(attn.reshape(*x.shape[:2], -1), lp["o"], "rtn,dn->rtd")
        if config.post_norms:
            out = _norm(out, lp["post_attn_norm"], config)
        x = x + out
        out = _mlp(_norm(x, lp["mlp_norm"], config) if config.pre_norms else x, lp, config)
        if config.post_norms:
            out = _norm(out, lp["post_mlp_norm"], config)
        return x + out, (k, v)

    layers, meta = params["layers"], _layer_meta(config)
    indices = jnp.arange(config.num_layers, dtype=jnp.int32)
    if not is_split(params):
        return jax.lax.scan(layer, x, (layers, meta, indices))
    # Per-layer buffers (`params.unstack_layers`): the same scan, over the layer index; each matmul
    # switches to its layer's own kernel (`_PerLayer`), which XLA reads in place, where a layer's
    # slice of a stacked kernel is first copied on CPU (the forward is 14-18% faster there).
    is_kernel, columns, treedef = _leaf_columns(layers)
    small = [jnp.stack(column) for column, kernel in zip(columns, is_kernel) if not kernel]

    def switched(x: Array, xs: tuple[list[Array], _LayerMeta, Array]) -> tuple[Array, tuple[Array, Array]]:
        small_leaves, meta, index = xs
        rest = iter(small_leaves)
        leaves = [_PerLayer(column, index) if kernel else next(rest) for column, kernel in zip(columns, is_kernel)]
        return layer(x, (jax.tree_util.tree_unflatten(treedef, leaves), meta, index))

    return jax.lax.scan(switched, x, (small, meta, indices))


def _leaf_columns(layers: tuple[Params, ...]) -> tuple[list[bool], list[tuple[Array, ...]], Any]:
    """Per-layer params -> (is each leaf a kernel, each leaf across the layers, the layer treedef)."""
    paths, treedef = jax.tree_util.tree_flatten_with_path(layers[0])
    is_kernel = [path[-1].key == "kernel" for path, _ in paths]
    columns = list(zip(*(jax.tree_util.tree_leaves(lp) for lp in layers)))
    return is_kernel, columns, treedef


def embed(
    params: Params, config: ModelConfig, tokens: Int[Array, "rows tokens"], positions: Int[Array, "rows tokens"]
) -> Float[Array, "rows tokens d"]:
    dtype = activation_dtype(params)
    table = params["embed"]
    if table.dtype == dtype:
        rows = table[tokens]
    else:
        # Gather the bits: XLA:CPU would convert the whole table first. In a loop it would also
        # hoist the bits' view of the table out of it, a copy on every run of the program
        # (SmolLM2's 56 MB: 24 ms); the barrier ties the table to the tokens, so nothing is.
        table, tokens = jax.lax.optimization_barrier((table, tokens))
        bits = jnp.dtype(f"uint{8 * table.dtype.itemsize}")
        rows = jax.lax.bitcast_convert_type(jax.lax.bitcast_convert_type(table, bits)[tokens], table.dtype)
    x = rows.astype(dtype) * jnp.asarray(config.embed_scale, dtype)
    if config.learned_positions:
        x = x + params["pos_embed"][positions]
    return x


def output_logits(params: Params, config: ModelConfig, h: Float[Array, "*batch d"]) -> Float[Array, "*batch vocab"]:
    """Final norm, then h @ head.T accumulated in float32 (optionally soft-capped)."""
    h = _norm(h, params["final_norm"], config)
    head = params["embed"] if config.tie_embeddings else params["lm_head"]
    # Rows flattened to one axis: with a unit axis among them (a decode step's [rows, 1, d]),
    # XLA:CPU copies a bfloat16 head transposed on every run of the program (SmolLM2's, 56 MB:
    # 40 ms); the product is the same, bit for bit.
    rows = h.reshape(-1, h.shape[-1])
    logits = _matmul("rd,vd->rv", rows, head, out=F32).reshape(*h.shape[:-1], head.shape[0])
    if config.final_softcap is not None:
        logits = jnp.tanh(logits / config.final_softcap) * config.final_softcap
    return logits


def forward(
    params: Params,
    config: ModelConfig,
    tokens: Int[Array, "batch tokens"],
    positions: Int[Array, "batch tokens"],
    mask: Bool[Array, "batch tokens"],
) -> Float[Array, "batch tokens vocab"]:
    """Full causal forward pass, no cache. Key j is visible to query i iff mask[j] and
    positions[j] <= positions[i] (within the window on sliding layers), so left or right padding
    with mask False leaves the other tokens' logits unchanged; padded rows' logits are garbage."""
    x = embed(params, config, tokens, positions)
    h, _ = decoder(params, config, x, positions, mask)
    return output_logits(params, config, h)


def prefill(
    params: Params, config: ModelConfig, tokens: Int[Array, " padded"], length: Int[Array, ""]
) -> tuple[PrefixCache, Float[Array, " vocab"]]:
    """Run one prompt, right-padded to a bucket size; return its cache and the next-token logits.

    Padding meets the cache here: tokens[length:] are padding. They are still computed (shapes are
    static) and their keys/values land in the cache at slots length..T_pad-1, but every reader
    masks them out: `extend` treats prefix slot j as a key only if j < prefix.length. Padding
    never changes valid outputs either: it sits at later positions, and attention is causal. The
    logits returned are those at position length - 1, i.e. the distribution of the first new token.
    """
    padded = tokens.shape[0]
    positions = jnp.arange(padded, dtype=jnp.int32)[None]
    x = embed(params, config, tokens[None], positions)
    h, (k, v) = decoder(params, config, x, positions, positions < length)
    last = jax.lax.dynamic_index_in_dim(h[0], length - 1, keepdims=False)
    cache = PrefixCache(k=k[:, 0], v=v[:, 0], length=jnp.asarray(length, jnp.int32))
    return cache, output_logits(params, config, last)


def prefill_read(
    params: Params, config: ModelConfig, tokens: Int[Array, " padded"], length: Int[Array, ""], read: int
) -> tuple[PrefixCache, Float[Array, " vocab"]]:
    """`prefill` of the first `read` tokens only (static; at least `length`), its cache widened
    with zero slots to the padded size: the work grows with the prompt, not its bucket, in one
    pass (the weights are read once, as a pass over the bucket does). The cache and logits are
    `prefill`'s up to float rounding (other matmul shapes); slots from `read` on stay zero
    (masked by the length, as padding is)."""
    padded = tokens.shape[0]
    if read >= padded or config.rope_switches_to_long:  # LongRoPE picks its factors per call
        return prefill(params, config, tokens, length)
    cache, logits = prefill(params, config, tokens[:read], length)
    widen = lambda x: jnp.pad(x, [(0, 0), (0, padded - read)] + [(0, 0)] * (x.ndim - 2))
    return PrefixCache(k=widen(cache.k), v=widen(cache.v), length=cache.length), logits


def extend(
    params: Params,
    config: ModelConfig,
    prefix: PrefixCache,
    suffix_k: Float[Array, "layers rows suffix kv_heads head_dim"],
    suffix_v: Float[Array, "layers rows suffix kv_heads head_dim"],
    suffix_len: Int[Array, " rows"],
    tokens: Int[Array, "rows new"],
) -> tuple[
    Float[Array, "rows new vocab"],
    Float[Array, "layers rows new kv_heads head_dim"],
    Float[Array, "layers rows new kv_heads head_dim"],
]:
    """Feed T new tokens to each of R rows that continue one shared prompt.

    Row r's new token t sits at absolute position prefix.length + suffix_len[r] + t and attends to

      * prompt slots [0, prefix.length)          (one shared block: read once for all rows),
      * its continuation slots [0, suffix_len[r]) at positions prefix.length + s,
      * its new tokens 0..t (causal).

    Padding meets the cache in two places. The prompt cache is right-padded to a bucket size:
    slots >= prefix.length hold keys of padding tokens and are masked. Each row's continuation
    cache is a fixed-size buffer of which only the first suffix_len[r] slots are written; the rest
    is stale (zeros, or keys of a row that was resampled away) and is masked, and its positions are
    computed as if it followed the valid part, so masking it is all that is needed. Because the
    continuation starts right after prefix.length (not after the padded prompt), RoPE positions
    match an unpadded run exactly, and sliding-window layers measure distances across the prompt
    and continuation alike.

    Nothing is written: the new keys/values [layers, R, T, kv_heads, head_dim] are returned for the
    caller to store (contiguous `KVCache.append`, or a paged pool). Rows whose last new tokens are
    padding simply ignore those outputs; earlier tokens never see later ones.
    """
    rows, new = tokens.shape
    prompt_slots = prefix.k.shape[1]
    suffix_slots = suffix_k.shape[2]
    start = prefix.length + suffix_len  # [R] position of each row's first new token
    q_pos = (start[:, None] + jnp.arange(new)[None]).astype(jnp.int32)
    prompt_pos = jnp.arange(prompt_slots, dtype=jnp.int32)
    suffix_slot = jnp.arange(suffix_slots, dtype=jnp.int32)[None]
    suffix_pos = jnp.broadcast_to(prefix.length + suffix_slot, (rows, suffix_slots))

    def context(layer: Array) -> list[Keys]:
        return [
            Keys(prefix.k[layer], prefix.v[layer], prompt_pos, prompt_pos < prefix.length),
            Keys(suffix_k[layer], suffix_v[layer], suffix_pos, suffix_slot < suffix_len[:, None]),
        ]

    x = embed(params, config, tokens, q_pos)
    h, (k, v) = decoder(params, config, x, q_pos, jnp.ones((rows, new), bool), context)
    return output_logits(params, config, h), k, v


def decode(
    params: Params,
    config: ModelConfig,
    prefix: PrefixCache,
    suffix_k: Float[Array, "layers rows suffix kv_heads head_dim"],
    suffix_v: Float[Array, "layers rows suffix kv_heads head_dim"],
    suffix_len: Int[Array, " rows"],
    tokens: Int[Array, " rows"],
) -> tuple[
    Float[Array, "rows vocab"],
    Float[Array, "layers rows kv_heads head_dim"],
    Float[Array, "layers rows kv_heads head_dim"],
]:
    """`extend` with one new token per row: logits [R, V] and new k, v [layers, R, kv_heads, hd]."""
    logits, k, v = extend(params, config, prefix, suffix_k, suffix_v, suffix_len, tokens[:, None])
    return logits[:, 0], k[:, :, 0], v[:, :, 0]


def log_softmax(logits: Float[Array, "... vocab"]) -> Float[Array, "... vocab"]:
    """Next-token log-probabilities in float32."""
    return jax.nn.log_softmax(logits.astype(F32), axis=-1)
