"""Byte vocabularies: the exact byte string of every token id of a Hugging Face tokenizer.

A token LM is a byte LM once every token id t has a byte string b(t): the LM's probability of a
byte string x is the sum over token sequences whose concatenated byte strings equal x (paper
App. B). This module computes b(t) from the tokenizer's own decoding rules:

* GPT-2 byte-level BPE (GPT-2, SmolLM2, Llama 3, Qwen2): a token's string form spells its bytes
  in GPT-2's printable alphabet; invert `gpt2_bytes_to_unicode`.
* SentencePiece with byte fallback (Gemma): '\u2581' stands for a space, '<0xNN>' is the raw
  byte NN, anything else is UTF-8.

The scheme is read from the backend's decoder (not from a model name); any other decoder raises.
Added (user-defined) tokens that are not special match their text verbatim in `encode`, so their
bytes are their UTF-8 text (kind TEXT_SPECIAL, e.g. Gemma's runs of '\n' and '\t'). Special
tokens, the tokenizer's BOS/EOS/PAD/UNK, known multimodal placeholders and the padding ids past
the tokenizer's length have no bytes (kind CONTROL, byte string None).

Several ids may share one byte string (Gemma: '\n' is both a user-defined token and '<0x0A>').
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from collections.abc import Collection
from typing import Any

import numpy as np
from jaxtyping import Int8

#: Number of distinct byte values.
NUM_BYTES = 256

#: SentencePiece's visible space ('LOWER ONE EIGHTH BLOCK'), which decodes to b' '.
SENTENCEPIECE_SPACE = "\u2581"

#: SentencePiece byte-fallback pieces: '<0xNN>' is the single raw byte 0xNN.
BYTE_FALLBACK_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")

#: Added tokens that tokenizers mark as non-special although they only stand in for non-text
#: inputs (Gemma 3's image placeholders: user-defined, not special, in both GGUF and HF). They
#: are CONTROL by default; pass `extra_control_tokens` to change the set.
MULTIMODAL_PLACEHOLDER_TOKENS = frozenset({"[multimodal]", "<start_of_image>", "<end_of_image>"})


class TokenKind(enum.IntEnum):
    """What a token id stands for, as far as bytes are concerned."""

    NORMAL = 0  # a piece of the tokenizer's model: plain text bytes
    TEXT_SPECIAL = 1  # an added token that stands for its text (e.g. Gemma's '\n\n')
    CONTROL = 2  # no bytes: special/control tokens, BOS/EOS, placeholders, padding ids


class TokenizerScheme(enum.Enum):
    """How a tokenizer's token strings spell bytes."""

    BYTE_LEVEL = "byte_level"  # GPT-2 bytes_to_unicode alphabet
    SENTENCEPIECE = "sentencepiece"  # '\u2581' = space, '<0xNN>' = byte NN, else UTF-8


@dataclasses.dataclass(frozen=True)
class ByteVocab:
    """Byte string and kind of every token id 0..vocab_size-1 (None for CONTROL tokens).

    Attributes
    ----------
    byte_strings : tuple of bytes or None
        The bytes of every token id 0..V-1 (None for control tokens).
    kinds : numpy.ndarray, shape [V], int8
        The `TokenKind` of every token id.
    scheme : TokenizerScheme
        How the tokenizer spells bytes.
    """

    byte_strings: tuple[bytes | None, ...]
    kinds: Int8[np.ndarray, "V"]  # TokenKind values
    scheme: TokenizerScheme

    @property
    def vocab_size(self) -> int:
        return len(self.byte_strings)


def gpt2_bytes_to_unicode() -> dict[int, str]:
    """GPT-2's bijection from bytes to printable characters.

    Bytes that are printable and not whitespace in Latin-1 ('!'..'~', '\u00a1'..'\u00ac',
    '\u00ae'..'\u00ff') map to the character with the same code point; the remaining 68 bytes
    map, in increasing order, to the code points 256, 257, ...
    """
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("\u00a1"), ord("\u00ac") + 1),
        *range(ord("\u00ae"), ord("\u00ff") + 1),
    ]
    printable_set = set(printable)
    others = [b for b in range(NUM_BYTES) if b not in printable_set]
    mapping = {b: chr(b) for b in printable}
    mapping.update({b: chr(NUM_BYTES + n) for n, b in enumerate(others)})
    return mapping


def _backend_component(component: Any) -> dict[str, Any]:
    """A `tokenizers` component (decoder, model...) as its JSON description."""
    return json.loads(component.__getstate__())


