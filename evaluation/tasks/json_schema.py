"""JSON task (JSONSchemaBench Glaiveai2K): generate a JSON object that validates against a schema.

Metric: the answer (after `strip_answer` and `unwrap_code_fence`) is one JSON value -- strict
JSON: no trailing text, no NaN/Infinity, not nested past Python's recursion limit -- that validates against the instance's schema with
`jsonschema`. The validator class follows the schema's `$schema`, Draft 2020-12 when it has none
(as JSONSchemaBench does). `format` is an annotation, not asserted (the Draft 2020-12 default):
date-time/time checkers need optional packages, and the verdict must not depend on what is
installed. A `$ref` that cannot be resolved locally is never fetched: the answer counts as
invalid (no Glaiveai2K schema has a `$ref`). Schemas that are themselves invalid are skipped at
load time and counted (`SchemaCollection.skipped`).
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for
from referencing.exceptions import Unresolvable

from evaluation.tasks.answers import strip_answer, unwrap_code_fence
from evaluation.tasks.base import Chat, Demonstration, sample
from evaluation.tasks.data_dir import data_set_path

SCHEMA_FOLDER = "jsonschemabench-glaive2k"
DEFAULT_VALIDATOR: type[Validator] = Draft202012Validator

SYSTEM_PROMPT_1 = (
    "You need to generate a JSON object that matches the schema below. Output the JSON object on a "
    "single line. DO NOT use multiple lines and DO NOT output any other text."
)
SYSTEM_PROMPT_2 = (
    "Task: JSON object generation from schema specification.\n"
    "Input: JSON Schema (draft-04 or later)\n"
    "Output: Valid JSON object satisfying all schema constraints\n"
    "Format: Single-line JSON, no extraneous text"
)
EXAMPLE_SCHEMA: dict[str, Any] = {
    "properties": {
        "location": {"description": "The city and country, e.g. Paris, France", "type": "string"},
        "unit": {"description": "The temperature unit", "enum": ["celsius", "fahrenheit"], "type": "string"},
    },
    "required": ["location"],
    "type": "object",
}
EXAMPLE_OUTPUT: dict[str, Any] = {"location": "Zurich, Switzerland", "unit": "celsius"}
DEMONSTRATION = Demonstration(input=json.dumps(EXAMPLE_SCHEMA), output=json.dumps(EXAMPLE_OUTPUT))

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JsonSchemaInstance:
    """One schema to satisfy; `id` is its file name without `.json`. The schema dict is shared
    with the per-process cache of `load_schemas`: read it, do not change it.

    Attributes
    ----------
    id : str
        The schema's file name without ".json".
    schema : dict
        The JSON schema.
    """

    id: str
    schema: dict[str, Any]


@dataclass(frozen=True)
class SchemaCollection:
    """The valid schemas of a folder, sorted by id, and (id, why) for each schema skipped."""

    instances: tuple[JsonSchemaInstance, ...]
    skipped: tuple[tuple[str, str], ...]


def validator_class(schema: dict[str, Any]) -> type[Validator]:
    """The validator for the schema's `$schema` dialect, `DEFAULT_VALIDATOR` when it names none."""
    return validator_for(schema, default=DEFAULT_VALIDATOR)


@functools.cache
def load_schemas(folder: Path) -> SchemaCollection:
    """Every `*.json` schema in `folder`; unreadable or invalid schemas are skipped with a reason.

    Checking a schema against its meta-schema takes ~2 ms (Draft 2020-12), so a folder is read
    once per process.
    """
    instances, skipped = [], []
    for path in sorted(folder.glob("*.json")):
        try:
            schema = json.loads(path.read_text(encoding="utf-8"))
            validator_class(schema).check_schema(schema)
        except (ValueError, SchemaError) as error:  # json.JSONDecodeError is a ValueError
            skipped.append((path.stem, f"{type(error).__name__}: {getattr(error, 'message', error)}"))
            continue
        instances.append(JsonSchemaInstance(id=path.stem, schema=schema))
    return SchemaCollection(tuple(instances), tuple(skipped))


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def parse_json(text: str) -> Any:
    """The JSON value `text` holds, by strict JSON (ValueError otherwise, NaN/Infinity too;
    RecursionError when nested too deeply)."""
    return json.loads(text, parse_constant=_reject_constant)


def conforms(text: str, schema: dict[str, Any]) -> bool:
    """Whether `text` is one JSON value that validates against `schema`."""
    try:
        return validator_class(schema)(schema).is_valid(parse_json(text))
    except (ValueError, RecursionError, Unresolvable):
        return False


@dataclass(frozen=True)
class JsonSchemaTask:
    """The JSON task: prompts of App. E (one demonstration, then `json.dumps(schema)`).

    Attributes
    ----------
    name : str
        "json".
    """

    name: str = "json"

    def instances(self, data_dir: str | Path | None = None, limit: int | None = None,
                  seed: int = 0) -> list[JsonSchemaInstance]:
        collection = load_schemas(data_set_path(data_dir, SCHEMA_FOLDER).resolve())
        if collection.skipped:
            log.warning("skipped %d invalid schemas of %s: %s", len(collection.skipped),
                        SCHEMA_FOLDER, ", ".join(schema_id for schema_id, _ in collection.skipped))
        return sample(collection.instances, limit, seed)

    def prompts(self, instance: JsonSchemaInstance) -> tuple[Chat, Chat]:
        def chat(system_prompt: str) -> Chat:
            return [
                {"role": "system", "content": system_prompt},
                {"role": "user", "content": DEMONSTRATION.input},
                {"role": "assistant", "content": DEMONSTRATION.output},
                {"role": "user", "content": json.dumps(instance.schema)},
            ]

        return chat(SYSTEM_PROMPT_1), chat(SYSTEM_PROMPT_2)

    def extract(self, text: str) -> str:
        return unwrap_code_fence(strip_answer(text))

    def is_correct(self, instance: JsonSchemaInstance, text: str) -> bool:
        return conforms(self.extract(text), instance.schema)
