"""Regular expressions and JSON Schemas compiled to byte automata (public as `smc_jax.constraints`).

Example::

    import smc_jax as sj
    digits = sj.constraints.regex(r"[0-9]{3}-[0-9]{4}")
    person = sj.constraints.json_schema({"type": "object", "properties": {"name": {"type": "string"}},
                                         "required": ["name"]})
    sj.sample([(smol, prompt)], "product", level="token", constraint=person)

Semantics (docs/constraints.md): a constraint is a separate *factor* of the target,

    Phi(x) ∝ f_w(p_1(x), ..., p_K(x)) * prod_j C_j(x),      C_j(x) = 1{x in L_j},

with shaping psi(x) = f_w(P_1(x), ..., P_K(x)) * prod_j C^_j(x) on prefixes, where
C^_j(x) = 1{x can still be completed in L_j}. The ensemble's weights stay on the language models,
so every f is allowed (for mixture/max too the constraint restricts the ensemble to L) and with
K = 1 this is plain constrained sampling from one model. `ConstrainedEnsemble`
(`smc_jax.smc.ensemble`) adds the constraints' log-potentials to log f; the constraint experts
themselves are `smc_jax.experts.constraint.ConstraintExpert`.

Why outlines-core (PyPI `outlines-core`, the Rust core of Outlines, used by vLLM and SGLang):
it compiles a regex to a DFA with `regex-automata` (the engine of Rust's `regex` crate: UTF-8
aware, minimal-ish, fast), and it ships a JSON Schema -> regex translation (`json_schema.
build_regex_from_schema`) in the same package, so both constraint kinds come from one
maintained library. Its `Index` walks the DFA over a vocabulary; over the 256-token
vocabulary of single bytes it yields the byte DFA itself, which we turn into a dense
[S, 256] table. `interegular` (pure Python, no JSON Schema, slower on large patterns) was the
alternative. Token-level tables are computed here from the byte DFA and the model's token byte
strings (`experts.constraint.token_transitions`), so they agree with the byte level exactly.

Patterns are matched in full (anchored at both ends) and read as UTF-8: a multi-byte character
is a path of bytes in the DFA.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from smc_jax.experts.constraint import NUM_BYTES, Automaton, AutomatonTooLargeError

#: Default bound on the states of a compiled automaton (the [S, S] reachability check and the
#: token tables grow with it); past it the compiler raises `AutomatonTooLargeError`.
MAX_STATES = 4096
#: The compiler's (unminimized) DFA may have at most this many times `max_states` states.
RAW_STATES_FACTOR = 4

#: JSON Schema keywords outlines-core would silently ignore (so the automaton would accept
#: strings the schema rejects) or cannot translate: refused up front with the keyword named.
UNSUPPORTED_SCHEMA_KEYWORDS = (
    "not", "if", "then", "else", "patternProperties", "dependentRequired", "dependentSchemas",
    "dependencies", "uniqueItems", "multipleOf", "minProperties", "maxProperties", "contains",
    "minContains", "maxContains", "propertyNames", "unevaluatedProperties", "unevaluatedItems",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
)
#: Keywords whose value is one subschema, a list of them or a mapping name -> subschema.
_SUBSCHEMA = ("items", "additionalProperties", "additionalItems", "not", "if", "then", "else", "contains",
              "propertyNames", "unevaluatedProperties", "unevaluatedItems")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")

_BYTE_VOCABULARY = None

#: The end marker appended to every pattern (see `regex`): U+10FFFF, a Unicode noncharacter,
#: which constrained strings therefore never contain.
END_MARKER = "\U0010ffff".encode("utf-8")
END_MARKER_REGEX = r"\x{10FFFF}"


def _byte_vocabulary():
    """outlines-core's Vocabulary of the 256 single bytes (id = byte value), EOS id 256."""
    global _BYTE_VOCABULARY
    if _BYTE_VOCABULARY is None:
        from outlines_core import Vocabulary

        _BYTE_VOCABULARY = Vocabulary(NUM_BYTES, {bytes([b]): [b] for b in range(NUM_BYTES)})
    return _BYTE_VOCABULARY


