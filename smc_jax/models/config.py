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

Reading a checkpoint's own description (HF config.json, GGUF metadata) into a `ModelConfig` is
`smc_jax.models.config_parsing`; this module only says what a config is.
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

    Attributes
    ----------
    theta : float
        The base.
    scaling : {"default", "linear", "llama3", "yarn", "longrope"}
        How inverse frequencies are adjusted.
    factor, low_freq_factor, high_freq_factor : float
        Scaling factors ("linear", "llama3", "yarn"; "longrope": max / original context).
    original_max_positions : int
        The pre-scaling context length.
    partial_rotary_factor : float
        Fraction of head_dim that is rotated.
    freq_factors : tuple of float, optional
        Per-frequency divisors (e.g. from a GGUF file).
    attention_factor : float
        Factor on cos and sin ("yarn", "longrope").
    beta_fast, beta_slow : float
        YaRN's ramp bounds, in rotations over the original context.
    truncate : bool
        Whether YaRN rounds the ramp bounds to whole dims.
    short_factor, long_factor : tuple of float, optional
        LongRoPE's per-frequency divisors below / from original_max_positions.
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
        Biases, q/k normalization, and norms of the attention and MLP outputs (Gemma, OLMo 2).
    qk_norm_per_head : bool
        q/k norms per head (True) or one over all heads' projection (OLMo 2).
    pre_norms : bool
        Norms on the attention and MLP inputs (False: OLMo 2).
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
    attn_softcap : float or None
        Soft cap of the attention scores (Gemma 2).
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


ACTIVATIONS = ("silu", "gelu_tanh", "gelu")
