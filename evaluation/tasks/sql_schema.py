"""A database's schema written out for the two text-to-SQL prompts, read from the database itself.

The two formats of App. E (from the text-to-SQL prompting literature), tables in creation order,
columns in table order, one table per line:
* "Table(Columns)":       `orders(order_id, customer_id, employee_id, order_date, status)`
* "Columns=[]+FK":        `Table orders, columns = [*, order_id, customer_id, ...]`, then one line
  `Foreign_keys = [orders.customer_id = customers.customer_id, ...]`.
"""

from __future__ import annotations

from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from evaluation.tasks.sql_execution import connect_read_only


@dataclass(frozen=True)
class TableSchema:
    """A table's name, column names and foreign keys as (column, referenced table, referenced column)."""

    name: str
    columns: tuple[str, ...]
    foreign_keys: tuple[tuple[str, str, str], ...]


def read_tables(database: Path) -> list[TableSchema]:
    """The user tables of `database` in creation order, foreign keys in column order."""
    with closing(connect_read_only(database)) as connection:
        names = [name for (name,) in connection.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY rowid")]
        tables = []
        for name in names:
            columns = tuple(column for (column,) in connection.execute(
                "SELECT name FROM pragma_table_info(?) ORDER BY cid", (name,)))
            keys = connection.execute('SELECT "from", "table", "to" FROM pragma_foreign_key_list(?)', (name,))
            foreign_keys = tuple(sorted(keys, key=lambda key: columns.index(key[0])))
            tables.append(TableSchema(name, columns, foreign_keys))
    return tables


def table_columns_schema(tables: list[TableSchema]) -> str:
    """The "Table(Columns)" format: one `table(column, ...)` line per table."""
    return "\n".join(f"{table.name}({', '.join(table.columns)})" for table in tables)


def columns_foreign_keys_schema(tables: list[TableSchema]) -> str:
    """The "Columns=[]+FK" format: one `Table t, columns = [*, ...]` line per table, then the keys."""
    lines = [f"Table {table.name}, columns = [*, {', '.join(table.columns)}]" for table in tables]
    keys = [f"{table.name}.{column} = {target}.{target_column}"
            for table in tables for column, target, target_column in table.foreign_keys]
    return "\n".join([*lines, f"Foreign_keys = [{', '.join(keys)}]"])
