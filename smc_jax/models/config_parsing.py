"""Checkpoint metadata -> `ModelConfig`: Hugging Face config.json dicts (one parser per
`model_type`) and GGUF key/values (translated to the HF layout, then parsed the same way).

A new architecture adds its parser to `_HF_PARSERS` (and its GGUF name to `_GGUF_ARCHITECTURES`);
`smc_jax.models.config` holds the dataclasses those parsers fill.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from smc_jax.models.config import (
    DEFAULT_ROPE_THETA,
    FULL_ATTENTION,
    GEMMA2_27B_LAYERS,
    GEMMA2_DEFAULT_ATTN_SOFTCAP,
    GEMMA2_DEFAULT_FINAL_SOFTCAP,
    GEMMA2_DEFAULT_QUERY_PRE_ATTN_SCALAR,
    GEMMA3_DEFAULT_GLOBAL_ROPE_THETA,
    GEMMA3_DEFAULT_LOCAL_ROPE_THETA,
    GEMMA3_DEFAULT_QUERY_PRE_ATTN_SCALAR,
    GEMMA3_DEFAULT_SLIDING_PATTERN,
    SLIDING_ATTENTION,
    SUPPORTED_ROPE_SCALINGS,
    YARN_DEFAULT_BETA_FAST,
    YARN_DEFAULT_BETA_SLOW,
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


def rope_from_hf(
    params: Mapping[str, Any] | None, theta: float, hf: Mapping[str, Any] | None = None
) -> RopeConfig:
    """Parse one HF RoPE parameter dict (v5 `rope_parameters` or v4 `rope_scaling`).

    `hf` (the whole config) gives `max_position_embeddings` and Phi-3's top-level
    `original_max_position_embeddings`, from which transformers derives yarn's and longrope's
    defaults: original context = max_position_embeddings, factor = max / original, and the
    attention factor 0.1 ln(factor) + 1 (yarn; mscale / mscale_all_dim when given) or
    sqrt(1 + ln(factor) / ln(original)) (longrope), 1 when factor <= 1.
    """
    params = dict(params or {})
    hf = hf or {}
    scaling = params.get("rope_type", params.get("type", "default"))
    if scaling not in SUPPORTED_ROPE_SCALINGS:
        raise unsupported(f"RoPE scaling {scaling!r}")
    max_positions = hf.get("max_position_embeddings", 2048)
    original = params.get("original_max_position_embeddings")
    if scaling in ("yarn", "longrope"):
        original = hf.get("original_max_position_embeddings") or original or max_positions
    original = int(original or 8192)
    factor = params.get("factor")
    if factor is None:
        factor = max_positions / original if scaling in ("yarn", "longrope") else 1.0
    factor = float(factor)
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        attention_factor = _default_attention_factor(scaling, factor, original, params)
    return RopeConfig(
        theta=float(params.get("rope_theta", theta)),
        scaling=scaling,
        factor=factor,
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_positions=original,
        partial_rotary_factor=float(params.get("partial_rotary_factor", 1.0)),
        attention_factor=float(attention_factor),
        beta_fast=float(params.get("beta_fast") or YARN_DEFAULT_BETA_FAST),
        beta_slow=float(params.get("beta_slow") or YARN_DEFAULT_BETA_SLOW),
        truncate=bool(params.get("truncate", True)),
        short_factor=tuple(float(f) for f in params["short_factor"]) if scaling == "longrope" else None,
        long_factor=tuple(float(f) for f in params["long_factor"]) if scaling == "longrope" else None,
    )


def _default_attention_factor(scaling: str, factor: float, original: int, params: Mapping[str, Any]) -> float:
    if scaling == "yarn":

        def mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        if params.get("mscale") and params.get("mscale_all_dim"):
            return mscale(factor, params["mscale"]) / mscale(factor, params["mscale_all_dim"])
        return mscale(factor)
    if scaling == "longrope":
        return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return 1.0


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
    return rope_from_hf(rope, hf.get("rope_theta", DEFAULT_ROPE_THETA), hf)


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


def _mistral(hf: Mapping[str, Any]) -> ModelConfig:
    # MistralModel applies `sliding_window` (when set) to every layer and ignores layer_types.
    window = hf.get("sliding_window")
    return dataclasses.replace(
        _llama(hf), sliding_window=window, sliding_layers=(window is not None,) * hf["num_hidden_layers"]
    )


def _olmo2(hf: Mapping[str, Any]) -> ModelConfig:
    return dataclasses.replace(_llama(hf), qk_norm=True, qk_norm_per_head=False, pre_norms=False, post_norms=True)


def _qwen3(hf: Mapping[str, Any]) -> ModelConfig:
    bias = bool(hf.get("attention_bias", False))
    return dataclasses.replace(_qwen2(hf), qkv_bias=bias, out_bias=bias, qk_norm=True)


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
        rope_global = rope_from_hf(params[FULL_ATTENTION], GEMMA3_DEFAULT_GLOBAL_ROPE_THETA, hf)
        rope_local = rope_from_hf(params.get(SLIDING_ATTENTION), GEMMA3_DEFAULT_LOCAL_ROPE_THETA, hf)
    else:  # v4 layout: rope_theta, rope_local_base_freq, rope_scaling for global layers only
        rope_global = rope_from_hf(
            hf.get("rope_scaling"), hf.get("rope_theta", GEMMA3_DEFAULT_GLOBAL_ROPE_THETA), hf
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


def _gemma2(hf: Mapping[str, Any]) -> ModelConfig:
    n = hf["num_hidden_layers"]
    default = [SLIDING_ATTENTION if (i + 1) % 2 else FULL_ATTENTION for i in range(n)]
    sliding = _layer_types(hf, default)
    window = hf.get("sliding_window")
    return ModelConfig(
        **_common(hf),
        norm_offset=1.0,
        activation=_activation(hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh"),
        qkv_bias=bool(hf.get("attention_bias", False)),
        out_bias=bool(hf.get("attention_bias", False)),
        post_norms=True,
        embed_scale=float(hf["hidden_size"]) ** 0.5,
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
        rope=_rope_single(hf),
        sliding_window=window if window and any(sliding) else None,
        sliding_layers=sliding if window else (False,) * n,
        query_scale=float(hf.get("query_pre_attn_scalar", GEMMA2_DEFAULT_QUERY_PRE_ATTN_SCALAR)) ** -0.5,
        attn_softcap=hf.get("attn_logit_softcapping", GEMMA2_DEFAULT_ATTN_SOFTCAP),
        final_softcap=hf.get("final_logit_softcapping", GEMMA2_DEFAULT_FINAL_SOFTCAP),
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


_HF_PARSERS = {
    "llama": _llama,
    "mistral": _mistral,
    "qwen2": _qwen2,
    "qwen3": _qwen3,
    "phi3": _phi3,
    "gemma2": _gemma2,
    "gemma3_text": _gemma3,
    "olmo2": _olmo2,
    "gpt2": _gpt2,
}


def from_hf_config(hf: Mapping[str, Any]) -> ModelConfig:
    """ModelConfig from a config.json dict; Gemma 3's multimodal config yields its text model."""
    model_type = hf.get("model_type")
    if model_type == "gemma3" and "text_config" in hf:
        hf = {"model_type": "gemma3_text", **hf["text_config"]}
        model_type = "gemma3_text"
    if model_type not in _HF_PARSERS:
        raise unsupported(f"Architecture {model_type!r} ({', '.join(hf.get('architectures') or [])})")
    return _HF_PARSERS[model_type](hf)


