"""A byte vocabulary kept on disk reads back as the one built, and is rebuilt when its tokenizer changes."""

import dataclasses
import os

import numpy as np

from smc_jax.bytes.trie import TokenTrie
from smc_jax.bytes.vocab import token_byte_strings
from smc_jax.experts.stored_vocab import entry_of, stored_vocabulary
from tests.helpers.tiny_checkpoints import VOCAB, save_tokenizer


def _load(directory):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory))


def _build(tokenizer, calls):
    def build():
        calls.append(1)
        byte_strings = token_byte_strings(tokenizer, vocab_size=VOCAB).byte_strings
        return TokenTrie.build(byte_strings), byte_strings

    return build


def test_stored_vocabulary_reads_back_the_built_one(tmp_path, monkeypatch):
    monkeypatch.setenv("SMC_JAX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SMC_JAX_NO_CACHE", raising=False)
    save_tokenizer(tmp_path / "tok")
    tokenizer, calls = _load(tmp_path / "tok"), []
    trie, byte_strings = stored_vocabulary(tokenizer, VOCAB, _build(tokenizer, calls))
    entry = entry_of(tokenizer, VOCAB)
    assert calls == [1] and entry is not None and entry.exists()
    again, again_strings = stored_vocabulary(tokenizer, VOCAB, _build(tokenizer, calls))
    assert calls == [1]  # read back, not built
    assert again_strings == byte_strings and any(b is None for b in byte_strings)
    for field in dataclasses.fields(TokenTrie):
        want, got = getattr(trie, field.name), getattr(again, field.name)
        assert type(got) is type(want), field.name
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=field.name)
    # another vocabulary size, or a changed tokenizer file, is another entry
    assert entry_of(tokenizer, VOCAB + 1) != entry
    config = tmp_path / "tok" / "tokenizer_config.json"
    os.utime(config, ns=(config.stat().st_atime_ns, config.stat().st_mtime_ns + 10**9))
    assert entry_of(tokenizer, VOCAB) != entry
    stored_vocabulary(tokenizer, VOCAB, _build(tokenizer, calls))
    assert calls == [1, 1]


def test_unreadable_entry_is_rebuilt_and_no_directory_is_not_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("SMC_JAX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SMC_JAX_NO_CACHE", raising=False)
    save_tokenizer(tmp_path / "tok")
    tokenizer, calls = _load(tmp_path / "tok"), []
    entry = entry_of(tokenizer, VOCAB)
    entry.parent.mkdir(parents=True)
    entry.write_bytes(b"not an archive")
    _, byte_strings = stored_vocabulary(tokenizer, VOCAB, _build(tokenizer, calls))
    assert calls == [1]
    assert stored_vocabulary(tokenizer, VOCAB, _build(tokenizer, calls))[1] == byte_strings and calls == [1]
    in_memory = save_tokenizer(tmp_path / "other")  # built in memory: no directory of its own
    assert entry_of(in_memory, VOCAB) is None
    monkeypatch.setenv("SMC_JAX_NO_CACHE", "1")
    assert entry_of(tokenizer, VOCAB) is None
