"""Hard constraints as one more factor of the target: Phi(x) ∝ f(p_1(x), ..., p_K(x)) * 1{x in L}.

    digits = sj.constraints.regex(r"[0-9]{3}-[0-9]{4}")
    person = sj.constraints.json_schema({"type": "object", "properties": {"name": {"type": "string"}}})
    sj.sample([(smol, prompt)], "product", level="token", constraint=person)

The public face of `smc_jax.experts.constraint_compiler` (regular expressions and JSON Schemas
compiled to byte automata) and `smc_jax.experts.constraint` (the automaton and its expert);
docs/constraints.md states the semantics.
"""

from smc_jax.experts.constraint import Automaton, AutomatonTooLargeError, ConstraintExpert, token_transitions
from smc_jax.experts.constraint_compiler import (
    MAX_STATES,
    UNSUPPORTED_SCHEMA_KEYWORDS,
    check_schema_supported,
    json_schema,
    load_schema,
    regex,
    schema_regex,
)

__all__ = [
    "Automaton", "AutomatonTooLargeError", "ConstraintExpert", "token_transitions", "MAX_STATES",
    "UNSUPPORTED_SCHEMA_KEYWORDS", "check_schema_supported", "json_schema", "load_schema", "regex", "schema_regex",
]