# llama.cpp converts Mistral checkpoints (MistralForCausalLM) to its "llama" architecture.
_GGUF_ARCHITECTURES = {
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "phi3": "phi3",
    "gemma2": "gemma2",
    "gemma3": "gemma3_text",
    "olmo2": "olmo2",
    "gpt2": "gpt2",
}


def from_gguf_metadata(
    meta: Mapping[str, Any], tensor_shapes: Mapping[str, tuple[int, ...]]
) -> ModelConfig:
    """ModelConfig from GGUF key/values (`general.architecture`, `<arch>.block_count`, ...).

    `tensor_shapes` maps tensor names to HF-order shapes; it tells whether the output head is tied
    (no `output.weight`), the vocabulary size, and llama.cpp's `rope_freqs` factors (and
    LongRoPE's `rope_factors_long` / `_short`) are passed in `meta` by the loader when present. Values GGUF does not store follow the
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
    if get("rope.scaling.original_context_length") is not None:
        rope["original_max_position_embeddings"] = int(get("rope.scaling.original_context_length"))
    for key in ("beta_fast", "beta_slow"):
        if get(f"rope.scaling.yarn_{key}") is not None:
            rope[key] = float(get(f"rope.scaling.yarn_{key}"))
    if meta.get("rope_factors_long") is not None:  # LongRoPE: llama.cpp keeps the factors as tensors
        rope.update(rope_type="longrope", long_factor=meta["rope_factors_long"], short_factor=meta["rope_factors_short"])
        if get("rope.scaling.attn_factor") is not None:
            rope["attention_factor"] = float(get("rope.scaling.attn_factor"))
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
    elif arch == "gemma2":
        # GGUF keeps no query_pre_attn_scalar: llama.cpp scales queries by hd^-.5, except for the
        # 27B model (46 layers), where by (D / H)^-.5, which is what those configs set.
        window = get("attention.sliding_window")
        hf.update(
            sliding_window=int(window) if window else None,
            rope_parameters=rope,
            # Absent keys: llama.cpp's (and Gemma2Config's) defaults.
            attn_logit_softcapping=float(get("attn_logit_softcapping", GEMMA2_DEFAULT_ATTN_SOFTCAP)),
            final_logit_softcapping=float(get("final_logit_softcapping", GEMMA2_DEFAULT_FINAL_SOFTCAP)),
            query_pre_attn_scalar=hidden // heads if layers == GEMMA2_27B_LAYERS else head_dim,
        )
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
