"""Checkpoint metadata -> `ModelConfig`: Hugging Face config.json dicts (one parser per
`model_type`) and GGUF key/values (translated to the HF layout, then parsed the same way).

A new architecture adds its parser to `_HF_PARSERS` (and its GGUF name to `_GGUF_ARCHITECTURES`);
`smc_jax.models.config` holds the dataclasses those parsers fill.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from smc_jax.models.config import (
    DEFAULT_ROPE_THETA,
    FULL_ATTENTION,
    GEMMA3_DEFAULT_GLOBAL_ROPE_THETA,
    GEMMA3_DEFAULT_LOCAL_ROPE_THETA,
    GEMMA3_DEFAULT_QUERY_PRE_ATTN_SCALAR,
    GEMMA3_DEFAULT_SLIDING_PATTERN,
    SLIDING_ATTENTION,
    SUPPORTED_ROPE_SCALINGS,
    ModelConfig,
    RopeConfig,
    unsupported,
)

_HF_ACTIVATIONS = {
    "silu": "silu",
    "swish": "silu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu": "gelu",
}


def _activation(name: str) -> str:
    if name not in _HF_ACTIVATIONS:
        raise unsupported(f"activation {name!r}")
    return _HF_ACTIVATIONS[name]


def rope_from_hf(params: Mapping[str, Any] | None, theta: float) -> RopeConfig:
    """Parse one HF RoPE parameter dict (v5 `rope_parameters` or v4 `rope_scaling`)."""
    params = dict(params or {})
    scaling = params.get("rope_type", params.get("type", "default"))
    if scaling not in SUPPORTED_ROPE_SCALINGS:
        raise unsupported(f"RoPE scaling {scaling!r}")
    return RopeConfig(
        theta=float(params.get("rope_theta", theta)),
        scaling=scaling,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_positions=int(params.get("original_max_position_embeddings", 8192)),
        partial_rotary_factor=float(params.get("partial_rotary_factor", 1.0)),
    )


def _layer_types(hf: Mapping[str, Any], default: list[str]) -> tuple[bool, ...]:
    types = hf.get("layer_types") or default
    unknown = set(types) - {SLIDING_ATTENTION, FULL_ATTENTION}
    if unknown:
        raise unsupported(f"layer types {sorted(unknown)}")
    return tuple(t == SLIDING_ATTENTION for t in types)


def _common(hf: Mapping[str, Any]) -> dict[str, Any]:
    heads = hf["num_attention_heads"]
    return dict(
        architecture=hf["model_type"],
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        max_positions=hf.get("max_position_embeddings", 2048),
        norm_eps=hf.get("rms_norm_eps", 1e-6),
    )


def _rope_single(hf: Mapping[str, Any]) -> RopeConfig:
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    rope = dict(params)
    if "partial_rotary_factor" in hf:
        rope.setdefault("partial_rotary_factor", hf["partial_rotary_factor"])
    return rope_from_hf(rope, hf.get("rope_theta", DEFAULT_ROPE_THETA))


def _llama(hf: Mapping[str, Any]) -> ModelConfig:
    bias = bool(hf.get("attention_bias", False))
    return ModelConfig(
        **_common(hf),
        activation=_activation(hf.get("hidden_act", "silu")),
        qkv_bias=bias,
        out_bias=bias,
        mlp_bias=bool(hf.get("mlp_bias", False)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        rope=_rope_single(hf),
    )


def _qwen2(hf: Mapping[str, Any]) -> ModelConfig:
    n = hf["num_hidden_layers"]
    window = hf.get("sliding_window") if hf.get("use_sliding_window", False) else None
    first_sliding = hf.get("max_window_layers", n)
    default = [SLIDING_ATTENTION if window and i >= first_sliding else FULL_ATTENTION for i in range(n)]
    sliding = _layer_types(hf, default)
    return ModelConfig(
        **_common(hf),
        activation=_activation(hf.get("hidden_act", "silu")),
        qkv_bias=True,
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        rope=_rope_single(hf),
        sliding_window=window if any(sliding) else None,
        sliding_layers=sliding,
    )


def _phi3(hf: Mapping[str, Any]) -> ModelConfig:
    window = hf.get("sliding_window")
    return ModelConfig(
        **_common(hf),
        activation=_activation(hf.get("hidden_act", "silu")),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        rope=_rope_single(hf),
        sliding_window=window,
        sliding_layers=(window is not None,) * hf["num_hidden_layers"],
    )


def _gemma3(hf: Mapping[str, Any]) -> ModelConfig:
    if hf.get("use_bidirectional_attention"):
        raise unsupported("Gemma 3 with bidirectional attention")
    n = hf["num_hidden_layers"]
    pattern = hf.get("sliding_window_pattern", GEMMA3_DEFAULT_SLIDING_PATTERN)
    default = [SLIDING_ATTENTION if (i + 1) % pattern else FULL_ATTENTION for i in range(n)]
    params = hf.get("rope_parameters")
    if params and FULL_ATTENTION in params:  # transformers v5 layout: one dict per layer kind
        rope_global = rope_from_hf(params[FULL_ATTENTION], GEMMA3_DEFAULT_GLOBAL_ROPE_THETA)
        rope_local = rope_from_hf(params.get(SLIDING_ATTENTION), GEMMA3_DEFAULT_LOCAL_ROPE_THETA)
    else:  # v4 layout: rope_theta, rope_local_base_freq, rope_scaling for global layers only
        rope_global = rope_from_hf(
            hf.get("rope_scaling"), hf.get("rope_theta", GEMMA3_DEFAULT_GLOBAL_ROPE_THETA)
        )
        rope_local = RopeConfig(theta=hf.get("rope_local_base_freq", GEMMA3_DEFAULT_LOCAL_ROPE_THETA))
    return ModelConfig(
        **_common(hf),
        norm_offset=1.0,
        activation=_activation(hf.get("hidden_activation", "gelu_pytorch_tanh")),
        qkv_bias=bool(hf.get("attention_bias", False)),
        out_bias=bool(hf.get("attention_bias", False)),
        qk_norm=True,
        post_norms=True,
        embed_scale=float(hf["hidden_size"]) ** 0.5,
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
        rope=rope_global,
        rope_local=rope_local,
        sliding_window=hf.get("sliding_window"),
        sliding_layers=_layer_types(hf, default),
        query_scale=float(hf.get("query_pre_attn_scalar", GEMMA3_DEFAULT_QUERY_PRE_ATTN_SCALAR)) ** -0.5,
        # attn_logit_softcapping is a Gemma 2 leftover in Gemma 3 configs: the model ignores it.
        final_softcap=hf.get("final_logit_softcapping"),
    )


def _gpt2(hf: Mapping[str, Any]) -> ModelConfig:
    if hf.get("add_cross_attention"):
        raise unsupported("GPT-2 with cross-attention")
    hidden = hf["n_embd"]
    heads = hf["n_head"]
    scale = (hidden // heads) ** -0.5 if hf.get("scale_attn_weights", True) else 1.0
    return ModelConfig(
        architecture="gpt2",
        vocab_size=hf["vocab_size"],
        hidden_size=hidden,
        intermediate_size=hf.get("n_inner") or 4 * hidden,
        num_layers=hf["n_layer"],
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=hidden // heads,
        max_positions=hf["n_positions"],
        norm="layer",
        norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        qkv_bias=True,
        out_bias=True,
        mlp="plain",
        mlp_bias=True,
        activation=_activation(hf.get("activation_function", "gelu_new")),
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
        learned_positions=True,
        rope=None,
        query_scale=scale,
        scale_by_inverse_layer=bool(hf.get("scale_attn_by_inverse_layer_idx", False)),
    )


_HF_PARSERS = {"llama": _llama, "qwen2": _qwen2, "phi3": _phi3, "gemma3_text": _gemma3, "gpt2": _gpt2}


def from_hf_config(hf: Mapping[str, Any]) -> ModelConfig:
    """ModelConfig from a config.json dict; Gemma 3's multimodal config yields its text model."""
    model_type = hf.get("model_type")
    if model_type == "gemma3" and "text_config" in hf:
        hf = {"model_type": "gemma3_text", **hf["text_config"]}
        model_type = "gemma3_text"
    if model_type not in _HF_PARSERS:
        raise unsupported(f"Architecture {model_type!r} ({', '.join(hf.get('architectures') or [])})")
    return _HF_PARSERS[model_type](hf)


