"""Load a GGUF file (llama.cpp format): metadata -> ModelConfig, tensors dequantized to float32.

`gguf.quants.dequantize` returns arrays already in HF's [out, in] orientation (GGUF lists
dimensions in reverse). What differs from HF checkpoints is handled by `mapping.gguf_table`:
llama.cpp's Q/K row permutation for the llama architecture and Gemma's norms stored as w + 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np

from smc_jax.models.config import ModelConfig
from smc_jax.models.mapping import convert, gguf_table

TOKENIZER_PREFIX = "tokenizer."  # large arrays (the vocabulary) we leave to transformers
ROPE_FREQS = "rope_freqs.weight"
# llama.cpp's form of LongRoPE (Phi-3.5, Phi-4-mini): the per-frequency factors as tensors.
ROPE_FACTORS = {"rope_factors_long": "rope_factors_long.weight", "rope_factors_short": "rope_factors_short.weight"}


def _metadata(reader: gguf.GGUFReader) -> dict[str, Any]:
    """Scalar and small-array metadata (everything except the tokenizer's arrays)."""
    meta = {}
    for key, field in reader.fields.items():
        if key.startswith(TOKENIZER_PREFIX) and field.types and field.types[0] == gguf.GGUFValueType.ARRAY:
            continue
        meta[key] = field.contents()
    return meta


def _dequantize(tensor: gguf.gguf_reader.ReaderTensor) -> np.ndarray:
    return np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), np.float32)


def load_gguf_checkpoint(path: str | Path) -> tuple[ModelConfig, dict[str, np.ndarray], dict[str, Any]]:
    """ModelConfig, flat float32 params and the metadata of a GGUF file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {path}")
    reader = gguf.GGUFReader(path)
    meta = _metadata(reader)
    tensors = {t.name: t for t in reader.tensors}
    shapes = {name: tuple(int(n) for n in reversed(t.shape)) for name, t in tensors.items()}
    if ROPE_FREQS in tensors:  # llama.cpp's form of Llama 3.1 RoPE scaling: per-frequency divisors
        meta["rope_freqs"] = _dequantize(tensors[ROPE_FREQS]).tolist()
    for key, name in ROPE_FACTORS.items():
        if name in tensors:
            meta[key] = _dequantize(tensors[name]).tolist()
    config = ModelConfig.from_gguf_metadata(meta, shapes)
    source = ((name, shapes[name], lambda t=t: _dequantize(t)) for name, t in tensors.items())
    return config, convert(source, gguf_table(config), config, source=str(path)), meta
