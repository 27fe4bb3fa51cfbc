"""Text-to-SQL (in place of Spider, which is not available offline): questions over the business
database built by `business_database`, scored by execution accuracy.

Metric: the answer (after `strip_answer` and `unwrap_code_fence`; a trailing semicolon is plain
SQL) runs read-only under a time limit (`sql_execution.run_read_only`); it is correct iff it
runs and its rows equal the gold query's rows -- as ordered lists when the gold query has an
ORDER BY, else as multisets (`sql_execution.same_result`). Any error, a write, a second
statement or a timeout is incorrect.

Prompts: App. E's two templates (from Loula et al. 2025); prompt 1 gives the "Table(Columns)"
schema in the user turn, prompt 2 gives the "Columns=[]+FK" schema in the system turn and one
demonstration (`sql_questions.DEMONSTRATION`, not an evaluated question).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from evaluation.tasks.answers import strip_answer, unwrap_code_fence
from evaluation.tasks.base import Chat, sample
from evaluation.tasks.business_database import database_path
from evaluation.tasks.sql_execution import QueryError, Row, is_ordered, run_read_only, same_result
from evaluation.tasks.sql_questions import DEMONSTRATION, QUESTIONS
from evaluation.tasks.sql_schema import columns_foreign_keys_schema, read_tables, table_columns_schema

SYSTEM_PROMPT = (
    "You are a coding assistant helping an analyst answer questions over business data in SQL. More "
    "specifically, the analyst provides you a database schema (tables in the database along with their "
    "column names and types) and asks a question about the data that can be solved by issuing a SQL query "
    "to the database. In response, you write the SQL statement that answers the question. You do not "
    "provide any commentary or explanation of what the code does, just the SQL statement ending in a "
    "semicolon."
)
SYSTEM_PROMPT_2 = SYSTEM_PROMPT + "\n Here is the database schema for all following queries: \n\n{schema}"
QUESTION_PROMPT = (
    "Please write me a SQL statement that answers the following question: {question}\n\nRemember, DO NOT "
    "provide any commentary or explanation of what the code does, just the SQL statement ending in a semicolon."
)
USER_PROMPT_1 = "Here is a database schema:\n\n{schema} " + QUESTION_PROMPT


@dataclass(frozen=True)
class SqlInstance:
    """A question, its gold query, the database file and the gold result rows.

    Attributes
    ----------
    id, question, gold_sql : str
        The instance's id, question and gold query.
    database : pathlib.Path
        The SQLite file.
    gold_rows : tuple
        The gold query's result rows.
    """

    id: str
    question: str
    gold_sql: str
    database: Path
    gold_rows: tuple[Row, ...]

    @property
    def ordered(self) -> bool:
        """Whether the predicted rows must come in the gold order."""
        return is_ordered(self.gold_sql)


@functools.cache
def schema_strings(database: Path) -> tuple[str, str]:
    """The "Table(Columns)" and "Columns=[]+FK" schema strings of `database`."""
    tables = read_tables(database)
    return table_columns_schema(tables), columns_foreign_keys_schema(tables)


@dataclass(frozen=True)
class TextToSqlTask:
    """The text-to-SQL task; its database is created in `database_dir` (default: the cache).

    Attributes
    ----------
    name : str
        "sql".
    database_dir : pathlib.Path, optional
        Where the database is built (default: the cache).
    """

    name: str = "sql"
    database_dir: Path | None = None

    def instances(self, data_dir: str | Path | None = None, limit: int | None = None,
                  seed: int = 0) -> list[SqlInstance]:
        """The questions as instances; `data_dir` is not read (questions and data are built in)."""
        database = database_path(self.database_dir)
        return [SqlInstance(q.id, q.question, q.gold_sql, database, tuple(run_read_only(database, q.gold_sql)))
                for q in sample(QUESTIONS, limit, seed)]

    def prompts(self, instance: SqlInstance) -> tuple[Chat, Chat]:
        table_columns, columns_foreign_keys = schema_strings(instance.database)
        prompt_1 = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": USER_PROMPT_1.format(schema=table_columns, question=instance.question)},
        ]
        prompt_2 = [
            {"role": "system", "content": SYSTEM_PROMPT_2.format(schema=columns_foreign_keys)},
            {"role": "user", "content": QUESTION_PROMPT.format(question=DEMONSTRATION.input)},
            {"role": "assistant", "content": f"{DEMONSTRATION.output};"},
            {"role": "user", "content": QUESTION_PROMPT.format(question=instance.question)},
        ]
        return prompt_1, prompt_2

    def extract(self, text: str) -> str:
        return unwrap_code_fence(strip_answer(text))

    def is_correct(self, instance: SqlInstance, text: str) -> bool:
        try:
            predicted = run_read_only(instance.database, self.extract(text))
        except QueryError:
            return False
        return same_result(instance.gold_rows, predicted, instance.ordered)
