"""Tiny random checkpoints of every supported architecture, built with transformers itself.

Every parameter is perturbed from HF's initialisation (norm weights, biases and Gemma's zero-init
norms included) with a fixed torch seed, so a wrong offset, transpose or split changes the logits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

VOCAB = 97
HIDDEN = 32
INTERMEDIATE = 48
HEADS = 4
KV_HEADS = 2
PERTURBATION = 0.1
SEED = 0
GEMMA_WINDOW = 4  # much shorter than the test sequences, so the window matters

ARCHITECTURES = ("llama", "llama_bias", "qwen2", "phi3", "gemma3", "gpt2")


def hf_config(arch: str) -> Any:
    import transformers as tf

    common = dict(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    if arch == "llama":  # Llama 3.x RoPE scaling, untied head
        return tf.LlamaConfig(
            **common,
            rope_scaling={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
            tie_word_embeddings=False,
        )
    if arch == "llama_bias":  # SmolLM2-like tied head, biases, head_dim != hidden / heads
        return tf.LlamaConfig(
            **common, head_dim=16, attention_bias=True, mlp_bias=True, tie_word_embeddings=True
        )
    if arch == "qwen2":
        return tf.Qwen2Config(**common, tie_word_embeddings=False)
    if arch == "phi3":  # fused qkv / gate_up, partial rotary
        return tf.Phi3Config(**common, partial_rotary_factor=0.5, tie_word_embeddings=False)
    if arch == "gemma3":  # sliding, global, sliding, global; soft caps on
        return tf.Gemma3TextConfig(
            **{**common, "num_hidden_layers": 4},
            head_dim=8,
            sliding_window=GEMMA_WINDOW,
            sliding_window_pattern=2,
            query_pre_attn_scalar=12,
            attn_logit_softcapping=5.0,
            final_logit_softcapping=8.0,
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1_000_000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            },
        )
    if arch == "gpt2":
        return tf.GPT2Config(
            vocab_size=VOCAB,
            n_embd=HIDDEN,
            n_layer=2,
            n_head=HEADS,
            n_positions=64,
            scale_attn_by_inverse_layer_idx=True,
            bos_token_id=1,
            eos_token_id=2,
        )
    raise ValueError(arch)


def build(arch: str, directory: Path, max_shard_size: str | None = None) -> Any:
    """Save a perturbed random `arch` model to `directory`; return the torch model (eval, eager)."""
    import torch
    import transformers as tf

    torch.manual_seed(SEED)
    config = hf_config(arch)
    config._attn_implementation = "eager"
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(PERTURBATION * torch.randn_like(p))
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(directory, **kwargs)
    return model


def torch_logits(model: Any, tokens: np.ndarray) -> np.ndarray:
    """Reference logits [B, T, V] of unpadded sequences."""
    import torch

    with torch.no_grad():
        return model(torch.as_tensor(tokens, dtype=torch.long)).logits.float().numpy()
