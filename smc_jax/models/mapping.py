"""Checkpoint tensor names -> params pytree paths, as regex tables with per-tensor transforms.

A table is a list of `Rule`s. Each checkpoint tensor must match exactly one rule; the rule checks
its shape, transforms it (transpose, split, reshape into heads, undo llama.cpp's Q/K row
permutation, subtract 1 from Gemma's GGUF norms, ...) and writes one or more params leaves. A
`(?P<layer>\\d+)` group sends the result to that slot of a stacked per-layer leaf.

`convert` fails loudly, listing every problem at once: tensors no rule maps, tensors whose shape
is not the expected one (both shapes given), and params leaves (or layers) nothing provided.
Rules with no targets drop known non-parameters (buffers such as GPT-2's causal mask).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from smc_jax.models.config import ModelConfig, unsupported
from smc_jax.models.params import param_shapes

Shape = tuple[int, ...]
Transform = Callable[[np.ndarray, ModelConfig], tuple[np.ndarray, ...]]


class CheckpointError(ValueError):
    """A checkpoint that does not fit the model: unmapped, missing or mis-shaped tensors."""


def _identity(x: np.ndarray, config: ModelConfig) -> tuple[np.ndarray, ...]:
    return (x,)


@dataclass(frozen=True)
class Rule:
    """`pattern` (full match) -> `targets` (params paths, "layers/..." ones per layer).

    `shape(config)` is the tensor's expected shape in the checkpoint; `transform` returns one array
    per target (per-layer ones without the layer axis).
    """

    pattern: str
    targets: tuple[str, ...]
    shape: Callable[[ModelConfig], Shape] | None = None
    transform: Transform = _identity


# ---------------------------------------------------------------------------------------------
# Transforms. Our kernels are [out, in] (y = x W^T), as HF nn.Linear and GGUF store them.


def _transpose(w: np.ndarray, c: ModelConfig) -> tuple[np.ndarray, ...]:
    """GPT-2 Conv1D weight [in, out] -> kernel [out, in]."""
    return (w.T,)


def _split_qkv(w: np.ndarray, c: ModelConfig) -> tuple[np.ndarray, ...]:
    """Fused [(H + 2K) * hd, D] (Phi-3 qkv_proj, GGUF attn_qkv) -> q, k, v kernels [*, D]."""
    q_rows, kv_rows = _q_rows(c), _kv_rows(c)
    return tuple(np.split(w, [q_rows, q_rows + kv_rows], axis=0))


def _split_qkv_bias(b: np.ndarray, c: ModelConfig) -> tuple[np.ndarray, ...]:
    q_rows, kv_rows = _q_rows(c), _kv_rows(c)
    return tuple(np.split(b, [q_rows, q_rows + kv_rows]))


def _split_gate_up(w: np.ndarray, c: ModelConfig) -> tuple[np.ndarray, ...]:
    """Fused [2F, D] (Phi-3 gate_up_proj: gate rows first) -> gate, up kernels [F, D]."""
    return tuple(np.split(w, 2, axis=0))


def _split_columns(x: np.ndarray, c: ModelConfig) -> tuple[np.ndarray, ...]:
    """GPT-2 Conv1D c_attn [in, out] = [D, 3D] -> q, k, v kernels [D, D] (or biases [3D] -> [D])."""
    return tuple(part.T if part.ndim == 2 else part for part in np.split(x, 3, axis=-1))


def unpermute_llama_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (it interleaves each head's two RoPE halves).

    llama.cpp stores row (2i + j) of a head where HF has row (j * hd/2 + i), j in {0, 1}.
    """
    half = w.shape[0] // heads // 2
    return w.reshape(heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_llama_qk(heads: Callable[[ModelConfig], int]) -> Transform:
    """llama.cpp Q/K weight [rows, D] or bias [rows]: unpermute the rows."""

    def transform(w: np.ndarray, c: ModelConfig) -> tuple[np.ndarray, ...]:
        return (unpermute_llama_rows(w, heads(c)),)

    return transform


def _minus_one(w: np.ndarray, c: ModelConfig) -> tuple[np.ndarray, ...]:
    """Gemma GGUF norms store w + 1; HF (and we) keep w and multiply by (1 + w)."""
    return (w - np.float32(1.0),)


# ---------------------------------------------------------------------------------------------
# Shapes (in the checkpoint's own layout).


def _h(c: ModelConfig) -> int:
    return c.num_heads


def _kv(c: ModelConfig) -> int:
    return c.num_kv_heads


def _d(c: ModelConfig) -> Shape:
    return (c.hidden_size,)


def _q_rows(c: ModelConfig) -> int:
    return c.num_heads * c.head_dim


def _kv_rows(c: ModelConfig) -> int:
    return c.num_kv_heads * c.head_dim


# ---------------------------------------------------------------------------------------------
# Hugging Face safetensors tables.

_L = r"(?P<layer>\d+)"


def _hf_decoder_rules(prefix: str, config: ModelConfig) -> list[Rule]:
    """Rules shared by the Llama-style families (names under `prefix`model.layers.N...)."""
    layer = f"{prefix}layers\\.{_L}\\."
    rules = [
        Rule(f"{prefix}embed_tokens\\.weight", ("embed",), lambda c: (c.vocab_size, c.hidden_size)),
        Rule(f"{prefix}norm\\.weight", ("final_norm/scale",), _d),
        Rule(layer + r"self_attn\.o_proj\.weight", ("layers/o/kernel",), lambda c: (c.hidden_size, _q_rows(c))),
        Rule(layer + r"mlp\.down_proj\.weight", ("layers/down/kernel",), lambda c: (c.hidden_size, c.intermediate_size)),
        Rule(r"(?:model\.)?rotary_emb\.inv_freq|" + layer + r"self_attn\.rotary_emb\.inv_freq", ()),
    ]
    head = "lm_head.weight"
    if config.tie_embeddings:
        rules.append(Rule(re.escape(head), ()))  # a redundant copy of the tied embedding
    else:
        rules.append(Rule(re.escape(head), ("lm_head",), lambda c: (c.vocab_size, c.hidden_size)))
    if config.architecture == "phi3":
        rules += [
            Rule(layer + r"self_attn\.qkv_proj\.weight", ("layers/q/kernel", "layers/k/kernel", "layers/v/kernel"),
                 lambda c: (_q_rows(c) + 2 * _kv_rows(c), c.hidden_size), _split_qkv),
            Rule(layer + r"mlp\.gate_up_proj\.weight", ("layers/gate/kernel", "layers/up/kernel"),
                 lambda c: (2 * c.intermediate_size, c.hidden_size), _split_gate_up),
        ]
    else:
        for name, rows in (("q", _q_rows), ("k", _kv_rows), ("v", _kv_rows)):
            rules.append(Rule(layer + f"self_attn\\.{name}_proj\\.weight", (f"layers/{name}/kernel",),
                              lambda c, rows=rows: (rows(c), c.hidden_size)))
            rules.append(Rule(layer + f"self_attn\\.{name}_proj\\.bias", (f"layers/{name}/bias",),
                              lambda c, rows=rows: (rows(c),)))
        rules.append(Rule(layer + r"self_attn\.o_proj\.bias", ("layers/o/bias",), _d))
        for name in ("gate", "up"):
            rules.append(Rule(layer + f"mlp\\.{name}_proj\\.weight", (f"layers/{name}/kernel",),
                              lambda c: (c.intermediate_size, c.hidden_size)))
            rules.append(Rule(layer + f"mlp\\.{name}_proj\\.bias", (f"layers/{name}/bias",),
                              lambda c: (c.intermediate_size,)))
        rules.append(Rule(layer + r"mlp\.down_proj\.bias", ("layers/down/bias",), _d))
    rules += _hf_norm_rules(layer, config)
    if config.architecture == "gemma3_text":
        # Gemma 3 multimodal checkpoints: the vision tower and projector are not ported.
        rules.append(Rule(r"(?:model\.)?(?:vision_tower|multi_modal_projector)\..*", ()))
    return rules


def _hf_norm_rules(layer: str, config: ModelConfig) -> list[Rule]:
    """The layer norms, by layout. HF's `post_attention_layernorm` is the MLP's input norm in
    pre-norm models (Llama, Qwen, Mistral, Phi-3) but the attention output's norm in those with
    post-norms (Gemma 2/3, whose MLP input norm is `pre_feedforward_layernorm`; OLMo 2)."""
    rules = []
    if config.pre_norms:
        rules.append(Rule(layer + r"input_layernorm\.weight", ("layers/attn_norm/scale",), _d))
    if config.post_norms:
        rules += [
            Rule(layer + r"post_attention_layernorm\.weight", ("layers/post_attn_norm/scale",), _d),
            Rule(layer + r"post_feedforward_layernorm\.weight", ("layers/post_mlp_norm/scale",), _d),
        ]
        if config.pre_norms:
            rules.append(Rule(layer + r"pre_feedforward_layernorm\.weight", ("layers/mlp_norm/scale",), _d))
    else:
        rules.append(Rule(layer + r"post_attention_layernorm\.weight", ("layers/mlp_norm/scale",), _d))
    if config.qk_norm:
        rules += [
            Rule(layer + r"self_attn\.q_norm\.weight", ("layers/q_norm/scale",), _qk_norm_shape(_q_rows)),
            Rule(layer + r"self_attn\.k_norm\.weight", ("layers/k_norm/scale",), _qk_norm_shape(_kv_rows)),
        ]
    return rules


def _qk_norm_shape(rows: Callable[[ModelConfig], int]) -> Callable[[ModelConfig], Shape]:
    """[hd] per head, or the whole projection's [heads * hd] (OLMo 2)."""
    return lambda c: (c.head_dim,) if c.qk_norm_per_head else (rows(c),)


def _hf_gpt2_rules(config: ModelConfig) -> list[Rule]:
    p = r"(?:transformer\.)?"
    layer = p + f"h\\.{_L}\\."
    rules = [
        Rule(p + r"wte\.weight", ("embed",), lambda c: (c.vocab_size, c.hidden_size)),
        Rule(p + r"wpe\.weight", ("pos_embed",), lambda c: (c.max_positions, c.hidden_size)),
        Rule(p + r"ln_f\.weight", ("final_norm/scale",), _d),
        Rule(p + r"ln_f\.bias", ("final_norm/bias",), _d),
        Rule(layer + r"attn\.c_attn\.weight", ("layers/q/kernel", "layers/k/kernel", "layers/v/kernel"),
             lambda c: (c.hidden_size, 3 * c.hidden_size), _split_columns),
        Rule(layer + r"attn\.c_attn\.bias", ("layers/q/bias", "layers/k/bias", "layers/v/bias"),
             lambda c: (3 * c.hidden_size,), _split_columns),
        Rule(layer + r"attn\.c_proj\.weight", ("layers/o/kernel",), lambda c: (c.hidden_size, c.hidden_size), _transpose),
        Rule(layer + r"attn\.c_proj\.bias", ("layers/o/bias",), _d),
        Rule(layer + r"mlp\.c_fc\.weight", ("layers/up/kernel",), lambda c: (c.hidden_size, c.intermediate_size), _transpose),
        Rule(layer + r"mlp\.c_fc\.bias", ("layers/up/bias",), lambda c: (c.intermediate_size,)),
        Rule(layer + r"mlp\.c_proj\.weight", ("layers/down/kernel",), lambda c: (c.intermediate_size, c.hidden_size),
             _transpose),
        Rule(layer + r"mlp\.c_proj\.bias", ("layers/down/bias",), _d),
        # Old checkpoints store the causal-mask buffers.
        Rule(layer + r"attn\.(?:masked_)?bias", ()),
    ]
    for norm, target in (("ln_1", "attn_norm"), ("ln_2", "mlp_norm")):
        for leaf, kind in (("weight", "scale"), ("bias", "bias")):
            rules.append(Rule(layer + f"{norm}\\.{leaf}", (f"layers/{target}/{kind}",), _d))
    head = "lm_head.weight"
    if config.tie_embeddings:
        rules.append(Rule(re.escape(head), ()))
    else:
        rules.append(Rule(re.escape(head), ("lm_head",), lambda c: (c.vocab_size, c.hidden_size)))
    return rules


# transformers v5 saves Gemma3ForConditionalGeneration text weights under model.language_model.;
# older checkpoints under language_model.model.
_HF_PREFIXES = {
    "gemma3_text": r"(?:model\.language_model\.|language_model\.model\.|model\.)",
}


def hf_table(config: ModelConfig) -> list[Rule]:
    """Regex table for Hugging Face safetensors names of `config.architecture`."""
    if config.architecture == "gpt2":
        return _hf_gpt2_rules(config)
    if config.architecture in ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3_text", "olmo2"):
        return _hf_decoder_rules(_HF_PREFIXES.get(config.architecture, r"model\."), config)
    raise unsupported(f"Architecture {config.architecture!r}")


# ---------------------------------------------------------------------------------------------
# GGUF tables (llama.cpp names; tensors dequantized to HF's [out, in] orientation).


def gguf_table(config: ModelConfig) -> list[Rule]:
    """Regex table for GGUF tensor names of `config.architecture`."""
    arch = config.architecture
    blk = f"blk\\.{_L}\\."
    norm_transform = _minus_one if arch in ("gemma2", "gemma3_text") else _identity
    rules = [
        Rule(r"token_embd\.weight", ("embed",), lambda c: (c.vocab_size, c.hidden_size)),
        Rule(r"output_norm\.weight", ("final_norm/scale",), _d, norm_transform),
        Rule(blk + r"ffn_down\.weight", ("layers/down/kernel",), lambda c: (c.hidden_size, c.intermediate_size)),
        Rule(r"rope_freqs\.weight", ()),  # read into config.rope.freq_factors by the loader
        Rule(r"rope_factors_(?:long|short)\.weight", ()),  # read into config.rope (LongRoPE) likewise
    ]
    if config.tie_embeddings:
        rules.append(Rule(r"output\.weight", ()))
    else:
        rules.append(Rule(r"output\.weight", ("lm_head",), lambda c: (c.vocab_size, c.hidden_size)))
    if config.pre_norms:
        rules.append(Rule(blk + r"attn_norm\.weight", ("layers/attn_norm/scale",), _d, norm_transform))
    if arch == "gpt2":
        rules += [
            Rule(r"position_embd\.weight", ("pos_embed",), lambda c: (c.max_positions, c.hidden_size)),
            Rule(r"output_norm\.bias", ("final_norm/bias",), _d),
            Rule(blk + r"attn_norm\.bias", ("layers/attn_norm/bias",), _d),
            Rule(blk + r"ffn_norm\.weight", ("layers/mlp_norm/scale",), _d),
            Rule(blk + r"ffn_norm\.bias", ("layers/mlp_norm/bias",), _d),
            Rule(blk + r"attn_qkv\.weight", ("layers/q/kernel", "layers/k/kernel", "layers/v/kernel"),
                 lambda c: (3 * c.hidden_size, c.hidden_size), _split_qkv),
            Rule(blk + r"attn_qkv\.bias", ("layers/q/bias", "layers/k/bias", "layers/v/bias"),
                 lambda c: (3 * c.hidden_size,), _split_qkv_bias),
            Rule(blk + r"attn_output\.weight", ("layers/o/kernel",), lambda c: (c.hidden_size, c.hidden_size)),
            Rule(blk + r"attn_output\.bias", ("layers/o/bias",), _d),
            Rule(blk + r"ffn_up\.weight", ("layers/up/kernel",), lambda c: (c.intermediate_size, c.hidden_size)),
            Rule(blk + r"ffn_up\.bias", ("layers/up/bias",), lambda c: (c.intermediate_size,)),
            Rule(blk + r"ffn_down\.bias", ("layers/down/bias",), _d),
        ]
        return rules
    rules.append(Rule(blk + r"attn_output\.weight", ("layers/o/kernel",), lambda c: (c.hidden_size, _q_rows(c))))
    if arch == "phi3":
        rules += [
            Rule(blk + r"attn_qkv\.weight", ("layers/q/kernel", "layers/k/kernel", "layers/v/kernel"),
                 lambda c: (_q_rows(c) + 2 * _kv_rows(c), c.hidden_size), _split_qkv),
            Rule(blk + r"ffn_up\.weight", ("layers/gate/kernel", "layers/up/kernel"),
                 lambda c: (2 * c.intermediate_size, c.hidden_size), _split_gate_up),
            Rule(blk + r"ffn_norm\.weight", ("layers/mlp_norm/scale",), _d),
        ]
        return rules
    permute = arch == "llama"  # llama.cpp permutes Q/K rows for the llama architecture only
    for name, heads, rows in (("q", _h, _q_rows), ("k", _kv, _kv_rows), ("v", _kv, _kv_rows)):
        rows_transform = _gguf_llama_qk(heads) if permute and name != "v" else _identity
        rules.append(Rule(blk + f"attn_{name}\\.weight", (f"layers/{name}/kernel",),
                          lambda c, rows=rows: (rows(c), c.hidden_size), rows_transform))
        rules.append(Rule(blk + f"attn_{name}\\.bias", (f"layers/{name}/bias",), lambda c, rows=rows: (rows(c),),
                          rows_transform))
    rules += [
        Rule(blk + r"ffn_gate\.weight", ("layers/gate/kernel",), lambda c: (c.intermediate_size, c.hidden_size)),
        Rule(blk + r"ffn_up\.weight", ("layers/up/kernel",), lambda c: (c.intermediate_size, c.hidden_size)),
    ]
    if config.pre_norms:  # the MLP's input norm
        rules.append(Rule(blk + r"ffn_norm\.weight", ("layers/mlp_norm/scale",), _d, norm_transform))
    if config.post_norms:
        rules += [
            Rule(blk + r"post_attention_norm\.weight", ("layers/post_attn_norm/scale",), _d, norm_transform),
            Rule(blk + r"post_ffw_norm\.weight", ("layers/post_mlp_norm/scale",), _d, norm_transform),
        ]
    if config.qk_norm:
        rules += [
            Rule(blk + r"attn_q_norm\.weight", ("layers/q_norm/scale",), _qk_norm_shape(_q_rows), norm_transform),
            Rule(blk + r"attn_k_norm\.weight", ("layers/k_norm/scale",), _qk_norm_shape(_kv_rows), norm_transform),
        ]
    return rules


# ---------------------------------------------------------------------------------------------


TensorSource = Iterable[tuple[str, Shape, Callable[[], np.ndarray]]]
"""(name, shape, load) triples; `load` is only called for tensors a rule maps."""


def convert(tensors: TensorSource, table: list[Rule], config: ModelConfig, source: str) -> dict[str, np.ndarray]:
    """Apply `table` to every tensor; return flat params {"layers/q/kernel": array, ...}.

    Raises CheckpointError naming every unmapped, mis-shaped, duplicated or missing tensor.
    """
    compiled = [(re.compile(rule.pattern), rule) for rule in table]
    expected = param_shapes(config)
    layers = config.num_layers
    per_layer: dict[str, list[np.ndarray | None]] = {}
    flat: dict[str, np.ndarray] = {}
    provider: dict[str, str] = {}
    problems: list[str] = []

    for name, shape, load in tensors:
        matches = [(m, rule) for pattern, rule in compiled if (m := pattern.fullmatch(name))]
        if not matches:
            problems.append(f"unmapped tensor {name!r} {tuple(shape)}")
            continue
        match, rule = matches[0]
        if not rule.targets:
            continue
        want = rule.shape(config) if rule.shape else None
        if want is not None and tuple(shape) != tuple(want):
            problems.append(f"tensor {name!r} has shape {tuple(shape)}, expected {tuple(want)}")
            continue
        arrays = rule.transform(np.asarray(load()), config)
        layer = int(match["layer"]) if "layer" in match.re.groupindex else None
        for target, array in zip(rule.targets, arrays, strict=True):
            if target not in expected:
                problems.append(f"tensor {name!r} maps to {target!r}, which this config has no use for")
                continue
            if layer is None:
                if target in flat:
                    problems.append(f"{target!r} given twice ({provider[target]!r} and {name!r})")
                flat[target], provider[target] = array, name
                continue
            if layer >= layers:
                problems.append(f"tensor {name!r} is for layer {layer} but the model has {layers} layers")
                continue
            slots = per_layer.setdefault(target, [None] * layers)
            if slots[layer] is not None:
                problems.append(f"{target!r} layer {layer} given twice (last by {name!r})")
            slots[layer] = array

    for target, slots in per_layer.items():
        missing = [i for i, a in enumerate(slots) if a is None]
        if missing:
            problems.append(f"{target!r} missing for layers {missing}")
        else:
            flat[target] = np.stack(slots)  # type: ignore[arg-type]
    for target, shape in expected.items():
        if target not in flat and target not in per_layer:
            sources = [rule.pattern for rule in table if target in rule.targets]
            problems.append(f"missing {target!r} {shape} (checkpoint name matching {' or '.join(sources) or '?'})")
        elif target in flat and flat[target].shape != shape:
            problems.append(f"{target!r} has shape {flat[target].shape} after conversion, expected {shape}")
    if problems:
        raise CheckpointError(
            f"{source} does not fit a {config.architecture} model ({len(problems)} problems):\n  "
            + "\n  ".join(problems)
        )
    return flat
