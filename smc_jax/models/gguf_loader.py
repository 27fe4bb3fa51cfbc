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

from smc_jax.models.config_parsing import from_gguf_metadata
from smc_jax.models.config import ModelConfig
from smc_jax.models.mapping import CheckpointError, convert, gguf_table

TOKENIZER_PREFIX = "tokenizer."  # large arrays (the vocabulary) we leave to transformers
ROPE_FREQS = "rope_freqs.weight"
# llama.cpp's form of LongRoPE (Phi-3.5, Phi-4-mini): the per-frequency factors as tensors.
ROPE_FACTORS = {"rope_factors_long": "rope_factors_long.weight", "rope_factors_short": "rope_factors_short.weight"}


class CorruptFileError(CheckpointError):
    """A GGUF file shorter than its own header says (an interrupted download or copy) or whose
    header cannot be parsed."""


class _CheckedReader(gguf.GGUFReader):
    """`gguf.GGUFReader` that says which tensor a truncated file lacks.

    The stock reader slices its memory map and reshapes; past the end of the file the slice is
    short and the user sees "cannot reshape array of size 25 into shape (8,4)". These overrides
    of the reader's private `_get` / `_build_tensors` check the sizes first; if a gguf release
    renames them, the wrapper in `_open` still turns the reshape error into a CorruptFileError.
    """

    def _get(self, offset, dtype, count=1, override_order=None):
        end = int(offset) + int(np.dtype(dtype).itemsize) * int(count)
        if end > len(self.data):
            raise CorruptFileError(
                f"file truncated/corrupt: expected {end - int(offset)} bytes at offset {int(offset)} of the "
                f"header, but the file has {len(self.data)} bytes"
            )
        return super()._get(offset, dtype, count, override_order)

    def _build_tensors(self, start_offs, fields):
        size = len(self.data)
        for field in fields:
            _, name, _, dims, raw_dtype, offset = field.parts
            block_size, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(int(raw_dtype[0]))]
            n_bytes = int(np.prod(dims)) * type_size // block_size
            start = int(start_offs + offset[0])
            if start + n_bytes > size:
                raise CorruptFileError(
                    f"file truncated/corrupt: expected {n_bytes} bytes for tensor {bytes(name).decode('utf-8', 'replace')} "
                    f"at offset {start}, but the file has {size} bytes"
                )
        return super()._build_tensors(start_offs, fields)


def _open(path: Path) -> gguf.GGUFReader:
    """The file's reader; a truncated or unparsable file raises `CorruptFileError`."""
    try:
        return _CheckedReader(path)
    except CorruptFileError as err:
        raise CorruptFileError(f"{path}: {err}") from None
    except (ValueError, IndexError, KeyError, UnicodeDecodeError) as err:
        raise CorruptFileError(f"{path}: file truncated/corrupt: {type(err).__name__}: {err}") from err


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
    reader = _open(path)
    meta = _metadata(reader)
    tensors = {t.name: t for t in reader.tensors}
    shapes = {name: tuple(int(n) for n in reversed(t.shape)) for name, t in tensors.items()}
    if ROPE_FREQS in tensors:  # llama.cpp's form of Llama 3.1 RoPE scaling: per-frequency divisors
        meta["rope_freqs"] = _dequantize(tensors[ROPE_FREQS]).tolist()
    for key, name in ROPE_FACTORS.items():
        if name in tensors:
            meta[key] = _dequantize(tensors[name]).tolist()
    config = from_gguf_metadata(meta, shapes)
    source = ((name, shapes[name], lambda t=t: _dequantize(t)) for name, t in tensors.items())
    return config, convert(source, gguf_table(config), config, source=str(path)), meta
