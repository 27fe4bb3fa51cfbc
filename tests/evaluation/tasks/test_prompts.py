"""The task registry, and both prompts of every task: well-formed, filled, deterministic."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from evaluation.tasks import TASKS, Task, get_task
from evaluation.tasks.text_to_sql import TextToSqlTask

ROLES = {"system", "user", "assistant"}
PLACEHOLDER = re.compile(r"<[^<>]+>")  # App. E writes every placeholder as <...>; no data holds a '<'
PROMPT_SAMPLE = 5


# --- registry -------------------------------------------------------------------------------

def test_registry_knows_the_three_tasks():
    assert set(TASKS) == {"json", "word_sorting", "sql"}
    for name in TASKS:
        assert get_task(name).name == name


def test_unknown_task_lists_known_names():
    with pytest.raises(ValueError, match="unknown task 'spider'; known tasks: json, sql, word_sorting"):
        get_task("spider")


# --- prompts of every task ------------------------------------------------------------------

def assert_well_formed(chat: list[dict[str, str]]) -> None:
    """A system message, then user/assistant turns alternating, ending on a user turn."""
    assert all(set(message) == {"role", "content"} for message in chat)
    roles = [message["role"] for message in chat]
    assert set(roles) <= ROLES and roles[0] == "system" and roles[-1] == "user"
    assert roles[1:] == ["user", "assistant"] * (len(roles[1:]) // 2) + ["user"]
    for message in chat:
        assert isinstance(message["content"], str) and message["content"].strip()
        assert not PLACEHOLDER.search(message["content"]), message["content"]


@pytest.fixture(params=sorted(TASKS))
def task_with_data(request: pytest.FixtureRequest, database_dir: Path) -> tuple[Task[Any], Path | None]:
    """Each task and the data folder it reads (None for SQL, whose data is built in)."""
    if request.param == "sql":
        return TextToSqlTask(database_dir=database_dir), None
    return get_task(request.param), request.getfixturevalue("data_dir")


def test_prompts_are_filled_well_formed_and_deterministic(task_with_data):
    task, data_dir = task_with_data
    instances = task.instances(data_dir, limit=PROMPT_SAMPLE, seed=1)
    again = task.instances(data_dir, limit=PROMPT_SAMPLE, seed=1)
    assert [i.id for i in instances] == [i.id for i in again]
    for instance, same in zip(instances, again):
        prompt_1, prompt_2 = task.prompts(instance)
        assert_well_formed(prompt_1)
        assert_well_formed(prompt_2)
        assert prompt_1 != prompt_2
        assert (prompt_1, prompt_2) == task.prompts(same)


def test_every_instance_gets_filled_prompts(task_with_data):
    """All instances of all three data sets, not just a sample (cheap: no model involved)."""
    task, data_dir = task_with_data
    for instance in task.instances(data_dir):
        for chat in task.prompts(instance):
            assert not any(PLACEHOLDER.search(message["content"]) for message in chat)


def test_instances_depend_on_the_seed_and_respect_the_limit(task_with_data):
    task, data_dir = task_with_data
    everything = task.instances(data_dir)
    assert len({i.id for i in everything}) == len(everything)
    drawn = task.instances(data_dir, limit=PROMPT_SAMPLE, seed=0)
    assert len(drawn) == PROMPT_SAMPLE and {i.id for i in drawn} <= {i.id for i in everything}
    assert [i.id for i in drawn] != [i.id for i in task.instances(data_dir, limit=PROMPT_SAMPLE, seed=1)]
