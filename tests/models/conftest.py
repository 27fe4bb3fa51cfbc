"""Fixtures for the model-port tests: tiny random HF checkpoints, built once per test run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.helpers import tiny_checkpoints


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny_models")


@pytest.fixture(scope="session")
def tiny(tiny_dir: Path) -> Any:
    """tiny(arch) -> (checkpoint directory, torch reference model), cached per test run."""
    built: dict[str, tuple[Path, Any]] = {}

    def get(arch: str) -> tuple[Path, Any]:
        if arch not in built:
            directory = tiny_dir / arch
            built[arch] = (directory, tiny_checkpoints.build(arch, directory))
        return built[arch]

    return get
