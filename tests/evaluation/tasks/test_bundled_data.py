"""The evaluation data that ships with the package: where it is found, that it is the unmodified
upstream data, and that it reproduces the instances of the committed benchmark results."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from evaluation.runner import load_instances
from evaluation.tasks import data_dir as data_dir_module
from evaluation.tasks.data_dir import BUNDLED_DATA_DIR, DATA_DIR_ENV, DataNotFoundError, data_set_path, resolve_data_dir
from evaluation.tasks.json_schema import SCHEMA_FOLDER
from evaluation.tasks.word_sorting import TASK_FILE

# sha256 of the upstream files (evaluation/tasks/data/README.md); the folder's is that of the
# output of `LC_ALL=C sha256sum *.json` in it.
WORD_SORTING_SHA256 = "8633aac2c5e59b0580f17a702d78c3a8294092144c7bb1380192dd5bb4255f29"
GLAIVE2K_SHA256 = "ff56cc0b045457f73cbd4480b971177fd24760ccd92e86cddf81b3c0e829fd78"
GLAIVE2K_SCHEMAS = 1707


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_the_bundled_data_is_the_default(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    assert resolve_data_dir() == BUNDLED_DATA_DIR
    assert data_set_path(None, TASK_FILE) == BUNDLED_DATA_DIR / TASK_FILE


def test_argument_then_environment_then_bundled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from_env, from_argument = tmp_path / "env", tmp_path / "argument"
    from_env.mkdir()
    from_argument.mkdir()
    monkeypatch.setenv(DATA_DIR_ENV, str(from_env))
    assert resolve_data_dir() == from_env
    assert resolve_data_dir(from_argument) == from_argument
    monkeypatch.setenv(DATA_DIR_ENV, "")  # set but empty counts as unset
    assert resolve_data_dir() == BUNDLED_DATA_DIR


def test_a_missing_bundled_file_says_how_to_restore_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    monkeypatch.setattr(data_dir_module, "BUNDLED_DATA_DIR", tmp_path)
    with pytest.raises(DataNotFoundError, match=r"the data in the repository \(evaluation/tasks/data\)") as error:
        data_set_path(None, TASK_FILE)
    assert "git checkout -- evaluation/tasks/data" in str(error.value) and DATA_DIR_ENV in str(error.value)


def test_the_bundled_data_is_the_unmodified_upstream_data():
    assert sha256((BUNDLED_DATA_DIR / TASK_FILE).read_bytes()) == WORD_SORTING_SHA256
    schemas = sorted((BUNDLED_DATA_DIR / SCHEMA_FOLDER).glob("*.json"), key=lambda path: path.name)
    assert len(schemas) == GLAIVE2K_SCHEMAS
    listing = "".join(f"{sha256(path.read_bytes())}  {path.name}\n" for path in schemas)
    assert sha256(listing.encode()) == GLAIVE2K_SHA256


def test_every_data_set_comes_with_its_license():
    licenses = BUNDLED_DATA_DIR / "LICENSES"
    assert "Apache License" in (licenses / "Apache-2.0.txt").read_text()
    assert "MIT License" in (licenses / "MIT-JSONSchemaBench.txt").read_text()
    readme = (BUNDLED_DATA_DIR / "README.md").read_text()
    assert WORD_SORTING_SHA256 in readme and GLAIVE2K_SHA256 in readme


# (task, --limit, --max-words) of the committed results in evaluation/results/ (instance seed 0)
# and the instances they report: the bundled data must draw exactly these again.
COMMITTED_DRAWS = [
    ("json", 3, None, ["calculate_area_fe414505", "calculate_distance_731540d9", "search_hotels_29d4c29d"]),
    ("word_sorting", 3, 3, ["example-107", "example-194", "example-98"]),  # evaluate_cpu
    ("word_sorting", 4, 3, ["example-10", "example-107", "example-194", "example-98"]),  # particle_study_cpu
    ("word_sorting", 6, 3, ["example-10", "example-107", "example-130", "example-194", "example-66",
                            "example-98"]),  # particle_study_cpu_eos
    ("word_sorting", 10, 3, ["example-10", "example-103", "example-107", "example-122", "example-124",
                             "example-130", "example-194", "example-66", "example-77",
                             "example-98"]),  # particle_study_cpu_long
]


@pytest.mark.parametrize("task, limit, max_words, ids", COMMITTED_DRAWS)
def test_committed_results_draw_the_same_instances(data_dir: Path, task, limit, max_words, ids):
    drawn = load_instances(task, limit, seed=0, data_dir=data_dir, max_words=max_words)
    assert sorted(instance.id for instance in drawn) == sorted(ids)