_GGUF_ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "phi3": "phi3", "gemma3": "gemma3_text", "gpt2": "gpt2"}


def from_gguf_metadata(
    meta: Mapping[str, Any], tensor_shapes: Mapping[str, tuple[int, ...]]
) -> ModelConfig:
    """ModelConfig from GGUF key/values (`general.architecture`, `<arch>.block_count`, ...).

    `tensor_shapes` maps tensor names to HF-order shapes; it tells whether the output head is tied
    (no `output.weight`), the vocabulary size, and llama.cpp's `rope_freqs` factors are passed
    in `meta["rope_freqs"]` by the loader when present. Values GGUF does not store follow the
    HF defaults, as transformers' own GGUF loading does (e.g. Gemma 3's local RoPE base 1e4, its
    sliding pattern 6 and query_pre_attn_scalar 256).
    """
    arch = meta["general.architecture"]
    if arch not in _GGUF_ARCHITECTURES:
        raise unsupported(f"GGUF architecture {arch!r}")

    def get(key: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{key}", default)

    hidden = int(get("embedding_length"))
    heads = int(get("attention.head_count"))
    head_dim = int(get("attention.key_length", hidden // heads))
    vocab = tensor_shapes["token_embd.weight"][0]
    layers = int(get("block_count"))
    hf: dict[str, Any] = dict(
        model_type=_GGUF_ARCHITECTURES[arch],
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=int(get("attention.head_count_kv", heads)),
        head_dim=head_dim,
        max_position_embeddings=int(get("context_length", 2048)),
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        tie_word_embeddings="output.weight" not in tensor_shapes,
    )
    rope: dict[str, Any] = {"rope_theta": float(get("rope.freq_base", DEFAULT_ROPE_THETA))}
    scaling = get("rope.scaling.type")
    if scaling not in (None, "none"):
        rope.update(rope_type=scaling, factor=float(get("rope.scaling.factor", 1.0)))
    rotary = get("rope.dimension_count")
    if rotary is not None and int(rotary) != head_dim:
        rope["partial_rotary_factor"] = int(rotary) / head_dim
    if arch == "gemma3":
        window = get("attention.sliding_window")
        hf.update(sliding_window=int(window) if window else None)
        local_theta = float(get("rope.freq_base_swa", GEMMA3_DEFAULT_LOCAL_ROPE_THETA))
        hf["rope_parameters"] = {FULL_ATTENTION: rope, SLIDING_ATTENTION: {"rope_theta": local_theta}}
        if window is None:
            hf["layer_types"] = [FULL_ATTENTION] * layers
    elif arch == "gpt2":
        hf = dict(
            model_type="gpt2",
            vocab_size=vocab,
            n_embd=hidden,
            n_inner=hf["intermediate_size"],
            n_layer=layers,
            n_head=heads,
            n_positions=hf["max_position_embeddings"],
            layer_norm_epsilon=float(get("attention.layer_norm_epsilon", 1e-5)),
            tie_word_embeddings=hf["tie_word_embeddings"],
        )
    else:
        hf["rope_parameters"] = rope
        window = get("attention.sliding_window")
        if arch == "phi3":
            hf["sliding_window"] = int(window) if window else None
    config = from_hf_config(hf)
    freq_factors = meta.get("rope_freqs")
    if freq_factors is not None and config.rope is not None:
        config = dataclasses.replace(
            config,
            rope=dataclasses.replace(config.rope, freq_factors=tuple(float(f) for f in freq_factors)),
        )
    return config
