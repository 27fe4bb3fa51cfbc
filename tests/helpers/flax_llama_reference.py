"""A small Llama-architecture decoder written as a plain `flax.linen` module, independently of
smc_jax's port (nothing here imports `smc_jax.models`), and its conversion to a Hugging Face
checkpoint directory.

The module follows Meta's original Llama layout rather than Hugging Face's: rotary embedding
rotates interleaved pairs (x[2i], x[2i + 1]) of each head, as the complex-number form
`(x[2i] + i x[2i+1]) * exp(i p theta_i)` does. Hugging Face's checkpoints rotate half-split pairs
(x[i], x[i + d/2]) instead, so the conversion permutes the query/key rows of every head; a wrong
permutation, transpose or head split changes the logits.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int = 97
    hidden: int = 32
    intermediate: int = 48
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16  # != hidden / heads on purpose
    rope_theta: float = 5_000.0
    eps: float = 1e-5
    tied: bool = False


def rotary(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """Rotate each interleaved pair (x[2i], x[2i+1]) of x [B, T, H, D] by angle p * theta^(-2i/D)."""
    d = x.shape[-1]
    inv_freq = theta ** (-jnp.arange(0, d, 2, dtype=jnp.float32) / d)  # [D/2]
    angle = positions[..., None].astype(jnp.float32) * inv_freq  # [B, T, D/2]
    cos, sin = jnp.cos(angle)[:, :, None], jnp.sin(angle)[:, :, None]  # broadcast over heads
    pairs = x.reshape(*x.shape[:-1], d // 2, 2)
    re, im = pairs[..., 0], pairs[..., 1]
    return jnp.stack([re * cos - im * sin, re * sin + im * cos], axis=-1).reshape(x.shape)


class Attention(nn.Module):
    config: LlamaConfig

    @nn.compact
    def __call__(self, x: jax.Array, positions: jax.Array, mask: jax.Array) -> jax.Array:
        c = self.config
        q = nn.DenseGeneral((c.heads, c.head_dim), use_bias=False, name="q")(x)
        k = nn.DenseGeneral((c.kv_heads, c.head_dim), use_bias=False, name="k")(x)
        v = nn.DenseGeneral((c.kv_heads, c.head_dim), use_bias=False, name="v")(x)
        q, k = rotary(q, positions, c.rope_theta), rotary(k, positions, c.rope_theta)
        group = c.heads // c.kv_heads  # grouped-query attention: each kv head serves `group` query heads
        k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
        out = nn.dot_product_attention(q, k, v, mask=mask)  # softmax(q k^T / sqrt(D)) v
        return nn.DenseGeneral(c.hidden, axis=(-2, -1), use_bias=False, name="o")(out)


class MLP(nn.Module):
    config: LlamaConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        c = self.config
        gate = nn.Dense(c.intermediate, use_bias=False, name="gate")(x)
        up = nn.Dense(c.intermediate, use_bias=False, name="up")(x)
        return nn.Dense(c.hidden, use_bias=False, name="down")(nn.silu(gate) * up)  # SwiGLU


class Block(nn.Module):
    config: LlamaConfig

    @nn.compact
    def __call__(self, x: jax.Array, positions: jax.Array, mask: jax.Array) -> jax.Array:
        eps = self.config.eps
        x = x + Attention(self.config, name="attention")(nn.RMSNorm(eps, name="attention_norm")(x), positions, mask)
        return x + MLP(self.config, name="mlp")(nn.RMSNorm(eps, name="mlp_norm")(x))


class FlaxLlama(nn.Module):
    """tokens [B, T] -> logits [B, T, V]; token t sits at position t."""

    config: LlamaConfig

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        c = self.config
        embed = nn.Embed(c.vocab_size, c.hidden, name="embed")
        x = embed(tokens)
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
        mask = nn.make_causal_mask(tokens)  # [B, 1, T, T]
        for i in range(c.layers):
            x = Block(c, name=f"block_{i}")(x, positions, mask)
        x = nn.RMSNorm(c.eps, name="final_norm")(x)
        if c.tied:
            return embed.attend(x)
        return nn.Dense(c.vocab_size, use_bias=False, name="head")(x)


def init_params(config: LlamaConfig, seed: int = 0) -> Any:
    """Random variables for `FlaxLlama(config)`, every norm scale perturbed away from 1 so a
    misplaced norm shows; weights scaled up from Flax's defaults so the logits are not flat."""
    variables = FlaxLlama(config).init(jax.random.key(seed), jnp.zeros((1, 4), jnp.int32))
    leaves, treedef = jax.tree.flatten(variables)
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    noisy = [leaf + 0.3 * jax.random.normal(key, leaf.shape, leaf.dtype) for leaf, key in zip(leaves, keys, strict=True)]
    return jax.tree.unflatten(treedef, noisy)


def _to_hf_rows(kernel: np.ndarray) -> np.ndarray:
    """DenseGeneral kernel [hidden, heads, D] in interleaved-pair order -> HF weight [heads*D, hidden]
    in half-split order: row (h, 2i + j) goes to row (h, j * D/2 + i)."""
    hidden, heads, d = kernel.shape
    return kernel.reshape(hidden, heads, d // 2, 2).transpose(1, 3, 2, 0).reshape(heads * d, hidden)


def hf_state_dict(config: LlamaConfig, variables: Any) -> dict[str, np.ndarray]:
    """The module's parameters under Hugging Face Llama names ([out, in] weights)."""
    p = jax.tree.map(np.asarray, variables["params"])
    out = {"model.embed_tokens.weight": p["embed"]["embedding"], "model.norm.weight": p["final_norm"]["scale"]}
    if not config.tied:
        out["lm_head.weight"] = p["head"]["kernel"].T
    for i in range(config.layers):
        b, prefix = p[f"block_{i}"], f"model.layers.{i}."
        a = b["attention"]
        out[prefix + "self_attn.q_proj.weight"] = _to_hf_rows(a["q"]["kernel"])
        out[prefix + "self_attn.k_proj.weight"] = _to_hf_rows(a["k"]["kernel"])
        out[prefix + "self_attn.v_proj.weight"] = a["v"]["kernel"].reshape(config.hidden, -1).T  # no rotation
        out[prefix + "self_attn.o_proj.weight"] = a["o"]["kernel"].reshape(-1, config.hidden).T
        for name in ("gate", "up", "down"):
            out[prefix + f"mlp.{name}_proj.weight"] = b["mlp"][name]["kernel"].T
        out[prefix + "input_layernorm.weight"] = b["attention_norm"]["scale"]
        out[prefix + "post_attention_layernorm.weight"] = b["mlp_norm"]["scale"]
    return {name: np.ascontiguousarray(w, np.float32) for name, w in out.items()}


def save_hf_checkpoint(config: LlamaConfig, variables: Any, directory: Path) -> Path:
    """Write config.json + model.safetensors (Hugging Face's Llama layout) into `directory`."""
    from safetensors.numpy import save_file

    directory.mkdir(parents=True, exist_ok=True)
    hf_config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden,
        "intermediate_size": config.intermediate,
        "num_hidden_layers": config.layers,
        "num_attention_heads": config.heads,
        "num_key_value_heads": config.kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": config.eps,
        "rope_theta": config.rope_theta,
        "max_position_embeddings": 256,
        "tie_word_embeddings": config.tied,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "torch_dtype": "float32",
    }
    (directory / "config.json").write_text(json.dumps(hf_config, indent=2))
    save_file(hf_state_dict(config, variables), str(directory / "model.safetensors"))
    return directory
