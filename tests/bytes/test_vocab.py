"""Token byte strings: toy tokenizers of both schemes, then facts about the two real tokenizers."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from smc_jax.bytes.vocab import (
    NUM_BYTES,
    TokenizerScheme,
    TokenKind,
    detect_scheme,
    gpt2_bytes_to_unicode,
    token_byte_strings,
)

#: Pieces a round-trip text is drawn from: ASCII, accents, emoji (with a modifier), CJK, and runs
#: of newlines, tabs and spaces (Gemma has dedicated tokens for the runs).
TEXT_PIECES = [
    "hello", " world", "The", " quick", "fox", ",", ".", "?", "42", "x=1;", "é", "naïve", "façade",
    "Ünïcödé", "😀", "🎉", "👍🏽", "中文", "字符", "測試", "日本語", "\n", "\n\n", "\n\n\n\n",
    "\t", "\t\t\t", "  ", "    ", " ", "\r\n", "<b>", "\u00a0", "ß", "€",
]


def random_texts(seed: int, count: int, max_pieces: int = 12) -> list[str]:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, max_pieces + 1, size=count)
    return ["".join(rng.choice(TEXT_PIECES, size=size)) for size in sizes]


def assert_round_trip(tokenizer, vocab, texts) -> None:
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert b"".join(vocab.byte_strings[i] for i in ids) == text.encode("utf-8"), (text, ids)


def byte_level_toy() -> PreTrainedTokenizerFast:
    """GPT-2-style BPE: the 256 byte characters, two merges, EOS, one text added token."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {char: index for index, char in enumerate(alphabet)}
    vocab.update({"ab": len(vocab), "\u0120a": len(vocab) + 1})  # '\u0120' spells b' '
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b"), ("\u0120", "a")]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>")
    tokenizer.add_tokens(["<table>"])
    return tokenizer


def sentencepiece_toy() -> PreTrainedTokenizerFast:
    """Gemma-style BPE with byte fallback; '\\n' is both '<0x0A>' and a user-defined token."""
    vocab = {"<unk>": 0, "<eos>": 1}
    vocab.update({f"<0x{byte:02X}>": 2 + byte for byte in range(NUM_BYTES)})
    for piece in ["\u2581", "a", "b", "\u2581a", "ab", "é"]:
        vocab[piece] = len(vocab)
    backend = Tokenizer(
        models.BPE(vocab=vocab, merges=[("\u2581", "a"), ("a", "b")], byte_fallback=True, unk_token="<unk>")
    )
    backend.normalizer = normalizers.Replace(" ", "\u2581")
    backend.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", unk_token="<unk>")
    tokenizer.add_tokens(["\n", "<start_of_image>"])
    return tokenizer


def test_gpt2_alphabet_is_the_tokenizers_one():
    mapping = gpt2_bytes_to_unicode()
    assert sorted(mapping) == list(range(NUM_BYTES))
    assert set(mapping.values()) == set(pre_tokenizers.ByteLevel.alphabet())
    assert mapping[ord(" ")] == "\u0120" and mapping[ord("A")] == "A"


def test_byte_level_toy():
    tokenizer = byte_level_toy()
    vocab = token_byte_strings(tokenizer, vocab_size=len(tokenizer) + 3)
    assert vocab.scheme is TokenizerScheme.BYTE_LEVEL
    ids = tokenizer.convert_tokens_to_ids(["ab", "\u0120a", "\u0120", "<table>", "<eos>"])
    assert [vocab.byte_strings[i] for i in ids] == [b"ab", b" a", b" ", b"<table>", None]
    assert [vocab.kinds[i] for i in ids] == [
        TokenKind.NORMAL, TokenKind.NORMAL, TokenKind.NORMAL, TokenKind.TEXT_SPECIAL, TokenKind.CONTROL,
    ]
    padding = range(len(tokenizer), vocab.vocab_size)
    assert all(vocab.byte_strings[i] is None and vocab.kinds[i] == TokenKind.CONTROL for i in padding)
    assert_round_trip(tokenizer, vocab, random_texts(seed=0, count=20) + ["ab a<table>ab"])


def test_sentencepiece_toy_with_duplicates_and_placeholders():
    tokenizer = sentencepiece_toy()
    vocab = token_byte_strings(tokenizer)
    assert vocab.scheme is TokenizerScheme.SENTENCEPIECE
    newline_ids = [i for i, data in enumerate(vocab.byte_strings) if data == b"\n"]
    assert sorted(vocab.kinds[newline_ids].tolist()) == [TokenKind.NORMAL, TokenKind.TEXT_SPECIAL]
    for name in ["<start_of_image>", "<unk>", "<eos>"]:
        token_id = tokenizer.convert_tokens_to_ids(name)
        assert vocab.byte_strings[token_id] is None and vocab.kinds[token_id] == TokenKind.CONTROL
    space_a = tokenizer.convert_tokens_to_ids("\u2581a")
    assert vocab.byte_strings[space_a] == b" a"
    assert vocab.byte_strings[tokenizer.convert_tokens_to_ids("<0xF0>")] == b"\xf0"
    assert_round_trip(tokenizer, vocab, random_texts(seed=1, count=20))


