"""The word sorting metric (exact match of the word list), the data and the prompts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evaluation.tasks.base import Demonstration
from evaluation.tasks.word_sorting import (
    DEMONSTRATION_WORDS, TASK_FILE, USER_PROMPT_1, WordSortingInstance, WordSortingTask, load_examples,
    split_words,
)

TASK = WordSortingTask()
INSTANCE = WordSortingInstance(id="hand-made", input="pear apple fig", target="apple fig pear",
                               demonstration=Demonstration(input="b a", output="a b"))


@pytest.mark.parametrize("text", [
    "apple, fig, pear",  # prompt 1's comma-separated form
    "apple,fig,pear",
    "apple fig pear",  # BIG-bench's target form
    "apple , fig ,\npear",
    "  apple, fig, pear\n<|im_end|>",
])
def test_sorted_words_are_correct(text: str):
    assert TASK.is_correct(INSTANCE, text)


@pytest.mark.parametrize("text", [
    "apple, pear, fig",  # wrong order
    "apple, fig",  # missing word
    "apple, fig, pear, plum",  # extra word
    "apple, fig, fig, pear",  # duplicated word
    "apple, fig, pear.",  # punctuation is part of a word
    "apple, fig, pear,",  # empty item
    "apple,, fig, pear",
    "Apple, fig, pear",  # case matters
    "Output: apple, fig, pear",
    "",
])
def test_other_answers_are_wrong(text: str):
    assert not TASK.is_correct(INSTANCE, text)


def test_split_words():
    assert split_words("a, b c,d") == ["a", "b", "c", "d"]
    assert split_words("") == []


def test_targets_are_the_sorted_inputs(data_dir: Path):
    for instance in TASK.instances(data_dir):
        assert instance.target.split() == sorted(instance.input.split())
        assert TASK.is_correct(instance, ", ".join(instance.target.split()))
        assert TASK.is_correct(instance, instance.target)


def test_demonstration_is_held_out(data_dir: Path):
    examples = json.loads((data_dir / TASK_FILE).read_text())["examples"]
    instances = load_examples(data_dir / TASK_FILE)
    assert len(instances) == len(examples) - 1
    demonstration = instances[0].demonstration
    assert len(demonstration.input.split()) == DEMONSTRATION_WORDS
    assert all(i.demonstration == demonstration for i in instances)
    assert demonstration.input not in {i.input for i in instances}


def test_prompts_fill_words_and_demonstration():
    prompt_1, prompt_2 = TASK.prompts(INSTANCE)
    assert prompt_1[1]["content"] == USER_PROMPT_1.format(words="pear apple fig")
    assert [m["content"] for m in prompt_2[1:]] == ["b a ->", "a b", "pear apple fig ->"]