def _is_sentencepiece_decoder(decoder: dict[str, Any]) -> bool:
    """Replace('\u2581' -> ' '), ByteFallback and Fuse in a Sequence (Gemma's decoder)."""
    if decoder.get("type") != "Sequence":
        return False
    steps = decoder["decoders"]
    types = [step["type"] for step in steps]
    replaces = [step for step in steps if step["type"] == "Replace"]
    return (
        sorted(types) == ["ByteFallback", "Fuse", "Replace"]
        and replaces[0]["pattern"] == {"String": SENTENCEPIECE_SPACE}
        and replaces[0]["content"] == " "
    )


def detect_scheme(tokenizer: Any) -> TokenizerScheme:
    """Reads the byte scheme from the tokenizer's backend decoder; raises on anything else.

    Parameters
    ----------
    tokenizer : tokenizers or transformers tokenizer
        The Hugging Face tokenizer.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or backend.decoder is None:
        raise ValueError(
            f"{type(tokenizer).__name__} has no `tokenizers` backend with a decoder: cannot "
            "derive token byte strings"
        )
    decoder = _backend_component(backend.decoder)
    steps = decoder.get("decoders", []) if decoder.get("type") == "Sequence" else [decoder]
    # Some transformers versions convert a GGUF's GPT-2 tokenizer with ByteFallback/Fuse/Replace
    # steps before ByteLevel; the GPT-2 byte alphabet still decides every piece (a piece outside
    # it raises in `_byte_level_bytes`).
    if any(step.get("type") == "ByteLevel" for step in steps):
        return TokenizerScheme.BYTE_LEVEL
    if _is_sentencepiece_decoder(decoder):
        return TokenizerScheme.SENTENCEPIECE
    raise ValueError(f"unknown tokenizer byte scheme (decoder {decoder!r})")


def _byte_level_bytes(piece: str, byte_decoder: dict[str, int]) -> bytes:
    try:
        return bytes(byte_decoder[char] for char in piece)
    except KeyError as missing:
        raise ValueError(f"token {piece!r} has a character {missing} outside GPT-2's byte alphabet") from None


def _sentencepiece_bytes(piece: str) -> bytes:
    byte_piece = BYTE_FALLBACK_PIECE.fullmatch(piece)
    if byte_piece is not None:
        return bytes([int(byte_piece.group(1), 16)])
    return piece.replace(SENTENCEPIECE_SPACE, " ").encode("utf-8")


def token_byte_strings(
    tokenizer: Any,
    vocab_size: int | None = None,
    extra_control_tokens: Collection[str] = MULTIMODAL_PLACEHOLDER_TOKENS,
) -> ByteVocab:
    """The byte string and kind of every token id of a Hugging Face (fast) tokenizer.

    Args:
      tokenizer: a `transformers` tokenizer with a `tokenizers` backend.
      vocab_size: the model's number of token ids (its embedding rows); ids from len(tokenizer)
        to vocab_size - 1 are padding (CONTROL). Defaults to len(tokenizer).
      extra_control_tokens: contents of non-special added tokens that are CONTROL anyway.
    """
    scheme = detect_scheme(tokenizer)
    num_tokenizer_ids = len(tokenizer)
    vocab_size = num_tokenizer_ids if vocab_size is None else vocab_size
    if vocab_size < num_tokenizer_ids:
        raise ValueError(f"vocab_size {vocab_size} < the tokenizer's {num_tokenizer_ids} ids")

    control_ids = set(tokenizer.all_special_ids)
    text_added: dict[int, str] = {}
    for token_id, added in tokenizer.added_tokens_decoder.items():
        if added.special or added.content in extra_control_tokens:
            control_ids.add(token_id)
        else:
            text_added[token_id] = added.content

    pieces = tokenizer.convert_ids_to_tokens(list(range(num_tokenizer_ids)))
    byte_decoder = {char: byte for byte, char in gpt2_bytes_to_unicode().items()}
    byte_strings: list[bytes | None] = [None] * vocab_size
    kinds = np.full(vocab_size, TokenKind.CONTROL, dtype=np.int8)
    for token_id, piece in enumerate(pieces):
        if token_id in control_ids or piece is None:
            continue
        if token_id in text_added:
            data = text_added[token_id].encode("utf-8")
            kinds[token_id] = TokenKind.TEXT_SPECIAL
        else:
            if scheme is TokenizerScheme.BYTE_LEVEL:
                data = _byte_level_bytes(piece, byte_decoder)
            else:
                data = _sentencepiece_bytes(piece)
            kinds[token_id] = TokenKind.NORMAL
        if not data:
            raise ValueError(f"token {token_id} ({piece!r}) has an empty byte string")
        byte_strings[token_id] = data
    return ByteVocab(tuple(byte_strings), kinds, scheme)
