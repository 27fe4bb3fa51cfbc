"""The evaluation data folder (skips the tests that need it when it is absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

from smc_jax.tasks.data_dir import DataNotFoundError, resolve_data_dir


@pytest.fixture(scope="session")
def data_dir() -> Path:
    try:
        return resolve_data_dir()
    except DataNotFoundError as error:
        pytest.skip(f"evaluation data not available: {error}")
