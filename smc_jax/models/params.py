"""The params pytree: which arrays a model has and their shapes.

Params are nested dicts of arrays. Per-layer weights are stacked with a leading layer axis under
"layers" so the model can `jax.lax.scan` over them. Every kernel is a 2-D [out, in] matrix
(y = x W^T, the layout of HF nn.Linear and GGUF; heads are split on the activations, not the
weights): then a layer's slice of a stacked kernel feeds the matmul directly, where a reshaped
slice would make XLA on CPU copy each layer's weights per call. [out, in] rather than [in, out]
because XLA:CPU's matmul of a few rows reads it faster: each output is a dot of two contiguous
vectors (SmolLM2's scanned forward, paired: 0.88x the time at 10 rows, 0.91x at 20, no
difference shown at 5).

    embed        [V, D]          token embeddings (also the output head when tied)
    pos_embed    [P, D]          learned positions (GPT-2)
    lm_head      [V, D]          untied output head (HF layout, logits = h @ lm_head.T)
    final_norm   {scale [D], bias [D] (LayerNorm only)}
    layers/
      attn_norm, mlp_norm, post_attn_norm, post_mlp_norm   {scale [L, D], bias [L, D]}
      q_norm, k_norm                   {scale [L, hd]} (OLMo 2: [L, H * hd] and [L, K * hd])
      q {kernel [L, H * hd, D], bias [L, H * hd]}
      k, v {kernel [L, K * hd, D], bias [L, K * hd]}
      o {kernel [L, D, H * hd], bias [L, D]}
      gate, up {kernel [L, F, D], bias [L, F]}; down {kernel [L, D, F], bias [L, D]}

The split layout (`unstack_layers`, load_model's CPU default) holds "layers" as a tuple of
per-layer dicts without the layer axis, with q/k/v as qkv {kernel [(H + 2K) * hd, D]} and gate/up
as gate_up {kernel [2F, D]} (`FUSED`; biases alike).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from smc_jax.models.config import ModelConfig

Params = dict[str, Any]
SEP = "/"
LAYERS = "layers"


def _norm_shapes(config: ModelConfig, dim: int) -> dict[str, tuple[int, ...]]:
    shapes = {"scale": (dim,)}
    if config.norm == "layer":
        shapes["bias"] = (dim,)
    return shapes


def _dense(kernel: tuple[int, ...], bias: tuple[int, ...] | None) -> dict[str, tuple[int, ...]]:
    return {"kernel": kernel} if bias is None else {"kernel": kernel, "bias": bias}


def layer_shapes(config: ModelConfig) -> dict[str, dict[str, tuple[int, ...]]]:
    """Shapes of one layer's weights (without the leading layer axis)."""
    d, h, k, hd, f = (
        config.hidden_size,
        config.num_heads,
        config.num_kv_heads,
        config.head_dim,
        config.intermediate_size,
    )
    qkv_bias = config.qkv_bias
    shapes: dict[str, dict[str, tuple[int, ...]]] = {}
    if config.pre_norms:
        shapes["attn_norm"] = _norm_shapes(config, d)
        shapes["mlp_norm"] = _norm_shapes(config, d)
    shapes |= {
        "q": _dense((h * hd, d), (h * hd,) if qkv_bias else None),
        "k": _dense((k * hd, d), (k * hd,) if qkv_bias else None),
        "v": _dense((k * hd, d), (k * hd,) if qkv_bias else None),
        "o": _dense((d, h * hd), (d,) if config.out_bias else None),
        "up": _dense((f, d), (f,) if config.mlp_bias else None),
        "down": _dense((d, f), (d,) if config.mlp_bias else None),
    }
    if config.mlp == "gated":
        shapes["gate"] = _dense((f, d), (f,) if config.mlp_bias else None)
    if config.qk_norm:  # per head, or over the whole projection (OLMo 2)
        shapes["q_norm"] = _norm_shapes(config, hd if config.qk_norm_per_head else h * hd)
        shapes["k_norm"] = _norm_shapes(config, hd if config.qk_norm_per_head else k * hd)
    if config.post_norms:
        shapes["post_attn_norm"] = _norm_shapes(config, d)
        shapes["post_mlp_norm"] = _norm_shapes(config, d)
    return shapes


