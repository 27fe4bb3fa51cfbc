"""The evaluation tasks by name."""

from __future__ import annotations

from typing import Any

from evaluation.tasks.base import Task
from evaluation.tasks.json_schema import JsonSchemaTask
from evaluation.tasks.text_to_sql import TextToSqlTask
from evaluation.tasks.word_sorting import WordSortingTask

TASKS: dict[str, type] = {"json": JsonSchemaTask, "word_sorting": WordSortingTask, "sql": TextToSqlTask}


def get_task(name: str) -> Task[Any]:
    """The task called `name` (one of `TASKS`), with its default settings.

    Parameters
    ----------
    name : str
        "json", "word_sorting" or "sql".
    """
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}")
    return TASKS[name]()
