"""Load a Hugging Face checkpoint directory: config.json + safetensors (one file or sharded).

Tensors are memory-mapped straight from the files (the safetensors header gives each tensor's
dtype, shape and byte range), so bfloat16 checkpoints load without torch and tensors that no rule
maps are never read.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import ml_dtypes
import numpy as np

from smc_jax.models.config_parsing import from_hf_config
from smc_jax.models.config import ModelConfig
from smc_jax.models.mapping import TensorSource, convert, hf_table

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
HEADER_SIZE_BYTES = 8  # little-endian u64 length of the JSON header

_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}


def read_hf_config(directory: Path) -> dict:
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {CONFIG_FILE} in {directory}: not a Hugging Face model directory")
    return json.loads(path.read_text())


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files of a checkpoint: the shards named by the index, or the single file."""
    index = directory / INDEX_FILE
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [directory / shard for shard in shards]
    elif (directory / SINGLE_FILE).is_file():
        files = [directory / SINGLE_FILE]
    else:
        found = sorted(p.name for p in directory.iterdir())
        raise FileNotFoundError(
            f"no {SINGLE_FILE} or {INDEX_FILE} in {directory} (found: {', '.join(found)}); only "
            "safetensors checkpoints are supported"
        )
    absent = [str(f) for f in files if not f.is_file()]
    if absent:
        raise FileNotFoundError(f"shards listed in {index} are missing: {', '.join(absent)}")
    return files


def tensors_in_file(path: Path) -> Iterator[tuple[str, tuple[int, ...], object]]:
    """(name, shape, loader) for every tensor of one safetensors file, memory-mapped."""
    with path.open("rb") as f:
        (header_size,) = struct.unpack("<Q", f.read(HEADER_SIZE_BYTES))
        header = json.loads(f.read(header_size))
    data_start = HEADER_SIZE_BYTES + header_size
    header.pop("__metadata__", None)
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    for name, info in header.items():
        if info["dtype"] not in _DTYPES:
            raise ValueError(f"tensor {name!r} in {path} has unsupported dtype {info['dtype']}")
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        dtype = _DTYPES[info["dtype"]]

        def load(begin: int = begin, end: int = end, dtype: type = dtype, shape: tuple = shape) -> np.ndarray:
            return mapped[data_start + begin : data_start + end].view(dtype).reshape(shape)

        yield name, shape, load


def load_hf_checkpoint(directory: str | Path) -> tuple[ModelConfig, dict[str, np.ndarray]]:
    """ModelConfig and flat params (host arrays, checkpoint dtype) from a local HF directory."""
    directory = Path(directory)
    config = from_hf_config(read_hf_config(directory))

    def all_tensors() -> TensorSource:
        for path in weight_files(directory):
            yield from tensors_in_file(path)

    return config, convert(all_tensors(), hf_table(config), config, source=str(directory))