def regex(pattern: str, *, max_states: int = MAX_STATES) -> Automaton:
    """Compiles a regular expression (matched in full, over UTF-8 bytes) to a byte automaton.

    Args:
        pattern: a regex in the syntax of Rust's `regex` crate (close to Python's `re`, without
            look-around or back-references).
        max_states: refuse automata with more states than this.

    Returns:
        An `Automaton`: transitions [S, 256], accepting [S], dead state S - 1.

    Raises:
        ValueError: the pattern does not parse, or matches no string.
        AutomatonTooLargeError: more than `max_states` states.
    """
    if not isinstance(pattern, str):
        raise TypeError(f"a regex constraint is a pattern string, got {type(pattern).__name__}")
    from outlines_core import Index

    try:
        # The end marker: outlines-core's Index drops a byte whose next DFA state is a match
        # state (regex-automata reports matches one byte late) unless the string may end there
        # too, so it cuts every continuation after an accepting position: "(ab)*" would not
        # accept "ab". Compiling P + END, where END only ever follows a complete match, puts
        # the only match after END; a state is accepting iff END leads from it to a final one.
        index = Index(f"(?:{pattern}){END_MARKER_REGEX}", _byte_vocabulary())
    except Exception as err:  # outlines-core raises plain ValueErrors with its parser's text
        if "Found no transitions" in str(err):  # its way of saying the language is empty
            raise ValueError(f"the constraint {pattern!r} matches no string (its language is empty)") from None
        message = str(err).replace(pattern, pattern[:80] + "...") if len(pattern) > 80 else err
        raise ValueError(f"cannot compile the regex {pattern[:200]!r}: {message}") from None
    transitions = index.get_transitions()
    states = sorted(set(transitions) | set(index.get_final_states()) | {index.get_initial_state()})
    # The compiler's DFA is not minimal; the bound applies to the minimal one, but the raw one
    # is bounded too (the normalization's reachability check is quadratic in its states).
    if len(states) > RAW_STATES_FACTOR * max_states:
        _too_large(pattern, len(states), max_states,
                   f" (before minimization; {RAW_STATES_FACTOR} x max_states are allowed there)")
    ids = {s: i for i, s in enumerate(states)}
    dead = len(states)
    table = np.full((dead + 1, NUM_BYTES), dead, np.int64)
    for s, row in transitions.items():
        for symbol, nxt in row.items():
            if symbol < NUM_BYTES:  # id 256 is outlines-core's EOS
                table[ids[s], symbol] = ids[nxt]
    final = np.zeros(dead + 1, bool)
    final[[ids[s] for s in index.get_final_states()]] = True
    # Read END from every state at once: accepting = END reaches a final state. The marker's
    # last byte is then cut where it would complete END, which removes END (and the character
    # U+10FFFF, a Unicode noncharacter) from the language.
    cur = np.arange(dead + 1)
    for b in END_MARKER[:-1]:
        cur = table[cur, b]
    accepting = final[table[cur, END_MARKER[-1]]] & (cur != dead)
    table[cur[accepting], END_MARKER[-1]] = dead
    table[dead] = dead
    automaton = Automaton.from_transitions(table, accepting, ids[index.get_initial_state()], source=pattern)
    if automaton.num_states > max_states:
        _too_large(pattern, automaton.num_states, max_states)
    return automaton


def _too_large(pattern: str, states: int, max_states: int, when: str = "") -> None:
    raise AutomatonTooLargeError(
        f"the automaton of {pattern[:80]!r} has {states} states, more than max_states={max_states}{when}; "
        "simplify the pattern (bounded repetitions such as {0,500} multiply states) or raise max_states"
    )


