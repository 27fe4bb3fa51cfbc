"""The evaluation data folder (the copy in the repository: always present, so no test is
skipped for want of data) and a fresh business database per test run."""

from __future__ import annotations

from pathlib import Path

import pytest

from evaluation.tasks.business_database import database_path
from evaluation.tasks.data_dir import BUNDLED_DATA_DIR


@pytest.fixture(scope="session")
def data_dir() -> Path:
    # The bundled copy, not $SMC_JAX_DATA: the tests check the data that ships. A missing file
    # fails the test that reads it with DataNotFoundError (which says how to restore it).
    return BUNDLED_DATA_DIR


@pytest.fixture(scope="session")
def database_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("business")


@pytest.fixture(scope="session")
def database(database_dir: Path) -> Path:
    return database_path(database_dir)
