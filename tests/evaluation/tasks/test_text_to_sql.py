"""Text-to-SQL: the generated database, the gold queries, execution accuracy, read-only safety."""

from __future__ import annotations

import hashlib
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from evaluation.tasks.business_database import ROWS, build_database, database_path
from evaluation.tasks.sql_execution import QueryError, run_read_only, same_result
from evaluation.tasks.sql_questions import DEMONSTRATION, QUESTIONS
from evaluation.tasks.sql_schema import read_tables
from evaluation.tasks.text_to_sql import SqlInstance, TextToSqlTask, schema_strings

MIN_QUESTIONS, MAX_QUESTIONS = 30, 40
SHORT_TIME_LIMIT_S = 0.05
ENDLESS_QUERY = "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) SELECT COUNT(*) FROM n"

# For each gold query with an ORDER BY: a query listing the sort keys of the rows it orders.
# Distinct keys mean the gold order is the only right one.
SORT_KEYS = {
    "q14": "SELECT unit_price FROM products",
    "q15": "SELECT salary FROM employees",
    "q16": "SELECT signup_date FROM customers",
    "q17": "SELECT name FROM customers WHERE country = 'UK'",
    "q33": "SELECT SUM(i.quantity * p.unit_price) FROM orders AS o JOIN order_items AS i ON o.order_id = i.order_id "
           "JOIN products AS p ON i.product_id = p.product_id WHERE o.status = 'shipped' GROUP BY o.customer_id",
    "q34": "SELECT COUNT(*) FROM orders GROUP BY employee_id",
    "q36": "SELECT budget FROM departments",
    "q39": "SELECT e.salary FROM employees AS e JOIN departments AS d ON e.department_id = d.department_id "
           "WHERE d.name = 'Sales'",
    "q40": "SELECT name FROM customers",
}


@pytest.fixture(scope="module")
def task(database_dir: Path) -> TextToSqlTask:
    return TextToSqlTask(database_dir=database_dir)


@pytest.fixture(scope="module")
def instances(task: TextToSqlTask) -> dict[str, SqlInstance]:
    return {instance.id: instance for instance in task.instances()}


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def dump(database: Path) -> list[str]:
    with closing(sqlite3.connect(database)) as connection:
        return list(connection.iterdump())


# --- the database and the questions ---------------------------------------------------------

def test_database_is_built_deterministically(tmp_path: Path, database: Path):
    assert dump(build_database(tmp_path / "again.sqlite")) == dump(database)
    assert database_path(database.parent) == database  # found, not rebuilt
    for table, rows in ROWS.items():
        assert same_result(rows, run_read_only(database, f"SELECT * FROM {table}"), ordered=False)


def test_questions_are_many_and_distinct():
    assert MIN_QUESTIONS <= len(QUESTIONS) <= MAX_QUESTIONS
    assert len({q.id for q in QUESTIONS}) == len({q.question for q in QUESTIONS}) == len(QUESTIONS)
    assert DEMONSTRATION.input not in {q.question for q in QUESTIONS}


def test_every_gold_query_runs_and_returns_rows(instances: dict[str, SqlInstance]):
    for instance in instances.values():
        assert instance.gold_rows, instance.id
        assert instance.gold_rows == tuple(run_read_only(instance.database, instance.gold_sql))
    assert len({instance.gold_rows for instance in instances.values()}) > len(instances) // 2


def test_gold_queries_are_correct_answers(task: TextToSqlTask, instances: dict[str, SqlInstance]):
    for instance in instances.values():
        assert task.is_correct(instance, instance.gold_sql + ";")


def test_ordered_gold_queries_have_no_ties(instances: dict[str, SqlInstance], database: Path):
    assert {i.id for i in instances.values() if i.ordered} == set(SORT_KEYS)
    for question_id, keys_sql in SORT_KEYS.items():
        keys = run_read_only(database, keys_sql)
        assert len(set(keys)) == len(keys), question_id


def test_demonstration_runs(database: Path):
    assert run_read_only(database, DEMONSTRATION.output) == [(len(ROWS["products"]),)]


# --- execution accuracy ---------------------------------------------------------------------

def test_textually_different_query_with_same_rows_is_correct(task: TextToSqlTask, instances):
    q10 = instances["q10"]  # customers signed up in 2021, gold uses BETWEEN
    assert task.is_correct(q10, "select count(customer_id) from customers where signup_date like '2021%';")
    q08 = instances["q08"]  # Engineering head count, gold uses a join
    assert task.is_correct(q08, "```sql\nSELECT COUNT(*) FROM employees WHERE department_id IN "
                                "(SELECT department_id FROM departments WHERE name = 'Engineering');\n```")


