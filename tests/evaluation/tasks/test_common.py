"""The parts every task shares: seeded sampling, the data folder, answer normalization."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from evaluation.tasks.answers import strip_answer, unwrap_code_fence
from evaluation.tasks.base import sample
from evaluation.tasks.data_dir import DATA_DIR_ENV, DataNotFoundError, data_set_path, resolve_data_dir


# --- sampling -------------------------------------------------------------------------------

def test_sample_is_deterministic_and_respects_limit():
    pool = list(range(100))
    first = sample(pool, 10, seed=3)
    assert first == sample(pool, 10, seed=3)
    assert len(first) == len(set(first)) == 10 and set(first) <= set(pool)
    assert first != sample(pool, 10, seed=4)
    assert sample(pool, None, seed=3) == pool


@pytest.mark.parametrize("limit", [0, -1, 101])
def test_sample_rejects_impossible_limits(limit: int):
    with pytest.raises(ValueError, match="between 1 and the 100 available"):
        sample(list(range(100)), limit, seed=0)


# --- the data folder ------------------------------------------------------------------------

def test_missing_data_dir_says_where_it_looked_and_how_to_pass_it(tmp_path: Path):
    missing = tmp_path / "nowhere"
    with pytest.raises(DataNotFoundError, match=re.escape(str(missing))) as error:
        resolve_data_dir(missing)
    assert "data_dir" in str(error.value) and DATA_DIR_ENV in str(error.value)


def test_data_dir_comes_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    assert resolve_data_dir() == tmp_path
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "gone"))
    with pytest.raises(DataNotFoundError, match=f"from \\${DATA_DIR_ENV}"):
        resolve_data_dir()


def test_missing_data_set_names_the_data_set(tmp_path: Path):
    with pytest.raises(DataNotFoundError, match="bigbench-word_sorting/task.json not found"):
        data_set_path(tmp_path, "bigbench-word_sorting/task.json")


# --- answer normalization -------------------------------------------------------------------

@pytest.mark.parametrize(("text", "answer"), [
    ("  a, b \n", "a, b"),
    ("a, b<|im_end|>", "a, b"),
    ("a, b <|eot_id|>\n", "a, b"),
    ("a, b<|end|><|endoftext|>", "a, b"),
    ("<|im_end|>a, b", "<|im_end|>a, b"),  # only trailing markers are artifacts
    ("a, b.", "a, b."),  # nothing else is repaired
])
def test_strip_answer(text: str, answer: str):
    assert strip_answer(text) == answer


@pytest.mark.parametrize(("text", "answer"), [
    ("```json\n{\"a\": 1}\n```", "{\"a\": 1}"),
    ("```sql\nSELECT 1;\n```", "SELECT 1;"),
    ("```\nSELECT 1\n```", "SELECT 1"),
    ("Here it is: ```sql\nSELECT 1\n```", "Here it is: ```sql\nSELECT 1\n```"),  # not all of it
    ("SELECT 1", "SELECT 1"),
])
def test_unwrap_code_fence(text: str, answer: str):
    assert unwrap_code_fence(text) == answer
