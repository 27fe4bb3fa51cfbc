"""The interface every evaluation task implements, and the seeded draw of evaluated instances.

A task turns a data set into instances, each instance into the paper's two prompt templates
(App. E) as chat messages, and a model's output text into a binary verdict (Sec. 6): expected
accuracy under an ensemble is then sum_m w_bar_m * is_correct(instance, text_m).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

Message = dict[str, str]
"""One chat message: {"role": "system" | "user" | "assistant", "content": text}."""

Chat = list[Message]
"""A prompt as chat messages, ready for a tokenizer's chat template."""

InstanceT = TypeVar("InstanceT")
ItemT = TypeVar("ItemT")


@dataclass(frozen=True)
class Demonstration:
    """One solved example shown to the model before the target (a few-shot turn pair).

    Attributes
    ----------
    input, output : str
        The example's input and its answer.
    """

    input: str
    output: str


class Task(Protocol[InstanceT]):
    """An evaluation task: instances, the two prompt templates, and the metric.

    `is_correct` applies `extract` itself, so callers pass the raw generated text.
    """

    name: str

    def instances(self, data_dir: str | Path | None = None, limit: int | None = None,
                  seed: int = 0) -> list[InstanceT]:
        """All instances (limit=None) or `limit` of them drawn by `sample` with `seed`."""
        ...

    def prompts(self, instance: InstanceT) -> tuple[Chat, Chat]:
        """Prompt 1 and prompt 2 of App. E for `instance`, placeholders filled."""
        ...

    def extract(self, text: str) -> str:
        """The answer the metric reads from a generated text (the task's normalization)."""
        ...

    def is_correct(self, instance: InstanceT, text: str) -> bool:
        """The task's binary metric on the generated `text`."""
        ...


def sample(pool: Sequence[ItemT], limit: int | None, seed: int) -> list[ItemT]:
    """`pool` in its own order when `limit` is None, else `limit` distinct items of it drawn by
    `random.Random(seed).sample`: the same pool, limit and seed always give the same list.

    Parameters
    ----------
    pool : sequence
        The items.
    limit : int or None
        How many.
    seed : int
        The draw's seed.
    """
    if limit is None:
        return list(pool)
    if not 0 < limit <= len(pool):
        raise ValueError(f"limit must be between 1 and the {len(pool)} available instances, got {limit}")
    return random.Random(seed).sample(list(pool), limit)
