"""The evaluation data folder (skips the tests that need it when it is absent) and a fresh
business database per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from smc_jax.tasks.business_database import database_path
from smc_jax.tasks.data_dir import DataNotFoundError, resolve_data_dir


@pytest.fixture(scope="session")
def data_dir() -> Path:
    try:
        return resolve_data_dir()
    except DataNotFoundError as error:
        pytest.skip(f"evaluation data not available: {error}")


@pytest.fixture(scope="session")
def database_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("business")


@pytest.fixture(scope="session")
def database(database_dir: Path) -> Path:
    return database_path(database_dir)
