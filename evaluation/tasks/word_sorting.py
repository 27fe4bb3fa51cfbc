"""Word sorting (BIG-bench `word_sorting`, the task BIG-Bench Hard's subset is drawn from).

Metric: exact match of the word list. The answer (after `strip_answer`) is split into words at
every separator -- a comma with any whitespace around it, or a run of whitespace -- so the
comma-separated form prompt 1 asks for ("a, b, c") and BIG-bench's space-separated targets
("a b c") both read as [a, b, c]. It is correct iff that list equals the target's words exactly:
same words, same order, same case, nothing extra or missing. An empty item (",," or a trailing
comma) and punctuation such as a final "." count as wrong words. No word in the data holds a
comma or whitespace, so the split is unambiguous.

Prompt 2's demonstration is a fixed held-out example, the first in file order with
`DEMONSTRATION_WORDS` words; it is excluded from the instances for every seed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from evaluation.tasks.answers import strip_answer
from evaluation.tasks.base import Chat, Demonstration, sample
from evaluation.tasks.data_dir import data_set_path

TASK_FILE = "bigbench-word_sorting/task.json"
DEMONSTRATION_WORDS = 8
WORD_SEPARATOR = re.compile(r"\s*,\s*|\s+")

SYSTEM_PROMPT_1 = (
    "You are a helpful assistant that sorts words in alphabetical order. Your task is to take a list "
    "of words and return them sorted alphabetically. Alphabetical order means sorting words from A "
    "to Z, comparing character by character from left to right. For example, 'apple' comes before "
    "'banana', and 'cat' comes before 'dog'. When words start with the same letter, compare the next "
    "letters. Output ONLY the sorted words separated by commas, with no additional text, "
    "explanation, or commentary. Do not include any prefixes, suffixes, or extra formatting - just "
    "the comma-separated sorted words."
)
USER_PROMPT_1 = "Sort the following words in alphabetical order.\n\nInput: {words}\nOutput:"
SYSTEM_PROMPT_2 = (
    "You are a helpful assistant that sorts words in alphabetical order. Your task is to take a list "
    "of words and return them sorted alphabetically. Output ONLY the sorted words separated by "
    "commas, with no additional text, explanation, or commentary."
)
USER_PROMPT_2 = "{words} ->"


@dataclass(frozen=True)
class WordSortingInstance:
    """One list to sort: BIG-bench's `input` (space-separated words) and `target` (them sorted);
    `id` is "example-<index in task.json>"; `demonstration` is prompt 2's solved example.

    Attributes
    ----------
    id, input, target : str
        The id, the words and the sorted words.
    demonstration : Demonstration
        Prompt 2's solved example.
    """

    id: str
    input: str
    target: str
    demonstration: Demonstration


def split_words(answer: str) -> list[str]:
    """The words of a comma- and/or whitespace-separated answer ([] for an empty answer)."""
    return WORD_SEPARATOR.split(answer) if answer else []


def load_examples(task_file: Path) -> list[WordSortingInstance]:
    """Every example of BIG-bench's task.json except the demonstration, in file order."""
    examples = json.loads(task_file.read_text(encoding="utf-8"))["examples"]
    demo_index = next((i for i, ex in enumerate(examples) if len(ex["input"].split()) == DEMONSTRATION_WORDS), None)
    if demo_index is None:
        raise ValueError(f"{task_file} has no example of {DEMONSTRATION_WORDS} words to serve as demonstration")
    demonstration = Demonstration(input=examples[demo_index]["input"], output=examples[demo_index]["target"])
    return [WordSortingInstance(id=f"example-{i}", input=ex["input"], target=ex["target"], demonstration=demonstration)
            for i, ex in enumerate(examples) if i != demo_index]


@dataclass(frozen=True)
class WordSortingTask:
    """The word sorting task: prompt 1 zero-shot, prompt 2 with one demonstration (App. E).

    Attributes
    ----------
    name : str
        "word_sorting".
    """

    name: str = "word_sorting"

    def instances(self, data_dir: str | Path | None = None, limit: int | None = None,
                  seed: int = 0) -> list[WordSortingInstance]:
        return sample(load_examples(data_set_path(data_dir, TASK_FILE)), limit, seed)

    def prompts(self, instance: WordSortingInstance) -> tuple[Chat, Chat]:
        prompt_1 = [
            {"role": "system", "content": SYSTEM_PROMPT_1},
            {"role": "user", "content": USER_PROMPT_1.format(words=instance.input)},
        ]
        prompt_2 = [
            {"role": "system", "content": SYSTEM_PROMPT_2},
            {"role": "user", "content": USER_PROMPT_2.format(words=instance.demonstration.input)},
            {"role": "assistant", "content": instance.demonstration.output},
            {"role": "user", "content": USER_PROMPT_2.format(words=instance.input)},
        ]
        return prompt_1, prompt_2

    def extract(self, text: str) -> str:
        return strip_answer(text)

    def is_correct(self, instance: WordSortingInstance, text: str) -> bool:
        return split_words(self.extract(text)) == instance.target.split()
