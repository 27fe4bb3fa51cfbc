"""Flax/JAX ports of decoder-only language models (Llama, Qwen2, Phi-3, Gemma 3, GPT-2).

    model = load_model("smollm2-135m-instruct")          # or a directory, a .gguf file, a hub id
    prefix, logits = model.prefill(model.encode_prompt("The capital of France is"))
"""

from smc_jax.models.cache import CacheCapacityError, KVCache, PrefixCache
from smc_jax.models.config import ModelConfig, RopeConfig, UnsupportedArchitectureError
from smc_jax.models.lm import LanguageModel
from smc_jax.models.mapping import CheckpointError
from smc_jax.models.registry import MissingPackageError, UnknownModelError, known_names, load_model
from smc_jax.models.tokenizer import NoChatTemplateError, Tokenizer

__all__ = [
    "CacheCapacityError",
    "CheckpointError",
    "KVCache",
    "LanguageModel",
    "MissingPackageError",
    "ModelConfig",
    "NoChatTemplateError",
    "PrefixCache",
    "RopeConfig",
    "Tokenizer",
    "UnknownModelError",
    "UnsupportedArchitectureError",
    "known_names",
    "load_model",
]
