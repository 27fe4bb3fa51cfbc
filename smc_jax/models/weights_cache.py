"""On-disk cache of converted checkpoints, so a GGUF file is parsed and dequantized only once.

Opening Gemma 3's GGUF file parses 262k token strings (~13 s), its tokenizer conversion takes as
long again, and dequantizing takes ~3 s. An entry stores the result instead: the float32 params as
one safetensors file (memory-mapped when read back: ~1 s for Gemma's 1 GiB), the ModelConfig and
eos ids as JSON and the tokenizer as `save_pretrained` files. Entries live in `$SMC_JAX_CACHE_DIR` (default ~/.cache/smc_jax), are keyed on the source
file's name, size and modification time and on a digest of the converting code (so a change to
the mapping tables or the config invalidates old entries), and are written to a
temporary folder that is renamed into place, so a reader never sees a half-written entry and two
writers cannot corrupt each other. Set SMC_JAX_NO_CACHE=1 to bypass the cache.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.numpy

from smc_jax.models.config import ModelConfig
from smc_jax.models.safetensors_loader import tensors_in_file
from smc_jax.utils.compilation import use_persistent_cache

CACHE_DIR_ENV = "SMC_JAX_CACHE_DIR"
NO_CACHE_ENV = "SMC_JAX_NO_CACHE"
DEFAULT_CACHE_DIR = Path("~/.cache/smc_jax")
FORMAT_VERSION = 1
PARAMS_FILE = "params.safetensors"
META_FILE = "meta.json"
TOKENIZER_DIR = "tokenizer"

log = logging.getLogger(__name__)


@dataclass
class Converted:
    """A checkpoint converted to this package's layout (host arrays)."""

    config: ModelConfig
    flat_params: dict[str, np.ndarray]
    hf_tokenizer: Any | None
    eos_token_ids: tuple[int, ...]


def cache_enabled() -> bool:
    return os.environ.get(NO_CACHE_ENV, "") not in ("1", "true", "yes")


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_DIR_ENV, DEFAULT_CACHE_DIR)).expanduser()


#: Where the compiled programs are kept, under `cache_root()`.
XLA_CACHE_SUBDIR = "xla"


def keep_compiled_programs() -> bool:
    """XLA's compiled programs persist in `$SMC_JAX_CACHE_DIR/xla` (default
    ~/.cache/smc_jax/xla; none with SMC_JAX_NO_CACHE=1), beside the converted checkpoints: a new
    process that builds a program of the same shapes and settings loads it instead of compiling
    it. `import smc_jax` calls this; a cache directory the user chose is left alone.

    Returns
    -------
    bool
        Whether the cache directory was set here.
    """
    return cache_enabled() and use_persistent_cache(cache_root() / XLA_CACHE_SUBDIR)


# The modules whose code determines a conversion's result.
_CONVERTING_MODULES = ("config", "config_parsing", "params", "mapping", "gguf_loader", "registry", "weights_cache")
DIGEST_CHARS = 12


@functools.cache
def code_digest() -> str:
    """Short SHA-256 of the converting modules' source files."""
    digest = hashlib.sha256(str(FORMAT_VERSION).encode())
    package = Path(__file__).parent
    for module in _CONVERTING_MODULES:
        digest.update((package / f"{module}.py").read_bytes())
    return digest.hexdigest()[:DIGEST_CHARS]


def entry_path(source: Path, name: str) -> Path:
    """Where the conversion of `source` is cached: changes whenever the file or the code changes."""
    stat = source.stat()
    return cache_root() / f"{_safe(name)}-{stat.st_size}-{stat.st_mtime_ns}-{code_digest()}"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def _tokenizer(directory: Path) -> Any:
    """The saved tokenizer. A tokenizer.json holds the whole pipeline: the generic class reads it
    as the model's own class would, without that class's rebuild (1.5 s for Gemma 3) or
    AutoTokenizer's import of torch (2 s)."""
    if (directory / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(directory)
    from transformers import AutoTokenizer  # a tokenizer without a `tokenizers` pipeline

    return AutoTokenizer.from_pretrained(directory)


def _read(entry: Path) -> Converted:
    meta = json.loads((entry / META_FILE).read_text())
    tokenizer_dir = entry / TOKENIZER_DIR
    return Converted(
        config=ModelConfig.from_dict(meta["config"]),
        flat_params={name: load() for name, _, load in tensors_in_file(entry / PARAMS_FILE)},
        hf_tokenizer=_tokenizer(tokenizer_dir) if tokenizer_dir.is_dir() else None,
        eos_token_ids=tuple(meta["eos_token_ids"]),
    )


def _write(entry: Path, converted: Converted, source: Path) -> None:
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.tmp-", dir=entry.parent))
    try:
        flat = {k: np.ascontiguousarray(v) for k, v in converted.flat_params.items()}
        safetensors.numpy.save_file(flat, tmp / PARAMS_FILE)
        if converted.hf_tokenizer is not None:
            converted.hf_tokenizer.save_pretrained(tmp / TOKENIZER_DIR)
        meta = {
            "format_version": FORMAT_VERSION,
            "source": str(source),
            "config": converted.config.to_dict(),
            "eos_token_ids": list(converted.eos_token_ids),
        }
        (tmp / META_FILE).write_text(json.dumps(meta, indent=1))
        os.rename(tmp, entry)  # atomic; fails if another process stored the entry first
    except OSError:
        if not entry.is_dir():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _remove_stale(entry: Path, name: str) -> None:
    """Drop entries of older versions of the same source file (same name, other size/mtime)."""
    pattern = re.compile(re.escape(name) + r"-\d+-\d+-[0-9a-f]{%d}" % DIGEST_CHARS)
    for other in entry.parent.iterdir():
        if other != entry and other.is_dir() and pattern.fullmatch(other.name):
            shutil.rmtree(other, ignore_errors=True)


def cached_conversion(source: Path, name: str, convert: Callable[[], Converted]) -> Converted:
    """`convert()`, or its stored result for this exact `source` file."""
    if not cache_enabled():
        return convert()
    entry = entry_path(source, name)
    if entry.is_dir():
        try:
            return _read(entry)
        except Exception as error:  # a damaged entry: convert again and replace it
            log.warning("ignoring damaged cache entry %s (%s)", entry, error)
            shutil.rmtree(entry, ignore_errors=True)
    converted = convert()
    try:
        _write(entry, converted, source)
        _remove_stale(entry, _safe(name))
    except OSError as error:  # a read-only or full disk must not stop the load
        log.warning("could not cache the converted weights in %s (%s)", entry, error)
    return converted
