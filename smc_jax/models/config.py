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
        from smc_jax.models.config_parsing import from_hf_config

        return from_hf_config(hf)

    @classmethod
    def from_gguf_metadata(
        cls, meta: Mapping[str, Any], tensor_shapes: Mapping[str, tuple[int, ...]]
    ) -> ModelConfig:
        """Build from GGUF metadata and tensor shapes (see `config_parsing.from_gguf_metadata`)."""
        from smc_jax.models.config_parsing import from_gguf_metadata

        return from_gguf_metadata(meta, tensor_shapes)


ACTIVATIONS = ("silu", "gelu_tanh", "gelu")
