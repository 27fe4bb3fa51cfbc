"""Constraints with the embedded models: JSON Schema at the token level (SmolLM2 under two
prompts) and a regex at the byte level (SmolLM2 x Gemma 3). Every string returned with positive
weight must be in the language; particles stopped by the forced EOS outside it get weight 0."""

from __future__ import annotations

import json
import math
import re

import pytest

import smc_jax as sj

pytestmark = [pytest.mark.slow, pytest.mark.real_model]

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}, "confidence": {"type": "integer", "enum": [1, 2, 3]}},
    "required": ["answer", "confidence"],
}


def check_in_language(result, accept) -> int:
    """Positive weight <=> finished with EOS and accepted; returns the number of such particles."""
    good = 0
    for text, w, fin in zip(result.texts, result.weights, result.finished):
        if w > 0:
            assert fin and accept(text), text
            good += 1
        else:
            assert not (fin and not accept(text)), text  # never a finished string outside L
    return good


def test_json_schema_token_level_two_prompts():
    jsonschema = pytest.importorskip("jsonschema")
    smol = sj.load_model("smollm2-135m-instruct")
    constraint = sj.constraints.json_schema(SCHEMA, whitespace="")
    experts = [(smol, "Is the sky blue? Answer in JSON:"), (smol, "Is grass green? Answer in JSON:")]
    result = sj.sample(experts, "product", level="token", num_particles=4, max_length=28, seed=0,
                       constraint=constraint, allow_zero_weight=True)

    def valid(text: str) -> bool:
        try:
            jsonschema.validate(json.loads(text), SCHEMA)
            return True
        except (ValueError, jsonschema.ValidationError):
            return False

    assert check_in_language(result, valid) >= 1, result.texts
    assert result.log_Z is not None and math.isfinite(result.log_Z)
    assert result.expert_logprobs.shape == (4, 2)  # the constraint's column is not reported
    # The local baseline (locally constrained decoding) is in the language too.
    local = sj.sample(experts, "product", level="local", num_particles=4, max_length=28, seed=0, constraint=constraint)
    check_in_language(local, valid)


def test_regex_byte_level_smollm2_and_gemma3():
    smol, gemma = sj.load_model("smollm2-135m-instruct"), sj.load_model("gemma3-270m")
    pattern = r" [A-Z][a-z]{2,7}\."
    result = sj.sample([(smol, "My favorite physicist is"), (gemma, "My favorite physicist is")], "product",
                       level="byte", num_particles=3, max_length=10, seed=0,
                       constraint=sj.constraints.regex(pattern), allow_zero_weight=True)
    assert check_in_language(result, lambda t: re.fullmatch(pattern, t) is not None) >= 1, result.texts


def test_sql_select_constraint_token_level(tmp_path):
    """Text-to-SQL's constraint (a 668-state automaton, a 1024 x 49152 token table) on SmolLM2
    under the task's prompt: every string is a SELECT of the language, naming only the database's
    tables, and the task's checker runs it."""
    from evaluation.methods import sql_constraint
    from evaluation.tasks.sql_schema import read_tables
    from evaluation.tasks.text_to_sql import TextToSqlTask

    task = TextToSqlTask(database_dir=tmp_path)
    instance = next(i for i in task.instances() if i.id == "q03")
    constraint = sql_constraint(instance.database)
    smol = sj.load_model("smollm2-135m-instruct")
    result = sj.sample([(smol, task.prompts(instance)[0])], "product", level="token", num_particles=4,
                       max_length=48, seed=0, constraint=constraint, allow_zero_weight=True)
    tables = {t.name for t in read_tables(instance.database)}
    assert check_in_language(result, constraint.matches) >= 1, result.texts
    for text, w in zip(result.texts, result.weights):
        if w > 0:
            assert text.startswith("SELECT ") and task.extract(text) == text
            assert re.search(r"\bFROM (\w+)", text).group(1) in tables
            task.is_correct(instance, text)  # runs (or fails cleanly) read-only
