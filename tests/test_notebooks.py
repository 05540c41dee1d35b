"""The research notebooks in notebooks/ run end to end (nbclient, CPU) and are stored
without outputs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))

nbformat = pytest.importorskip("nbformat", reason="pip install -e '.[test]' (nbformat, nbclient, ipykernel)")
nbclient = pytest.importorskip("nbclient", reason="pip install -e '.[test]' (nbformat, nbclient, ipykernel)")
pytest.importorskip("ipykernel", reason="pip install -e '.[test]' (ipykernel runs the notebooks)")


def execute(path: Path, timeout_s: int = 300):
    """Run every cell of ``path`` in a fresh python3 kernel (cwd: notebooks/, matplotlib Agg).

    Returns the executed notebook; raises nbclient's CellExecutionError on a failing cell.
    """
    nb = nbformat.read(path, as_version=4)
    env_backup = os.environ.get("MPLBACKEND")
    os.environ["MPLBACKEND"] = "Agg"
    try:
        client = nbclient.NotebookClient(nb, timeout=timeout_s, kernel_name="python3",
                                         resources={"metadata": {"path": str(path.parent)}})
        client.execute()
    finally:
        if env_backup is None:
            os.environ.pop("MPLBACKEND", None)
        else:
            os.environ["MPLBACKEND"] = env_backup
    return nb


def test_there_are_notebooks():
    names = {p.stem for p in NOTEBOOKS}
    assert {"01_quickstart", "02_kv_cache_decode"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_outputs_are_stripped(path):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: strip outputs"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path):
    nb = execute(path)
    # the first cell says, in plain words, which question the notebook answers
    assert nb.cells[0].cell_type == "markdown" and "question" in nb.cells[0].source.lower()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    # no accelerator-plugin start-up noise (a CUDA plugin traceback, libtpu warnings) in the
    # outputs: a notebook imports jaxmove before jax, so jax starts on the CPU here
    from jaxmove._platform import _NOISE
    noise = [o.text[:200] for c in nb.cells if c.cell_type == "code" for o in c.outputs
             if o.output_type == "stream" and _NOISE.search(o.text)]
    assert not noise, noise
