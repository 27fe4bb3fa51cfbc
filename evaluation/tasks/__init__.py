"""Evaluation tasks of the paper (Sec. 6, App. E): JSON schema, word sorting, text-to-SQL::

    task = get_task("word_sorting")
    for instance in task.instances(limit=100, seed=0):        # bundled data, or $SMC_JAX_DATA when set
        prompt_1, prompt_2 = task.prompts(instance)           # chat messages
        ...                                                   # sample texts from an ensemble
        task.is_correct(instance, text)                       # the metric, on the raw text

Each task module's docstring states its metric and normalization.
"""

from evaluation.tasks.base import Chat, Demonstration, Message, Task, sample
from evaluation.tasks.data_dir import DATA_DIR_ENV, DataNotFoundError, resolve_data_dir
from evaluation.tasks.json_schema import JsonSchemaInstance, JsonSchemaTask
from evaluation.tasks.registry import TASKS, get_task
from evaluation.tasks.text_to_sql import SqlInstance, TextToSqlTask
from evaluation.tasks.word_sorting import WordSortingInstance, WordSortingTask

__all__ = [
    "Chat", "Demonstration", "Message", "Task", "sample",
    "DATA_DIR_ENV", "DataNotFoundError", "resolve_data_dir",
    "JsonSchemaInstance", "JsonSchemaTask", "SqlInstance", "TextToSqlTask",
    "WordSortingInstance", "WordSortingTask", "TASKS", "get_task",
]