def param_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Flat map "path/to/leaf" -> full shape (per-layer leaves include the layer axis)."""
    d, v = config.hidden_size, config.vocab_size
    flat: dict[str, tuple[int, ...]] = {"embed": (v, d)}
    if config.learned_positions:
        flat["pos_embed"] = (config.max_positions, d)
    if not config.tie_embeddings:
        flat["lm_head"] = (v, d)
    for leaf, shape in _norm_shapes(config, d).items():
        flat[f"final_norm{SEP}{leaf}"] = shape
    for module, leaves in layer_shapes(config).items():
        for leaf, shape in leaves.items():
            flat[SEP.join((LAYERS, module, leaf))] = (config.num_layers, *shape)
    return flat


def unflatten(flat: dict[str, Any]) -> Params:
    """{"a/b/c": x} -> {"a": {"b": {"c": x}}}."""
    tree: Params = {}
    for path, value in flat.items():
        node = tree
        *parents, leaf = path.split(SEP)
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return tree


def flatten(params: Params) -> dict[str, Any]:
    """Inverse of `unflatten` (for stacked layers)."""
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    return {SEP.join(str(key.key) for key in path): leaf for path, leaf in leaves}


def is_split(params: Params) -> bool:
    """Whether "layers" holds one dict per layer (`unstack_layers`) rather than stacked leaves."""
    return isinstance(params[LAYERS], tuple)


#: Projections of the same input that the split layout holds as one kernel: one matmul (and one
#: layer switch) instead of three or two, whose output slices are the parts' outputs, bit for bit
#: (SmolLM2 and Gemma 3 on CPU, float32 and bfloat16). Byte and token SMC runs on CPU take
#: 0.80-0.92x the time.
FUSED = {"qkv": ("q", "k", "v"), "gate_up": ("gate", "up")}


def _xp(array: Any) -> Any:
    """numpy for host arrays (split or fused on the host: no device copy of the weights), else jnp."""
    return np if isinstance(array, np.ndarray) else jnp


def fuse_projections(layer: Params) -> Params:
    """One layer's q, k, v as "qkv" and gate, up as "gate_up": kernels [out, in] (and biases)
    concatenated on the output axis, in the order of `FUSED`."""
    layer = dict(layer)
    for fused, parts in FUSED.items():
        if all(part in layer for part in parts):
            pieces = [layer.pop(part) for part in parts]
            layer[fused] = {leaf: _xp(pieces[0][leaf]).concatenate([piece[leaf] for piece in pieces], axis=0)
                            for leaf in pieces[0]}
    return layer


def _fused_sizes(layer: Params) -> dict[str, tuple[int, ...]]:
    """The output rows of each part of a fused layer's kernels: q has o's input width and k, v
    share the rest; gate and up are halves."""
    sizes = {}
    if "qkv" in layer:
        rows, q = layer["qkv"]["kernel"].shape[-2], layer["o"]["kernel"].shape[-1]
        sizes["qkv"] = (q, (rows - q) // 2, (rows - q) // 2)
    if "gate_up" in layer:
        half = layer["gate_up"]["kernel"].shape[-2] // 2
        sizes["gate_up"] = (half, half)
    return sizes


def unfuse_projections(layer: Params) -> Params:
    """Inverse of `fuse_projections`."""
    layer = dict(layer)
    for fused, sizes in _fused_sizes(layer).items():
        bounds = np.cumsum(sizes)[:-1]
        pieces = {leaf: _xp(value).split(value, bounds) for leaf, value in layer.pop(fused).items()}
        for i, part in enumerate(FUSED[fused]):
            layer[part] = {leaf: split[i] for leaf, split in pieces.items()}
    return layer


def unstack_layers(params: Params) -> Params:
    """"layers" as a tuple of per-layer dicts, each weight its own buffer and the projections of
    `FUSED` fused (see `transformer.decoder`)."""
    if is_split(params):
        return params
    layers = params[LAYERS]
    count = jax.tree_util.tree_leaves(layers)[0].shape[0]
    return {**params, LAYERS: tuple(fuse_projections(jax.tree_util.tree_map(lambda a, i=i: a[i], layers))
                                    for i in range(count))}


def stack_layers(params: Params) -> Params:
    """Inverse of `unstack_layers`: per-layer leaves, unfused, stacked on a leading layer axis."""
    if not is_split(params):
        return params
    layers = [unfuse_projections(layer) for layer in params[LAYERS]]
    return {**params, LAYERS: jax.tree_util.tree_map(lambda *a: jnp.stack(a), *layers)}


def random_params(config: ModelConfig, key: jax.Array, scale: float = 0.3, dtype: Any = jnp.float32) -> Params:
    """Random weights for `config` (normal * scale; norm scales 1): tiny models for tests and
    benchmarks."""
    shapes = param_shapes(config)
    keys = jax.random.split(key, len(shapes))
    return unflatten({
        path: jnp.ones(shape, dtype) if path.endswith("scale") else (scale * jax.random.normal(k, shape)).astype(dtype)
        for k, (path, shape) in zip(keys, shapes.items())
    })


def cast(params: Params, dtype: Any) -> Params:
    """All floating leaves to `dtype` (e.g. jnp.bfloat16 for half the memory)."""
    return jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype), params)


def is_matmul_weight(path: tuple[Any, ...], leaf: Any) -> bool:
    """Whether a leaf (at `path`, from `jax.tree_util.tree_flatten_with_path`) multiplies the
    activations: a kernel, the token embeddings (the tied head) or the untied head."""
    name = str(getattr(path[-1], "key", path[-1]))
    return getattr(leaf, "ndim", 0) >= 2 and (name == "kernel" or str(path[0].key) in ("embed", "lm_head"))


FLOAT_DTYPES = (jnp.float32, jnp.bfloat16)


def check_float_dtype(dtype: Any, name: str = "dtype") -> Any:
    """`dtype` if it is float32 or bfloat16, else a ValueError that says so (before any loading)."""
    try:
        dt = jnp.dtype(dtype)
    except TypeError:
        dt = None
    if dt not in [jnp.dtype(d) for d in FLOAT_DTYPES]:
        raise ValueError(f"{name} must be jnp.float32 or jnp.bfloat16 (or their names), got {dtype!r}")
    return dt


def cast_matmuls(params: Params, dtype: Any, rest: Any = None) -> Params:
    """The matmul weights (`is_matmul_weight`) to `dtype`, the rest (norms, biases, positions) to
    `rest` (None: kept), in one pass: the model then multiplies in `dtype` with float32
    accumulation and keeps its activations in `activation_dtype` (see `transformer._matmul`)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: jnp.asarray(leaf, dtype if is_matmul_weight(path, leaf) else rest), params)


def activation_dtype(params: Params) -> Any:
    """The dtype of the activations and the KV cache: that of the norms (all float32 after
    `cast_matmuls`; the params' dtype after `cast`)."""
    return params["final_norm"]["scale"].dtype


def to_device(flat: dict[str, np.ndarray], dtype: Any) -> Params:
    """Host arrays (flat) -> device params pytree in `dtype`."""
    return unflatten({path: jnp.asarray(array, dtype) for path, array in flat.items()})