def test_unordered_gold_accepts_any_row_order(task: TextToSqlTask, instances):
    q02 = instances["q02"]
    assert not q02.ordered
    assert task.is_correct(q02, "SELECT name FROM customers WHERE country = 'Germany' ORDER BY name DESC")


@pytest.mark.parametrize(("question_id", "sql"), [
    ("q02", "SELECT name FROM customers WHERE country = 'France'"),  # other rows
    ("q02", "SELECT name, city FROM customers WHERE country = 'Germany'"),  # extra column
    ("q21", "SELECT c.name FROM customers AS c JOIN orders AS o ON c.customer_id = o.customer_id "
            "WHERE o.employee_id = 7"),  # duplicates where the question asks for each name once
    ("q15", "SELECT name, salary FROM employees ORDER BY salary"),  # gold is ordered: reversed is wrong
    ("q15", "SELECT salary, name FROM employees ORDER BY salary DESC"),  # column order matters
])
def test_wrong_rows_are_incorrect(task: TextToSqlTask, instances, question_id: str, sql: str):
    assert not task.is_correct(instances[question_id], sql)


@pytest.mark.parametrize("sql", [
    "SELECT nme FROM customers",  # no such column
    "SELECT name FROM customers WHERE",  # syntax error
    "SELECT COUNT(*) FROM orders; SELECT 1",  # two statements
    "The answer is SELECT COUNT(*) FROM orders WHERE status = 'pending';",
    "",
])
def test_failing_queries_are_incorrect(task: TextToSqlTask, instances, sql: str):
    assert not task.is_correct(instances["q07"], sql)


@pytest.mark.parametrize("sql", [
    "DELETE FROM orders WHERE status = 'pending'",
    "UPDATE orders SET status = 'pending'",
    "INSERT INTO orders VALUES (99, 1, 6, '2024-03-01', 'pending')",
    "DROP TABLE orders",
    "CREATE TABLE notes (x)",
    "ATTACH DATABASE '{folder}/other.sqlite' AS other",
    "PRAGMA journal_mode = WAL",
])
def test_writing_queries_are_incorrect_and_change_nothing(task: TextToSqlTask, instances, database: Path, sql: str):
    before = file_digest(database)
    assert not task.is_correct(instances["q07"], sql.format(folder=database.parent))
    assert file_digest(database) == before
    assert not list(database.parent.glob("other*"))


def test_queries_are_time_limited(database: Path):
    with pytest.raises(QueryError, match="interrupted"):
        run_read_only(database, ENDLESS_QUERY, time_limit_s=SHORT_TIME_LIMIT_S)


def test_huge_results_are_refused(database: Path):
    with pytest.raises(QueryError, match="more than 10 result rows"):
        run_read_only(database, "SELECT * FROM order_items", max_rows=10)


def test_same_result_rule():
    rows = [(1, "a"), (2, "b"), (2, "b")]
    assert same_result(rows, list(reversed(rows)), ordered=False)
    assert not same_result(rows, list(reversed(rows)), ordered=True)
    assert not same_result(rows, rows[:2], ordered=False)  # multiset, not set
    assert same_result([(3,)], [(3.0,)], ordered=True) and not same_result([(3,)], [("3",)], ordered=True)


# --- prompts --------------------------------------------------------------------------------

def test_schema_strings_list_every_table_column_and_key(database: Path):
    table_columns, columns_keys = schema_strings(database)
    tables = read_tables(database)
    assert [t.name for t in tables] == list(ROWS)
    for table in tables:
        assert f"{table.name}({', '.join(table.columns)})" in table_columns.splitlines()
        assert f"Table {table.name}, columns = [*, {', '.join(table.columns)}]" in columns_keys.splitlines()
    assert "orders.customer_id = customers.customer_id" in columns_keys.splitlines()[-1]
    assert columns_keys.splitlines()[-1].startswith("Foreign_keys = [")


def test_prompts_place_schema_question_and_demonstration(task: TextToSqlTask, instances, database: Path):
    instance = instances["q01"]
    table_columns, columns_keys = schema_strings(database)
    prompt_1, prompt_2 = task.prompts(instance)
    assert table_columns in prompt_1[1]["content"] and instance.question in prompt_1[1]["content"]
    assert prompt_2[0]["content"].endswith(columns_keys)
    assert DEMONSTRATION.input in prompt_2[1]["content"]
    assert prompt_2[2]["content"] == DEMONSTRATION.output + ";"
    assert instance.question in prompt_2[3]["content"]
