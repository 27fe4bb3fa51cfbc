"""The text-to-SQL constraint (`tasks.sql_grammar`): every gold query is in the language, and
names the database does not have, lower-case keywords and non-SELECT statements are not."""

from __future__ import annotations

from pathlib import Path

import pytest

from evaluation.methods import instance_constraint, sql_constraint
from evaluation.tasks.sql_grammar import select_regex
from evaluation.tasks.sql_questions import DEMONSTRATION, QUESTIONS
from evaluation.tasks.sql_schema import read_tables
from evaluation.tasks.text_to_sql import TextToSqlTask


@pytest.fixture(scope="module")
def constraint(database: Path):
    return sql_constraint(database)


@pytest.mark.parametrize("question", QUESTIONS, ids=lambda q: q.id)
def test_gold_query_is_in_the_language(constraint, question):
    assert constraint.matches(question.gold_sql + ";")
    assert constraint.matches(question.gold_sql)


def test_demonstration_and_common_forms_are_in_the_language(constraint):
    for sql in (DEMONSTRATION.output, "SELECT * FROM employees;", "SELECT name, salary FROM employees e WHERE "
                "e.salary >= 1000.5 AND title LIKE '%Engineer%' ORDER BY salary DESC, name LIMIT 5;",
                "SELECT COUNT(*) FROM orders WHERE status IN ('pending', 'shipped');",
                "SELECT name FROM employees WHERE manager_id IS NULL;"):
        assert constraint.matches(sql), sql


@pytest.mark.parametrize("sql", [
    "SELECT nme FROM employees;",                       # no such column
    "SELECT name FROM employes;",                        # no such table
    "SELECT name FROM employees WHERE salry > 1;",      # no such column in the tail
    "select name from employees;",                      # keywords are upper case
    "DELETE FROM employees;",                           # not a SELECT
    "SELECT name FROM employees; DROP TABLE employees", # one statement
    "SELECT name FROM employees WHERESALARY > 1",       # two words need a space
    "```sql\nSELECT name FROM employees;\n```",         # no code fence
])
def test_outside_the_language(constraint, sql):
    assert not constraint.matches(sql)


def test_prefixes_of_gold_queries_are_viable_and_the_automaton_is_small(constraint):
    for question in QUESTIONS:
        text = question.gold_sql
        assert all(constraint.viable(text[:i]) for i in range(len(text) + 1))
    # minimized: small enough for a token-level table (V entries per state)
    assert constraint.num_states < 1024


def test_instance_constraint_for_sql_is_the_database_constraint(database: Path, database_dir: Path):
    instance = TextToSqlTask(database_dir=database_dir).instances(limit=1)[0]
    assert instance_constraint("sql", instance) is sql_constraint(database)


def test_select_regex_needs_a_schema(database: Path):
    tables = read_tables(database)
    assert select_regex([t.name for t in tables], ["name"]).startswith("SELECT")
    with pytest.raises(ValueError, match="at least one table"):
        select_regex([], ["name"])
