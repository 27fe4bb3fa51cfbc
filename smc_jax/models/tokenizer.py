"""A thin wrapper over a Hugging Face tokenizer: ids in and out, chat template, stop tokens."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any


class NoChatTemplateError(ValueError):
    """The tokenizer has no chat template, so chat messages cannot be rendered."""


class InvalidPromptError(ValueError):
    """A prompt that is not text a tokenizer can read (not a str, not valid Unicode, or chat
    messages that are not {"role": ..., "content": str} mappings)."""


def check_prompt(prompt: Any, what: str = "prompt") -> None:
    """Raises `InvalidPromptError` unless `prompt` is text (encodable as UTF-8, so no lone
    surrogates such as "\\ud800") or a sequence of chat messages with text contents.

    Checked before any model work: tokenizers fail on such input deep inside with a TypeError
    that does not say which prompt or why."""
    if isinstance(prompt, str):
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError as err:
            raise InvalidPromptError(
                f"{what} is not valid text: {err.reason} at character {err.start} "
                f"({prompt[err.start:err.end]!r}); pass a str of valid Unicode"
            ) from None
        return
    if isinstance(prompt, (bytes, bytearray)):
        raise InvalidPromptError(f"{what} is bytes; decode it to a str first")
    try:
        messages = list(prompt)
    except TypeError:
        raise InvalidPromptError(f"{what} must be a str or a list of chat messages, got {type(prompt).__name__}") from None
    for i, message in enumerate(messages):
        if not (isinstance(message, Mapping) and "content" in message and "role" in message):
            raise InvalidPromptError(f"{what} message {i} must be a mapping with 'role' and 'content', got {message!r}")
        if not isinstance(message["content"], str):
            raise InvalidPromptError(f"{what} message {i} content must be a str, got {message['content']!r}")
        check_prompt(message["content"], f"{what} message {i} content")


class Tokenizer:
    """Encode/decode with the model's own tokenizer.

    `vocab_size` is the model's number of embedding rows (it may exceed `len(hf)`: padded
    vocabularies); `eos_token_ids` are all ids that end a sequence (tokenizer eos, plus the
    generation config's and model config's eos ids when known). `hf` is the underlying HF
    tokenizer (the byte-level layer reads each token's bytes from it).

    Parameters
    ----------
    hf : transformers tokenizer
        The Hugging Face tokenizer.
    vocab_size : int
        The model's embedding rows.
    extra_eos_token_ids : iterable of int
        More ids that end a sequence.
    """

    def __init__(self, hf: Any, vocab_size: int, extra_eos_token_ids: Iterable[int] = ()) -> None:
        self.hf = hf
        self.vocab_size = vocab_size
        ids = [hf.eos_token_id] if hf.eos_token_id is not None else []
        ids += [int(i) for i in extra_eos_token_ids]
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(i for i in ids if 0 <= i < vocab_size))

    @property
    def bos_token_id(self) -> int | None:
        return self.hf.bos_token_id

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.hf, "chat_template", None))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; add_special_tokens adds what the tokenizer adds by default (Gemma:
        <bos>; SmolLM2: nothing)."""
        return list(self.hf(text, add_special_tokens=add_special_tokens)["input_ids"])

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True
    ) -> list[int]:
        """Ids of the messages rendered by the chat template (which adds its own special tokens)."""
        if not self.has_chat_template:
            raise NoChatTemplateError(
                f"the tokenizer of this model ({type(self.hf).__name__}) has no chat template; pass "
                "the prompt as raw text instead of a list of messages"
            )
        text = self.hf.apply_chat_template(
            list(messages), add_generation_prompt=add_generation_prompt, tokenize=False
        )
        return self.encode(text, add_special_tokens=False)

    def __repr__(self) -> str:
        return (
            f"Tokenizer({type(self.hf).__name__}, vocab_size={self.vocab_size}, "
            f"eos_token_ids={self.eos_token_ids}, bos_token_id={self.bos_token_id})"
        )
