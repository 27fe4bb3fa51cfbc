"""Static description of a decoder-only transformer: one dataclass for every supported family.

`ModelConfig` is frozen and hashable so that it can be a static argument of `jax.jit`. The
families agree on most of the computation; where they differ, a field says how:

| family       | norm            | attention                       | MLP                | other                        |
|--------------|-----------------|---------------------------------|--------------------|------------------------------|
| llama        | RMS, w          | RoPE (default/linear/llama3)    | SiLU gated         | optional attention/MLP bias  |
| qwen2        | RMS, w          | RoPE, bias on q/k/v             | SiLU gated         | optional sliding layers      |
| phi3         | RMS, w          | RoPE (partial), fused qkv       | SiLU gated, fused  | optional sliding window      |
| gemma3_text  | RMS, 1 + w      | RoPE per layer kind, q/k norms  | GeLU(tanh) gated   | sliding/global layers,       |
|              |                 | scale query_pre_attn_scalar^-.5 |                    | post norms, embed * sqrt(D)  |
| gpt2         | LayerNorm       | learned positions, biases       | GeLU(tanh) plain   | Conv1D weights [in, out]     |
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

SUPPORTED_ARCHITECTURES: tuple[str, ...] = ("llama", "qwen2", "phi3", "gemma3_text", "gpt2")
"""HF `model_type`s (after unwrapping Gemma 3's multimodal config) that this package ports."""

SUPPORTED_ROPE_SCALINGS: tuple[str, ...] = ("default", "linear", "llama3")

# Defaults that HF configuration classes fill in when a config.json leaves a field out.
GEMMA3_DEFAULT_GLOBAL_ROPE_THETA = 1_000_000.0
GEMMA3_DEFAULT_LOCAL_ROPE_THETA = 10_000.0  # Older GGUF files lack rope.freq_base_swa: HF's default.
GEMMA3_DEFAULT_SLIDING_PATTERN = 6  # Every 6th layer is global.
GEMMA3_DEFAULT_QUERY_PRE_ATTN_SCALAR = 256
DEFAULT_ROPE_THETA = 10_000.0

SLIDING_ATTENTION = "sliding_attention"
FULL_ATTENTION = "full_attention"


class UnsupportedArchitectureError(ValueError):
    """A checkpoint whose architecture (or one of whose options) this package does not port."""


def unsupported(what: str) -> UnsupportedArchitectureError:
    return UnsupportedArchitectureError(
        f"{what} is not supported; supported architectures (HF model_type): "
        f"{', '.join(SUPPORTED_ARCHITECTURES)}; RoPE scalings: {', '.join(SUPPORTED_ROPE_SCALINGS)}."
    )


@dataclass(frozen=True)
class RopeConfig:
    """Rotary position embedding: rotate dims (i, i + d/2) of q and k by angle pos * inv_freq[i].

    inv_freq[i] = theta^(-2i/d) for the first d = head_dim * partial_rotary_factor dims, then
    adjusted by `scaling`: "linear" divides by `factor`; "llama3" divides low frequencies
    (wavelength > original_max_positions / low_freq_factor) by `factor`, keeps high ones
    (wavelength < original_max_positions / high_freq_factor) and interpolates in between.
    `freq_factors` (llama.cpp's `rope_freqs` tensor) divides inv_freq elementwise.

    Attributes
    ----------
    theta : float
        The base.
    scaling : {"default", "linear", "llama3"}
        How inverse frequencies are adjusted.
    factor, low_freq_factor, high_freq_factor : float
        Scaling factors ("linear", "llama3").
    original_max_positions : int
        The pre-scaling context length.
    partial_rotary_factor : float
        Fraction of head_dim that is rotated.
    freq_factors : tuple of float, optional
        Per-frequency divisors (e.g. from a GGUF file).
    """

    theta: float = DEFAULT_ROPE_THETA
    scaling: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_positions: int = 8192
    partial_rotary_factor: float = 1.0
    freq_factors: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.scaling not in SUPPORTED_ROPE_SCALINGS:
            raise unsupported(f"RoPE scaling {self.scaling!r}")

    def rotary_dim(self, head_dim: int) -> int:
        return int(head_dim * self.partial_rotary_factor)

    def inv_freq(self, head_dim: int) -> np.ndarray:
        """float32[rotary_dim // 2], computed in float32 like the PyTorch reference."""
        dim = self.rotary_dim(head_dim)
        exponents = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
        inv = (np.float32(1.0) / (np.float32(self.theta) ** exponents)).astype(np.float32)
        if self.scaling == "linear":
            inv = inv / np.float32(self.factor)
        elif self.scaling == "llama3":
            inv = _llama3_scale(inv, self)
        if self.freq_factors is not None:
            inv = inv / np.asarray(self.freq_factors, np.float32)
        return inv.astype(np.float32)


def _llama3_scale(inv: np.ndarray, rope: RopeConfig) -> np.ndarray:
    """Llama 3.1's frequency-dependent RoPE scaling (rope_type "llama3")."""
    low_freq_wavelen = rope.original_max_positions / rope.low_freq_factor
    high_freq_wavelen = rope.original_max_positions / rope.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > low_freq_wavelen, inv / rope.factor, inv)
    smooth = (rope.original_max_positions / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


@dataclass(frozen=True)
class ModelConfig:
    """Everything static about a model; weights live in a separate params pytree.

    Per-layer fields are tuples with one entry per layer. `rope_local` (if set) is used by
    sliding-window layers, `rope` by the others (Gemma 3: local base 1e4, global base 1e6).

    Attributes
    ----------
    architecture : str
        "llama", "qwen2", "phi3", "gemma3", "gpt2", ...
    vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, head_dim, max_positions : int
        Sizes.
    norm : {"rms", "layer"}
        The normalization.
    norm_eps, norm_offset : float
        Its epsilon; RMSNorm multiplies by (norm_offset + w) (Gemma: 1).
    qkv_bias, out_bias, mlp_bias, qk_norm, post_norms : bool
        Biases, q/k normalization, and norms of the attention and MLP outputs (Gemma).
    mlp : {"gated", "plain"}
        down(act(gate x) * up x) or down(act(up x)).
    activation : {"silu", "gelu_tanh", "gelu"}
        The MLP's activation.
    embed_scale : float
        Multiplies the embeddings.
    tie_embeddings, learned_positions : bool
        Output layer = embeddings; learned position embeddings (GPT-2).
    rope, rope_local : RopeConfig or None
        Rotary embeddings of the global and the sliding-window layers.
    sliding_window : int or None
        The window of sliding-window layers.
    sliding_layers : tuple of bool
        Which layers use it.
    query_scale : float
        Attention score scale (0: head_dim ** -0.5).
    scale_by_inverse_layer : bool
        GPT-2 option: scores divided by (layer + 1) too.
    final_softcap : float or None
        Soft cap of the logits.
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_positions: int
    norm: str = "rms"  # "rms" | "layer"
    norm_eps: float = 1e-6
    norm_offset: float = 0.0  # RMSNorm multiplies by (norm_offset + w); Gemma: 1.
    qkv_bias: bool = False
    out_bias: bool = False
    mlp: str = "gated"  # "gated": down(act(gate x) * up x); "plain": down(act(up x))
    mlp_bias: bool = False
    activation: str = "silu"  # "silu" | "gelu_tanh" | "gelu"
    qk_norm: bool = False
    post_norms: bool = False  # Gemma: norm the attention and MLP outputs before the residual.
    embed_scale: float = 1.0
    tie_embeddings: bool = True
    learned_positions: bool = False
    rope: RopeConfig | None = field(default_factory=RopeConfig)
    rope_local: RopeConfig | None = None
    sliding_window: int | None = None
    sliding_layers: tuple[bool, ...] = ()
    query_scale: float = 0.0  # 0 means head_dim ** -0.5
    scale_by_inverse_layer: bool = False  # GPT-2 option: scores also divided by (layer + 1).
    final_softcap: float | None = None

    def __post_init__(self) -> None:
        if not self.sliding_layers:
            object.__setattr__(self, "sliding_layers", (False,) * self.num_layers)
        if self.query_scale == 0.0:
            object.__setattr__(self, "query_scale", self.head_dim**-0.5)
        if len(self.sliding_layers) != self.num_layers:
            raise ValueError(f"{len(self.sliding_layers)} sliding flags for {self.num_layers} layers")
        if any(self.sliding_layers) and not self.sliding_window:
            raise ValueError("sliding layers need a sliding_window")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.num_heads} heads are not a multiple of {self.num_kv_heads} kv heads")
        if self.norm not in ("rms", "layer") or self.mlp not in ("gated", "plain"):
            raise ValueError(f"unknown norm {self.norm!r} or mlp {self.mlp!r}")
        if self.activation not in ACTIVATIONS:
            raise unsupported(f"activation {self.activation!r}")
        if (self.rope is None) == (not self.learned_positions):
            raise ValueError("a model uses exactly one of RoPE and learned positions")

    @property
    def uses_sliding_window(self) -> bool:
        return any(self.sliding_layers)

    def layer_inv_freq(self) -> np.ndarray:
        """float32[num_layers, rotary_dim // 2]: each layer's RoPE frequencies."""
        if self.rope is None:
            return np.zeros((self.num_layers, 0), np.float32)
        local = self.rope_local or self.rope
        table = [
            (local if sliding else self.rope).inv_freq(self.head_dim) for sliding in self.sliding_layers
        ]
        return np.stack(table).astype(np.float32)

    def layer_query_scale(self) -> np.ndarray:
        """float32[num_layers]: factor on q.k for each layer."""
        scale = np.full(self.num_layers, self.query_scale, np.float32)
        if self.scale_by_inverse_layer:
            scale = scale / np.arange(1, self.num_layers + 1, dtype=np.float32)
        return scale

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelConfig:
        """Inverse of `to_dict` (JSON round trip: lists back to tuples)."""

        def rope(d: Mapping[str, Any] | None) -> RopeConfig | None:
            if d is None:
                return None
            d = dict(d)
            if d.get("freq_factors") is not None:
                d["freq_factors"] = tuple(d["freq_factors"])
            return RopeConfig(**d)

        data = dict(data)
        data["rope"] = rope(data.get("rope"))
        data["rope_local"] = rope(data.get("rope_local"))
        data["sliding_layers"] = tuple(data["sliding_layers"])
        return cls(**data)

    @classmethod
    def from_hf_config(cls, hf: Mapping[str, Any]) -> ModelConfig:
        """Build from a Hugging Face config.json dict (transformers v4 or v5 layout)."""
        return from_hf_config(hf)

    @classmethod
    def from_gguf_metadata(
        cls, meta: Mapping[str, Any], tensor_shapes: Mapping[str, tuple[int, ...]]
    ) -> ModelConfig:
        """Build from GGUF metadata and tensor shapes (see `from_gguf_metadata`)."""
        return from_gguf_metadata(meta, tensor_shapes)


ACTIVATIONS = ("silu", "gelu_tanh", "gelu")
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
