"""Running an untrusted SQL query read-only, and comparing result rows (execution accuracy).

A query runs on a connection that cannot change anything: the file is opened with the
`mode=ro` URI and an authorizer allows only reading (SELECT, reading columns, calling functions,
recursive CTEs), so writes, ATTACH, PRAGMA and the like fail. A progress handler stops it after
`time_limit_s` seconds, and more than `max_rows` result rows is an error too. Every failure
raises `QueryError`.

Comparison (Spider's execution-accuracy rule): the rows must be equal as ordered lists when the
gold query has an ORDER BY, else as multisets. Rows are tuples compared with Python's `==`, so
column order matters, 3 == 3.0, and '3' != 3.
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path

QUERY_TIME_LIMIT_S = 2.0
MAX_RESULT_ROWS = 10_000
PROGRESS_CHECK_INSTRUCTIONS = 1_000
READ_ACTIONS = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION,
                          sqlite3.SQLITE_RECURSIVE})
ORDER_BY = re.compile(r"\border\s+by\b", re.IGNORECASE)

Row = tuple
"""One result row: a tuple of int, float, str, bytes or None."""


class QueryError(Exception):
    """The query could not be run to completion, read-only, within the limits."""


def _authorize_reads(action: int, *_: object) -> int:
    return sqlite3.SQLITE_OK if action in READ_ACTIONS else sqlite3.SQLITE_DENY


def connect_read_only(database: Path) -> sqlite3.Connection:
    """A connection to the existing file `database` opened with SQLite's `mode=ro`."""
    return sqlite3.connect(f"{database.resolve().as_uri()}?mode=ro", uri=True)


def run_read_only(database: Path, sql: str, time_limit_s: float = QUERY_TIME_LIMIT_S,
                  max_rows: int = MAX_RESULT_ROWS) -> list[Row]:
    """The result rows of the single statement `sql` on `database`, run read-only within the
    limits; `QueryError` (with SQLite's reason) for anything else."""
    deadline = time.monotonic() + time_limit_s
    try:
        with closing(connect_read_only(database)) as connection:
            connection.set_authorizer(_authorize_reads)
            connection.set_progress_handler(lambda: time.monotonic() > deadline, PROGRESS_CHECK_INSTRUCTIONS)
            rows = connection.execute(sql).fetchmany(max_rows + 1)
    # sqlite3.Warning: "one statement at a time" on older Pythons; ValueError: text not encodable
    except (sqlite3.Error, sqlite3.Warning, ValueError) as error:
        raise QueryError(f"{type(error).__name__}: {error}") from error
    if len(rows) > max_rows:
        raise QueryError(f"more than {max_rows} result rows")
    return rows


def is_ordered(gold_sql: str) -> bool:
    """Whether results are compared in order: the gold query has an ORDER BY (Spider's rule)."""
    return ORDER_BY.search(gold_sql) is not None


def same_result(gold: Sequence[Row], predicted: Sequence[Row], ordered: bool) -> bool:
    """Equal rows, as lists when `ordered`, else as multisets."""
    if ordered:
        return list(gold) == list(predicted)
    return Counter(gold) == Counter(predicted)
