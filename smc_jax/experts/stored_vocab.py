"""A model's byte vocabulary (its tokens' byte strings and their trie) kept on disk.

Building it reads every token and sorts the byte strings: about 2 s for Gemma 3's 262,144 tokens,
in every process that reads a model at the byte level. A tokenizer loaded from a directory (a
converted checkpoint's, or a local Hugging Face one) is keyed on that directory, its files'
sizes and modification times, the vocabulary size and the building code, and its vocabulary is
kept in `$SMC_JAX_CACHE_DIR/vocab` (none with SMC_JAX_NO_CACHE=1). Other tokenizers are built
each time. Entries are written to a temporary file renamed into place: a reader never sees half
of one.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from smc_jax.bytes import trie as trie_module
from smc_jax.bytes import vocab as vocab_module
from smc_jax.bytes.trie import TokenTrie
from smc_jax.models.weights_cache import cache_enabled, cache_root

VOCAB_SUBDIR = "vocab"
FORMAT_VERSION = 1
#: Field names of the stored byte strings (the trie's fields are stored under their own names).
_BLOB, _LENGTHS = "_byte_blob", "_byte_lengths"

Built = tuple[TokenTrie, tuple[bytes | None, ...]]


@functools.cache
def _code_digest() -> str:
    digest = hashlib.sha256(str(FORMAT_VERSION).encode())
    for module in (trie_module, vocab_module):
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()


def entry_of(tokenizer: Any, vocab_size: int) -> Path | None:
    """Where the vocabulary of `tokenizer` is kept, or None where it is not kept (no cache, or a
    tokenizer not read from a directory).

    Parameters
    ----------
    tokenizer : transformers tokenizer
        Its `name_or_path` is the directory it was read from, if any.
    vocab_size : int
        The model's number of token ids.
    """
    folder = Path(str(getattr(tokenizer, "name_or_path", "") or ""))
    if not cache_enabled() or not folder.is_absolute() or not folder.is_dir():
        return None
    digest = hashlib.sha256(f"{folder.resolve()}|{vocab_size}|{_code_digest()}".encode())
    for file in sorted(folder.iterdir()):
        stat = file.stat()
        digest.update(f"|{file.name}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    return cache_root() / VOCAB_SUBDIR / f"{digest.hexdigest()[:24]}.npz"


def _save(path: Path, built: Built) -> None:
    trie, byte_strings = built
    arrays = {f.name: np.asarray(getattr(trie, f.name)) for f in dataclasses.fields(trie)}
    arrays[_BLOB] = np.frombuffer(b"".join(b or b"" for b in byte_strings), np.uint8)
    arrays[_LENGTHS] = np.array([-1 if b is None else len(b) for b in byte_strings], np.int64)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as f:
        np.savez(f, **arrays)
    os.replace(f.name, path)


def _load(path: Path) -> Built:
    with np.load(path) as stored:
        fields = {f.name: stored[f.name] for f in dataclasses.fields(TokenTrie)}
        blob, lengths = stored[_BLOB].tobytes(), stored[_LENGTHS]
    for f in dataclasses.fields(TokenTrie):  # arrays on the device as `TokenTrie.build` puts them
        static = not f.metadata.get("pytree_node", True)
        fields[f.name] = int(fields[f.name]) if static else jax.device_put(fields[f.name])
    ends = np.cumsum(np.maximum(lengths, 0)).tolist()
    starts = [0] + ends[:-1]
    byte_strings = tuple(None if n < 0 else blob[s:e] for n, s, e in zip(lengths.tolist(), starts, ends))
    return TokenTrie(**fields), byte_strings


def stored_vocabulary(tokenizer: Any, vocab_size: int, build: Callable[[], Built]) -> Built:
    """(trie, byte strings) of a tokenizer: read back where kept, else `build()` (then kept).

    Parameters
    ----------
    tokenizer : transformers tokenizer
        The tokenizer whose vocabulary `build` reads.
    vocab_size : int
        The model's number of token ids.
    build : callable
        () -> (TokenTrie, each id's bytes or None).
    """
    path = entry_of(tokenizer, vocab_size)
    if path is not None and path.exists():
        try:
            return _load(path)
        except (OSError, KeyError, ValueError, zipfile.BadZipFile):  # unreadable: build it again and replace it
            pass
    built = build()
    if path is not None:
        try:
            _save(path, built)
        except OSError:  # a read-only cache still builds
            pass
    return built