def check_schema_supported(schema: Any, path: str = "#") -> None:
    """Raises ValueError naming the first keyword of `UNSUPPORTED_SCHEMA_KEYWORDS` in the schema.

    Parameters
    ----------
    schema : dict
        A JSON Schema (sub-schemas are checked recursively).
    path : str
        The JSON pointer of `schema` in the whole schema, for the error message.
    """
    if not isinstance(schema, Mapping):
        return
    for keyword in UNSUPPORTED_SCHEMA_KEYWORDS:
        if keyword in schema:
            raise ValueError(
                f"JSON Schema keyword {keyword!r} (at {path}) is not supported by the constraint compiler: "
                "its automaton would accept strings the schema rejects; remove it from the schema or "
                "express it with properties/enum/anyOf"
            )
    for key in _SUBSCHEMA:
        if isinstance(schema.get(key), Mapping):
            check_schema_supported(schema[key], f"{path}/{key}")
    for key in _SUBSCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            for i, sub in enumerate(schema[key]):
                check_schema_supported(sub, f"{path}/{key}/{i}")
    for key in _SUBSCHEMA_MAPS:
        if isinstance(schema.get(key), Mapping):
            for name, sub in schema[key].items():
                check_schema_supported(sub, f"{path}/{key}/{name}")


def schema_regex(schema: Mapping | str | os.PathLike, whitespace: str | None = None) -> str:
    """The regex outlines-core derives from a JSON Schema.

    Parameters
    ----------
    schema : dict, str or path
        A dict, a JSON string or the path of a JSON file.
    whitespace : str, optional
        The regex of the whitespace allowed between tokens of the JSON text (outlines-core's
        default `[ ]?`: at most one space; a richer one makes larger automata).
    """
    schema = load_schema(schema)
    check_schema_supported(schema)
    from outlines_core.json_schema import build_regex_from_schema

    try:
        return build_regex_from_schema(json.dumps(schema), whitespace)
    except Exception as err:
        raise ValueError(f"cannot translate the JSON Schema to a regex: {err}") from None


def load_schema(schema: Mapping | str | os.PathLike) -> dict:
    """A schema from a dict, a JSON string or the path of a JSON file.

    Parameters
    ----------
    schema : dict, str or path
        The schema, its JSON text, or the path of a JSON file holding it.
    """
    if isinstance(schema, Mapping):
        return dict(schema)
    if isinstance(schema, os.PathLike) or (isinstance(schema, str) and not schema.lstrip().startswith("{")):
        path = Path(schema)
        if not path.is_file():
            raise FileNotFoundError(f"JSON Schema file {str(path)!r} not found")
        text = path.read_text()
    elif isinstance(schema, str):
        text = schema
    else:
        raise TypeError(f"a JSON Schema is a dict, a JSON string or a file path, got {type(schema).__name__}")
    try:
        loaded = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"the JSON Schema is not valid JSON: {err}") from None
    if not isinstance(loaded, dict):
        raise ValueError(f"a JSON Schema is a JSON object, got {type(loaded).__name__}")
    return loaded


def json_schema(
    schema: Mapping | str | os.PathLike, *, whitespace: str | None = None, max_states: int = MAX_STATES
) -> Automaton:
    """Compiles a JSON Schema to a byte automaton (schema -> regex -> DFA, via outlines-core).

    Every string the automaton accepts is a JSON text that validates against the schema (the
    translation may be stricter than the schema: e.g. properties appear in the order given and
    unlisted properties are not generated); keywords that would make it laxer are refused.

    Parameters
    ----------
    schema : dict, str or path
        A dict, a JSON string or the path of a JSON file.
    whitespace : str, optional
        The regex of the whitespace allowed between JSON tokens (see `schema_regex`).
    max_states : int
        Bound on the automaton's states.

    Raises
    ------
    ValueError
        An unsupported keyword (named), invalid JSON, or an empty language.
    AutomatonTooLargeError
        More than `max_states` states.
    """
    return regex(schema_regex(schema, whitespace), max_states=max_states)


__all__ = [
    "MAX_STATES", "UNSUPPORTED_SCHEMA_KEYWORDS", "check_schema_supported", "json_schema", "load_schema", "regex",
    "schema_regex",
]
