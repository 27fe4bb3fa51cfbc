"""Where the evaluation data sets live: read in place, never copied.

The data folder holds one sub-folder per data set (`bigbench-word_sorting/task.json`,
`jsonschemabench-glaive2k/*.json`; see docs/data.md). It is, in order:

1. the `data_dir` argument when given (a caller's explicit choice wins),
2. else `$SMC_JAX_DATA` when set (other data for every run in a shell or on a machine),
3. else `BUNDLED_DATA_DIR`, the copy in the repository (`evaluation/tasks/data/`), so a fresh
   clone works with no set-up step and no network.
"""

from __future__ import annotations

import os
from pathlib import Path

DATA_DIR_ENV = "SMC_JAX_DATA"
BUNDLED_DATA_DIR = Path(__file__).resolve().parent / "data"

#: What to do when the bundled copy lacks a file (it ships whole, so it was deleted or left out).
RESTORE_HINT = (
    "restore the bundled data with `git checkout -- evaluation/tasks/data` in a clone")
_BUNDLED = "the data in the repository (evaluation/tasks/data)"


class DataNotFoundError(FileNotFoundError):
    """The evaluation data folder, or a data set inside it, is not where it was looked for."""


def _chosen_data_dir(data_dir: str | Path | None) -> tuple[Path, str]:
    """The data folder by the module docstring's order, and where that choice came from."""
    if data_dir is not None:
        return Path(data_dir).expanduser(), "the data_dir argument"
    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV]).expanduser(), f"${DATA_DIR_ENV}"
    return BUNDLED_DATA_DIR, _BUNDLED


def _what_to_do(origin: str, relative: str) -> str:
    """The advice of a DataNotFoundError for data looked for in the folder from `origin`."""
    if origin == _BUNDLED:
        return f"{RESTORE_HINT}; or set ${DATA_DIR_ENV} to a folder that holds {relative}"
    return (f"pass data_dir=... or set ${DATA_DIR_ENV} to a folder that holds {relative}, or leave "
            f"both unset to use {_BUNDLED}")


def resolve_data_dir(data_dir: str | Path | None = None) -> Path:
    """The evaluation data folder (see the module docstring for the order).

    Parameters
    ----------
    data_dir : str or pathlib.Path, optional
        An explicit folder (else $SMC_JAX_DATA, else the data in the repository).

    Raises
    ------
    DataNotFoundError
        When that folder does not exist; the message names the folder, where it came from and
        what to do.
    """
    folder, origin = _chosen_data_dir(data_dir)
    if not folder.is_dir():
        raise DataNotFoundError(f"evaluation data folder {folder} (from {origin}) does not exist; "
                                + _what_to_do(origin, "the data sets"))
    return folder


def data_set_path(data_dir: str | Path | None, relative: str) -> Path:
    """The path `relative` (a data set's folder or file) inside the evaluation data folder.

    Raises
    ------
    DataNotFoundError
        When the folder or `relative` inside it is missing; the message says what to do.
    """
    folder = resolve_data_dir(data_dir)
    path = folder / relative
    if not path.exists():
        _, origin = _chosen_data_dir(data_dir)
        raise DataNotFoundError(f"{relative} not found in the evaluation data folder {folder} (from "
                                f"{origin}); " + _what_to_do(origin, relative))
    return path
