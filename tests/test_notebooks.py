"""The notebooks run top to bottom (on the embedded models, CPU)."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 1200


@pytest.mark.slow
@pytest.mark.real_model
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, monkeypatch):
    # The kernel inherits the environment: the notebooks run long programs (sampling, fitting),
    # where XLA's optimizations pay for their compile time (conftest turns them off elsewhere).
    monkeypatch.setenv("JAX_DISABLE_MOST_OPTIMIZATIONS", "0")
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    errors = [o for cell in notebook.cells for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors


def test_notebooks_exist():
    assert {p.stem for p in NOTEBOOKS} >= {"quickstart", "prompt_intersection"}
