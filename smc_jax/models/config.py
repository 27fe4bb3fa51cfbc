"""Static description of a decoder-only transformer: one dataclass for every supported family.

`ModelConfig` is frozen and hashable so that it can be a static argument of `jax.jit`. The
families agree on most of the computation; where they differ, a field says how:

| family       | norm            | attention                       | MLP                | other                        |
|--------------|-----------------|---------------------------------|--------------------|------------------------------|
| llama        | RMS, w          | RoPE (default/linear/llama3)    | SiLU gated         | optional attention/MLP bias  |
| qwen2        | RMS, w          | RoPE, bias on q/k/v             | SiLU gated         | optional sliding layers      |
| phi3         | RMS, w          | RoPE (partial), fused qkv       | SiLU gated, fused  | optional sliding window      |
| qwen3        | RMS, w          | RoPE, per-head q/k RMS norms    | SiLU gated         | optional sliding layers      |
| mistral      | RMS, w          | RoPE                            | SiLU gated         | sliding window on all layers |
| gemma2       | RMS, 1 + w      | RoPE, scores soft-capped        | GeLU(tanh) gated   | sliding/global alternating,  |
|              |                 | scale query_pre_attn_scalar^-.5 |                    | post norms, final soft cap   |
| gemma3_text  | RMS, 1 + w      | RoPE per layer kind, q/k norms  | GeLU(tanh) gated   | sliding/global layers,       |
|              |                 | scale query_pre_attn_scalar^-.5 |                    | post norms, embed * sqrt(D)  |
| olmo2        | RMS, w          | RoPE, q/k RMS norms over the    | SiLU gated         | post-norm only: no norm      |
|              |                 | whole projection (all heads)    |                    | before attention or MLP      |
| gpt2         | LayerNorm       | learned positions, biases       | GeLU(tanh) plain   | Conv1D weights [in, out]     |

RoPE scalings: default, linear, llama3, yarn (static frequencies + attention factor) and longrope
(short or long factors chosen per call by its largest position, as transformers does).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

SUPPORTED_ARCHITECTURES: tuple[str, ...] = (
    "llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3_text", "olmo2", "gpt2"
)
"""HF `model_type`s (after unwrapping Gemma 3's multimodal config) that this package ports."""

SUPPORTED_ROPE_SCALINGS: tuple[str, ...] = ("default", "linear", "llama3", "yarn", "longrope")

# Defaults that HF configuration classes fill in when a config.json leaves a field out.
GEMMA3_DEFAULT_GLOBAL_ROPE_THETA = 1_000_000.0
GEMMA3_DEFAULT_LOCAL_ROPE_THETA = 10_000.0  # Older GGUF files lack rope.freq_base_swa: HF's default.
GEMMA3_DEFAULT_SLIDING_PATTERN = 6  # Every 6th layer is global.
GEMMA3_DEFAULT_QUERY_PRE_ATTN_SCALAR = 256
GEMMA2_DEFAULT_QUERY_PRE_ATTN_SCALAR = 256
GEMMA2_DEFAULT_ATTN_SOFTCAP = 50.0
GEMMA2_DEFAULT_FINAL_SOFTCAP = 30.0
GEMMA2_27B_LAYERS = 46  # llama.cpp scales Gemma 2 27B's queries by (D / H)^-.5, the others by hd^-.5
YARN_DEFAULT_BETA_FAST = 32.0
YARN_DEFAULT_BETA_SLOW = 1.0
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

    "yarn" (YaRN, Qwen2.5/Qwen3 long context) blends interpolated theta^(-2i/d) / factor and
    extrapolated theta^(-2i/d) frequencies with a linear ramp over dims i in [low, high], the dims
    that complete between beta_fast and beta_slow turns over original_max_positions:

        inv_freq = interp * ramp(i) + extrap * (1 - ramp(i)),
        ramp(i) = clip((i - low) / (high - low), 0, 1).

    "longrope" (Phi-3.5, Phi-4-mini) divides theta^(-2i/d) by `short_factor[i]`, or by
    `long_factor[i]` when a call's largest position is >= original_max_positions (see
    `inv_freq_long`). Both multiply cos and sin by `attention_factor` (so q . k by its square).
    """

    theta: float = DEFAULT_ROPE_THETA
    scaling: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_positions: int = 8192
    partial_rotary_factor: float = 1.0
    freq_factors: tuple[float, ...] | None = None
    attention_factor: float = 1.0
    beta_fast: float = YARN_DEFAULT_BETA_FAST
    beta_slow: float = YARN_DEFAULT_BETA_SLOW
    truncate: bool = True
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.scaling not in SUPPORTED_ROPE_SCALINGS:
            raise unsupported(f"RoPE scaling {self.scaling!r}")
        if self.scaling == "longrope" and (self.short_factor is None or self.long_factor is None):
            raise ValueError("longrope needs short_factor and long_factor")

    @property
    def switches_to_long(self) -> bool:
        """Whether the frequencies depend on the largest position of a call (longrope)."""
        return self.scaling == "longrope"

    def rotary_dim(self, head_dim: int) -> int:
        return int(head_dim * self.partial_rotary_factor)

    def inv_freq(self, head_dim: int) -> np.ndarray:
        """float32[rotary_dim // 2], computed in float32 like the PyTorch reference (for
        longrope: the short factors, used while every position is < original_max_positions)."""
        dim = self.rotary_dim(head_dim)
        exponents = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
        inv = (np.float32(1.0) / (np.float32(self.theta) ** exponents)).astype(np.float32)
        if self.scaling == "linear":
            inv = inv / np.float32(self.factor)
        elif self.scaling == "llama3":
            inv = _llama3_scale(inv, self)
        elif self.scaling == "yarn":
            inv = _yarn(dim, self)
        elif self.scaling == "longrope":
            inv = _longrope(dim, self, self.short_factor)
        if self.freq_factors is not None:
            inv = inv / np.asarray(self.freq_factors, np.float32)
        return inv.astype(np.float32)

    def inv_freq_long(self, head_dim: int) -> np.ndarray:
        """Frequencies of calls that reach original_max_positions: longrope's long factors (the
        same as `inv_freq` for every other scaling)."""
        if self.scaling != "longrope":
            return self.inv_freq(head_dim)
        inv = _longrope(self.rotary_dim(head_dim), self, self.long_factor)
        if self.freq_factors is not None:
            inv = inv / np.asarray(self.freq_factors, np.float32)
        return inv.astype(np.float32)


def _longrope(dim: int, rope: RopeConfig, factors: tuple[float, ...] | None) -> np.ndarray:
    """1 / (factors[i] * theta^(2i/d)), in float32 as transformers computes it."""
    exponents = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    ext = np.asarray(factors, np.float32)
    if ext.shape != exponents.shape:
        raise ValueError(f"longrope factors have {ext.shape[0]} entries, expected rotary_dim / 2 = {dim // 2}")
    return (np.float32(1.0) / (ext * np.float32(rope.theta) ** exponents)).astype(np.float32)


def _yarn(dim: int, rope: RopeConfig) -> np.ndarray:
    """YaRN: interpolate the low frequencies by `factor`, keep the high ones, ramp in between."""

    def correction_dim(rotations: float) -> float:
        # The dim whose wavelength fits `rotations` times into the original context.
        return dim * math.log(rope.original_max_positions / (rotations * 2 * math.pi)) / (2 * math.log(rope.theta))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # a zero-width ramp would divide by zero
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1).astype(np.float32)
    extrapolation = (np.float32(1.0) - ramp).astype(np.float32)
    pos_freqs = np.float32(rope.theta) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))
    extrapolated = (np.float32(1.0) / pos_freqs).astype(np.float32)
    interpolated = (np.float32(1.0) / (np.float32(rope.factor) * pos_freqs)).astype(np.float32)
    return (interpolated * (1 - extrapolation) + extrapolated * extrapolation).astype(np.float32)


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
    qk_norm_per_head: bool = True  # False (OLMo 2): one RMSNorm over all heads' q (and k).
    pre_norms: bool = True  # False (OLMo 2): no norm on the attention and MLP inputs.
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
    attn_softcap: float | None = None  # Gemma 2: scores -> cap * tanh(scores / cap) before the mask.

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
        if not (self.pre_norms or self.post_norms):
            raise ValueError("a layer needs pre-norms, post-norms or both")

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

    def _layer_ropes(self) -> list[RopeConfig]:
        local = self.rope_local or self.rope
        return [local if sliding else self.rope for sliding in self.sliding_layers]  # type: ignore[misc]

    @property
    def rope_switches_to_long(self) -> bool:
        """Whether some layer's frequencies depend on a call's largest position (longrope)."""
        return self.rope is not None and any(r.switches_to_long for r in self._layer_ropes())

    def layer_inv_freq_long(self) -> np.ndarray:
        """float32[num_layers, rotary_dim // 2]: frequencies once positions reach the original
        context (longrope's long factors; equal to `layer_inv_freq` for other scalings)."""
        if self.rope is None:
            return np.zeros((self.num_layers, 0), np.float32)
        return np.stack([r.inv_freq_long(self.head_dim) for r in self._layer_ropes()]).astype(np.float32)

    def layer_long_from(self) -> np.ndarray:
        """int32[num_layers]: the position from which a call uses `layer_inv_freq_long`."""
        never = np.iinfo(np.int32).max
        if self.rope is None:
            return np.full(self.num_layers, never, np.int32)
        return np.asarray(
            [r.original_max_positions if r.switches_to_long else never for r in self._layer_ropes()], np.int32
        )

    def layer_rope_attention_factor(self) -> np.ndarray:
        """float32[num_layers]: factor on cos and sin (YaRN and LongRoPE's attention factor)."""
        if self.rope is None:
            return np.ones(self.num_layers, np.float32)
        return np.asarray([r.attention_factor for r in self._layer_ropes()], np.float32)

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
            for key in ("freq_factors", "short_factor", "long_factor"):
                if d.get(key) is not None:
                    d[key] = tuple(d[key])
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