def sequence_decoder_toy() -> PreTrainedTokenizerFast:
    """The 256 GPT-2 byte characters with a decoder Sequence(ByteFallback, Fuse, Replace,
    ByteLevel): how transformers 5.17 converts SmolLM2's GGUF tokenizer (seen on the GPU machine)."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE(vocab={char: index for index, char in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse(), decoders.Replace("\u2581", " "),
                                         decoders.ByteLevel()])
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>")


def test_byte_level_decoder_inside_a_sequence():
    """A ByteLevel step inside a decoder Sequence is still GPT-2's byte alphabet, same byte strings."""
    wrapped = sequence_decoder_toy()
    assert detect_scheme(wrapped) is TokenizerScheme.BYTE_LEVEL
    vocab = token_byte_strings(wrapped)
    assert vocab.byte_strings[wrapped.convert_tokens_to_ids("\u0120")] == b" "
    assert sorted(data for data in vocab.byte_strings if data is not None and len(data) == 1) == [
        bytes([b]) for b in range(NUM_BYTES)]


def test_unknown_scheme_and_bad_sizes_raise():
    backend = Tokenizer(models.WordLevel(vocab={"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    backend.decoder = decoders.WordPiece()
    with pytest.raises(ValueError, match="unknown tokenizer byte scheme"):
        detect_scheme(PreTrainedTokenizerFast(tokenizer_object=backend))
    tokenizer = byte_level_toy()
    with pytest.raises(ValueError, match="vocab_size"):
        token_byte_strings(tokenizer, vocab_size=len(tokenizer) - 1)


@pytest.mark.real_model
def test_smollm2_facts(smollm2_tokenizer, smollm2_vocab):
    vocab = smollm2_vocab
    assert vocab.scheme is TokenizerScheme.BYTE_LEVEL and vocab.vocab_size == 49_152
    kinds = collections.Counter(vocab.kinds.tolist())
    assert kinds == {TokenKind.NORMAL: 49_135, TokenKind.CONTROL: 17}
    byte_strings = [data for data in vocab.byte_strings if data is not None]
    assert len(set(byte_strings)) == len(byte_strings)
    assert max(map(len, byte_strings)) == 81
    single = {data[0] for data in byte_strings if len(data) == 1}
    missing = [0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xC0, 0xC1, 0xF1, 0xF2, *range(0xF5, 0x100)]
    assert sorted(set(range(NUM_BYTES)) - single) == missing
    for token_id in (smollm2_tokenizer.bos_token_id, smollm2_tokenizer.eos_token_id):
        assert vocab.kinds[token_id] == TokenKind.CONTROL
    assert_round_trip(smollm2_tokenizer, vocab, random_texts(seed=2, count=40))


@pytest.mark.real_model
def test_gemma_facts(gemma_tokenizer, gemma_vocab):
    vocab = gemma_vocab
    assert vocab.scheme is TokenizerScheme.SENTENCEPIECE and vocab.vocab_size == 262_144
    control = np.flatnonzero(vocab.kinds == TokenKind.CONTROL)
    special = {i for i, added in gemma_tokenizer.added_tokens_decoder.items() if added.special}
    assert len(special) == 6_249
    placeholders = {gemma_tokenizer.convert_tokens_to_ids(name) for name in ["[multimodal]", "<start_of_image>", "<end_of_image>"]}
    assert set(control.tolist()) == special | placeholders
    assert all(vocab.byte_strings[i] is None for i in control)
    text_special = [vocab.byte_strings[i] for i in np.flatnonzero(vocab.kinds == TokenKind.TEXT_SPECIAL)]
    assert b"\n\n" in text_special and b"\t" in text_special and b"<table>" in text_special
    counts = collections.Counter(data for data in vocab.byte_strings if data is not None)
    assert sorted(collections.Counter(counts.values()).items()) == [(1, 262_144 - 6_252 - 220), (2, 110)]
    assert counts[b"\n"] == 2
    for byte in range(NUM_BYTES):
        assert vocab.byte_strings[gemma_tokenizer.convert_tokens_to_ids(f"<0x{byte:02X}>")] == bytes([byte])
    for token_id in (gemma_tokenizer.bos_token_id, gemma_tokenizer.eos_token_id, gemma_tokenizer.pad_token_id):
        assert vocab.kinds[token_id] == TokenKind.CONTROL
    assert_round_trip(gemma_tokenizer, vocab, random_texts(seed=3, count=40))
