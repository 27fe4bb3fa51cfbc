"""The JSON task's metric on a real Glaiveai2K schema, schema loading and its prompts."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from jsonschema import Draft7Validator, Draft202012Validator

from evaluation.tasks.data_dir import DataNotFoundError
from evaluation.tasks.json_schema import (
    DEMONSTRATION, EXAMPLE_OUTPUT, EXAMPLE_SCHEMA, SCHEMA_FOLDER, JsonSchemaInstance, JsonSchemaTask,
    conforms, load_schemas, validator_class,
)

TASK = JsonSchemaTask()
HEALTH_SCHEMA_ID = "analyze_health_data_4ad104b4"  # data: [{measurement: str, value: number, timestamp: date-time}]
VALID_HEALTH_DATA = {"data": [{"measurement": "heart_rate", "value": 72, "timestamp": "2024-03-01T08:00:00Z"}]}


@pytest.fixture(scope="module")
def health(data_dir: Path) -> JsonSchemaInstance:
    return next(i for i in TASK.instances(data_dir) if i.id == HEALTH_SCHEMA_ID)


def test_valid_object_is_correct(health: JsonSchemaInstance):
    assert TASK.is_correct(health, json.dumps(VALID_HEALTH_DATA))
    assert TASK.is_correct(health, " ```json\n" + json.dumps(VALID_HEALTH_DATA) + "\n```<|im_end|>")


@pytest.mark.parametrize("invalid", [
    {"data": [{"measurement": "heart_rate", "value": "72", "timestamp": "2024-03-01T08:00:00Z"}]},  # wrong type
    {"data": [{"measurement": "heart_rate", "value": 72}]},  # missing required key
    {"records": []},  # missing top-level required key
    [VALID_HEALTH_DATA],  # not an object
])
def test_invalid_object_is_wrong(health: JsonSchemaInstance, invalid: object):
    assert not TASK.is_correct(health, json.dumps(invalid))


@pytest.mark.parametrize("malformed", [
    '{"data": [',  # truncated
    "{'data': []}",  # Python, not JSON
    json.dumps(VALID_HEALTH_DATA) + " Hope this helps!",  # trailing text
    '{"data": [{"measurement": "x", "value": NaN, "timestamp": "t"}]}',  # NaN is not JSON
    "",
])
def test_malformed_json_is_wrong(health: JsonSchemaInstance, malformed: str):
    assert not TASK.is_correct(health, malformed)


def test_format_is_an_annotation_not_asserted(health: JsonSchemaInstance):
    odd_timestamp = {"data": [{"measurement": "heart_rate", "value": 72, "timestamp": "yesterday"}]}
    assert TASK.is_correct(health, json.dumps(odd_timestamp))


def test_validator_follows_dollar_schema():
    assert validator_class({"type": "object"}) is Draft202012Validator
    assert validator_class({"$schema": "http://json-schema.org/draft-07/schema#"}) is Draft7Validator
    draft7_tuple = {"$schema": "http://json-schema.org/draft-07/schema#", "items": [{"type": "string"}]}
    assert conforms('["a", 1]', draft7_tuple) and not conforms("[1]", draft7_tuple)


def test_remote_ref_is_never_fetched_and_fails(monkeypatch: pytest.MonkeyPatch):
    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("the metric must not open a connection")

    monkeypatch.setattr(socket, "create_connection", no_network)
    assert not conforms('{"a": 1}', {"$ref": "https://example.com/schema.json"})


def test_missing_data_set_says_which(tmp_path: Path):
    with pytest.raises(DataNotFoundError, match=f"{SCHEMA_FOLDER} not found"):
        TASK.instances(data_dir=tmp_path)


def test_deeply_nested_json_is_wrong_not_an_error():
    depth = 100_000
    assert not conforms("[" * depth + "]" * depth, {"type": "array"})


def test_invalid_schemas_are_skipped_and_counted(tmp_path: Path):
    (tmp_path / "good.json").write_text(json.dumps({"type": "object"}))
    (tmp_path / "bad_type.json").write_text(json.dumps({"type": 5}))
    (tmp_path / "not_json.json").write_text("{")
    collection = load_schemas(tmp_path)
    assert [i.id for i in collection.instances] == ["good"]
    assert dict(collection.skipped).keys() == {"bad_type", "not_json"}


def test_every_data_schema_is_valid(data_dir: Path):
    collection = load_schemas((data_dir / SCHEMA_FOLDER).resolve())
    assert len(collection.instances) == len(list((data_dir / SCHEMA_FOLDER).glob("*.json")))
    assert not collection.skipped


def test_demonstration_is_valid_and_not_a_data_schema(data_dir: Path):
    assert conforms(DEMONSTRATION.output, EXAMPLE_SCHEMA)
    assert json.loads(DEMONSTRATION.input) == EXAMPLE_SCHEMA and json.loads(DEMONSTRATION.output) == EXAMPLE_OUTPUT
    assert all(i.schema != EXAMPLE_SCHEMA for i in TASK.instances(data_dir))


def test_prompts_end_with_the_dumped_schema(health: JsonSchemaInstance):
    for chat in TASK.prompts(health):
        assert chat[-1] == {"role": "user", "content": json.dumps(health.schema)}
        assert chat[1:3] == [{"role": "user", "content": DEMONSTRATION.input},
                             {"role": "assistant", "content": DEMONSTRATION.output}]
