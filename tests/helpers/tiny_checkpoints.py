"""Tiny random checkpoints of every supported architecture, built with transformers itself.

Every parameter is perturbed from HF's initialisation (norm weights, biases and Gemma's zero-init
norms included) with a fixed torch seed, so a wrong offset, transpose or split changes the logits.
"""

from __future__ import annotations

import math
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

ARCHITECTURES = (
    "llama", "llama_bias", "qwen2", "phi3", "gemma3", "gpt2",
    "qwen3", "mistral", "gemma2", "olmo2", "phi3_longrope",
)
YARN_ORIGINAL_CONTEXT = 8  # Qwen 3's tiny YaRN: test sequences (12 tokens) go past it
LONGROPE_ORIGINAL_CONTEXT = 4  # Phi-3.5's tiny LongRoPE: prompts of 5+ tokens use the long factors
# GGUF stores less than config.json: llama.cpp fixes Gemma 3's sliding pattern at 6 and keeps no
# query_pre_attn_scalar or soft caps, so the GGUF test uses a Gemma 3 with those defaults (and a
# GPT-2 without scale_attn_by_inverse_layer_idx).
# Mistral GGUF files are llama.cpp "llama" files, which keep no sliding window; Gemma 2 GGUF files
# keep no query_pre_attn_scalar (llama.cpp uses head_dim).
GGUF_ARCHITECTURES = (
    "llama", "qwen2", "phi3", "gemma3_gguf", "gpt2_gguf", "qwen3", "mistral_gguf", "gemma2_gguf", "olmo2",
    "phi3_longrope",
)


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
    if arch == "gemma3_gguf":  # 5 sliding layers, then a global one
        return tf.Gemma3TextConfig(
            **{**common, "num_hidden_layers": 6},
            head_dim=8,
            sliding_window=GEMMA_WINDOW,
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1_000_000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            },
        )
    if arch == "qwen3":  # per-head q/k norms, head_dim != hidden / heads, YaRN
        return tf.Qwen3Config(
            **common,
            head_dim=16,
            max_position_embeddings=4 * YARN_ORIGINAL_CONTEXT,
            rope_parameters={
                "rope_type": "yarn",
                "factor": 4.0,
                "rope_theta": 10_000.0,
                "original_max_position_embeddings": YARN_ORIGINAL_CONTEXT,
            },
            tie_word_embeddings=False,
        )
    if arch in ("mistral", "mistral_gguf"):  # sliding window on every layer
        window = GEMMA_WINDOW if arch == "mistral" else None
        return tf.MistralConfig(**common, sliding_window=window, tie_word_embeddings=False)
    if arch in ("gemma2", "gemma2_gguf"):  # sliding, global; both soft caps
        return tf.Gemma2Config(
            **common,
            head_dim=8,
            sliding_window=GEMMA_WINDOW,
            query_pre_attn_scalar=12 if arch == "gemma2" else 8,
            attn_logit_softcapping=2.0,
            final_logit_softcapping=8.0,
        )
    if arch == "olmo2":  # post-norms only, q/k norms over all heads
        return tf.Olmo2Config(**common, tie_word_embeddings=False)
    if arch == "phi3_longrope":  # Phi-3.5 / Phi-4-mini: LongRoPE, partial rotary
        return tf.Phi3Config(
            **common,
            partial_rotary_factor=0.75,
            max_position_embeddings=64,
            original_max_position_embeddings=LONGROPE_ORIGINAL_CONTEXT,
            rope_parameters={
                "rope_type": "longrope",
                "rope_theta": 10_000.0,
                "short_factor": [1.0, 1.3, 2.1],
                "long_factor": [1.5, 3.0, 7.0],
            },
            tie_word_embeddings=False,
        )
    if arch in ("gpt2", "gpt2_gguf"):
        return tf.GPT2Config(
            vocab_size=VOCAB,
            n_embd=HIDDEN,
            n_layer=2,
            n_head=HEADS,
            n_positions=64,
            scale_attn_by_inverse_layer_idx=arch == "gpt2",
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


# ---------------------------------------------------------------------------------------------
# Tiny GGUF files in llama.cpp's layout (names and transforms of its convert_hf_to_gguf.py), all
# tensors float32 so dequantization is exact.

GGUF_ARCH = {
    "llama": "llama",
    "qwen2": "qwen2",
    "phi3": "phi3",
    "gemma3_gguf": "gemma3",
    "gpt2_gguf": "gpt2",
    "qwen3": "qwen3",
    "mistral_gguf": "llama",  # llama.cpp's convert_hf_to_gguf writes Mistral as llama
    "gemma2_gguf": "gemma2",
    "olmo2": "olmo2",
    "phi3_longrope": "phi3",
}


def _permute_llama(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's Q/K row order: each head's two RoPE halves interleaved."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_tensors(arch: str, model: Any) -> dict[str, np.ndarray]:
    """HF state dict -> llama.cpp tensor names and layouts."""
    config = model.config
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    out: dict[str, np.ndarray] = {}
    if arch == "gpt2_gguf":
        out["token_embd.weight"] = sd["transformer.wte.weight"]
        out["position_embd.weight"] = sd["transformer.wpe.weight"]
        out["output_norm.weight"] = sd["transformer.ln_f.weight"]
        out["output_norm.bias"] = sd["transformer.ln_f.bias"]
        for i in range(config.n_layer):
            h = f"transformer.h.{i}."
            b = f"blk.{i}."
            for ours, theirs in (("attn_norm", "ln_1"), ("ffn_norm", "ln_2")):
                out[b + ours + ".weight"] = sd[h + theirs + ".weight"]
                out[b + ours + ".bias"] = sd[h + theirs + ".bias"]
            for ours, theirs in (("attn_qkv", "attn.c_attn"), ("attn_output", "attn.c_proj"),
                                 ("ffn_up", "mlp.c_fc"), ("ffn_down", "mlp.c_proj")):
                out[b + ours + ".weight"] = sd[h + theirs + ".weight"].T  # Conv1D [in, out] -> [out, in]
                out[b + ours + ".bias"] = sd[h + theirs + ".bias"]
        return out
    gemma = arch in ("gemma3_gguf", "gemma2_gguf")
    norm = (lambda w: w + 1.0) if gemma else (lambda w: w)  # noqa: E731
    out["token_embd.weight"] = sd["model.embed_tokens.weight"]
    out["output_norm.weight"] = norm(sd["model.norm.weight"])
    if not config.tie_word_embeddings:
        out["output.weight"] = sd["lm_head.weight"]
    names = {
        "input_layernorm": "attn_norm",
        "self_attn.o_proj": "attn_output",
        "mlp.down_proj": "ffn_down",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.gate_up_proj": "ffn_up",  # phi3: fused, gate rows first
        "self_attn.qkv_proj": "attn_qkv",  # phi3
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.q_norm": "attn_q_norm",
        "self_attn.k_norm": "attn_k_norm",
        "post_attention_layernorm": "post_attention_norm" if gemma or arch == "olmo2" else "ffn_norm",
        "pre_feedforward_layernorm": "ffn_norm",
        "post_feedforward_layernorm": "post_ffw_norm",
    }
    for key, value in sd.items():
        if not key.startswith("model.layers."):
            continue
        _, _, layer, rest = key.split(".", 3)
        module, leaf = rest.rsplit(".", 1)
        name = f"blk.{layer}.{names[module]}.{leaf}"
        if GGUF_ARCH[arch] == "llama" and module in ("self_attn.q_proj", "self_attn.k_proj"):
            heads = config.num_attention_heads if "q_proj" in module else config.num_key_value_heads
            value = _permute_llama(value, heads)
        if "norm" in module:
            value = norm(value)
        out[name] = value
    return out


def _llama3_divisors(config: Any) -> np.ndarray:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](config)
    dim = config.head_dim
    base = 1.0 / (config.rope_parameters["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    return (base / scaled.numpy()).astype(np.float32)


def write_gguf(arch: str, model: Any, path: Path) -> Path:
    """Write `model` (a tiny HF model of `arch`) as a float32 GGUF file with llama.cpp's layout."""
    import gguf

    config = model.config
    name = GGUF_ARCH[arch]
    writer = gguf.GGUFWriter(path, name)
    writer.add_vocab_size(config.vocab_size)
    if arch == "gpt2_gguf":
        writer.add_block_count(config.n_layer)
        writer.add_context_length(config.n_positions)
        writer.add_embedding_length(config.n_embd)
        writer.add_feed_forward_length(4 * config.n_embd)
        writer.add_head_count(config.n_head)
        writer.add_layer_norm_eps(config.layer_norm_epsilon)
    else:
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        rope = config.rope_parameters
        rope = rope.get("full_attention", rope)
        writer.add_block_count(config.num_hidden_layers)
        writer.add_context_length(config.max_position_embeddings)
        writer.add_embedding_length(config.hidden_size)
        writer.add_feed_forward_length(config.intermediate_size)
        writer.add_head_count(config.num_attention_heads)
        writer.add_head_count_kv(config.num_key_value_heads)
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
        writer.add_layer_norm_rms_eps(config.rms_norm_eps)
        writer.add_rope_freq_base(rope["rope_theta"])
        writer.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 1.0)))
        if arch in ("gemma3_gguf", "gemma2_gguf"):
            writer.add_sliding_window(config.sliding_window)
        if arch == "gemma2_gguf":
            writer.add_attn_logit_softcapping(config.attn_logit_softcapping)
            writer.add_final_logit_softcapping(config.final_logit_softcapping)
        if rope["rope_type"] == "linear":
            writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            writer.add_rope_scaling_factor(rope["factor"])
        if rope["rope_type"] == "yarn":
            writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
            writer.add_rope_scaling_factor(rope["factor"])
            writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        if rope["rope_type"] == "longrope":  # as convert_hf_to_gguf.py: factors as tensors
            original = config.original_max_position_embeddings
            factor = config.max_position_embeddings / original
            writer.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(factor) / math.log(original)))
            writer.add_rope_scaling_orig_ctx_len(original)
            writer.add_tensor("rope_factors_long.weight", np.asarray(rope["long_factor"], np.float32))
            writer.add_tensor("rope_factors_short.weight", np.asarray(rope["short_factor"], np.float32))
        if rope["rope_type"] == "llama3":  # llama.cpp stores the per-frequency divisors instead
            writer.add_tensor("rope_freqs.weight", _llama3_divisors(config))
    for tensor_name, array in _gguf_tensors(arch, model).items():
        writer.add_tensor(tensor_name, np.ascontiguousarray(array, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# ---------------------------------------------------------------------------------------------
# A tiny GPT-2-style byte-level BPE tokenizer whose ids fit the tiny models' vocabulary: pad,
# bos, eos at ids 0-2 (as in the tiny configs), the letters, space and '.', and a few merges so
# that strings have several tokenizations (what the byte-level LM sums over).

TOKENIZER_MERGES = (("a", "b"), ("\u0120", "a"), ("b", "a"), ("\u0120", "b"))


def save_tokenizer(directory: Path) -> Any:
    """Save the tiny tokenizer into `directory` (next to a tiny checkpoint); return it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    pieces = ["<pad>", "<bos>", "<eos>", *"abcdefghijklmnopqrstuvwxyz", "\u0120", "."]
    pieces += ["".join(pair) for pair in TOKENIZER_MERGES]
    vocab = {piece: index for index, piece in enumerate(pieces)}
    assert len(vocab) <= VOCAB
    backend = Tokenizer(models.BPE(vocab=vocab, merges=list(TOKENIZER_MERGES)))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>"
    )
    tokenizer.save_pretrained(directory)
    return tokenizer
