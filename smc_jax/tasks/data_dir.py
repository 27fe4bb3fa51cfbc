"""Where the evaluation data sets live: read in place, never copied into the project.

The data folder holds one sub-folder per data set (see shared/data/README.md). It is, in order:
the `data_dir` argument when given, else $SMC_JAX_DATA when set, else `../shared/data` seen from
the repository root (where CI and this workspace put it).
"""

from __future__ import annotations

import os
from pathlib import Path

DATA_DIR_ENV = "SMC_JAX_DATA"
REPOSITORY_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DATA_DIR = REPOSITORY_ROOT.parent / "shared" / "data"


class DataNotFoundError(FileNotFoundError):
    """The evaluation data folder, or a data set inside it, is not where it was looked for."""


def resolve_data_dir(data_dir: str | Path | None = None) -> Path:
    """The evaluation data folder (see the module docstring for the order); an error naming the
    place it looked and how to point at the data when that folder does not exist.

    Parameters
    ----------
    data_dir : str or pathlib.Path, optional
        An explicit folder (else $SMC_JAX_DATA, else ../shared/data).
    """
    if data_dir is not None:
        folder, origin = Path(data_dir), "the data_dir argument"
    elif os.environ.get(DATA_DIR_ENV):
        folder, origin = Path(os.environ[DATA_DIR_ENV]), f"${DATA_DIR_ENV}"
    else:
        folder, origin = DEFAULT_DATA_DIR, "the default ../shared/data beside the repository"
    folder = folder.expanduser()
    if not folder.is_dir():
        raise DataNotFoundError(
            f"evaluation data folder {folder} (from {origin}) does not exist; pass data_dir=... or "
            f"set ${DATA_DIR_ENV} to the folder that holds the data sets (see shared/data/README.md)")
    return folder


def data_set_path(data_dir: str | Path | None, relative: str) -> Path:
    """The path `relative` (a data set's folder or file) inside the evaluation data folder."""
    folder = resolve_data_dir(data_dir)
    path = folder / relative
    if not path.exists():
        raise DataNotFoundError(
            f"{relative} not found in the evaluation data folder {folder}; data_dir (or "
            f"${DATA_DIR_ENV}) must be the folder that holds {relative}")
    return path
