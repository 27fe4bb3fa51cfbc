"""A regular approximation of SQLite's SELECT over one database's tables and columns.

SQL is not regular (subqueries nest, parentheses balance), so the text-to-SQL constraint is a
regular language that keeps what a schema fixes and leaves the rest lexical:

    SELECT <select list> FROM <table> [[AS] alias] <tail> [;]

* the select list is a sequence of the database's column names (each optionally qualified,
  `alias.column`), numbers, 'strings', DISTINCT, `AS alias`, aggregate calls
  (COUNT( SUM( AVG( MIN( MAX( ), operators, commas and parentheses;
* the tail is a sequence of the SQL keywords a SELECT query uses (JOIN, LEFT JOIN, ON, WHERE,
  AND, OR, NOT, IN, BETWEEN, LIKE, IS, NULL, GROUP, ORDER, BY, HAVING, ASC, DESC, LIMIT, and
  SELECT / FROM / DISTINCT / AS for subqueries), the database's tables (with an optional alias)
  and columns, literals, `BY alias` (ordering by a select-list name), operators and punctuation;
* keywords are upper case; two words are separated by exactly one space, punctuation may touch.

So the model cannot name a table or column the database does not have, write keywords outside
SQL's or leave the SELECT form; which clauses it writes, in which order, and whether the query
answers the question stay its job (a string of the language can still fail to run: the metric
stays execution accuracy). Every gold query of `sql_questions.QUESTIONS` is in the language, and
misspelled tables or columns are not (tests/tasks/test_sql_grammar.py). A clause-by-clause
grammar with one level of subqueries was tried first: 5,218 states after minimization (the
schema's column names are copied into every position that takes a column), against 668 for this
one; at the token level every state costs a row of V entries (SmolLM2: 200 KB).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

#: A lower-case alias (`e`, `total`).
IDENT = r"[a-z][a-z0-9_]*"
NUMBER = r"-?[0-9]+(?:\.[0-9]+)?"
STRING = r"'[^'\n]*'"
AGGREGATE_CALL = r"(?:COUNT|SUM|AVG|MIN|MAX)\("
PUNCTUATION = r"(?:=|!=|<>|<=|>=|<|>|\+|-|\*|/|,|\(|\))"
TAIL_KEYWORDS = (
    "JOIN", "LEFT JOIN", "INNER JOIN", "ON", "WHERE", "AND", "OR", "NOT", "IN", "BETWEEN", "LIKE", "IS",
    "NULL", "GROUP", "ORDER", "BY", "HAVING", "ASC", "DESC", "LIMIT", "SELECT", "FROM", "DISTINCT", "AS",
)


def _alternation(names: Iterable[str]) -> str:
    return "(?:" + "|".join(re.escape(n) for n in sorted(set(names), key=lambda n: (-len(n), n))) + ")"


def _lexemes(words: Sequence[str], punctuation: Sequence[str]) -> str:
    """Any sequence of words and punctuation that follows a word: a word after a word needs one
    space, anything next to punctuation an optional one."""
    word, punct = f"(?:{'|'.join(words)})", f"(?:{'|'.join(punctuation)})"
    return f"(?: {word}| ?{punct}(?: ?{punct})*(?: ?{word})?)*"


def select_regex(tables: Sequence[str], columns: Sequence[str]) -> str:
    """The regex of the SELECT language above over `tables` and `columns` (see the module doc).

    Args:
        tables: the database's table names.
        columns: the database's column names (of all its tables).

    Returns:
        A regex in the syntax of `smc_jax.constraints.regex` (matched in full).
    """
    if not tables or not columns:
        raise ValueError("a SELECT grammar needs at least one table and one column")
    table = _alternation(tables)
    column = f"(?:{IDENT}\\.)?{_alternation(columns)}"
    table_ref = f"{table}(?: (?:AS )?{IDENT})?"
    select_list = _lexemes([column, NUMBER, STRING, "DISTINCT", f"AS {IDENT}"], [AGGREGATE_CALL, PUNCTUATION])
    tail = _lexemes([_alternation(TAIL_KEYWORDS), column, table_ref, NUMBER, STRING, f"BY {IDENT}"],
                    [AGGREGATE_CALL, PUNCTUATION])
    return f"SELECT{select_list} FROM {table_ref}{tail};?"
